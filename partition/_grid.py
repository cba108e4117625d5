"""Structured grids as meshes: box decompositions, the grid's stencil graph, and halo plans.

A grid of shape ``(N_0, ..., N_{d-1})`` (``d`` = 1, 2 or 3) is a mesh whose nodes are its points,
numbered in row-major (C) order: global id ``g = ravel_multi_index((i_0, ..., i_{d-1}), shape)``.

**Decomposition.** A process grid ``(P_0, ..., P_{d-1})`` with ``prod(P) = R`` ranks; rank ``r``
sits at ``unravel_index(r, P)`` (row-major, so ``(2, 2)`` puts ranks 0, 1 in the first row of
boxes). Along axis ``k`` the ``N_k`` points are cut into ``P_k`` consecutive blocks of sizes
``splits[k]`` (default: balanced, the first ``N_k mod P_k`` blocks one larger, as
``numpy.array_split``; empty blocks are allowed). Rank ``r`` owns the box that is the product of
its blocks. A ``(P, 1)`` process grid is a slab decomposition, ``(P_0, P_1)`` a box one.

Owned points in row-major order within the box are in ascending global id, which is DESIGN.md's
owned order: the local tensor ``(B, C, *box_shape)`` flattened over space is the local numbering.

**Halo plans** (:func:`window_plan`). An operation (a convolution, a pool) tells, for every rank,
the window of input coordinates its owned outputs read: per axis a range ``[start, stop)``, which
may reach outside the grid. Coordinates outside are mapped by a padding mode per axis:
``"zeros"`` (no point: a fill value), ``"reflect"`` (``-1 -> 1``), ``"replicate"`` (``-1 -> 0``)
or ``"circular"`` (``-1 -> N - 1``; the first and last ranks along the axis exchange). The points
of a window owned by another rank are its **ghosts**, grouped by owning rank (ascending), then by
ascending global id: exactly DESIGN.md's ghost order, and the plan (``send_index``,
``send_counts``, ``recv_counts``) is the one :func:`meshshard.comm.indexed_all_to_all_v` takes,
whose result is the ghost rows in that order. Corners and edges of a box come through the same
plan (diagonal neighbours exchange directly), so one exchange fills the whole window.
``source_index`` then says, for every window position in row-major order, which row of
``concat(owned rows, ghost rows, one fill row)`` it holds.

**Partition folders** (:func:`partition_grid`, ``meshshard partition --grid H,W[,D]``). The grid's
graph joins each point to its ``3^d - 1`` box-stencil neighbours (the support of a ``3 x 3`` or
``3 x 3 x 3`` kernel), so ``halo_hops = r`` ghosts are exactly the band of width ``r`` around each
box, corners included (Chebyshev distance ``<= r``); with ``periodic=True`` the stencil wraps.
Those ghosts equal the ones :func:`window_plan` finds for a window of half-width ``r`` with
``"zeros"`` (or ``"circular"`` when periodic) padding, plan for plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GridLayout", "GridPlan", "PADDING_MODES", "grid_graph", "grid_layout",
           "halo_windows", "partition_grid", "window_plan"]

#: Padding modes of :func:`window_plan` (the ``padding_mode`` values of ``torch.nn.Conv2d``).
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _balanced(n: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(n, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


@dataclass(frozen=True)
class GridLayout:
    """A grid of ``shape`` cut into boxes by a ``proc_grid`` of ranks with per-axis ``splits``.

    Build it with :func:`grid_layout`. ``splits[k][p]`` is the size of block ``p`` along axis
    ``k``; rank ``r`` owns the product of its blocks (see the module docstring).
    """

    shape: tuple[int, ...]
    proc_grid: tuple[int, ...]
    splits: tuple[tuple[int, ...], ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def num_parts(self) -> int:
        return int(np.prod(self.proc_grid))

    @property
    def num_nodes(self) -> int:
        return int(np.prod(self.shape))

    def offsets(self, axis: int) -> np.ndarray:
        """``(P_k + 1,)`` block boundaries along ``axis``."""
        return np.concatenate([[0], np.cumsum(self.splits[axis])]).astype(np.int64)

    def coords(self, rank: int) -> tuple[int, ...]:
        """The rank's position in the process grid."""
        return tuple(int(c) for c in np.unravel_index(rank, self.proc_grid))

    def box(self, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(starts, stops)``: the rank's owned box, per axis ``[start, stop)``."""
        c = self.coords(rank)
        starts = tuple(int(self.offsets(k)[c[k]]) for k in range(self.ndim))
        stops = tuple(int(self.offsets(k)[c[k] + 1]) for k in range(self.ndim))
        return starts, stops

    def box_shape(self, rank: int) -> tuple[int, ...]:
        """The shape of rank ``rank``'s box (its owned points along each grid axis)."""
        c = self.coords(rank)
        return tuple(self.splits[k][c[k]] for k in range(self.ndim))

    def owned_counts(self) -> tuple[int, ...]:
        """Every rank's number of owned points, in rank order."""
        return tuple(int(np.prod(self.box_shape(r))) for r in range(self.num_parts))

    def owned_ids(self, rank: int) -> np.ndarray:
        """``(N_own,)`` int64: the rank's owned global ids, ascending (row-major in its box)."""
        starts, stops = self.box(rank)
        axes = [np.arange(a, b, dtype=np.int64) for a, b in zip(starts, stops)]
        return _ravel(np.meshgrid(*axes, indexing="ij"), self.shape).reshape(-1)

    def parts(self) -> np.ndarray:
        """``(N,)`` int64: the owning rank of every point (global id order)."""
        per_axis = [np.repeat(np.arange(p, dtype=np.int64), s)
                    for p, s in zip(self.proc_grid, self.splits)]
        ranks = _ravel(np.meshgrid(*per_axis, indexing="ij"), self.proc_grid)
        return ranks.reshape(-1)

    def __repr__(self) -> str:
        return f"GridLayout(shape={self.shape}, proc_grid={self.proc_grid}, splits={self.splits})"


def _ravel(coords: Sequence[np.ndarray], shape: Sequence[int]) -> np.ndarray:
    """Row-major index of broadcastable coordinate arrays (int64; no bounds check)."""
    out = np.zeros(np.broadcast_shapes(*(np.shape(c) for c in coords)), dtype=np.int64)
    for c, n in zip(coords, shape):
        out = out * int(n) + c
    return out


def _ints(name: str, values: Any) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"Expected '{name}' to be a sequence of integers (got {values!r})") from None
    return out


def grid_layout(
    shape: Sequence[int],
    parts: int | None = None,
    *,
    proc_grid: Sequence[int] | None = None,
    splits: Sequence[Sequence[int] | None] | None = None,
) -> GridLayout:
    """A box decomposition of a grid.

    Args:
        shape: The grid, ``(N_0, ..., N_{d-1})``, ``d`` in 1..3, every ``N_k >= 1``.
        parts: Number of ranks ``R``; without ``proc_grid``, slabs along axis 0 (``(R, 1, ...)``).
        proc_grid: Ranks per axis (``prod == R``), e.g. ``(2, 2)``.
        splits: Per axis, the block sizes (summing to ``N_k``, ``P_k`` of them) or ``None``
            for balanced blocks.

    Raises:
        ValueError: on inconsistent arguments, with one line that names the argument.
    """
    shape = _ints("shape", shape)
    if not 1 <= len(shape) <= 3 or min(shape) < 1:
        raise ValueError(f"Expected a grid 'shape' of 1 to 3 positive sizes (got {shape})")
    d = len(shape)
    if proc_grid is None:
        if parts is None:
            raise ValueError("Expected 'parts' or 'proc_grid'")
        proc_grid = (int(parts),) + (1,) * (d - 1)
    proc_grid = _ints("proc_grid", proc_grid)
    if len(proc_grid) != d or min(proc_grid) < 1:
        raise ValueError(f"Expected 'proc_grid' of {d} positive sizes for a {d}-D grid "
                         f"(got {proc_grid})")
    if parts is not None and int(np.prod(proc_grid)) != parts:
        raise ValueError(f"Expected 'proc_grid' {proc_grid} to hold --parts {parts} ranks "
                         f"(it holds {int(np.prod(proc_grid))})")
    given = list(splits) if splits is not None else [None] * d
    if len(given) != d:
        raise ValueError(f"Expected 'splits' for each of the {d} axes (got {len(given)})")
    out = []
    for k, (n, p, s) in enumerate(zip(shape, proc_grid, given)):
        if s is None:
            out.append(_balanced(n, p))
            continue
        s = _ints(f"splits[{k}]", s)
        if len(s) != p or min(s) < 0 or sum(s) != n:
            raise ValueError(f"Expected 'splits[{k}]' to be {p} non-negative sizes summing to {n} "
                             f"(got {list(s)})")
        out.append(s)
    return GridLayout(shape=shape, proc_grid=proc_grid, splits=tuple(out))


@dataclass(frozen=True, eq=False)
class GridPlan:
    """One rank's halo plan for a window of the grid (see the module docstring).

    Shapes:
        ghost_ids, ghost_owner: ``(N_ghost,)`` int64. send_index: ``(sum(send_counts),)`` int64,
        owned local indices. send_counts, recv_counts: ``(R,)`` int64. source_index:
        ``(prod(window_shape),)`` int64 in ``[0, N_own + N_ghost]``, ``N_own + N_ghost`` being
        the fill row.
    """

    window_start: tuple[int, ...]
    window_shape: tuple[int, ...]
    ghost_ids: np.ndarray
    ghost_owner: np.ndarray
    send_index: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray
    source_index: np.ndarray
    num_owned: int
    any_ghosts: bool  # some rank of the layout has ghosts (else no rank needs to exchange)


def _map_axis(coord: np.ndarray, n: int, mode: str) -> np.ndarray:
    """Global coordinate of each (possibly outside) coordinate along one axis; -1 for none."""
    if mode == "zeros":
        return np.where((coord >= 0) & (coord < n), coord, -1)
    if mode == "replicate":
        return np.clip(coord, 0, n - 1)
    if mode == "circular":
        return np.mod(coord, n)
    if n == 1:  # reflect of a single point
        return np.zeros_like(coord)
    period = 2 * (n - 1)
    m = np.mod(coord, period)
    return np.where(m < n, m, period - m)


def _check_window(layout: GridLayout, starts: np.ndarray, stops: np.ndarray,
                  modes: tuple[str, ...]) -> None:
    for k, mode in enumerate(modes):
        n = layout.shape[k]
        if mode not in PADDING_MODES:
            raise ValueError(f"Expected a padding mode in {', '.join(PADDING_MODES)} (got {mode!r})")
        nonempty = stops[:, k] > starts[:, k]
        lo = int(np.max(np.where(nonempty, -starts[:, k], 0), initial=0))
        hi = int(np.max(np.where(nonempty, stops[:, k] - n, 0), initial=0))
        if mode == "reflect" and max(lo, hi) >= n:
            raise ValueError(f"Expected reflect padding narrower than the grid along axis {k} "
                             f"(padding {max(lo, hi)}, size {n})")
        if mode == "circular" and max(lo, hi) > n:
            raise ValueError(f"Expected circular padding at most the grid size along axis {k} "
                             f"(padding {max(lo, hi)}, size {n})")


def _mapped(layout: GridLayout, starts: Sequence[int], stops: Sequence[int],
            modes: Sequence[str], ranges: Sequence[np.ndarray] | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """Global id (-1: fill) and owning rank (-1: fill) of window points given per-axis ranges."""
    axes = ranges if ranges is not None else [np.arange(a, b, dtype=np.int64)
                                              for a, b in zip(starts, stops)]
    gcoord = [_map_axis(c, n, m) for c, n, m in zip(axes, layout.shape, modes)]
    owner_axis = [np.searchsorted(layout.offsets(k)[1:], g, side="right")
                  for k, g in enumerate(gcoord)]
    grids = np.meshgrid(*gcoord, indexing="ij")
    valid = np.ones(grids[0].shape, dtype=bool)
    for g in grids:
        valid &= g >= 0
    gid = np.where(valid, _ravel(grids, layout.shape), -1)
    owner = np.where(valid, _ravel(np.meshgrid(*owner_axis, indexing="ij"), layout.proc_grid), -1)
    return gid.reshape(-1), owner.reshape(-1)


def _ghosts(layout: GridLayout, rank: int, starts: Sequence[int], stops: Sequence[int],
            modes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Rank's ghosts for a window, sorted by (owner, global id), visiting only the window's band
    (the positions outside the rank's own box): O(halo), not O(window)."""
    if any(b <= a for a, b in zip(starts, stops)) or layout.owned_counts()[rank] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    own_lo, own_hi = layout.box(rank)
    inner = [(max(a, s), min(b, e)) for a, b, s, e in zip(starts, stops, own_lo, own_hi)]
    full = [np.arange(a, b, dtype=np.int64) for a, b in zip(starts, stops)]
    if any(b <= a for a, b in inner):  # the window misses the box: all of it is band
        pieces = [full]
    else:  # disjoint pieces: axes < k inside the box, axis k outside, axes > k anything
        pieces = [[np.arange(*inner[j], dtype=np.int64) for j in range(k)]
                  + [np.concatenate([np.arange(starts[k], inner[k][0], dtype=np.int64),
                                     np.arange(inner[k][1], stops[k], dtype=np.int64)])]
                  + full[k + 1:] for k in range(layout.ndim)]
    gids, owners = [], []
    for ranges in pieces:
        if any(len(r) == 0 for r in ranges):
            continue
        g, o = _mapped(layout, starts, stops, modes, ranges)
        keep = (o >= 0) & (o != rank)
        gids.append(g[keep])
        owners.append(o[keep])
    if not gids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    g, o = np.concatenate(gids), np.concatenate(owners)
    key = np.unique(o * layout.num_nodes + g)
    return key % layout.num_nodes, key // layout.num_nodes


def _local_index(layout: GridLayout, rank: int, gids: np.ndarray) -> np.ndarray:
    """Row-major index within the rank's box of points it owns."""
    starts, _ = layout.box(rank)
    coords = np.unravel_index(gids, layout.shape)
    return _ravel([c - s for c, s in zip(coords, starts)], layout.box_shape(rank))


def window_plan(
    layout: GridLayout,
    rank: int,
    starts: np.ndarray,
    stops: np.ndarray,
    modes: str | Sequence[str] = "zeros",
) -> GridPlan:
    """The halo plan of ``rank`` when every rank ``q`` reads the window ``starts[q]..stops[q]``.

    Every rank computes every rank's ghosts over the window's band only, so no communication is
    needed and the cost is the total halo, not the grid.

    Args:
        layout: The decomposition.
        rank: This rank.
        starts, stops: Every rank's window, in global coordinates (may reach outside the grid).
        modes: Padding mode per axis (or one for all), one of :data:`PADDING_MODES`.

    Shapes:
        starts, stops: ``(R, d)`` integer.
    """
    starts = np.asarray(starts, dtype=np.int64).reshape(layout.num_parts, layout.ndim)
    stops = np.asarray(stops, dtype=np.int64).reshape(layout.num_parts, layout.ndim)
    modes = (modes,) * layout.ndim if isinstance(modes, str) else tuple(modes)
    if len(modes) != layout.ndim:
        raise ValueError(f"Expected {layout.ndim} padding modes (got {len(modes)})")
    _check_window(layout, starts, stops, modes)
    R = layout.num_parts
    ghosts = [_ghosts(layout, q, starts[q], stops[q], modes) for q in range(R)]
    ghost_ids, ghost_owner = ghosts[rank]
    send = [g[o == rank] for g, o in ghosts]
    send_counts = np.array([len(s) if q != rank else 0 for q, s in enumerate(send)], np.int64)
    send_gids = np.concatenate([s for q, s in enumerate(send) if q != rank] or [np.zeros(0, np.int64)])
    send_index = _local_index(layout, rank, send_gids)
    recv_counts = np.bincount(ghost_owner, minlength=R).astype(np.int64)
    n_own = layout.owned_counts()[rank]
    w_start, w_stop = tuple(int(s) for s in starts[rank]), tuple(int(s) for s in stops[rank])
    window_shape = tuple(max(0, b - a) for a, b in zip(w_start, w_stop))
    gid, owner = _mapped(layout, w_start, w_stop, modes) if min(window_shape, default=0) > 0 \
        else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    source = np.full(gid.shape, n_own + len(ghost_ids), dtype=np.int64)
    mine = owner == rank
    source[mine] = _local_index(layout, rank, gid[mine])
    other = (owner >= 0) & ~mine
    order = np.argsort(ghost_ids, kind="stable")
    source[other] = n_own + order[np.searchsorted(ghost_ids[order], gid[other])]
    return GridPlan(window_start=w_start, window_shape=window_shape, ghost_ids=ghost_ids,
                    ghost_owner=ghost_owner, send_index=send_index, send_counts=send_counts,
                    recv_counts=recv_counts, source_index=source, num_owned=n_own,
                    any_ghosts=any(len(g) for g, _ in ghosts))


def halo_windows(layout: GridLayout, width: int | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's box grown by ``width`` points per side (per axis, or one for all); empty
    boxes stay empty. Returns ``(starts, stops)``, each ``(R, d)``."""
    w = np.broadcast_to(np.asarray(width, dtype=np.int64), (layout.ndim,))
    boxes = [layout.box(r) for r in range(layout.num_parts)]
    starts = np.array([b[0] for b in boxes], np.int64).reshape(layout.num_parts, layout.ndim)
    stops = np.array([b[1] for b in boxes], np.int64).reshape(layout.num_parts, layout.ndim)
    empty = (stops <= starts).any(axis=1, keepdims=True)
    return np.where(empty, starts, starts - w), np.where(empty, starts, stops + w)


def grid_graph(shape: Sequence[int], *, periodic: bool = False) -> Any:
    """The grid's box-stencil graph (each point joined to its ``3^d - 1`` neighbours), with the
    point coordinates as ``pos``; ``periodic`` wraps every axis."""
    from ._graph import Graph

    shape = _ints("shape", shape)
    n = int(np.prod(shape))
    coords = np.meshgrid(*[np.arange(s, dtype=np.int64) for s in shape], indexing="ij")
    coords = [c.reshape(-1) for c in coords]
    src, dst = [], []
    for offset in itertools.product((-1, 0, 1), repeat=len(shape)):
        if not any(offset) or offset > tuple(0 for _ in shape):
            continue  # each undirected pair once: offsets lexicographically below zero
        moved = [c + o for c, o in zip(coords, offset)]
        if periodic:
            moved = [np.mod(m, s) for m, s in zip(moved, shape)]
            keep = np.ones(n, dtype=bool)
        else:
            keep = np.logical_and.reduce([(m >= 0) & (m < s) for m, s in zip(moved, shape)])
        src.append(np.arange(n, dtype=np.int64)[keep])
        dst.append(_ravel([m[keep] for m in moved], shape))
    edge_index = np.stack([np.concatenate(src), np.concatenate(dst)]) if src \
        else np.zeros((2, 0), np.int64)
    pos = np.stack(coords, axis=1).astype(np.float64)
    return Graph.from_edge_index(edge_index, n, pos=pos, kind="grid")


def partition_grid(
    shape: Sequence[int],
    parts: int | None = None,
    *,
    proc_grid: Sequence[int] | None = None,
    splits: Sequence[Sequence[int] | None] | None = None,
    halo_width: int = 1,
    periodic: bool = False,
) -> list[Any]:
    """Every rank's :class:`~meshshard.partition.Partition` of a grid's box decomposition.

    The usual partition (nodes = grid points in row-major id order, edges = the box stencil,
    ghosts = the band of width ``halo_width``, i.e. ``halo_hops = halo_width``), ready for
    :func:`~meshshard.partition.save_partition`. Arguments as for :func:`grid_layout`.
    """
    from ._plan import build_partitions

    layout = grid_layout(shape, parts, proc_grid=proc_grid, splits=splits)
    graph = grid_graph(layout.shape, periodic=periodic)
    attrs = {"method": "grid", "graph": "grid",
             "input": {"kind": "grid", "name": None, "sha256": None},
             "parameters": {"shape": list(layout.shape), "proc_grid": list(layout.proc_grid),
                            "splits": [list(s) for s in layout.splits], "periodic": periodic}}
    return build_partitions(graph, layout.parts(), layout.num_parts, halo_hops=halo_width,
                            attrs=attrs)
