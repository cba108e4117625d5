"""The halo exchange that moves the ghost rows and nothing else: :func:`append_halo`.

``append_halo(x)`` is ``torch.cat([x, ghosts])``. Built as a concatenation, it costs two memory
passes over all ``N_own`` owned rows (copy them into the result, copy their gradient back) for an
exchange of the ghost rows (on a mesh, a few percent of them). Here neither pass is needed:

- **Forward, rows with room.** Owned rows written into a buffer that already has room for the ghost
  rows (:func:`empty_with_room`, ``HaloPlan.empty_owned``) are not copied: the exchange writes the
  ghost rows into the room, and the result is a view of ``x`` over owned and ghost rows. A tensor
  without room (any other tensor) is copied once into the result, while the ghost rows travel.
- **Backward.** Two autograd nodes, so that the owned rows' gradient is never copied: the result's
  gradient ``g`` splits into views ``g[:N_own]`` (to ``x``) and ``g[N_own:]`` (to the exchange), and
  the exchange's backward sends the ghost rows' gradients back to their owners and hands them to
  autograd as a sparse ``(N_own, ...)`` gradient (``N_sent`` rows). Autograd's engine adds the two
  where ``x``'s gradient is accumulated, in place into ``g[:N_own]`` when nothing else holds ``g``
  (the case in a layer: ``g`` is the consumer's fresh gradient), else into a new tensor, which is
  the copy the concatenation always made. ``x``'s gradient is dense either way.

Safety. A tensor's room is used only when the tensor is the very one :func:`empty_with_room` made
(it carries a mark) and nothing else holds its storage (so no former result still shows ghost rows
that the exchange would overwrite): otherwise the copy path runs. A result over the room is a view of
``x``: writing into it in place raises autograd's error for views made in a custom Function, and an
in-place change of ``x`` is caught by the version counter they share. Half precision takes the
former fused path (``_HaloPass``: its gradients accumulate in float32).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from ._collectives import (
    _exchange,
    _exchange_rows,
    _HaloPass,
    _recycler,
    _select_into_workspace,
    _send_back_and_add,
    group_rank_and_size,
)
from ._validate import Counts, as_counts, check_dim, check_tensor
from ._validate import check_index as _check_index

__all__ = ["append_halo", "empty_with_room"]

_ROOM = "_meshshard_rows_with_room"  # set on a tensor by empty_with_room: the rows its storage holds
_use_count = getattr(torch._C, "_storage_Use_Count", None)
_SPARSE_GRAD = (torch.float32, torch.float64)


def empty_with_room(num_owned: int, num_ghost: int, rest: tuple[int, ...], dtype: torch.dtype,
                    device: torch.device | str) -> Tensor:
    """An uninitialised ``(num_owned, *rest)`` tensor on storage with room for ``num_ghost`` more
    rows: write the owned rows into it, and :func:`append_halo` writes the ghost rows after them
    instead of copying the owned rows into a new tensor."""
    rest = tuple(int(s) for s in rest)
    rows = int(num_owned) + int(num_ghost)
    storage = torch.empty(rows * math.prod(rest), dtype=dtype, device=device).untyped_storage()
    x = torch.empty(0, dtype=dtype, device=device).set_(storage, 0, (int(num_owned), *rest))
    setattr(x, _ROOM, rows)
    return x


def _has_room(x: Tensor, rows: int) -> bool:
    """Whether ``x`` was made by :func:`empty_with_room` with room for ``rows`` rows, and nothing but
    ``x`` holds its storage (a former result over the room, or any view, would see it overwritten)."""
    made = getattr(x, _ROOM, None)
    if made is None or made < rows or _use_count is None or not x.is_contiguous() or x.storage_offset() != 0:
        return False
    return _use_count(x.untyped_storage()._cdata) == 2  # x and the storage object just made


def _rows_after(x: Tensor, start: int, rows: int) -> Tensor:
    """``rows`` rows from row ``start`` of contiguous ``x``'s storage (past its end, too), as a tensor
    of its own: no view of ``x`` to autograd (no reference to ``x`` either), and its own version
    counter (writing past ``x``'s rows changes none of them)."""
    offset = x.storage_offset() + start * x.stride(0)
    return torch.empty(0, dtype=x.dtype, device=x.device).set_(x, offset, (rows, *x.shape[1:]), x.stride())


class _GhostRows(Function):
    """Owned rows -> the ghost rows, received into ``box[0]``; ``box[1]`` (local work) runs while
    they travel. Backward: the ghost rows' gradients go back to their owners, as a sparse gradient."""

    @staticmethod
    def forward(ctx: Any, x0: Tensor, index: Tensor, send_counts: list[int], recv_counts: list[int], rank: int,
                group: Any, box: list) -> Tensor:
        ctx.save_for_backward(index)
        ctx.args = (tuple(x0.shape), send_counts, recv_counts, rank, group)
        into, meanwhile, ctx.shared = box
        send = _select_into_workspace(x0, index)
        return _exchange(send, None, send_counts, recv_counts, rank, group, "indexed_all_to_all_v", "forward",
                         out=into, meanwhile=meanwhile)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        shape, send_counts, recv_counts, rank, group = ctx.args
        owned = ctx.shared.pop("owned_grad", None)
        if owned is not None:  # the owned rows' gradient is held elsewhere: copy it, add in the ghost rows
            grad_x = _send_back_and_add(grad.contiguous(), index, lambda: _recycler.empty(shape, owned.dtype,
                                        owned.device).copy_(owned), send_counts, recv_counts, rank, group)
            return grad_x, None, None, None, None, None, None
        # not a workspace buffer: the sparse gradient holds these rows until the engine adds them
        back = _exchange_rows(grad.contiguous(), recv_counts, send_counts, rank, group, "indexed_all_to_all_v",
                              "backward")
        grad_x = torch.sparse_coo_tensor(index.to(torch.int64).unsqueeze(0), back, shape, check_invariants=False)
        return grad_x, None, None, None, None, None, None


class _Later(Function):
    """The identity, for the order of the backward: autograd runs a node made earlier later, so the
    owned rows' gradient reaches ``x`` after the ghost rows' sparse one, and the engine adds that
    one into it in place (the other order makes a new tensor)."""

    @staticmethod
    def forward(ctx: Any, x0: Tensor) -> Tensor:
        ctx.set_materialize_grads(False)  # no gradient stays none, not a tensor of zeros
        return x0.view_as(x0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None) -> Tensor | None:
        return grad


class _OwnedThenGhosts(Function):
    """``(x, ghosts)`` -> the owned then the ghost rows: ``box[0]`` (already filled), or, when ``box[0]``
    is ``None``, a view of ``x`` over its storage's room. Backward: the gradient's two parts, no copy:
    tensors of their own over its memory (a view would keep the whole gradient alive, and the engine
    adds into a gradient in place only when nothing else holds its memory)."""

    @staticmethod
    def forward(ctx: Any, x0: Tensor, ghosts: Tensor, box: list) -> Tensor:
        ctx.num_owned, ctx.shared = x0.shape[0], box[1]
        if box[0] is not None:
            return box[0]
        return x0.as_strided((x0.shape[0] + ghosts.shape[0], *x0.shape[1:]), x0.stride(), x0.storage_offset())

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        n = ctx.num_owned
        if not grad.is_contiguous() or sys.getrefcount(grad) > _fresh_references():
            # held by the caller too (``y.backward(g)``), so the engine would add the sparse part into a
            # new tensor: the ghost rows' node copies it instead, into recycled memory, as before
            ctx.shared["owned_grad"] = grad[:n]
            return None, grad[n:], None
        return _rows_after(grad, 0, n), _rows_after(grad, n, grad.shape[0] - n), None


@functools.cache
def _fresh_references() -> int:
    """References to a gradient that only autograd holds, inside a backward like the one above
    (Python and torch versions differ): what a gradient held by its caller exceeds."""
    seen: list[int] = []

    class _Probe(Function):
        @staticmethod
        def forward(ctx: Any, x: Tensor) -> Tensor:
            return x.clone()

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad: Tensor) -> Tensor:
            seen.append(sys.getrefcount(grad))
            return grad

    with torch.enable_grad():
        (_Probe.apply(torch.zeros(1, requires_grad=True)) * 2).sum().backward()
    return seen[0]


def _append_rows(x: Tensor, index: Tensor, send_counts: list[int], recv_counts: list[int], rank: int,
                 group: Any) -> Tensor:
    n, ghosts = x.shape[0], sum(recv_counts)
    if _has_room(x, n + ghosts):
        into = _rows_after(x, n, ghosts)
        full = None
        meanwhile = None
    else:
        full = _recycler.empty((n + ghosts, *x.shape[1:]), x.dtype, x.device)
        into = _rows_after(full, n, ghosts)

        def meanwhile() -> None:
            full[:n].copy_(x)

    shared: dict[str, Tensor] = {}  # the owned rows' gradient, when the ghost rows' node must add it
    owned = _Later.apply(x)  # made first, run last in the backward
    ghost_rows = _GhostRows.apply(x, index, send_counts, recv_counts, rank, group, [into, meanwhile, shared])
    return _OwnedThenGhosts.apply(owned, ghost_rows, [full, shared])


def append_halo(
    x: Tensor,
    send_index: Tensor,
    send_counts: Counts,
    recv_counts: Counts,
    *,
    group: Any = None,
    check_index: bool = True,
) -> Tensor:
    """``x`` with the rows received from other ranks appended: ``torch.cat([x, indexed_all_to_all_v(x, ...)])``.

    The halo exchange as layers use it, with no copy of the owned rows' gradient, and none of the
    owned rows themselves when ``x`` was made with room for the ghost rows (:func:`empty_with_room`;
    the module docstring says how). A halo plan sends nothing to its own rank. Recorded as one
    ``indexed_all_to_all_v`` per pass. Float16 / bfloat16 gradients accumulate in float32.

    Shapes:
        x: ``(N_own, ...)``; send_index: ``(sum(send_counts),)``; result: ``(N_own + sum(recv_counts), ...)``.

    Communication: one ``all_to_all_single`` forward, one backward (the adjoint exchange).
    """
    x = check_tensor("x", x)
    rank, world = group_rank_and_size(group)
    check_dim(0, x.dim())
    sc = as_counts("send_counts", send_counts, world)
    rc = as_counts("recv_counts", recv_counts, world)
    if sc[rank] or rc[rank]:
        raise ValueError(
            f"Expected a halo plan to send nothing to its own rank (got send_counts[{rank}] = {sc[rank]}, "
            f"recv_counts[{rank}] = {rc[rank]})"
        )
    index = _check_index(send_index, sc, x.shape[0] if check_index else None, x, 0)
    if x.dtype not in _SPARSE_GRAD:
        return _HaloPass.apply(x, index, sc, rc, rank, group, False)
    return _append_rows(x, index, sc, rc, rank, group)
