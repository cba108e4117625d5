"""A deterministic ball query: for each query point, the points within ``radius``, at most ``k``.

Selection rule (the contract the sharded query reproduces exactly):

- candidate ``j`` of query ``i`` when ``d2 <= radius ** 2``, where
  ``d2 = sum_d (pos[j, d] - query_pos[i, d]) ** 2`` is computed in float64 from the input
  coordinates (float32 / float16 coordinates are widened exactly), summed over the axes in order,
  with this formula and no other (not ``|a|^2 + |b|^2 - 2ab``): the inclusive test and the order
  are then bit-for-bit the same wherever the same coordinates meet (whole cloud or shards);
- the candidates are ordered by ``(d2, point_ids[j])`` (nearest first, ties by global id) and the
  first ``max_neighbors`` kept.

How: a uniform grid hash in torch (CPU and CUDA, no Python loop per point). Points are sorted by
cell; cells have side ``radius / 2`` (widened by ``1e-5`` relative, far more than the rounding of
the cell arithmetic, so no candidate is ever missed), and a query reads the ``5 ** (D - 1)``
contiguous runs of sorted points that cover the 5 cells around it along each axis (cells along the
innermost axis are adjacent in the order). Where each cell starts in the order comes from a dense
table when the lattice is small (at most 8 cells per point; int32 where the points fit), else from
a binary search. The queries go in blocks (their runs: 16 MB) and each block's candidate pairs in
chunks of at most ``chunk_pairs`` pairs (default 256K, ~25 MB), each chunk writing its final
neighbour lists at once, so the build's working set is bounded whatever the number of points
(beyond the sorted copy of the points and the outputs). Each chunk's pairs within ``radius`` are
ordered by one int64 sort on (query, ``d2`` quantised to 40 bits, monotone), and the rare runs of
equal keys re-sorted exactly by ``(d2, id)``. ``bench/ball_query.py`` compares it with scipy's
``cKDTree.query_ball_point`` (truncated the same way): the grid is faster on CPU in our runs, and
it runs on CUDA as is.

Truncation is never silent: the result carries ``num_candidates`` (every query's count before
truncation) and ``num_truncated`` (how many queries had more than ``max_neighbors``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["BallQueryResult", "ball_query"]

# Cell side = radius / _CELLS_PER_RADIUS * (1 + _CELL_SLACK): the slack covers rounding in
# (p - origin) / cell (relative error ~1e-16 times at most 2 ** 30 cells) with room to spare, so the
# 2 * _CELLS_PER_RADIUS + 1 cells around a query along each axis always hold all its candidates.
_CELL_SLACK = 1e-5
_KEY_BITS = 60  # cell keys are int64: at most 2 ** (60 / D) cells per axis
_CELLS_PER_RADIUS = 2
_D2_BITS = 40  # sort key: (query in chunk) << 40 | d2 quantised; queries per chunk < 2 ** 23
_MAX_CHUNK_QUERIES = 1 << 22
_DENSE_TABLE_PER_POINT = 8  # a dense cell table when it has at most 8 cells per point
_DEFAULT_CHUNK_PAIRS = 1 << 18  # ~100 bytes a pair in flight: ~25 MB
_RUN_BYTES = 16 << 20  # the runs of a block of queries: 32 bytes a run, 25 runs a query in 3-D

#: ``True``: the former build (every query's runs at once, chunks of ``2 ** 22`` pairs), for
#: ``bench/pointcloud.py``'s "before" of the build's memory. Same result.
WHOLE_QUERY = False


class _Result(NamedTuple):
    index: Tensor
    mask: Tensor
    distance: Tensor


class BallQueryResult(_Result):
    """``(index, mask, distance)``, each ``(Q, max_neighbors)``, plus the truncation report.

    Attributes:
        index: int64 indices into ``pos`` (nearest first), ``-1`` where ``mask`` is False.
        mask: bool, True for a real neighbour.
        distance: Euclidean distance, in ``query_pos``'s dtype, ``0`` where ``mask`` is False.
        num_candidates: ``(Q,)`` int64, the number of points within ``radius`` before truncation.
        num_truncated: how many queries had more than ``max_neighbors`` candidates (a Python int).
    """

    num_candidates: Tensor

    @property
    def num_truncated(self) -> int:
        return int((self.num_candidates > self.index.shape[1]).sum())


def _result(index: Tensor, mask: Tensor, distance: Tensor, num_candidates: Tensor) -> BallQueryResult:
    out = BallQueryResult(index, mask, distance)
    out.num_candidates = num_candidates
    return out


# --- validation ---------------------------------------------------------------------------------


def check_radius(radius: Any) -> float:
    try:
        r = float(radius)
    except (TypeError, ValueError):
        raise ValueError(f"Expected 'radius' to be a positive number (got {radius!r})") from None
    if not (r > 0 and math.isfinite(r)):
        raise ValueError(f"Expected 'radius' to be positive and finite (got {radius!r})")
    return r


def check_max_neighbors(max_neighbors: Any) -> int:
    if isinstance(max_neighbors, bool) or not isinstance(max_neighbors, int) or max_neighbors < 1:
        raise ValueError(f"Expected 'max_neighbors' to be an integer >= 1 (got {max_neighbors!r})")
    return max_neighbors


def check_points(name: str, pos: Any, dims: int | None = None) -> Tensor:
    """``pos`` as a 2-D floating tensor ``(N, D)`` with finite coordinates."""
    if not isinstance(pos, Tensor):
        raise TypeError(f"Expected '{name}' to be a torch.Tensor (got {type(pos).__name__})")
    if pos.dim() != 2:
        raise ValueError(f"Expected '{name}' to be two-dimensional (N, D) (got {pos.dim()} dimensions)")
    if not pos.is_floating_point():
        raise ValueError(f"Expected '{name}' to be a floating point tensor (got {pos.dtype})")
    if dims is not None and pos.shape[1] != dims:
        raise ValueError(f"Expected '{name}' to have D = {dims} columns, like the other point set (got {pos.shape[1]})")
    bad = int((~torch.isfinite(pos)).any(1).sum()) if pos.numel() else 0
    if bad:
        raise ValueError(f"Expected '{name}' to hold finite coordinates (got {bad} rows with NaN or inf)")
    return pos


# --- the query ---------------------------------------------------------------------------------


def ball_query(
    query_pos: Tensor,
    pos: Tensor,
    radius: float,
    max_neighbors: int,
    *,
    point_ids: Tensor | None = None,
    chunk_pairs: int = _DEFAULT_CHUNK_PAIRS,
) -> BallQueryResult:
    """For each query point, the points of ``pos`` within ``radius`` (inclusive), at most ``max_neighbors``.

    Deterministic: nearest first, ties broken by ``point_ids`` (default: the row number in ``pos``;
    on shards, the global id). Distances are computed in float64 as ``((pos[j] - query_pos[i]) ** 2).sum(-1)``
    and compared with ``radius ** 2``. Not differentiable (the result is a selection); compute
    differentiable relative positions from ``index`` afterwards.

    Args:
        query_pos: query coordinates.
        pos: the points searched.
        radius: the ball radius, positive.
        max_neighbors: the most neighbours kept per query, ``>= 1``.
        point_ids: the tie-break key of each point (unique, e.g. global node ids).
        chunk_pairs: the most candidate pairs held in memory at once.

    Shapes:
        query_pos: ``(Q, D)``; pos: ``(N, D)``; point_ids: ``(N,)`` int64.
        result: ``index``, ``mask``, ``distance`` ``(Q, max_neighbors)``; ``num_candidates`` ``(Q,)``.

    Communication: none.

    Raises:
        ValueError: on ``radius <= 0``, ``max_neighbors < 1``, non-finite coordinates, or point
            sets whose dimensions, devices or sizes disagree.
    """
    query_pos = check_points("query_pos", query_pos)
    pos = check_points("pos", pos, query_pos.shape[1])
    r = check_radius(radius)
    k = check_max_neighbors(max_neighbors)
    if pos.device != query_pos.device:
        raise ValueError(f"Expected 'pos' on the device of 'query_pos', {query_pos.device} (got {pos.device})")
    if point_ids is None:
        point_ids = torch.arange(pos.shape[0], device=pos.device)
    elif not isinstance(point_ids, Tensor) or point_ids.shape != (pos.shape[0],):
        got = tuple(point_ids.shape) if isinstance(point_ids, Tensor) else type(point_ids).__name__
        raise ValueError(f"Expected 'point_ids' to have shape ({pos.shape[0]},), one id per point (got {got})")
    if chunk_pairs < 1:
        raise ValueError(f"Expected 'chunk_pairs' to be >= 1 (got {chunk_pairs})")
    with torch.no_grad():
        return _ball_query(query_pos.detach(), pos.detach(), r, k, point_ids.to(pos.device, torch.int64), chunk_pairs)


def _ball_query(query_pos: Tensor, pos: Tensor, r: float, k: int, ids: Tensor, chunk_pairs: int) -> BallQueryResult:
    if WHOLE_QUERY:
        return _ball_query_whole(query_pos, pos, r, k, ids)
    q64 = query_pos.to(torch.float64)
    p64 = q64 if pos is query_pos else pos.to(torch.float64)
    nq, device = q64.shape[0], q64.device
    index = torch.full((nq, k), -1, dtype=torch.int64, device=device)
    distance = torch.zeros((nq, k), dtype=query_pos.dtype, device=device)
    num_candidates = torch.zeros(nq, dtype=torch.int64, device=device)
    if nq and p64.shape[0]:
        grid = _Grid(q64, p64, r)
        # coordinates and ids in cell order: candidate runs read contiguous memory
        p_cols = [c.contiguous() for c in p64[grid.order].unbind(1)]
        q_cols = [c.contiguous() for c in q64.unbind(1)]
        ids_sorted = ids[grid.order]
        del p64
        block = max(1, _RUN_BYTES // (32 * grid.runs_per_query))  # start, stop and their cells: 4 int64 a run
        for b0 in range(0, nq, block):
            start, stop = grid.runs(q64[b0 : b0 + block])
            for lo, hi in _chunks((stop - start).sum(1), chunk_pairs):
                qi, sp, d2 = _candidates(q_cols, p_cols, start[lo:hi], stop[lo:hi], b0 + lo, r * r)
                kept = _keep_nearest(qi, sp, d2, ids_sorted, k, r * r, num_candidates)
                if kept is not None:  # the final lists at once: original rows, distances in the query's dtype
                    qi, slot, sp, d2 = kept
                    index[qi, slot] = grid.order[sp]
                    distance[qi, slot] = d2.sqrt().to(distance.dtype)
            del start, stop
    return _result(index, index >= 0, distance, num_candidates)


def _ball_query_whole(query_pos: Tensor, pos: Tensor, r: float, k: int, ids: Tensor) -> BallQueryResult:
    """The former build (``WHOLE_QUERY``): every query's runs at once, chunks of ``2 ** 22`` pairs,
    float64 distances and sorted rows mapped back at the end. Same result; kept for
    ``bench/pointcloud.py --attention dense``, the "before" of the build's memory."""
    q64, p64 = query_pos.to(torch.float64), pos.to(torch.float64)
    nq, device = q64.shape[0], q64.device
    index = torch.full((nq, k), -1, dtype=torch.int64, device=device)
    d2_out = torch.zeros((nq, k), dtype=torch.float64, device=device)
    num_candidates = torch.zeros(nq, dtype=torch.int64, device=device)
    if nq and p64.shape[0]:
        grid = _Grid(q64, p64, r, table_dtype=torch.int64)
        start, stop = grid.runs(q64)
        p_cols = [c.contiguous() for c in p64[grid.order].unbind(1)]
        q_cols = [c.contiguous() for c in q64.unbind(1)]
        ids_sorted = ids[grid.order]
        for lo, hi in _chunks((stop - start).sum(1), 1 << 22):
            qi, sp, d2 = _candidates(q_cols, p_cols, start[lo:hi], stop[lo:hi], lo, r * r)
            kept = _keep_nearest(qi, sp, d2, ids_sorted, k, r * r, num_candidates)
            if kept is not None:
                index[kept[0], kept[1]] = kept[2]
                d2_out[kept[0], kept[1]] = kept[3]
        index = torch.where(index >= 0, grid.order[index.clamp(min=0)], index)
    mask = index >= 0
    return _result(index, mask, d2_out.sqrt().to(query_pos.dtype), num_candidates)


def squared_distance(a_cols: list[Tensor], b_cols: list[Tensor]) -> Tensor:
    """``sum_d (a_d - b_d) ** 2``, summed over the axes in order: the one formula of the query."""
    d2 = (a_cols[0] - b_cols[0]) ** 2
    for a, b in zip(a_cols[1:], b_cols[1:]):
        d2 = d2 + (a - b) ** 2
    return d2


class _Grid:
    """The points sorted by grid cell, and for any queries the runs of sorted points to visit.

    Cells have side ``r / _CELLS_PER_RADIUS`` (slightly widened), so the candidates of a query lie
    in the ``2 * _CELLS_PER_RADIUS + 1`` cells around it along each axis; the cells along the
    innermost axis are adjacent in the sort order, hence one run per outer cell.

    ``order`` ``(N,)``: the points in cell order. ``runs(q)``: ``start``, ``stop`` ``(Q, M)``, the
    candidates of query ``i`` are ``order[start[i, m]:stop[i, m]]`` over the ``M`` runs. The lattice
    covers both point sets given here, so any block of ``q64``'s rows may be asked for.
    """

    def __init__(self, q64: Tensor, p64: Tensor, r: float, table_dtype: torch.dtype | None = None) -> None:
        dims, device = q64.shape[1], q64.device
        self.origin = torch.minimum(q64.min(0).values, p64.min(0).values)
        extent = float((torch.maximum(q64.max(0).values, p64.max(0).values) - self.origin).max())
        reach = _CELLS_PER_RADIUS
        max_cells = int(2 ** (_KEY_BITS / dims)) - 2 * reach - 1
        self.cell = max(r / reach * (1 + _CELL_SLACK), extent / max_cells)
        # a margin of `reach` empty cells on each side, so neighbour cells never wrap around an axis
        self.shape = int(extent / self.cell) + 1 + 2 * reach
        strides = [self.shape ** (dims - 1 - d) for d in range(dims)]
        self.strides = torch.tensor(strides, dtype=torch.int64, device=device)
        self.key_sorted, self.order = torch.sort(self._keys(p64), stable=True)
        steps = torch.arange(-reach, reach + 1, device=device)
        if dims > 1:
            outer = torch.cartesian_prod(*([steps] * (dims - 1))).reshape(-1, dims - 1)
            self.offsets = (outer * self.strides[:-1]).sum(1) - reach
        else:
            self.offsets = torch.full((1,), -reach, dtype=torch.int64, device=device)
        self.runs_per_query = int(self.offsets.numel())
        num_cells = self.shape**dims
        self.begin = None
        if num_cells <= _DENSE_TABLE_PER_POINT * (p64.shape[0] + q64.shape[0]):
            # a table of where each cell's points begin in the sorted order: lookups, no binary search
            # (int32 where the point count fits: the table is the build's one array of cells)
            if table_dtype is None:
                table_dtype = torch.int32 if p64.shape[0] < 2**31 else torch.int64
            counts = torch.bincount(self.key_sorted, minlength=num_cells).cumsum_(0)
            self.begin = torch.zeros(num_cells + 1, dtype=table_dtype, device=device)
            self.begin[1:] = counts
            del counts

    def _keys(self, x: Tensor) -> Tensor:
        reach = _CELLS_PER_RADIUS
        c = torch.floor((x - self.origin) / self.cell).to(torch.int64).add_(reach).clamp_(reach, self.shape - 1 - reach)
        return (c * self.strides).sum(1)

    def runs(self, q64: Tensor) -> tuple[Tensor, Tensor]:
        """``start``, ``stop`` ``(Q, M)`` int64 of the queries ``q64``."""
        first = self._keys(q64)[:, None] + self.offsets[None, :]
        last = first + 2 * _CELLS_PER_RADIUS
        if self.begin is not None:
            return self.begin[first].to(torch.int64), self.begin[last + 1].to(torch.int64)
        return (torch.searchsorted(self.key_sorted, first, side="left"),
                torch.searchsorted(self.key_sorted, last, side="right"))


def _chunks(pairs_per_query: Tensor, budget: int) -> list[tuple[int, int]]:
    """Consecutive query ranges of at most ``budget`` candidate pairs and ``2 ** 22`` queries."""
    total = torch.cumsum(pairs_per_query, 0).cpu()
    n = int(total.numel())
    bounds, lo = [], 0
    while lo < n:
        already = int(total[lo - 1]) if lo else 0
        hi = int(torch.searchsorted(total, torch.tensor(already + budget), side="right"))
        hi = min(max(hi, lo + 1), lo + _MAX_CHUNK_QUERIES, n)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _candidates(
    q_cols: list[Tensor], p_cols: list[Tensor], start: Tensor, stop: Tensor, q0: int, r2: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The (query, point) pairs of the runs with ``d2 <= r2``: query rows, sorted point rows, ``d2``."""
    lengths = (stop - start).reshape(-1)
    total = int(lengths.sum())
    device = start.device
    ends = torch.cumsum(lengths, 0)
    # pair j lies in run m: its sorted point is start[m] + (j - first pair of run m)
    shift = torch.repeat_interleave(start.reshape(-1) - (ends - lengths), lengths, output_size=total)
    sp = torch.arange(total, device=device).add_(shift)
    per_query = lengths.view(start.shape).sum(1)
    qi = torch.repeat_interleave(torch.arange(q0, q0 + start.shape[0], device=device), per_query, output_size=total)
    d2 = squared_distance([c[sp] for c in p_cols], [c[qi] for c in q_cols])
    keep = d2 <= r2
    return qi[keep], sp[keep], d2[keep]


def _keep_nearest(
    qi: Tensor, sp: Tensor, d2: Tensor, ids: Tensor, k: int, r2: float, num_candidates: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """Order each query's candidates by ``(d2, id)``; count them into ``num_candidates``.

    Returns the first ``k`` of each query as ``(query, slot, sorted point row, d2)`` (``None``
    when there are no candidates). One int64 sort on ``(query, d2 quantised to 40 bits)``
    (monotone in ``d2``), then an exact ``(d2, id)`` sort of the few runs whose keys tie.
    """
    if qi.numel() == 0:
        return None
    q0 = int(qi[0])
    level = torch.floor(d2 * (float(1 << _D2_BITS) / r2)).to(torch.int64).clamp_(0, (1 << _D2_BITS) - 1)
    key, perm = torch.sort(((qi - q0) << _D2_BITS) | level)
    tied = key[1:] == key[:-1]
    del key, level
    if bool(tied.any()):
        perm = _break_ties(perm, tied, d2, ids[sp])
    qi, sp, d2 = qi[perm], sp[perm], d2[perm]
    counts = torch.bincount(qi - q0)
    num_candidates[q0 : q0 + counts.numel()] += counts
    first = torch.cumsum(counts, 0) - counts
    slot = torch.arange(qi.numel(), device=qi.device) - first[qi - q0]
    keep = slot < k
    return qi[keep], slot[keep], sp[keep], d2[keep]


def _break_ties(perm: Tensor, tied: Tensor, d2: Tensor, ids: Tensor) -> Tensor:
    """Reorder the runs of equal keys in ``perm`` by exact ``(d2, id)``."""
    run = torch.cat([tied.new_zeros(1, dtype=torch.int64), torch.cumsum(~tied, 0)])
    member = torch.zeros(perm.numel(), dtype=torch.bool, device=perm.device)
    member[1:] |= tied
    member[:-1] |= tied
    at = torch.nonzero(member).squeeze(1)
    sub = perm[at]
    # lexicographic (run, d2, id) by stable sorts, least significant first; runs are contiguous
    o = torch.sort(ids[sub], stable=True).indices
    o = o[torch.sort(d2[sub][o], stable=True).indices]
    o = o[torch.sort(run[at][o], stable=True).indices]
    perm = perm.clone()
    perm[at] = sub[o]
    return perm
