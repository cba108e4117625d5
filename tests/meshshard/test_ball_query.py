"""The single-process ball query against a brute-force reference (all pairs, numpy lexsort).

Clouds: uniform, clustered, with duplicate points, with points exactly on the radius (integer
lattices, where many distances tie exactly), and the vertices of a real mesh
(../shared/data/sfepy/wheelset.vtk, SfePy, BSD-3-Clause).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshshard.nn._ball_query import BallQueryResult, ball_query
from tests._meshes import data_file


def brute_force(query_pos, pos, radius, k, ids=None):
    """Every pair's float64 ``d2`` (summed over axes in order), sorted by (query, d2, id), first k kept."""
    q = np.asarray(query_pos, dtype=np.float64)
    p = np.asarray(pos, dtype=np.float64)
    ids = np.arange(len(p)) if ids is None else np.asarray(ids)
    d2 = np.zeros((len(q), len(p)))
    for d in range(q.shape[1]):
        d2 = d2 + (p[None, :, d] - q[:, None, d]) ** 2
    rows, cols = np.nonzero(d2 <= radius * radius)
    order = np.lexsort((ids[cols], d2[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    counts = np.bincount(rows, minlength=len(q))
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = slot < k
    index = np.full((len(q), k), -1)
    index[rows[keep], slot[keep]] = cols[keep]
    dist = np.zeros((len(q), k))
    dist[rows[keep], slot[keep]] = np.sqrt(d2[rows[keep], cols[keep]])
    return index, dist, counts


def check_against_brute_force(query_pos, pos, radius, k, ids=None, **kwargs) -> BallQueryResult:
    res = ball_query(query_pos, pos, radius, k, point_ids=None if ids is None else torch.as_tensor(ids), **kwargs)
    index, dist, counts = brute_force(query_pos, pos, radius, k, ids)
    assert res.index.shape == res.mask.shape == res.distance.shape == (len(query_pos), k)
    assert res.index.dtype == torch.int64 and res.mask.dtype == torch.bool and res.distance.dtype == query_pos.dtype
    np.testing.assert_array_equal(res.index.numpy(), index)
    np.testing.assert_array_equal(res.mask.numpy(), index >= 0)
    np.testing.assert_allclose(res.distance.double().numpy(), dist, rtol=1e-6 if query_pos.dtype != torch.float64 else 1e-15)
    np.testing.assert_array_equal(res.num_candidates.numpy(), counts)
    assert res.num_truncated == int((counts > k).sum())
    return res


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_uniform_clouds_match_brute_force(dims):
    pos = torch.rand(700, dims, generator=_gen(dims), dtype=torch.float64)
    query = torch.cat([torch.rand(150, dims, generator=_gen(10 + dims), dtype=torch.float64), pos[:100]])
    for radius, k in [(0.02, 4), (0.1, 8), (0.25, 40), (5.0, 800)]:
        check_against_brute_force(query, pos, radius, k)


def test_clustered_cloud_with_duplicates_and_shuffled_ids():
    g = _gen(1)
    centres = torch.rand(5, 3, generator=g, dtype=torch.float64)
    pos = centres[torch.randint(0, 5, (900,), generator=g)] + 0.01 * torch.randn(900, 3, generator=g, dtype=torch.float64)
    pos = torch.cat([pos, pos[:200], pos[:50]])  # points repeated two and three times
    ids = torch.randperm(len(pos), generator=g)  # ties must follow these ids, not row order
    res = check_against_brute_force(pos, pos, 0.02, 16, ids)
    assert res.num_truncated > 0  # the clusters are far denser than 16 per ball
    # small chunks give the same answer
    small = ball_query(pos, pos, 0.02, 16, point_ids=ids, chunk_pairs=3001)
    assert torch.equal(small.index, res.index) and torch.equal(small.num_candidates, res.num_candidates)


@pytest.mark.parametrize("dims", [2, 3])
def test_points_exactly_on_the_radius_are_included_and_ties_go_by_id(dims):
    # an integer lattice: distances 1, sqrt(2), 2 tie exactly, and radius 2 is hit exactly
    axes = [torch.arange(6, dtype=torch.float64)] * dims
    pos = torch.cartesian_prod(*axes).reshape(-1, dims)
    ids = torch.randperm(len(pos), generator=_gen(dims))
    for radius, k in [(1.0, 3), (1.0, 2 * dims + 1), (2.0, 9), (2.0, 100)]:
        res = check_against_brute_force(pos, pos, radius, k, ids)
        assert bool((res.distance[res.mask] <= radius).all())
    # the six neighbours at exactly 1 of an inner point are all there when k allows
    res = ball_query(pos, pos, 1.0, 2 * dims + 1)
    inner = int(((pos == 2).all(1)).nonzero())
    assert int(res.mask[inner].sum()) == 2 * dims + 1 and float(res.distance[inner].max()) == 1.0


def test_float32_coordinates_are_searched_in_float64_exactly():
    pos = torch.rand(500, 3, generator=_gen(3))
    res = check_against_brute_force(pos, pos, 0.1, 10)
    res64 = ball_query(pos.double(), pos.double(), 0.1, 10)
    assert torch.equal(res.index, res64.index)


def test_real_mesh_vertices():
    from meshshard.partition import read_input

    pos = torch.as_tensor(read_input(data_file("sfepy/wheelset.vtk")).pos)
    extent = float((pos.max(0).values - pos.min(0).values).max())
    query = pos[::7]
    check_against_brute_force(query, pos, extent / 40, 12)


def test_truncation_is_reported_never_exceeded_and_deterministic():
    pos = torch.rand(400, 2, generator=_gen(4), dtype=torch.float64)
    a = ball_query(pos, pos, 0.2, 5)
    b = ball_query(pos, pos, 0.2, 5)
    assert torch.equal(a.index, b.index) and torch.equal(a.distance, b.distance)
    assert a.index.shape == (400, 5) and bool(a.mask.all())
    assert a.num_truncated == int((a.num_candidates > 5).sum()) > 300
    index, mask, distance = a  # a plain 3-tuple to unpack
    assert index is a.index and mask is a.mask and distance is a.distance
    # permuting the points, with their ids, permutes nothing in the answer (in ids)
    perm = torch.randperm(400, generator=_gen(5))
    c = ball_query(pos, pos[perm], 0.2, 5, point_ids=perm)
    assert torch.equal(perm[c.index], a.index)


def test_empty_inputs():
    pos = torch.rand(10, 3)
    r = ball_query(pos[:0], pos, 0.5, 4)
    assert r.index.shape == (0, 4) and r.num_truncated == 0
    r = ball_query(pos, pos[:0], 0.5, 4)
    assert r.index.shape == (10, 4) and not bool(r.mask.any()) and bool((r.index == -1).all())
    assert bool((r.distance == 0).all()) and int(r.num_candidates.sum()) == 0


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    q=st.integers(0, 30),
    dims=st.integers(1, 3),
    radius=st.sampled_from([0.05, 0.3, 1.0, 3.0]),
    k=st.integers(1, 12),
    grid=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_matches_brute_force(n, q, dims, radius, k, grid, seed):
    g = _gen(seed)
    pos = torch.rand(n, dims, generator=g, dtype=torch.float64) * 4
    if grid:  # integer coordinates: exact ties and exact radius hits
        pos = pos.floor()
    query = torch.cat([pos[: q // 2], torch.rand(q - q // 2, dims, generator=g, dtype=torch.float64) * 4])
    check_against_brute_force(query, pos, radius, k, torch.randperm(n, generator=g))


def test_bad_input_fails_clearly():
    pos = torch.rand(10, 3)
    with pytest.raises(ValueError, match=r"Expected 'radius' to be positive and finite \(got 0\)"):
        ball_query(pos, pos, 0, 4)
    with pytest.raises(ValueError, match=r"Expected 'radius' to be positive and finite \(got -1.0\)"):
        ball_query(pos, pos, -1.0, 4)
    with pytest.raises(ValueError, match=r"Expected 'radius' to be positive and finite \(got nan\)"):
        ball_query(pos, pos, float("nan"), 4)
    with pytest.raises(ValueError, match=r"Expected 'max_neighbors' to be an integer >= 1 \(got 0\)"):
        ball_query(pos, pos, 0.5, 0)
    with pytest.raises(ValueError, match=r"Expected 'max_neighbors' to be an integer >= 1 \(got 2.5\)"):
        ball_query(pos, pos, 0.5, 2.5)
    bad = pos.clone()
    bad[3, 1] = float("nan")
    bad[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"Expected 'pos' to hold finite coordinates \(got 2 rows with NaN or inf\)"):
        ball_query(pos, bad, 0.5, 4)
    with pytest.raises(ValueError, match=r"Expected 'query_pos' to hold finite coordinates \(got 2 rows"):
        ball_query(bad, pos, 0.5, 4)
    with pytest.raises(ValueError, match=r"Expected 'pos' to have D = 3 columns, like the other point set \(got 2\)"):
        ball_query(pos, pos[:, :2], 0.5, 4)
    with pytest.raises(ValueError, match=r"Expected 'query_pos' to be two-dimensional \(N, D\) \(got 1 dimensions\)"):
        ball_query(pos[:, 0], pos, 0.5, 4)
    with pytest.raises(ValueError, match=r"Expected 'pos' to be a floating point tensor \(got torch.int64\)"):
        ball_query(pos, pos.long(), 0.5, 4)
    with pytest.raises(ValueError, match=r"Expected 'point_ids' to have shape \(10,\), one id per point \(got \(9,\)\)"):
        ball_query(pos, pos, 0.5, 4, point_ids=torch.arange(9))
    with pytest.raises(TypeError, match=r"Expected 'pos' to be a torch.Tensor \(got ndarray\)"):
        ball_query(pos, pos.numpy(), 0.5, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    pos = torch.rand(3000, 3, generator=_gen(6), dtype=torch.float64)
    cpu = ball_query(pos, pos, 0.08, 16)
    gpu = ball_query(pos.cuda(), pos.cuda(), 0.08, 16)
    assert torch.equal(gpu.index.cpu(), cpu.index) and torch.equal(gpu.num_candidates.cpu(), cpu.num_candidates)
