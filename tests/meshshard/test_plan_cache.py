"""``PlanCache``: a point set's ball-query plans built once, reused, never stale, bounded in bytes.

One process: hits and misses for the same owner, moved points (in place), another owner, a freed
owner, the byte bound (least recently used out first; a plan larger than the bound is not kept),
copies and pickles without plans, ``MESHSHARD_PLAN_CACHE_MB``; ``PointModel`` keys the cache with
the sample's ``ShardGraph``. On 3 gloo ranks: the second forward builds nothing (no collective of
the plan), the output is the same, and when one rank alone has lost its entry every rank rebuilds
(together: nobody waits).
"""

from __future__ import annotations

import copy
import gc
import pickle

import pytest
import torch

from meshshard import ShardGraph, ShardTensor
from meshshard.comm import count_collectives
from meshshard.nn import BallAttentionNet, PlanCache
from meshshard.nn._plan_cache import default_max_bytes, plans_nbytes
from meshshard.run._recipe import PointModel
from tests._dist import run_ranks
from tests.meshshard.test_ball_query_sharded import isolated_layout, spec_from_owner, uniform_cloud


class _Owner:
    """Stands for a ShardGraph: an object that holds a point set."""


def _model() -> BallAttentionNet:
    torch.manual_seed(0)
    return BallAttentionNet(4, 2, width=8, layers=2, heads=2, radius=[0.15, 0.25], max_neighbors=6).double()


def test_plans_are_built_once_per_owner_and_never_stale() -> None:
    model = _model()
    pos, x = uniform_cloud(300, 1), torch.randn(300, 4, dtype=torch.float64)
    a, b = _Owner(), _Owner()
    y = model(x, pos, plan_owner=a)
    assert (model.plan_cache.hits, model.plan_cache.misses, len(model.plan_cache)) == (0, 1, 1)
    assert torch.equal(model(x, pos, plan_owner=a), y)
    assert (model.plan_cache.hits, model.plan_cache.misses) == (1, 1)
    model(x, pos, plan_owner=b)  # another point set: built
    assert (model.plan_cache.misses, len(model.plan_cache)) == (2, 2)
    model(x, pos.clone(), plan_owner=a)  # other positions for the same owner: built again
    assert model.plan_cache.misses == 3
    moved = pos.clone()
    model(x, moved, plan_owner=a)
    moved[0, 0] += 0.5  # moved in place: the version counter says so
    y_moved = model(x, moved, plan_owner=a)
    assert model.plan_cache.misses == 5
    assert torch.allclose(y_moved, model(x, moved)), "the rebuilt plan is the plan of the moved points"
    assert model.plan_cache.hits == 1
    del b
    gc.collect()
    assert len(model.plan_cache) == 1  # a freed owner's plans go with it
    model(x, pos)  # no owner: built, not kept
    assert (model.plan_cache.misses, len(model.plan_cache)) == (5, 1)


def test_the_byte_bound_evicts_the_least_recently_used() -> None:
    model = _model()
    pos, x = uniform_cloud(200, 2), torch.randn(200, 4, dtype=torch.float64)
    size = plans_nbytes(model.build_plans(pos))
    assert size >= 200 * 6 * (8 + 1 + 8)  # neighbour indices, mask, distances of both radii
    model.plan_cache = PlanCache(2 * size)
    owners = [_Owner() for _ in range(3)]
    for o in owners[:2]:
        model(x, pos, plan_owner=o)
    model(x, pos, plan_owner=owners[0])  # owners[0] is now the most recently used
    model(x, pos, plan_owner=owners[2])  # evicts owners[1]
    assert len(model.plan_cache) == 2 and model.plan_cache.nbytes <= 2 * size
    misses = model.plan_cache.misses
    model(x, pos, plan_owner=owners[0])
    assert model.plan_cache.misses == misses
    model(x, pos, plan_owner=owners[1])
    assert model.plan_cache.misses == misses + 1
    model.plan_cache = PlanCache(size - 1)  # a plan over the bound is used, not kept
    model(x, pos, plan_owner=owners[0])
    assert len(model.plan_cache) == 0
    model.plan_cache = PlanCache(0)  # off
    model(x, pos, plan_owner=owners[0])
    model(x, pos, plan_owner=owners[0])
    assert (model.plan_cache.misses, len(model.plan_cache)) == (0, 0)


def test_copies_start_empty_and_the_bound_is_set_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    owner = _Owner()
    model(torch.randn(50, 4, dtype=torch.float64), uniform_cloud(50), plan_owner=owner)
    assert len(model.plan_cache) == 1
    assert len(copy.deepcopy(model).plan_cache) == 0
    assert len(pickle.loads(pickle.dumps(model.plan_cache))) == 0
    monkeypatch.setenv("MESHSHARD_PLAN_CACHE_MB", "3")
    assert default_max_bytes() == 3 << 20 and PlanCache().max_bytes == 3 << 20
    monkeypatch.setenv("MESHSHARD_PLAN_CACHE_MB", "lots")
    with pytest.raises(ValueError, match=r"Expected MESHSHARD_PLAN_CACHE_MB to be a number of megabytes >= 0 \(got 'lots'\)"):
        PlanCache()
    with pytest.raises(ValueError, match=r"Expected 'max_bytes' to be >= 0 bytes \(got -1\)"):
        PlanCache(-1)


def test_point_model_keys_the_cache_with_the_sample_graph() -> None:
    from meshshard.partition import partition_points

    pos = uniform_cloud(120, 3)
    graph = ShardGraph.from_partition(partition_points(pos.numpy(), 1, graph="knn")[0], dtype=torch.float64)
    model = PointModel(_model())
    x = ShardTensor.from_local(torch.randn(120, 4, dtype=torch.float64), graph.spec)
    y1 = model(x, graph, None)
    y2 = model(x, graph, None)
    assert torch.equal(y1.to_local(), y2.to_local())
    assert (model.inner.plan_cache.misses, model.inner.plan_cache.hits) == (1, 1)


# --- shards ---------------------------------------------------------------------------------------


def _sharded(rank: int, world: int) -> str:
    torch.set_num_threads(1)
    pos, owner = isolated_layout(world, 300, 100)
    spec = spec_from_owner(owner, rank, world)
    own = spec.global_ids
    x = torch.randn(len(pos), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    model, graph = _model(), _Owner()
    xs, ps = ShardTensor.from_local(x[own], spec), pos[own]
    with count_collectives() as first:
        y1 = model(xs, ps, plan_owner=graph)
    with count_collectives() as second:
        y2 = model(xs, ps, plan_owner=graph)
    assert first.count("all_to_all_v") > 0 and first.count("all_gather_v") == 2, first  # two plans built
    assert second.count("all_to_all_v") == 0 and second.count("all_gather_v") == 0, second  # none
    assert second.count("indexed_all_to_all_v") == 2, second  # one halo exchange per block, as before
    assert torch.equal(y1.to_local(), y2.to_local())
    if rank == 1:
        model.plan_cache.clear()  # one rank alone lost the plans: every rank rebuilds, nobody waits
    with count_collectives() as third:
        y3 = model(xs, ps, plan_owner=graph)
    assert third.count("all_gather_v") == 2, third
    assert torch.equal(y3.to_local(), y1.to_local())
    assert (model.plan_cache.hits, model.plan_cache.misses) == (1, 2)
    return "ok"


def test_ranks_hit_and_miss_together() -> None:
    assert run_ranks(_sharded, 3, timeout=120) == ["ok"] * 3
