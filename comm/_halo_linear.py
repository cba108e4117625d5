"""A linear layer written straight into a buffer with room for the ghost rows, which the halo
exchange then fills: ``append_halo(F.linear(x, W, b))`` with no copy of the owned rows.

:func:`~meshshard.comm.append_halo` on a tensor that already exists must copy its ``N_own`` owned
rows into the owned + ghost result, and their gradient back: two memory passes over the owned rows
for an exchange that moves only the ghost rows (on a mesh, a few percent of them). A layer that
makes the rows it exchanges can make them in place instead: the GEMM writes the owned rows of the
result, the exchange writes the ghost rows after them. In the backward, the ghost rows' gradients
go back to their owners, and there they pass through the layer's adjoint on their own (``r W``,
``r^T x[index]``: ``O(N_sent)`` work) instead of being added into a copy of the owned rows'
gradient first:

    y = [x W^T + b; ghosts]          grad_x = g[:N] W + index_add(index, r W)
    r = the ghost rows' gradients,   grad_W = g[:N]^T x + r^T x[index]
        sent back to their owners    grad_b = sum(g[:N]) + sum(r)

which is the gradient of ``append_halo(F.linear(x, W, b))`` with the sums regrouped (equal to
rounding: 1e-10 relative in float64).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from ._collectives import _exchange, _exchange_rows, _recycler, _select_into_workspace
from ._halo_room import append_halo

__all__ = ["linear_with_halo"]


class _LinearHalo(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, index: Tensor, send_counts: list[int],
                recv_counts: list[int], rank: int, group: Any) -> Tensor:
        n = x.shape[0]
        out = _recycler.empty((n + sum(recv_counts), weight.shape[0]), x.dtype, x.device)
        owned = out[:n]
        if bias is None:
            torch.mm(x, weight.t(), out=owned)
        else:
            torch.addmm(bias, x, weight.t(), out=owned)
        send = _select_into_workspace(owned, index)
        _exchange(send, None, send_counts, recv_counts, rank, group, "indexed_all_to_all_v", "forward", out=out[n:])
        ctx.save_for_backward(x, weight, index)
        ctx.args = (send_counts, recv_counts, rank, group, bias is not None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, index = ctx.saved_tensors
        send_counts, recv_counts, rank, group, has_bias = ctx.args
        n = x.shape[0]
        grad = grad.contiguous()
        mine = grad[:n]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = has_bias and ctx.needs_input_grad[2]
        parts: dict[str, Tensor] = {}

        def owned_rows() -> None:  # the owned rows' share, while the ghost rows' gradients travel
            if need_x:
                parts["x"] = mine.mm(weight)
            if need_w:
                parts["w"] = mine.t().mm(x)
            if need_b:
                parts["b"] = mine.sum(0)

        back = _exchange_rows(grad[n:], recv_counts, send_counts, rank, group, "indexed_all_to_all_v", "backward",
                              pooled_result=True, meanwhile=owned_rows)  # (N_sent, H), consumed below
        if not parts:  # a world of one: nothing was in flight
            owned_rows()
        grad_x, grad_w, grad_b = parts.get("x"), parts.get("w"), parts.get("b")
        if grad_x is not None:
            grad_x.index_add_(0, index, back.mm(weight))
        if grad_w is not None:
            grad_w.addmm_(back.t(), x.index_select(0, index))
        if grad_b is not None:
            grad_b += back.sum(0)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def linear_with_halo(x: Tensor, weight: Tensor, bias: Tensor | None, index: Tensor, send_counts: list[int],
                     recv_counts: list[int], rank: int, group: Any) -> Tensor:
    """``append_halo(F.linear(x, weight, bias), index, ...)`` without copying the owned rows, for a
    checked halo plan (nothing to or from the rank itself; ``index`` on ``x``'s device).

    Runs as one autograd Function for float32 / float64 ``x`` of two dimensions outside autocast;
    anything else (half precision, autocast, more dimensions) runs as the two steps it stands for,
    with the same result.

    Shapes:
        x: ``(N_own, F)``; weight: ``(H, F)``; bias: ``(H,)``; result: ``(N_own + N_ghost, H)``.

    Communication: one ``indexed_all_to_all_v`` forward, one backward (the adjoint exchange).
    """
    fused = (
        x.dim() == 2 and x.dtype in (torch.float32, torch.float64) and weight.dtype == x.dtype
        and (bias is None or bias.dtype == x.dtype) and not torch.is_autocast_enabled(x.device.type)
    )
    if not fused:
        y = torch.nn.functional.linear(x, weight, bias)
        return append_halo(y, index, send_counts, recv_counts, group=group, check_index=False)
    return _LinearHalo.apply(x, weight, bias, index, send_counts, recv_counts, rank, group)
