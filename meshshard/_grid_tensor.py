"""``GridTensor``: a ``(B, C, *spatial)`` tensor sharded in boxes along its spatial dims.

A structured grid is a mesh, so a grid tensor uses the same halo plans (a
:class:`meshshard.comm.HaloPlan`: ``send_index``, ``send_counts``, ``recv_counts``, ghosts in
DESIGN.md's order) and the same exchange (``HaloPlan.exchange``, that is
:func:`meshshard.comm.indexed_all_to_all_v`) as every sharded mesh tensor. The plan comes from
:func:`meshshard.partition._grid.window_plan`: each rank's box of a
:class:`~meshshard.partition._grid.GridLayout`, grown into the window of input points an operation
reads, with the grid's padding mode applied where the window leaves the grid.

One exchange fills a window: faces, edges and corners of a box come from the ranks that own
them directly (corners through the plan, not a second phase), and points outside the grid come
from the padding mode (``zeros``: a fill value; ``reflect``, ``replicate``: points of the grid,
local or received; ``circular``: the first and last ranks along the axis exchange).

Shapes: ``B`` batch, ``C`` channels, spatial dims ``(N_0, ..., N_{d-1})`` globally and the
rank's box ``(n_0, ..., n_{d-1})`` locally, ``d`` in 1..3. Local tensors are ``(B, C, n_0, ...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.autograd import Function

from meshshard.comm import HaloPlan, all_gather_v, group_rank_and_size
from meshshard.partition import GridLayout, grid_layout, halo_windows, window_plan

from ._rowwise import ELEMENTWISE
from ._spec import ShardSpec
from ._tensor import ShardTensor

__all__ = ["GridTensor", "GridLayout", "grid_layout"]


@dataclass(frozen=True, eq=False)
class _Piece:
    """How one rectangle of a rank's window is assembled: its overlap with the box (a strided
    copy) plus the band of other positions, each taking an owned point (reflect / circular
    padding onto the rank's own points), a received ghost row, or the fill value."""

    shape: tuple[int, ...]
    piece_slices: tuple[slice, ...]  # the overlap, in piece coordinates
    box_slices: tuple[slice, ...]  # the overlap, in box coordinates
    owned_pos: Tensor  # band positions (flat piece index) taking an owned point ...
    owned_src: Tensor  # ... this one (flat box index)
    ghost_pos: Tensor
    ghost_src: Tensor  # index into the received ghost rows
    fill_pos: Tensor

    def to(self, device: torch.device) -> _Piece:
        return replace(self, **{k: v.to(device) for k, v in self.__dict__.items() if isinstance(v, Tensor)})


def _piece(source: np.ndarray, lo: Sequence[int], hi: Sequence[int], box_lo: Sequence[int],
           box_hi: Sequence[int], n_own: int, n_ghost: int) -> _Piece:
    """The piece ``[lo, hi)`` of a window whose ``source`` index (window-shaped) says where each
    position comes from; the box is ``[box_lo, box_hi)``, all in window coordinates."""
    o_lo = [max(a, b) for a, b in zip(lo, box_lo)]
    o_hi = [max(min(a, b), c) for a, b, c in zip(hi, box_hi, o_lo)]
    piece_slices = tuple(slice(a - low, b - low) for a, b, low in zip(o_lo, o_hi, lo))
    box_slices = tuple(slice(a - low, b - low) for a, b, low in zip(o_lo, o_hi, box_lo))
    sub = source[tuple(slice(a, b) for a, b in zip(lo, hi))]
    inside = np.zeros(sub.shape, dtype=bool)
    inside[piece_slices] = True
    band = np.flatnonzero(~inside.reshape(-1))
    src = sub.reshape(-1)[band]
    owned, ghost = src < n_own, (src >= n_own) & (src < n_own + n_ghost)
    t = torch.from_numpy
    return _Piece(shape=tuple(sub.shape), piece_slices=piece_slices, box_slices=box_slices,
                  owned_pos=t(band[owned]), owned_src=t(src[owned]), ghost_pos=t(band[ghost]),
                  ghost_src=t(src[ghost] - n_own), fill_pos=t(band[~owned & ~ghost]))


@dataclass(frozen=True, eq=False)
class _WindowPlan:
    """A rank's window plan as tensors: the exchange and the pieces the window is built from.

    ``local``: no rank has a ghost, so no rank exchanges. Without a kernel extent the one piece
    is the whole window. With one (a stride-1 convolution), ``interior`` is the rectangle of
    the output box computable from the box alone (``out_slices``, and ``in_slices`` of the box),
    and the pieces are the windows of the frame around it (``frames``: their output slices).
    """

    halo: HaloPlan
    window_shape: tuple[int, ...]
    local: bool
    pieces: tuple[_Piece, ...]
    interior: tuple[tuple[slice, ...], tuple[slice, ...]] | None = None
    frames: tuple[tuple[slice, ...], ...] = ()

    def to(self, device: torch.device) -> _WindowPlan:
        return replace(self, pieces=tuple(piece.to(device) for piece in self.pieces))


def _frames(out_shape: Sequence[int], i_lo: Sequence[int], i_hi: Sequence[int]
            ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The output box minus its interior, as disjoint rectangles ``(lo, hi)``."""
    rects = []
    d = len(out_shape)
    for k in range(d):
        for a, b in ((0, i_lo[k]), (i_hi[k], out_shape[k])):
            if b > a:
                lo = [*i_lo[:k], a, *([0] * (d - k - 1))]
                hi = [*i_hi[:k], b, *out_shape[k + 1:]]
                rects.append((tuple(lo), tuple(hi)))
    return rects


@lru_cache(maxsize=256)
def _plan(layout: GridLayout, rank: int, starts: bytes, stops: bytes, modes: tuple[str, ...],
          device: torch.device, group: Any, extent: tuple[int, ...] | None = None) -> _WindowPlan:
    """The window plan of this rank (cached: layers ask for the same windows at every step).

    Its :class:`~meshshard.comm.HaloPlan` is made without the cross-rank check of
    ``HaloPlan.build``: every rank derives every rank's plan from the same layout and windows,
    so the counts agree by construction (and tests compare them with the stencil partition's).
    """
    shape = (layout.num_parts, layout.ndim)
    lo, hi = np.frombuffer(starts, np.int64).reshape(shape), np.frombuffer(stops, np.int64).reshape(shape)
    p = window_plan(layout, rank, lo, hi, modes)
    w_lo = [int(v) for v in lo[rank]]
    b_lo, b_hi = layout.box(rank)
    box_lo = [a - w for a, w in zip(b_lo, w_lo)]
    box_hi = [a - w for a, w in zip(b_hi, w_lo)]
    source = p.source_index.reshape(p.window_shape)
    n = (p.num_owned, len(p.ghost_ids))
    halo = HaloPlan(torch.from_numpy(p.send_index), tuple(p.send_counts.tolist()), tuple(p.recv_counts.tolist()),
                    p.num_owned, rank, group)
    common = dict(halo=halo, window_shape=p.window_shape, local=not p.any_ghosts)
    whole = _WindowPlan(pieces=(_piece(source, [0] * len(w_lo), p.window_shape, box_lo, box_hi, *n),), **common)
    if extent is None or min(p.window_shape, default=0) == 0:
        return whole.to(device)
    # Output position i (window coordinates of its first input) is interior when its input
    # window [i, i + e) lies in the box.
    out_shape = [w - e + 1 for w, e in zip(p.window_shape, extent)]
    i_lo = [min(max(a, 0), m) for a, m in zip(box_lo, out_shape)]
    i_hi = [max(min(b - e + 1, m), low) for b, e, m, low in zip(box_hi, extent, out_shape, i_lo)]
    if any(b <= a for a, b in zip(i_lo, i_hi)):
        return whole.to(device)
    rects = _frames(out_shape, i_lo, i_hi)
    pieces = tuple(_piece(source, r_lo, [b + e - 1 for b, e in zip(r_hi, extent)], box_lo, box_hi, *n)
                   for r_lo, r_hi in rects)
    interior = (tuple(slice(a, b) for a, b in zip(i_lo, i_hi)),
                tuple(slice(a - bl, b + e - 1 - bl) for a, b, e, bl in zip(i_lo, i_hi, extent, box_lo)))
    plan = _WindowPlan(pieces=pieces, interior=interior,
                       frames=tuple(tuple(slice(a, b) for a, b in zip(*r)) for r in rects), **common)
    return plan.to(device)


class _Assemble(Function):
    """(box, received ghost rows) -> the plan's pieces: for each, one strided copy of its
    overlap with the box, plus its band.

    Backward: the overlaps' gradients are copied back into the box, and the bands' gradients
    added to the owned points and ghost rows they came from (``index_add``: a point used several
    times, by reflect or circular padding or by two pieces, accumulates).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, ghosts: Tensor, plan: _WindowPlan, fill: float) -> tuple[Tensor, ...]:
        ctx.plan, ctx.box_shape, ctx.n_ghost = plan, x.shape, ghosts.shape[2]
        B, C = x.shape[:2]
        x_flat = x.reshape(B, C, -1)
        outs = []
        for piece in plan.pieces:
            out = x.new_empty((B, C, *piece.shape))
            out[(..., *piece.piece_slices)] = x[(..., *piece.box_slices)]
            flat = out.view(B, C, -1)
            if piece.fill_pos.numel():
                flat.index_fill_(2, piece.fill_pos, fill)
            if piece.owned_pos.numel():
                flat.index_copy_(2, piece.owned_pos, x_flat.index_select(2, piece.owned_src))
            if piece.ghost_pos.numel():
                flat.index_copy_(2, piece.ghost_pos, ghosts.index_select(2, piece.ghost_src))
            outs.append(out)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        plan = ctx.plan
        B, C = ctx.box_shape[:2]
        grad_x = grads[0].new_zeros(ctx.box_shape)
        grad_x_flat = grad_x.view(B, C, -1)
        grad_ghosts = grads[0].new_zeros((B, C, ctx.n_ghost))
        for piece, grad in zip(plan.pieces, grads):
            grad = grad.contiguous()
            grad_x[(..., *piece.box_slices)] += grad[(..., *piece.piece_slices)]
            flat = grad.view(B, C, -1)
            if piece.owned_pos.numel():
                grad_x_flat.index_add_(2, piece.owned_src, flat.index_select(2, piece.owned_pos))
            if piece.ghost_pos.numel():
                grad_ghosts.index_add_(2, piece.ghost_src, flat.index_select(2, piece.ghost_pos))
        return grad_x, grad_ghosts, None, None


class _Place(Function):
    """Pieces of the output box -> the output box (each piece copied into its slices).
    Backward: each piece gets its slices of the gradient. ``anchor`` (the received ghost rows)
    gets a zero gradient: it ties the result to the exchange, so that a rank whose output needs
    no ghost (the last slab of a "valid" convolution) still joins the backward exchange."""

    @staticmethod
    def forward(ctx: Any, shape: tuple[int, ...], slices: tuple[tuple[slice, ...], ...], anchor: Tensor,
                *pieces: Tensor) -> Tensor:
        ctx.slices, ctx.anchor = slices, (anchor.shape, anchor.dtype, anchor.device)
        out = pieces[0].new_empty(shape)
        for sl, piece in zip(slices, pieces):
            out[(..., *sl)] = piece
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        shape, dtype, device = ctx.anchor
        return (None, None, torch.zeros(shape, dtype=dtype, device=device),
                *(grad[(..., *sl)] for sl in ctx.slices))


class _FullTensor(Function):
    """Boxes -> the replicated whole grid. Backward: each rank keeps its own box's gradient."""

    @staticmethod
    def forward(ctx: Any, flat: Tensor, counts: list[int], ids: Tensor, own: Tensor, group: Any) -> Tensor:
        ctx.own = own
        with torch.no_grad():
            rows = all_gather_v(flat, counts, dim=2, group=group)
        return torch.empty_like(rows).index_copy_(2, ids.to(rows.device), rows)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad.index_select(2, ctx.own.to(grad.device)), None, None, None, None


class GridTensor:
    """The owned box of a ``(B, C, *spatial)`` tensor, plus its :class:`GridLayout` and group.

    Build one with :meth:`from_local` (this rank's box) or :meth:`distribute` (slice a tensor every
    rank holds). Element-wise functions (activations, arithmetic between grid tensors of one
    layout) and ``torch.cat`` along the batch or channel dim run on the local box and keep the
    layout; the grid layers of :mod:`meshshard.nn` (``GridConv``, ``GridPool``, ``GridUpsample``)
    exchange halos. Anything else raises a ``TypeError`` rather than compute a silently wrong
    result at box borders.

    Shapes:
        local: ``(B, C, n_0, ..., n_{d-1})``, the rank's box ``layout.box_shape(rank)``.
        full_tensor(): ``(B, C, N_0, ..., N_{d-1})``.
    """

    def __init__(self, local: Tensor, layout: GridLayout, group: Any = None) -> None:
        rank, world = group_rank_and_size(group)
        if layout.num_parts != world:
            raise ValueError(f"Expected a layout of {world} ranks for a group of {world} "
                             f"(got {layout.num_parts}, process grid {layout.proc_grid})")
        box = layout.box_shape(rank)
        if not isinstance(local, Tensor) or local.dim() != 2 + layout.ndim or tuple(local.shape[2:]) != box:
            got = tuple(local.shape) if isinstance(local, Tensor) else type(local).__name__
            raise ValueError(f"Expected a local tensor of shape (B, C, {', '.join(map(str, box))}), "
                             f"rank {rank}'s box (got {got})")
        self._local = local
        self._layout = layout
        self._group = group
        self._rank = rank

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def from_local(cls, local: Tensor, layout: GridLayout, group: Any = None) -> GridTensor:
        """Wrap this rank's box (no communication)."""
        return cls(local, layout, group)

    @classmethod
    def distribute(cls, full: Tensor, layout: GridLayout | None = None, group: Any = None, *,
                   proc_grid: Sequence[int] | None = None,
                   splits: Sequence[Sequence[int] | None] | None = None) -> GridTensor:
        """Slice this rank's box out of ``full``, held whole by every rank (differentiable).

        Without ``layout``, one is made from ``full``'s spatial shape, ``proc_grid`` (default:
        slabs along the first spatial dim) and ``splits`` (default: balanced).
        """
        rank, world = group_rank_and_size(group)
        if full.dim() < 3:
            raise ValueError(f"Expected a (B, C, *spatial) tensor (got shape {tuple(full.shape)})")
        if layout is None:
            layout = grid_layout(full.shape[2:], None if proc_grid else world,
                                 proc_grid=proc_grid, splits=splits)
        if tuple(full.shape[2:]) != layout.shape:
            raise ValueError(f"Expected spatial shape {layout.shape} (got {tuple(full.shape[2:])})")
        starts, stops = layout.box(rank)
        index = (slice(None), slice(None), *(slice(a, b) for a, b in zip(starts, stops)))
        return cls(full[index], layout, group)

    # --- what it holds --------------------------------------------------------------------------

    def to_local(self) -> Tensor:
        """This rank's box ``(B, C, *box)``, a plain tensor (differentiable)."""
        return self._local

    @property
    def layout(self) -> GridLayout:
        return self._layout

    @property
    def group(self) -> Any:
        return self._group

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def shape(self) -> torch.Size:
        """The local box's shape."""
        return self._local.shape

    @property
    def global_shape(self) -> torch.Size:
        return torch.Size((*self._local.shape[:2], *self._layout.shape))

    # Accessors shared with ShardTensor: both keep their local tensor in ``_local``.
    dtype = ShardTensor.dtype
    device = ShardTensor.device
    requires_grad = ShardTensor.requires_grad
    dim = ShardTensor.dim
    size = ShardTensor.size
    requires_grad_ = ShardTensor.requires_grad_

    def detach(self) -> GridTensor:
        """The same box and layout, cut from the autograd graph."""
        return GridTensor(self._local.detach(), self._layout, self._group)

    def __repr__(self) -> str:
        return (f"GridTensor(local={tuple(self._local.shape)}, global={tuple(self.global_shape)}, "
                f"rank={self._rank}, proc_grid={self._layout.proc_grid}, dtype={self.dtype})")

    def _like(self, local: Tensor, layout: GridLayout | None = None) -> GridTensor:
        return GridTensor(local, layout or self._layout, self._group)

    # --- halos ----------------------------------------------------------------------------------

    def window(self, starts: np.ndarray, stops: np.ndarray, modes: str | Sequence[str] = "zeros",
               fill: float = 0.0) -> Tensor:
        """Every rank's window of the grid, filled by one halo exchange (differentiable).

        ``starts``/``stops`` give every rank's window, ``(R, d)`` global coordinates (see
        :func:`meshshard.partition._grid.window_plan`); ``modes`` the padding per spatial dim;
        ``fill`` the value of points outside the grid in ``"zeros"`` mode.

        Shapes:
            result: ``(B, C, *window_shape)`` of this rank.

        Communication: one ``indexed_all_to_all_v`` forward (only to ranks owning a point of
        the window; none at all when no rank's window needs another rank's point), its adjoint
        backward (gradients of the ghost copies return to their owners and add up there, as do
        those of points used several times by reflect/circular padding). The window is the box's
        overlap (one strided copy) plus its band, filled from the ghost rows.
        """
        plan = self._window_plan(starts, stops, modes)
        return self._assemble(plan, fill)[0][0]

    def _window_plan(self, starts: np.ndarray, stops: np.ndarray, modes: str | Sequence[str],
              extent: tuple[int, ...] | None = None) -> _WindowPlan:
        modes = (modes,) * self._layout.ndim if isinstance(modes, str) else tuple(modes)
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        stops = np.ascontiguousarray(stops, dtype=np.int64)
        return _plan(self._layout, self._rank, starts.tobytes(), stops.tobytes(), modes,
                     self._local.device, self._group, extent)

    def _assemble(self, plan: _WindowPlan, fill: float = 0.0) -> tuple[tuple[Tensor, ...], Tensor]:
        """The plan's pieces, after its exchange (none when no rank has a ghost), and the ghost
        rows received (a result must depend on them even when no piece does, so that every rank
        joins the backward exchange)."""
        x = self._local
        if plan.local:  # no rank has a ghost (one rank, a pool inside the boxes): no exchange
            ghosts = x.new_empty((*x.shape[:2], 0))
        else:
            ghosts = plan.halo.exchange(x.reshape(*x.shape[:2], -1).movedim(2, 0)).movedim(0, 2)
        pieces = _Assemble.apply(x, ghosts, plan, fill) if plan.pieces else ()
        return pieces, ghosts

    def halo(self, width: int | Sequence[int], mode: str | Sequence[str] = "zeros") -> Tensor:
        """The local box with a halo of ``width`` points per side (per dim, or one for all).

        Shapes:
            result: ``(B, C, n_0 + 2 w_0, ...)``; an empty box stays empty.

        Communication: one ``indexed_all_to_all_v`` forward, one backward (see :meth:`window`).
        """
        starts, stops = halo_windows(self._layout, width)
        return self.window(starts, stops, mode)

    # --- whole tensor, ShardTensor, DTensor ------------------------------------------------------

    def full_tensor(self) -> Tensor:
        """The whole ``(B, C, *spatial)`` tensor on every rank (replicated: every rank must use it
        the same way; the backward hands each rank its own box's gradient).

        Communication: one ``all_gather_v`` forward, none backward.
        """
        lay, x = self._layout, self._local
        ids = torch.from_numpy(np.concatenate([lay.owned_ids(r) for r in range(lay.num_parts)]))
        own = torch.from_numpy(lay.owned_ids(self._rank))
        flat = _FullTensor.apply(x.reshape(*x.shape[:2], -1), list(lay.owned_counts()), ids, own,
                                 self._group)
        return flat.reshape(*x.shape[:2], *lay.shape)

    def shard_spec(self, halo_width: int = 1) -> ShardSpec:
        """The :class:`ShardSpec` of this layout: grid points as nodes (row-major global ids),
        with the halo plan of a ``halo_width`` band (zeros padding), which is the plan of
        ``meshshard partition --grid ... --halo-hops halo_width``. No communication."""
        lay = self._layout
        plan = self._window_plan(*halo_windows(lay, halo_width), "zeros")
        return ShardSpec(owned_counts=lay.owned_counts(), rank=self._rank,
                         owned_ids=torch.from_numpy(lay.owned_ids(self._rank)), halo=plan.halo,
                         group=self._group,
                         source=f"grid:{lay.shape}:{lay.proc_grid}:{lay.splits}:{halo_width}")

    def to_shard_tensor(self, halo_width: int = 1) -> ShardTensor:
        """The same values as a node-indexed :class:`ShardTensor`: rows are the owned grid points
        (row-major), features ``(B, C)``; its ``with_halo()`` appends the ghost band.

        Shapes:
            result local: ``(n_0 * ... * n_{d-1}, B, C)``.
        """
        x = self._local
        rows = x.reshape(*x.shape[:2], -1).permute(2, 0, 1)
        return ShardTensor.from_local(rows, self.shard_spec(halo_width))

    @classmethod
    def from_shard_tensor(cls, st: ShardTensor, layout: GridLayout) -> GridTensor:
        """Back from :meth:`to_shard_tensor`'s layout (rows = this rank's box, row-major)."""
        spec = st.spec
        ids = layout.owned_ids(spec.rank)
        if spec.num_owned != len(ids) or not torch.equal(spec.owned_ids, torch.from_numpy(ids)):
            raise ValueError("Expected a ShardTensor whose rows are this rank's grid box in row-major "
                             "order; redistribute it to GridTensor(...).shard_spec() first")
        local = st.to_local()
        box = layout.box_shape(spec.rank)
        return cls(local.permute(*range(1, local.dim()), 0).reshape(*local.shape[1:], *box), layout, spec.group)

    def _slab_axis(self) -> int | None:
        split = [k for k, p in enumerate(self._layout.proc_grid) if p > 1]
        if len(split) > 1:
            raise ValueError(f"DTensor interop needs slabs (one split dim); this layout is a "
                             f"{self._layout.proc_grid} box decomposition: use full_tensor()")
        return split[0] if split else None

    def to_dtensor(self, device_mesh: Any = None) -> Any:
        """A DTensor placed ``Shard(2 + k)`` for slabs along spatial dim ``k`` whose sizes are
        ``torch.chunk``'s (DTensor's uneven rule), or ``Replicate()`` for one rank.

        Raises:
            ValueError: for a box decomposition or slabs of other sizes (one line, what to use).
        """
        # DTensor interop: torch's DTensor types and placements; nothing is sent by importing them
        from torch.distributed.tensor import DTensor, Replicate, Shard

        from ._tensor import device_mesh_of

        axis = self._slab_axis()
        if device_mesh is None:
            device_mesh = device_mesh_of(self._group, self.device)
        if axis is None:
            return DTensor.from_local(self._local, device_mesh, [Replicate()], run_check=False)
        n, p = self._layout.shape[axis], self._layout.proc_grid[axis]
        chunk = -(-n // p)
        expected = tuple(max(0, min(chunk, n - r * chunk)) for r in range(p))
        if self._layout.splits[axis] != expected:
            raise ValueError(f"Expected slabs of torch.chunk sizes {list(expected)} along spatial dim "
                             f"{axis} for DTensor's Shard({2 + axis}) (got {list(self._layout.splits[axis])}); "
                             "use GridTensor.distribute(x.full_tensor(), grid_layout(..., splits=...))")
        shape = self.global_shape
        stride = torch.empty(0).new_empty(shape, device="meta").stride()
        return DTensor.from_local(self._local, device_mesh, [Shard(2 + axis)], run_check=False,
                                  shape=shape, stride=stride)

    @classmethod
    def from_dtensor(cls, dtensor: Any, group: Any = None) -> GridTensor:
        """From a DTensor on a 1-D mesh placed ``Shard(k)``, ``k >= 2`` (a slab layout along
        spatial dim ``k - 2`` with ``torch.chunk`` sizes)."""
        # DTensor interop: torch's DTensor types and placements; nothing is sent by importing them
        from torch.distributed.tensor import Shard

        placements = tuple(dtensor.placements)
        shape = tuple(dtensor.shape)
        _, world = group_rank_and_size(group)
        if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim < 2:
            raise ValueError(f"Expected a DTensor on a 1-D mesh placed Shard(k), k >= 2 (got {placements})")
        axis = placements[0].dim - 2
        n = shape[2 + axis]
        chunk = -(-n // world)
        splits: list[Any] = [None] * (len(shape) - 2)
        splits[axis] = [max(0, min(chunk, n - r * chunk)) for r in range(world)]
        proc = [1] * (len(shape) - 2)
        proc[axis] = world
        return cls(dtensor.to_local(), grid_layout(shape[2:], proc_grid=proc, splits=splits), group)

    # --- element-wise torch functions ---------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Tensor methods (g.relu(), g.tanh()) go through __torch_function__, as torch.relu(g) does:
        # the element-wise ones run on the local box, the others are refused there with the reason.
        method = getattr(Tensor, name, None) if not name.startswith("_") else None
        if method is None or not callable(method):
            raise AttributeError(f"'GridTensor' object has no attribute {name!r}")

        def call(*args: Any, **kwargs: Any) -> Any:
            return GridTensor.__torch_function__(method, (GridTensor,), (self, *args), kwargs)

        return call

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in ELEMENTWISE:
            grids = [a for a in (*args, *kwargs.values()) if isinstance(a, GridTensor)]
            first = grids[0]
            for g in grids[1:]:
                if g._layout != first._layout or g._group is not first._group:
                    raise ValueError(f"{name}: grid tensors of different layouts "
                                     f"({first._layout} and {g._layout})")
            for a in (*args, *kwargs.values()):
                if isinstance(a, Tensor) and a.dim() > 2 and not isinstance(a, GridTensor):
                    raise TypeError(f"{name}: a plain tensor with spatial dims would not match the "
                                    "local box; wrap it with GridTensor.distribute")
            return first._like(func(*_unwrap(args), **_unwrap(kwargs)))
        if func is torch.cat:
            tensors = args[0]
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if not all(isinstance(t, GridTensor) for t in tensors):
                raise TypeError("torch.cat: expected only GridTensors")
            if dim % tensors[0].dim() >= 2:
                raise TypeError("torch.cat along a spatial dim changes the layout; concatenate "
                                "along the batch or channel dim")
            for t in tensors[1:]:
                if t._layout != tensors[0]._layout:
                    raise ValueError(f"torch.cat: grid tensors of different layouts "
                                     f"({tensors[0]._layout} and {t._layout})")
            return tensors[0]._like(torch.cat([t._local for t in tensors], dim))
        raise TypeError(f"{name} would be wrong at the box borders of a GridTensor; use the grid "
                        "layers of meshshard.nn (GridConv, GridPool, GridUpsample), "
                        "GridTensor.halo() / window() for your own stencil, or to_local()")

    # Operators shared with ShardTensor: each calls the torch function, which comes back to
    # ``__torch_function__`` above.
    __add__, __radd__ = ShardTensor.__add__, ShardTensor.__radd__
    __sub__, __rsub__ = ShardTensor.__sub__, ShardTensor.__rsub__
    __mul__, __rmul__ = ShardTensor.__mul__, ShardTensor.__rmul__
    __truediv__, __neg__ = ShardTensor.__truediv__, ShardTensor.__neg__


def _unwrap(x: Any) -> Any:
    if isinstance(x, GridTensor):
        return x._local
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(a) for a in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x
