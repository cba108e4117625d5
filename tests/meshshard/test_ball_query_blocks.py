"""The ball query's bounded build: blocks of queries and chunks of pairs give exactly the former
whole-query build's result (``WHOLE_QUERY``, kept for the benchmark's "before"), and no step holds
more than its block of query runs and its chunk of candidate pairs."""

from __future__ import annotations

import pytest
import torch

import meshshard.nn._ball_query as bq
from meshshard.nn._ball_query import ball_query


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _cloud(dims, dtype, seed=0):
    g = _gen(seed)
    pos = torch.rand(500, dims, generator=g, dtype=torch.float64)
    pos = torch.cat([pos, pos[:100], (pos[:40] * 64).round() / 64])  # duplicates and lattice ties
    return pos.to(dtype), torch.randperm(len(pos), generator=g)


def _whole(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(bq, "WHOLE_QUERY", True)
        return ball_query(*args, **kwargs)


def _assert_same(a, b):
    assert torch.equal(a.index, b.index) and torch.equal(a.mask, b.mask)
    assert torch.equal(a.distance, b.distance) and a.distance.dtype == b.distance.dtype
    assert torch.equal(a.num_candidates, b.num_candidates)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dense_table", [True, False])
def test_blocks_and_chunks_give_the_whole_query_result(monkeypatch, dims, dtype, dense_table):
    pos, ids = _cloud(dims, dtype, seed=dims)
    query = torch.cat([pos[::5], torch.rand(60, dims, generator=_gen(9), dtype=torch.float64).to(dtype)])
    if not dense_table:
        monkeypatch.setattr(bq, "_DENSE_TABLE_PER_POINT", 0)  # the binary-search path
    for radius, k in [(0.03, 6), (0.12, 24)]:
        before = _whole(monkeypatch, query, pos, radius, k, point_ids=ids)
        assert int(before.mask.sum()) > 0
        for run_bytes, pairs in [(32 * 25 * 3, 50), (32 * 25 * 37, 997), (1 << 24, 1 << 18)]:
            monkeypatch.setattr(bq, "_RUN_BYTES", run_bytes)
            _assert_same(ball_query(query, pos, radius, k, point_ids=ids, chunk_pairs=pairs), before)
        monkeypatch.setattr(bq, "_RUN_BYTES", 1 << 24)
        _assert_same(ball_query(pos, pos, radius, k, point_ids=ids), _whole(monkeypatch, pos, pos, radius, k, point_ids=ids))


def test_working_set_is_one_block_of_runs_and_one_chunk_of_pairs(monkeypatch):
    pos, ids = _cloud(3, torch.float32)
    seen = []
    candidates = bq._candidates

    def spy(q_cols, p_cols, start, stop, q0, r2):
        seen.append((start.shape[0], int((stop - start).sum()), int((stop - start).sum(1).max())))
        return candidates(q_cols, p_cols, start, stop, q0, r2)

    monkeypatch.setattr(bq, "_candidates", spy)
    monkeypatch.setattr(bq, "_RUN_BYTES", 32 * 25 * 50)  # blocks of 50 queries
    res = ball_query(pos, pos, 0.12, 16, point_ids=ids, chunk_pairs=2000)
    assert len(seen) > len(pos) // 50 > 5
    for rows, pairs, widest in seen:
        assert rows <= 50
        assert pairs <= 2000 or rows == 1, (rows, pairs)  # one query alone may exceed the budget
    assert sum(p for _, p, _ in seen) >= int(res.num_candidates.sum())
