"""The sharded ball query (``BallQueryPlan``) against the single-process query on the whole cloud.

On 1-4 gloo ranks, with truncation active: the neighbour lists in global ids, their order, the
distances and the candidate counts are exactly (bit for bit) those of ``ball_query`` on the whole
cloud. Clouds: uniform (partitioned through the kNN graph with METIS, and by RCB), clustered with
duplicate points, an integer lattice (exact ties, points exactly on the radius), the vertices of a
real mesh (../shared/data/sfepy/wheelset.vtk, SfePy, BSD-3-Clause, METIS on the mesh graph), and a
layout with an empty rank and a rank whose region touches no other.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard import ShardSpec, ShardTensor
from meshshard.comm import count_collectives
from meshshard.nn._ball_halo import BallQueryPlan
from meshshard.nn._ball_query import ball_query
from tests._dist import run_ranks
from tests._meshes import mesh_case

MESH = "sfepy/wheelset.vtk"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def uniform_cloud(n: int = 2500, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, generator=_gen(seed), dtype=torch.float64)


def clustered_cloud(seed: int = 1) -> torch.Tensor:
    g = _gen(seed)
    centres = torch.rand(6, 3, generator=g, dtype=torch.float64)
    pos = centres[torch.randint(0, 6, (1500,), generator=g)] + 0.03 * torch.randn(1500, 3, generator=g, dtype=torch.float64)
    return torch.cat([pos, pos[:300], pos[:40]])  # duplicates: some points two and three times


def lattice_cloud() -> torch.Tensor:
    axis = torch.arange(12, dtype=torch.float64)
    return torch.cartesian_prod(axis, axis, axis * 0.5)


def isolated_layout(world: int, near_points: int = 1500, far_points: int = 500) -> tuple[torch.Tensor, np.ndarray]:
    """Two blobs 10 apart: rank 0 owns the far one (its region touches no other rank); with 3 or
    more ranks, rank 1 owns nothing; the rest split the near one into slabs along x."""
    near = uniform_cloud(near_points, 2)
    far = uniform_cloud(far_points, 3) + 10.0
    pos = torch.cat([near, far])
    owner = np.zeros(len(pos), np.int64)
    first = 2 if world >= 3 else 1
    if world > 1:
        slabs = world - first
        owner[: len(near)] = first + np.minimum((near[:, 0].numpy() * slabs).astype(np.int64), slabs - 1)
    return pos, owner


def spec_from_owner(owner: np.ndarray, rank: int, world: int) -> ShardSpec:
    own = np.nonzero(owner == rank)[0]
    return ShardSpec.from_counts(np.bincount(owner, minlength=world).tolist(), global_ids=own)


def spec_from_points(pos: torch.Tensor, rank: int, world: int, method: str) -> ShardSpec:
    from meshshard.partition import partition_points

    return ShardSpec.from_partition(partition_points(pos.numpy(), world, graph="knn", method=method)[rank])


def check_plan(pos: torch.Tensor, spec: ShardSpec, radius: float, k: int, what: str, expect_truncation: bool = True) -> BallQueryPlan:
    own = spec.global_ids
    with count_collectives() as log:
        plan = BallQueryPlan.build(pos[own], radius, k, spec)
    assert log.count() == 5, (what, log)
    whole = ball_query(pos, pos, radius, k)
    if expect_truncation:
        assert whole.num_truncated > 0, what  # truncation must be active for the check to mean anything
    assert torch.equal(plan.neighbor_ids, whole.index[own]), f"{what}: neighbour ids differ"
    assert torch.equal(plan.neighbors.mask, whole.mask[own]), what
    assert torch.equal(plan.neighbors.distance, whole.distance[own]), f"{what}: distances differ"
    assert torch.equal(plan.neighbors.num_candidates, whole.num_candidates[own]), what
    # the halo rows are the points the plan says they are
    local_ids = torch.cat([own, plan.halo_ids])
    assert torch.equal(plan.with_halo(pos[own]), pos[local_ids]), what
    assert plan.halo_ids.unique().numel() == plan.num_halo and not bool(torch.isin(plan.halo_ids, own).any()), what
    return plan


def _battery(rank: int, world: int) -> str:
    pos = uniform_cloud()
    check_plan(pos, spec_from_points(pos, rank, world, "metis"), 0.09, 10, "uniform, knn + metis")
    check_plan(pos, spec_from_points(pos, rank, world, "rcb"), 0.09, 10, "uniform, rcb")
    check_plan(pos.float(), spec_from_points(pos, rank, world, "rcb"), 0.09, 10, "uniform float32, rcb")

    pos = clustered_cloud()
    check_plan(pos, spec_from_points(pos, rank, world, "rcb"), 0.04, 12, "clustered with duplicates")

    pos = lattice_cloud()
    for radius, k in [(1.0, 5), (1.0, 7), (1.5, 20)]:
        check_plan(pos, spec_from_points(pos, rank, world, "morton"), radius, k, f"lattice r={radius} k={k}")

    case = mesh_case(MESH, world)
    pos = torch.as_tensor(case.pos)
    spec = ShardSpec.from_partition(case.parts[rank])
    extent = float((pos.max(0).values - pos.min(0).values).max())
    check_plan(pos, spec, extent / 30, 16, "wheelset vertices, metis")

    pos, owner = isolated_layout(world)
    spec = spec_from_owner(owner, rank, world)
    plan = check_plan(pos, spec, 0.1, 12, "isolated + empty ranks")
    if rank == 0 and world > 1:
        assert plan.num_halo == 0 and sum(plan.send_counts) == 0, "the isolated rank exchanges nothing"
    if rank == 1 and world >= 3:
        assert plan.num_owned == 0 and plan.num_halo == 0

    # moving points: rebuild is explicit and exact
    moved = pos + 0.01 * torch.randn(pos.shape, generator=_gen(7), dtype=torch.float64)
    again = plan.rebuild(ShardTensor.from_local(moved[spec.global_ids], spec))
    assert torch.equal(again.neighbor_ids, ball_query(moved, moved, 0.1, 12).index[spec.global_ids])

    # bad input fails clearly, on every rank at once for non-finite coordinates
    local = pos[spec.global_ids].clone()
    if rank == world - 1 and len(local):
        local[0, 1] = float("nan")
    bad_rank = world - 1 if (owner == world - 1).any() else None
    if bad_rank is not None:
        with pytest.raises(ValueError, match=rf"Expected 'pos' to hold finite coordinates on every rank \(got rows with NaN or inf: 1 on rank {bad_rank}\)"):
            BallQueryPlan.build(local, 0.1, 12, spec)
    with pytest.raises(ValueError, match=rf"Expected 'pos' to have spec.num_owned = {spec.num_owned} rows on rank {rank} \(got {spec.num_owned + 1}\)"):
        BallQueryPlan.build(torch.zeros(spec.num_owned + 1, 3), 0.1, 12, spec)
    with pytest.raises(ValueError, match=r"Expected 'radius' to be positive and finite \(got -0.1\)"):
        BallQueryPlan.build(pos[spec.global_ids], -0.1, 12, spec)
    with pytest.raises(ValueError, match=r"Expected 'max_neighbors' to be an integer >= 1 \(got 0\)"):
        BallQueryPlan.build(pos[spec.global_ids], 0.1, 0, spec)
    return "ok"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sharded_ball_query_equals_whole_cloud(world: int) -> None:
    mesh_case(MESH, world)  # fails here, not in the ranks, if the mesh cannot be built
    assert run_ranks(_battery, world) == ["ok"] * world


def test_whole_cloud_plan_needs_no_communication() -> None:
    pos = uniform_cloud(500)
    with count_collectives() as log:
        plan = BallQueryPlan.build(pos, 0.15, 8)
    assert log.count() == 0 and plan.num_halo == 0 and plan.spec is None
    assert torch.equal(plan.neighbor_ids, ball_query(pos, pos, 0.15, 8).index)
    x = torch.randn(500, 4)
    assert plan.with_halo(x) is x
    assert "whole cloud" in repr(plan)
    with pytest.raises(ValueError, match=r"Expected 'pos' to hold finite coordinates \(got 1 rows with NaN or inf\)"):
        BallQueryPlan.build(torch.cat([pos, torch.full((1, 3), float("nan"), dtype=torch.float64)]), 0.15, 8)
    with pytest.raises(ValueError, match=r"Expected 'x' to have 500 rows, the owned points of the plan \(got 3\)"):
        plan.exchange(x[:3])
