"""``BallQueryPlan``: the geometric halo of a sharded point cloud, and its ball-query neighbours.

A ball query needs, on each rank, every point within ``radius`` of an owned point. The halo is
geometric, not a graph's ghost layer: built once per point set (and radius), in four steps, with
five small collectives and no list of every point anywhere:

1. every rank shares its bounding box and owned count (one ``all_gather_v`` of one row);
2. every rank sends each other rank its *fine region* near that rank: the tight bounding boxes of
   its points in each cell of a global lattice (cell side ~ ``radius``), for the cells within
   ``radius`` of the other rank's bounding box (two ``all_to_all_v``: counts, boxes);
3. every rank sends each other rank the owned points within ``radius`` of that rank's fine region
   (one ``all_to_all_v`` of counts, which builds the plan's :class:`~meshshard.comm.HaloPlan`,
   and one ``indexed_all_to_all_v`` of global ids and coordinates through it);
4. the ball query runs locally over owned + received (halo) points, ties broken by global id.

Exactness: all distance tests of steps 1-3 use ``radius * (1 + 1e-6)``, far more than their
rounding error (relative, ~1e-16), so every point whose float64 distance to an owned point passes
``d2 <= radius ** 2`` reaches that point's rank. Points sent in excess are never selected. Every rank
then computes the same ``d2`` (same float64 coordinates, same formula) as the single-process query,
and sorts by the same ``(d2, global id)``, so the neighbour lists, in global ids and in order, are
exactly those of :func:`~meshshard.nn._ball_query.ball_query` on the whole cloud, truncation included.

Reuse: build the plan once per point set and pass it to every layer that uses the same radius;
when points move, :meth:`BallQueryPlan.rebuild` builds a new one (same cost as the first; nothing
is updated in place). Local numbering of a plan: rows ``0..N_own-1`` are the owned points,
``N_own..N_own+N_ghost-1`` the ghost (halo) points, grouped by source rank (ascending), in the
source's owned order within a group (ascending global id for a partition).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from meshshard.comm import HaloPlan, all_gather_v, all_to_all_v

from .._spec import ShardSpec
from .._tensor import ShardTensor
from ._ball_query import (
    _DEFAULT_CHUNK_PAIRS,
    BallQueryResult,
    _ball_query,
    check_max_neighbors,
    check_points,
    check_radius,
)

__all__ = ["BallQueryPlan"]

_HALO_SLACK = 1e-6  # relative widening of the radius in every halo test (rounding is ~1e-16)
_CELL_SLACK = 1e-5  # the lattice cell is a little wider still, so rounding never skips a cell
_KEY_BITS = 60


class BallQueryPlan:
    """The geometric halo of a point set and the ball-query neighbours of its owned points.

    Build it with :meth:`build`. On a whole cloud (``spec=None``) there is no halo and no
    communication, so the same code path serves whole and sharded inputs.

    Attributes:
        radius, max_neighbors: the query's parameters.
        spec: the layout of the owned points (``None``: the whole cloud on this process).
        halo: the halo exchange, a :class:`meshshard.comm.HaloPlan` (``None`` on a whole cloud);
            ``send_index``, ``send_counts`` and ``recv_counts`` read it.
        ghost_ids: global ids of the ghost (halo) rows, in local order; ``num_ghost`` counts
            them. ``halo_ids``, ``halo_pos`` and ``num_halo`` are deprecated aliases of
            ``ghost_ids``, ``ghost_pos`` and ``num_ghost`` (the names of ``ShardSpec`` and
            ``HaloPlan``).
        ghost_pos: the ghost rows' coordinates, float64.
        neighbors: the :class:`BallQueryResult` of the owned points, ``index`` in local rows
            (owned, then ghost).
        neighbor_ids: the same neighbours in global ids, ``-1`` where ``mask`` is False.

    Shapes:
        send_index: ``(sum(send_counts),)``; ghost_ids: ``(N_ghost,)``; ghost_pos: ``(N_ghost, D)``;
        neighbors (each field), neighbor_ids: ``(N_own, max_neighbors)``.
    """

    def __init__(
        self,
        radius: float,
        max_neighbors: int,
        spec: ShardSpec | None,
        halo: HaloPlan | None,
        ghost_ids: Tensor,
        ghost_pos: Tensor,
        neighbors: BallQueryResult,
        neighbor_ids: Tensor,
    ) -> None:
        # Internal: use BallQueryPlan.build.
        self.radius = radius
        self.max_neighbors = max_neighbors
        self.spec = spec
        self.halo = halo
        self.ghost_ids = ghost_ids
        self.ghost_pos = ghost_pos
        self.neighbors = neighbors
        self.neighbor_ids = neighbor_ids

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def build(
        cls, pos: Tensor | ShardTensor, radius: float, max_neighbors: int, spec: ShardSpec | None = None
    ) -> BallQueryPlan:
        """The halo and neighbours of the points ``pos``: the owned rows of ``spec``, or a whole cloud.

        Args:
            pos: owned coordinates; a ``ShardTensor`` brings its own spec.
            radius: ball radius (inclusive), positive.
            max_neighbors: the most neighbours per point (nearest first, ties by global id).
            spec: the layout; ``None`` (and a plain tensor): the whole cloud, no communication.

        Shapes:
            pos: ``(N_own, D)``, any floating dtype (the search runs in float64).

        Communication (sharded): one ``all_gather_v`` and two ``all_to_all_v`` (bounding boxes,
        fine regions), one ``all_to_all_v`` of counts and one ``indexed_all_to_all_v`` of ids and
        coordinates. Every rank of ``spec.group`` must call it.

        Raises:
            ValueError: on ``radius <= 0``, ``max_neighbors < 1``, a ``pos`` that is not
                ``(spec.num_owned, D)``; on every rank at once when any rank has non-finite
                coordinates.
        """
        if isinstance(pos, ShardTensor):
            if spec is not None and spec != pos.spec:
                raise ValueError(f"Expected 'spec' to be the spec of 'pos' (got {spec!r} and {pos.spec!r})")
            spec, pos = pos.spec, pos.to_local()
        if not isinstance(pos, Tensor):
            raise TypeError(f"Expected 'pos' to be a torch.Tensor or a ShardTensor (got {type(pos).__name__})")
        if pos.dim() != 2 or not pos.is_floating_point():
            raise ValueError(
                f"Expected 'pos' to be a two-dimensional floating point tensor (N, D) "
                f"(got shape {tuple(pos.shape)}, {pos.dtype})"
            )
        r = check_radius(radius)
        k = check_max_neighbors(max_neighbors)
        with torch.no_grad():
            pos = pos.detach()
            if spec is None:
                check_points("pos", pos)
                return cls._local(pos, r, k)
            if not isinstance(spec, ShardSpec):
                raise TypeError(f"Expected 'spec' to be a ShardSpec (got {type(spec).__name__})")
            if pos.shape[0] != spec.num_owned:
                raise ValueError(
                    f"Expected 'pos' to have spec.num_owned = {spec.num_owned} rows on rank {spec.rank} "
                    f"(got {pos.shape[0]})"
                )
            return cls._sharded(pos, r, k, spec)

    def rebuild(self, pos: Tensor | ShardTensor) -> BallQueryPlan:
        """A new plan for moved points, with this plan's radius, ``max_neighbors`` and spec.

        Communication: that of :meth:`build` (every rank must call it).
        """
        return BallQueryPlan.build(pos, self.radius, self.max_neighbors, self.spec)

    @classmethod
    def _local(cls, pos: Tensor, r: float, k: int) -> BallQueryPlan:
        ids = torch.arange(pos.shape[0], device=pos.device)
        result = _ball_query(pos, pos, r, k, ids, _CHUNK_PAIRS)
        return cls(r, k, None, None, ids[:0], pos[:0].to(torch.float64), result, result.index)

    @classmethod
    def _sharded(cls, pos: Tensor, r: float, k: int, spec: ShardSpec) -> BallQueryPlan:
        p64, device = pos.to(torch.float64), pos.device
        ids = spec.owned_ids.to(device)
        boxes = _share_boxes(p64, spec)
        wide = r * (1 + _HALO_SLACK)
        lattice = _Lattice(boxes, wide, p64.shape[1], device)
        regions, region_counts = _exchange_regions(p64, boxes, lattice, wide, spec)
        send_index, send_counts = _select_sends(p64, boxes, regions, region_counts, lattice, wide, spec)
        plan = HaloPlan.from_send_counts(send_index, send_counts, num_owned=p64.shape[0], group=spec.group)
        # global ids and the float64 coordinates' bits, in one int64 exchange
        ghosts = plan.exchange(torch.cat([ids[:, None], p64.view(torch.int64)], 1))
        ghost_ids, ghost_pos = ghosts[:, 0].contiguous(), ghosts[:, 1:].contiguous().view(torch.float64)
        local_ids = torch.cat([ids, ghost_ids])
        result = _ball_query(pos, torch.cat([p64, ghost_pos]), r, k, local_ids, _CHUNK_PAIRS)
        neighbor_ids = torch.where(result.mask, local_ids[result.index.clamp(min=0)], result.index)
        return cls(r, k, spec, plan, ghost_ids, ghost_pos, result, neighbor_ids)

    # --- use --------------------------------------------------------------------------------------

    @property
    def num_owned(self) -> int:
        return self.neighbors.index.shape[0]

    @property
    def num_ghost(self) -> int:
        """The ghost (halo) rows this rank receives, ``N_ghost`` (0 on a whole cloud)."""
        return int(self.ghost_ids.numel())

    @property
    def num_halo(self) -> int:
        """Deprecated alias of :attr:`num_ghost`."""
        return self.num_ghost

    @property
    def halo_ids(self) -> Tensor:
        """Deprecated alias of :attr:`ghost_ids` (the same tensor)."""
        return self.ghost_ids

    @property
    def halo_pos(self) -> Tensor:
        """Deprecated alias of :attr:`ghost_pos` (the same tensor)."""
        return self.ghost_pos

    @property
    def send_index(self) -> Tensor:
        """Owned rows sent to other ranks, grouped by destination (empty on a whole cloud)."""
        return self.halo.send_index if self.halo is not None else self.ghost_ids.new_zeros(0).cpu()

    @property
    def send_counts(self) -> list[int]:
        return list(self.halo.send_counts) if self.halo is not None else [0]

    @property
    def recv_counts(self) -> list[int]:
        return list(self.halo.recv_counts) if self.halo is not None else [0]

    def exchange(self, x: Tensor) -> Tensor:
        """The halo rows of ``x`` (owned rows), differentiable.

        Shapes:
            x: ``(N_own, ...)``; result: ``(N_ghost, ...)``.

        Communication: one ``indexed_all_to_all_v`` forward, one backward (the adjoint: the halo
        rows' gradients return to their owners and accumulate there); none on a whole cloud.
        """
        if x.shape[0] != self.num_owned:
            raise ValueError(
                f"Expected 'x' to have {self.num_owned} rows, the owned points of the plan (got {x.shape[0]})"
            )
        if self.halo is None:
            return x[:0]
        return self.halo.exchange(x)

    def with_halo(self, x: Tensor) -> Tensor:
        """Owned rows followed by the halo rows, ``(N_own + N_ghost, ...)``, the plan's local numbering.

        Communication: that of :meth:`exchange`, fused with the concatenation
        (:meth:`meshshard.comm.HaloPlan.append`).
        """
        if x.shape[0] != self.num_owned:
            raise ValueError(
                f"Expected 'x' to have {self.num_owned} rows, the owned points of the plan (got {x.shape[0]})"
            )
        return x if self.halo is None else self.halo.append(x)

    def __repr__(self) -> str:
        where = "whole cloud" if self.spec is None else f"rank {self.spec.rank}/{self.spec.world_size}"
        sent = sum(self.send_counts)
        return (
            f"BallQueryPlan({where}, radius={self.radius}, max_neighbors={self.max_neighbors}, "
            f"owned={self.num_owned}, halo={self.num_ghost}, sent={sent}, truncated={self.neighbors.num_truncated})"
        )


_CHUNK_PAIRS = _DEFAULT_CHUNK_PAIRS


# --- step 1: bounding boxes -------------------------------------------------------------------------


def _share_boxes(p64: Tensor, spec: ShardSpec) -> Tensor:
    """Every rank's ``[count, non-finite rows, lo (D), hi (D)]``, ``(R, 2 + 2D)`` float64."""
    n, dims = p64.shape
    bad = (~torch.isfinite(p64)).any(1) if n else torch.zeros(0, dtype=torch.bool, device=p64.device)
    good = p64[~bad]
    if good.shape[0]:
        lo, hi = good.min(0).values, good.max(0).values
    else:
        lo = hi = p64.new_zeros(dims)
    row = torch.cat([p64.new_tensor([n, float(bad.sum())]), lo, hi])[None]
    boxes = all_gather_v(row, [1] * spec.world_size, group=spec.group)
    flagged = [(q, int(c)) for q, c in enumerate(boxes[:, 1].tolist()) if c]
    if flagged:
        where = ", ".join(f"{c} on rank {q}" for q, c in flagged)
        raise ValueError(f"Expected 'pos' to hold finite coordinates on every rank (got rows with NaN or inf: {where})")
    return boxes


def _box_gap2(p: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Squared distance from points (or boxes ``[p, p_hi]``) to boxes, broadcasting: ``sum_d gap_d ** 2``."""
    gap = torch.clamp(torch.maximum(lo - p, p - hi), min=0)
    return (gap**2).sum(-1)


class _Lattice:
    """A global cell lattice, the same on every rank (built from the shared boxes)."""

    def __init__(self, boxes: Tensor, wide: float, dims: int, device: torch.device) -> None:
        live = boxes[boxes[:, 0] > 0]
        if live.shape[0] == 0:
            self.origin, extent = torch.zeros(dims, dtype=torch.float64, device=device), 0.0
        else:
            self.origin = live[:, 2 : 2 + dims].min(0).values
            extent = float((live[:, 2 + dims :].max(0).values - self.origin).max())
        max_cells = int(2 ** (_KEY_BITS / dims)) - 3
        self.cell = max(wide * (1 + _CELL_SLACK), extent / max_cells)
        self.shape = int(extent / self.cell) + 3
        self.strides = torch.tensor(
            [self.shape ** (dims - 1 - d) for d in range(dims)], dtype=torch.int64, device=device
        )
        steps = torch.tensor([-1, 0, 1], device=device)
        self.offsets = (torch.cartesian_prod(*([steps] * dims)).reshape(-1, dims) * self.strides).sum(1)

    def keys(self, p64: Tensor) -> Tensor:
        c = (torch.floor((p64 - self.origin) / self.cell).to(torch.int64) + 1).clamp_(1, self.shape - 2)
        return (c * self.strides).sum(1)


# --- step 2: fine regions ----------------------------------------------------------------------------


def _cell_boxes(p64: Tensor, lattice: _Lattice) -> tuple[Tensor, Tensor, Tensor]:
    """The occupied cells of this rank's points and the tight box of the points in each."""
    keys = lattice.keys(p64)
    cells, inverse = torch.unique(keys, return_inverse=True)
    index = inverse[:, None].expand_as(p64)
    lo = torch.full((cells.numel(), p64.shape[1]), math.inf, dtype=torch.float64, device=p64.device)
    hi = torch.full_like(lo, -math.inf)
    lo.scatter_reduce_(0, index, p64, "amin")
    hi.scatter_reduce_(0, index, p64, "amax")
    return cells, lo, hi


def _exchange_regions(
    p64: Tensor, boxes: Tensor, lattice: _Lattice, wide: float, spec: ShardSpec
) -> tuple[Tensor, list[int]]:
    """Send each rank this rank's cell boxes within ``wide`` of its bounding box; return what arrives.

    Rows are int64: ``[cell key, lo bits (D), hi bits (D)]``, grouped by source rank.
    """
    dims, world = p64.shape[1], spec.world_size
    cells, lo, hi = _cell_boxes(p64, lattice)
    rows = torch.cat([cells[:, None], lo.view(torch.int64), hi.view(torch.int64)], 1)
    parts, counts = [], []
    for b in range(world):
        if b == spec.rank or boxes[b, 0] == 0 or cells.numel() == 0:
            counts.append(0)
            continue
        b_lo, b_hi = boxes[b, 2 : 2 + dims], boxes[b, 2 + dims :]
        # box-to-box gap: per axis, max(lo - b_hi, b_lo - hi, 0)
        gap = torch.clamp(torch.maximum(lo - b_hi, b_lo - hi), min=0)
        near = (gap**2).sum(1) <= wide * wide
        parts.append(rows[near])
        counts.append(int(near.sum()))
    send = torch.cat(parts) if parts else rows[:0]
    recv_counts = all_to_all_v(
        torch.tensor(counts, dtype=torch.int64, device=p64.device)[:, None], [1] * world, [1] * world, group=spec.group
    )[:, 0].tolist()
    return all_to_all_v(send, counts, recv_counts, group=spec.group), recv_counts


# --- step 3: what to send ----------------------------------------------------------------------------


def _select_sends(
    p64: Tensor,
    boxes: Tensor,
    regions: Tensor,
    region_counts: list[int],
    lattice: _Lattice,
    wide: float,
    spec: ShardSpec,
) -> tuple[Tensor, list[int]]:
    """For each other rank, the owned rows within ``wide`` of its fine region (ascending)."""
    dims, device = p64.shape[1], p64.device
    parts, counts, at = [], [], 0
    for b, m in enumerate(region_counts):
        region, at = regions[at : at + m], at + m
        if m == 0 or p64.shape[0] == 0:
            counts.append(0)
            continue
        near_box = _box_gap2(p64, boxes[b, 2 : 2 + dims], boxes[b, 2 + dims :]) <= wide * wide
        cand = torch.nonzero(near_box).squeeze(1)
        keys, order = torch.sort(region[:, 0])
        lo = region[order, 1 : 1 + dims].contiguous().view(torch.float64)
        hi = region[order, 1 + dims :].contiguous().view(torch.float64)
        # each candidate against the boxes in the 3 ** D cells around it
        look = lattice.keys(p64[cand])[:, None] + lattice.offsets[None, :]
        slot = torch.searchsorted(keys, look).clamp_(max=keys.numel() - 1)
        found = keys[slot] == look
        gap2 = _box_gap2(p64[cand][:, None, :], lo[slot], hi[slot])
        hit = (found & (gap2 <= wide * wide)).any(1)
        chosen = cand[hit]
        parts.append(chosen)
        counts.append(int(chosen.numel()))
    send_index = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)
    return send_index, counts
