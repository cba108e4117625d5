"""``BallQueryAttention``: the math on a whole cloud, then shards against the whole cloud.

Whole cloud: against a dense reference (attention over all pairs, masked to the ball-query
neighbours), and ``gradcheck`` in float64. Shards, on 1-4 gloo ranks: every rank builds the whole
reference module from the same seed; the sharded forward on owned rows, the gradients of features
and positions on owned rows, and the parameter gradients summed over ranks equal the whole-cloud
module's: 1e-10 relative in float64, 1e-5 in float32. One ``indexed_all_to_all_v`` forward and one
backward per call with a plan. Clouds: uniform (kNN + METIS), clustered with duplicates (RCB),
the vertices of a real mesh (../shared/data/sfepy/wheelset.vtk, SfePy, BSD-3-Clause), and a layout
with an empty rank and a rank whose region touches no other.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist

from meshshard import ShardSpec, ShardTensor
from meshshard.comm import count_collectives
from meshshard.nn._attention import BallQueryAttention
from meshshard.nn._ball_halo import BallQueryPlan
from meshshard.nn._ball_query import ball_query
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._tolerance import assert_close
from tests.meshshard.test_ball_query_sharded import (
    clustered_cloud,
    isolated_layout,
    spec_from_owner,
    spec_from_points,
    uniform_cloud,
)

MESH = "sfepy/wheelset.vtk"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _module(dtype, radius, k, seed=0, **kwargs) -> BallQueryAttention:
    torch.manual_seed(seed)
    return BallQueryAttention(8, 2, radius, k, out_dim=5, pos_hidden=6, **kwargs).to(dtype)


def dense_reference(m: BallQueryAttention, x, pos) -> torch.Tensor:
    """Attention over all pairs (N, N), masked to the ball-query neighbours: another formulation."""
    n, heads, width = x.shape[0], m.heads, m.dim // m.heads
    nb = ball_query(pos, pos, m.radius, m.max_neighbors)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    rows = torch.arange(n)[:, None].expand_as(nb.index)
    allowed[rows[nb.mask], nb.index[nb.mask]] = True
    q = m.q(x).view(n, heads, width)
    kk, vv = m.kv(x).split(m.dim, dim=1)
    enc = m.pos_mlp(pos[None, :, :] - pos[:, None, :])  # (N, N, dim): e_ij
    keys = (kk[None] + enc).view(n, n, heads, width)
    values = (vv[None] + enc).view(n, n, heads, width)
    logits = torch.einsum("ihd,ijhd->ijh", q, keys) / width**0.5
    logits = logits.masked_fill(~allowed[..., None], float("-inf"))
    weights = torch.softmax(logits, dim=1)
    return m.out(torch.einsum("ijh,ijhd->ihd", weights, values).reshape(n, m.dim))


def test_whole_cloud_matches_dense_reference_and_gradcheck():
    pos = torch.cat([uniform_cloud(120, 4), uniform_cloud(10, 4)])  # 10 duplicated points
    x = torch.randn(130, 8, generator=_gen(1), dtype=torch.float64)
    m = _module(torch.float64, 0.25, 6)
    assert ball_query(pos, pos, 0.25, 6).num_truncated > 0
    y = m(x, pos)
    assert y.shape == (130, 5)
    assert_close(y, dense_reference(m, x, pos), torch.float64, "forward", cast=True)
    plan = m.build_plan(pos)
    assert torch.equal(m(x, pos, plan), y)
    # gradcheck on 16 points, with a radius that gives each several neighbours (and truncates)
    m = _module(torch.float64, 0.6, 5)
    small_x, small_pos = x[:16].clone().requires_grad_(), pos[:16].clone().requires_grad_()
    small_plan = m.build_plan(small_pos)
    assert small_plan.neighbors.mask.sum(1).min() > 1 and small_plan.neighbors.num_truncated > 0
    assert torch.autograd.gradcheck(lambda a, b: m(a, b, small_plan), (small_x, small_pos), fast_mode=True)
    # parameters too: gradcheck through a functional call
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in m.parameters())
    call = lambda *ps: torch.func.functional_call(m, dict(zip(names, ps)), (small_x.detach(), small_pos.detach(), small_plan))  # noqa: E731
    assert torch.autograd.gradcheck(call, params, fast_mode=True)


def test_state_dict_is_the_same_for_whole_and_sharded_use():
    m = _module(torch.float32, 0.2, 8)
    keys = set(m.state_dict())
    assert keys == {"q.weight", "q.bias", "kv.weight", "kv.bias", "pos_mlp.0.weight", "pos_mlp.0.bias",
                    "pos_mlp.2.weight", "pos_mlp.2.bias", "out.weight", "out.bias"}
    assert "radius=0.2, max_neighbors=8" in repr(m)


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match=r"Expected 'dim' to be a positive multiple of 'heads' = 3 \(got 8\)"):
        BallQueryAttention(8, 3, 0.1, 4)
    with pytest.raises(ValueError, match=r"Expected 'radius' to be positive and finite \(got 0.0\)"):
        BallQueryAttention(8, 2, 0.0, 4)
    with pytest.raises(ValueError, match=r"Expected 'max_neighbors' to be an integer >= 1 \(got 0\)"):
        BallQueryAttention(8, 2, 0.1, 0)
    m = _module(torch.float64, 0.2, 4)
    pos, x = uniform_cloud(50), torch.randn(50, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"Expected 'x' to have shape \(N, 8\) \(got \(50, 7\)\)"):
        m(x[:, :7], pos)
    with pytest.raises(ValueError, match=r"Expected 'pos' to have shape \(50, 3\), one row per row of 'x' \(got \(50, 2\)\)"):
        m(x, pos[:, :2])
    with pytest.raises(ValueError, match=r"Expected 'pos' to have shape \(50, 3\), one row per row of 'x' \(got \(49, 3\)\)"):
        m(x, pos[:49])
    bad = pos.clone()
    bad[7, 2] = float("nan")
    with pytest.raises(ValueError, match=r"Expected 'pos' to hold finite coordinates \(got 1 rows with NaN or inf\)"):
        m(x, bad)
    with pytest.raises(ValueError, match=r"Expected a plan of radius=0.2, max_neighbors=4 \(got radius=0.3, max_neighbors=4\)"):
        m(x, pos, BallQueryPlan.build(pos, 0.3, 4))
    with pytest.raises(ValueError, match=r"Expected a plan built for the layout of 'x'"):
        m(x[:10], pos[:10], m.build_plan(pos))


# --- shards against the whole cloud ---------------------------------------------------------------


def _check_layout(pos: torch.Tensor, spec: ShardSpec, radius: float, k: int, dtype: torch.dtype, what: str) -> None:
    n = pos.shape[0]
    own = spec.global_ids
    pos = pos.to(dtype)
    x_full = torch.randn(n, 8, generator=_gen(11), dtype=torch.float64).to(dtype)
    w_full = torch.randn(n, 5, generator=_gen(12), dtype=torch.float64).to(dtype)

    ref = _module(dtype, radius, k)  # every rank builds the same whole-cloud reference
    xr, pr = x_full.clone().requires_grad_(), pos.clone().requires_grad_()
    y_ref = ref(xr, pr)
    (y_ref * w_full).sum().backward()

    m = copy.deepcopy(ref)
    m.zero_grad()
    plan = m.build_plan(ShardTensor.from_local(pos[own], spec))
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
    p = ShardTensor.from_local(pos[own].clone().requires_grad_(), spec)
    with count_collectives() as log:
        y = m(x, p, plan)
        (y.to_local() * w_full[own]).sum().backward()
    assert isinstance(y, ShardTensor) and y.spec == spec
    assert log.count("indexed_all_to_all_v", "forward") == 1 and log.count("indexed_all_to_all_v", "backward") == 1, log
    assert log.count() == 2, log

    assert_close(y.to_local().detach(), y_ref.detach()[own], dtype, f"{what}: forward", cast=True)
    assert_close(x.grad.to_local(), xr.grad[own], dtype, f"{what}: grad x", cast=True)
    assert_close(p.grad.to_local(), pr.grad[own], dtype, f"{what}: grad pos", cast=True)
    for (name, a), b in zip(m.named_parameters(), ref.parameters()):
        g = a.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(g)  # parameters are replicated: their gradients add up over ranks
        assert_close(g, b.grad, dtype, f"{what}: grad {name}", cast=True)

    # without a plan the module builds one (five more small collectives), same answer
    with count_collectives() as log:
        y2 = m(x.detach(), pos[own])
    assert log.count("indexed_all_to_all_v", "forward") == 2 and log.count() == 6, log
    assert_close(y2.to_local(), y.to_local().detach(), dtype, f"{what}: forward without a plan", cast=True)


def _battery(rank: int, world: int) -> str:
    for dtype in (torch.float64, torch.float32):
        pos = uniform_cloud(1200)
        _check_layout(pos, spec_from_points(pos, rank, world, "metis"), 0.12, 10, dtype, "uniform, knn + metis")
        pos = clustered_cloud()[:900]
        _check_layout(pos, spec_from_points(pos, rank, world, "rcb"), 0.05, 12, dtype, "clustered, rcb")
        pos, owner = isolated_layout(world)
        _check_layout(pos, spec_from_owner(owner, rank, world), 0.12, 8, dtype, "isolated + empty ranks")
    case = mesh_case(MESH, world)
    pos = torch.as_tensor(case.pos)
    extent = float((pos.max(0).values - pos.min(0).values).max())
    _check_layout(pos, ShardSpec.from_partition(case.parts[rank]), extent / 25, 12, torch.float64, "wheelset, metis")

    # features in float32 with positions in float64: the positions are cast to float32 first
    pos = uniform_cloud(600)
    spec = spec_from_points(pos, rank, world, "rcb")
    m = _module(torch.float32, 0.15, 8)
    x_full = torch.randn(600, 8, generator=_gen(3))
    y = m(ShardTensor.from_local(x_full[spec.global_ids], spec), pos[spec.global_ids])
    assert_close(y.to_local(), m(x_full, pos.float()).detach()[spec.global_ids], torch.float32, "mixed dtypes", cast=True)

    # a pos laid out by another spec is refused
    other = ShardSpec.chunked(600)
    if other != spec:
        with pytest.raises(ValueError, match=r"Expected 'pos' laid out like 'x'"):
            m(ShardTensor.from_local(x_full[spec.global_ids], spec), ShardTensor.from_local(pos[: other.num_owned], other))
    return "ok"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sharded_attention_equals_whole_cloud(world: int) -> None:
    mesh_case(MESH, world)  # fails here, not in the ranks, if the mesh cannot be built
    assert run_ranks(_battery, world) == ["ok"] * world


def test_layouts_have_empty_and_isolated_ranks() -> None:
    _, owner = isolated_layout(4)
    counts = np.bincount(owner, minlength=4)
    assert counts[1] == 0 and counts[0] == 500 and (counts[2:] > 0).all()
