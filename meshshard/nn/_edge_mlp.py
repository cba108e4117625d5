"""The MeshGraphNet edge MLP and the sum at destinations as autograd Functions that allocate little.

On CPU, each fresh ``(E, L)`` tensor costs its page faults on first touch (large blocks come
straight from ``mmap``), as much as an element-wise pass over it; the edge MLP under autograd makes
one per operation, twice when recomputed. These Functions do the same operations, in the same order
and with the same kernels as autograd, but into a few reused buffers:

- :func:`edge_mlp`: ``LayerNorm(... relu(W_2 relu(W_e e + b + P_s[src] + P_d[dst]) + b_2) ...)``
  keeps its inputs, the LayerNorm statistics and, unless ``recompute``, the hidden activations;
  with ``recompute`` the backward reruns the forward into its buffers first;
- :func:`scatter_sum`: ``out[i] = sum of message[k] over k with index[k] == i``, which keeps only
  ``index`` (``index_add_`` under autograd keeps the whole ``(E, L)`` message as well).

Sums at destinations take :func:`segment_lengths` when ``dst`` is sorted (as a partition's CSR
order leaves it): ``segment_reduce`` over runs of equal ``dst``, about half the time of
``index_add_`` on CPU, the same values (each row's terms added in edge order either way).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def segment_lengths(index: Tensor, num_rows: int) -> Tensor | None:
    """How many entries of ``index`` hold each row ``0..num_rows-1`` if ``index`` is sorted
    (non-decreasing) and not empty, else ``None``. Shapes: ``index (E,)`` -> ``(num_rows,)``."""
    if index.numel() == 0 or not bool((index[1:] >= index[:-1]).all()):
        return None
    lengths = torch.bincount(index, minlength=num_rows)
    return lengths if len(lengths) == num_rows else None  # an index out of range: index_add_ says so


def _sum_at(values: Tensor, index: Tensor, num_rows: int, lengths: Tensor | None) -> Tensor:
    """``zeros(num_rows, H).index_add_(0, index, values)``; by segments when ``lengths``."""
    if lengths is not None:
        return torch.segment_reduce(values, "sum", lengths=lengths, axis=0)
    return values.new_zeros(num_rows, values.shape[1]).index_add_(0, index, values)


def edge_mlp(
    e: Tensor,
    src_proj: Tensor | None,
    dst_proj: Tensor | None,
    src: Tensor | None,
    dst: Tensor | None,
    params: list[Tensor | None],
    eps: float,
    recompute: bool,
    dst_lengths: Tensor | None = None,
) -> Tensor:
    """An MLP on edges, ReLU between layers, LayerNorm at the end, its first layer in the lean form.

    ``params`` is ``[W_0, b_0, W_1, b_1, ..., W_k, b_k, gamma, beta]``: ``W_0`` the first layer's
    weight columns for ``e``; ``(W_i, b_i)`` the ``k >= 0`` layers after it. The first layer is
    ``P_s[src] + P_d[dst] + W_0 e`` with ``b_0=None`` (the bias is then in ``P_d``), or
    ``W_0 e + b_0`` with no node products (``src_proj=dst_proj=src=dst=None``: the edge encoder).
    Gradients equal those of the same operations under autograd (autograd's formulas, in its order).
    ``dst_lengths`` (from :func:`segment_lengths`, ``dst`` sorted) sums ``P_d``'s gradient by segments.

    Shapes:
        e: ``(E, F)``; src_proj: ``(N_rows, H)``; dst_proj: ``(N_dst, H)``; src, dst: ``(E,)``.
        Returns ``(E, H_out)``.
    """
    return _EdgeMLP.apply(e, src_proj, dst_proj, src, dst, dst_lengths, eps, recompute, *params)


def scatter_sum(message: Tensor, index: Tensor, num_rows: int, dtype: torch.dtype, lengths: Tensor | None = None) -> Tensor:
    """``zeros(num_rows, H, dtype).index_add_(0, index, message.to(dtype))``, by segments when
    ``lengths`` (:func:`segment_lengths`); the backward (``grad[index]``, in ``message``'s dtype)
    keeps only ``index``.

    Shapes:
        message: ``(E, H)``; index: ``(E,)`` in ``[0, num_rows)``. Returns ``(num_rows, H)``.
    """
    return _ScatterSum.apply(message, index, num_rows, dtype, lengths)


class _ScatterSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, message: Tensor, index: Tensor, num_rows: int, dtype: torch.dtype, lengths: Tensor | None) -> Tensor:
        ctx.save_for_backward(index)
        ctx.message_dtype = message.dtype
        return _sum_at(message.to(dtype), index, num_rows, lengths)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index).to(ctx.message_dtype), None, None, None, None


def _first_layer(e: Tensor, src_proj: Tensor | None, dst_proj: Tensor | None, src: Tensor, dst: Tensor, w: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``P_s[src] + P_d[dst] + W_0 e`` (the GEMM accumulates into the gathered sum: no bias pass;
    ``b`` is then inside ``P_d``), or ``W_0 e + b`` without node products; and the spare buffer."""
    if src_proj is None:
        return torch.addmm(b, e, w.t()), None
    z = torch.index_select(src_proj, 0, src)
    spare = torch.index_select(dst_proj, 0, dst)
    return z.add_(spare).addmm_(e, w.t()), spare


def _hidden(z: Tensor, spare: Tensor | None, layers: list[tuple[Tensor, Tensor]], keep: bool) -> tuple[Tensor, list[Tensor]]:
    """ReLU then each ``(W_i, b_i)`` from the first layer's output ``z``: the last pre-LayerNorm
    values and the ReLU outputs (kept in their own buffers when ``keep``, else ping-ponged)."""
    acts = []
    for w, b in layers:
        a = z.relu_()
        acts.append(a)
        z = torch.addmm(b, a, w.t()) if spare is None else torch.addmm(b, a, w.t(), out=spare)
        spare = None if keep else a
    return z, acts


class _EdgeMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, e: Tensor, src_proj: Tensor | None, dst_proj: Tensor | None, src: Tensor | None, dst: Tensor | None,
                dst_lengths: Tensor | None, eps: float, recompute: bool, *params: Tensor | None) -> Tensor:
        w_e, b_0, gamma, beta = params[0], params[1], params[-2], params[-1]
        layers = list(zip(params[2:-2:2], params[3:-2:2]))
        z, spare = _first_layer(e, src_proj, dst_proj, src, dst, w_e, b_0)
        z, acts = _hidden(z, spare, layers, keep=not recompute)
        y, mean, rstd = torch.native_layer_norm(z, [z.shape[1]], gamma, beta, eps)
        ctx.eps, ctx.recompute, ctx.num_params = eps, recompute, len(params)
        ctx.dst_lengths = dst_lengths  # (N_dst,) counts, or None
        ctx.save_for_backward(e, src_proj, dst_proj, src, dst, mean, rstd, *params, *(() if recompute else (z, *acts)))
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        saved = ctx.saved_tensors
        e, src_proj, dst_proj, src, dst, mean, rstd = saved[:7]
        params = saved[7 : 7 + ctx.num_params]
        w_e, b_0, gamma, beta = params[0], params[1], params[-2], params[-1]
        layers = list(zip(params[2:-2:2], params[3:-2:2]))
        if ctx.recompute:
            z, spare = _first_layer(e, src_proj, dst_proj, src, dst, w_e, b_0)
            z, acts = _hidden(z, spare, layers, keep=True)
        else:
            z, acts = saved[7 + ctx.num_params], list(saved[8 + ctx.num_params :])
        need = ctx.needs_input_grad
        grad_z, grad_gamma, grad_beta = torch.ops.aten.native_layer_norm_backward(
            grad_y, z, [z.shape[1]], mean, rstd, gamma, beta, [True, need[-2], need[-1]]
        )
        free = z if ctx.recompute else None  # the pre-LayerNorm buffer, no longer needed
        grads_layers: list[Tensor | None] = []
        for (w, b), a in zip(reversed(layers), reversed(acts)):
            grads_layers[:0] = [grad_z.t().mm(a), grad_z.sum(0)]  # addmm's weight and bias gradients
            grad_a = grad_z.mm(w) if free is None else torch.mm(grad_z, w, out=free)
            free = grad_z if ctx.recompute else None
            grad_z = torch.ops.aten.threshold_backward.grad_input(grad_a, a, 0, grad_input=grad_a)
        grad_e = grad_z.mm(w_e) if need[0] else None
        grad_src = torch.zeros_like(src_proj).index_add_(0, src, grad_z) if need[1] else None
        grad_dst = _sum_at(grad_z, dst, dst_proj.shape[0], ctx.dst_lengths) if need[2] else None
        column_major = w_e.stride(1) == 1 and w_e.stride(0) == w_e.shape[1]  # W_0.t() as addmm saw it
        grad_w_e = grad_z.t().mm(e) if column_major else e.t().mm(grad_z).t()  # autograd's choice of order
        grads_first = [grad_w_e, grad_z.sum(0) if need[9] else None]
        return (grad_e, grad_src, grad_dst, None, None, None, None, None, *grads_first, *grads_layers, grad_gamma, grad_beta)
