"""Ball-query attention in chunks of points: memory linear in points x width, forward and backward.

The dense formulation gathers, for every point ``i``, the keys, values and relative-position
encodings of its ``K`` neighbours: several ``(N, K, width)`` tensors (and the position MLP's
``(N, K, hidden)``), all kept by autograd for the backward. That is most of a step's memory
(about 8 KB per point at width 16 and ``K = 8``).

Here the points are taken in chunks of ``c`` rows (``c * K * width`` at most ``chunk_elements``).
Each point's softmax runs over its own neighbours only, so the chunks are independent: the
forward computes a chunk's output rows ``(c, width)`` from its neighbour tensors and frees them,
and saves for the backward only the inputs (``q`` ``(N, width)``, ``kv`` ``(N_all, 2 width)``, the
positions, the neighbour lists) -- nothing of size ``N * K * width``. The backward (a custom
autograd Function, flash-attention style) recomputes one chunk at a time under autograd,
differentiates it, and returns the gradients of the gathered rows to their rows with
``index_add_``: the adjoint of the gather. Peak memory: the inputs, their gradients, and one
chunk's working set, in the forward and in the backward alike.

The per-point arithmetic is the dense formulation's, operation for operation (gather, position
MLP, ``q . (k + e)``, masked softmax, weighted sum of ``v + e``), so a chunk's rows equal the dense
rows up to the rounding of batched matrix products; the gradients of a row gathered by several
chunks are summed in chunk order. Chunking over neighbours instead (an online softmax: running
maximum, denominator and weighted sum) would still hold ``(N, chunk_of_K, width)`` per step and an
``(N, H, width)`` running state; chunking over points bounds the working set by ``chunk_elements``
whatever ``N``, and needs no rescaling.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["chunked_ball_attention", "CHUNK_ELEMENTS"]

#: Default bound on one chunk's ``points * neighbours * width`` (4M elements: about 16 MB per
#: float32 tensor of the chunk).
CHUNK_ELEMENTS = 1 << 22


def chunk_rows(num_neighbors: int, dim: int, chunk_elements: int) -> int:
    """Points per chunk: ``chunk_elements // (K * dim)``, at least one."""
    return max(1, chunk_elements // max(1, num_neighbors * dim))


def attend_rows(q: Tensor, kv_all: Tensor, pos: Tensor, pos_all: Tensor, index: Tensor, mask: Tensor,
                heads: int, params: tuple[Tensor, ...]) -> Tensor:
    """The attention output of some rows from their own neighbour lists (the dense formulation).

    Shapes: q ``(c, dim)``, kv_all ``(N_all, 2 dim)``, pos ``(c, D)``, pos_all ``(N_all, D)``,
    index, mask ``(c, K)`` (index clamped to valid rows); result ``(c, dim)`` (before ``out``).
    ``params``: the position MLP's ``(w1, b1, w2, b2)``.
    """
    return _attend_gathered(q, kv_all[index], pos_all[index] - pos[:, None, :], mask, heads, params)


def _attend_gathered(q: Tensor, kv: Tensor, rel: Tensor, mask: Tensor, heads: int,
                     params: tuple[Tensor, ...]) -> Tensor:
    """The rows' attention from the gathered ``kv`` ``(c, K, 2 dim)`` and relative positions ``rel`` ``(c, K, D)``."""
    c, k = mask.shape
    dim = q.shape[1]
    width = dim // heads
    w1, b1, w2, b2 = params
    enc = F.linear(F.gelu(F.linear(rel, w1, b1)), w2, b2)  # (c, K, dim): the position MLP
    keys = (kv[..., :dim] + enc).view(c, k, heads, width)
    values = (kv[..., dim:] + enc).view(c, k, heads, width)
    logits = (q.view(c, 1, heads, width) * keys).sum(-1) / math.sqrt(width)  # (c, K, H)
    logits = torch.where(mask[..., None], logits, torch.finfo(logits.dtype).min)
    weights = F.softmax(logits, dim=1) * mask[..., None]  # a point with no neighbour gets 0
    return (weights[..., None] * values).sum(1).reshape(c, dim)


def chunked_ball_attention(q: Tensor, kv_all: Tensor, pos: Tensor, pos_all: Tensor, index: Tensor, mask: Tensor,
                           heads: int, params: tuple[Tensor, ...], chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Ball-query attention of the owned rows, ``chunk_elements`` at a time, forward and backward.

    Args:
        q: queries of the owned points; kv_all: ``[keys, values]`` of owned + ghost points.
        pos, pos_all: coordinates of the owned and of owned + ghost points (the features' dtype).
        index, mask: the neighbour lists in local rows (``-1`` / False in padding slots).
        heads: attention heads.
        params: the position MLP's ``(w1, b1, w2, b2)`` (``Linear``, GELU, ``Linear``).
        chunk_elements: the most ``points * K * dim`` of one chunk.

    Shapes:
        q ``(N_own, dim)``, kv_all ``(N_all, 2 dim)``, pos ``(N_own, D)``, pos_all ``(N_all, D)``,
        index, mask ``(N_own, K)``; result ``(N_own, dim)``.

    Communication: none. Backward: the adjoint of the gathers (``index_add_``), each chunk
    recomputed; not twice differentiable.
    """
    rows = chunk_rows(index.shape[1], q.shape[1], chunk_elements)
    return _ChunkedBallAttention.apply(q, kv_all, pos, pos_all, index.clamp(min=0), mask, heads, rows, *params)


class _ChunkedBallAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, kv_all: Tensor, pos: Tensor, pos_all: Tensor, index: Tensor, mask: Tensor,
                heads: int, rows: int, *params: Tensor) -> Tensor:
        ctx.heads, ctx.rows = heads, rows
        ctx.autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in (q.device.type,)}
        ctx.save_for_backward(q, kv_all, pos, pos_all, index, mask, *params)
        n = q.shape[0]
        if n == 0:
            return q.new_zeros(0, q.shape[1])
        parts = [attend_rows(q[a:a + rows], kv_all, pos[a:a + rows], pos_all, index[a:a + rows], mask[a:a + rows],
                             heads, params) for a in range(0, n, rows)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, kv_all, pos, pos_all, index, mask, *params = ctx.saved_tensors
        need = ctx.needs_input_grad
        want_q, want_kv, want_pos, want_pos_all = need[0], need[1], need[2], need[3]
        want_params = need[8:]
        want_rel = want_pos or want_pos_all
        grad_q = torch.zeros_like(q) if want_q else None
        grad_kv = torch.zeros_like(kv_all) if want_kv else None
        grad_pos = torch.zeros_like(pos) if want_pos else None
        grad_pos_all = torch.zeros_like(pos_all) if want_pos_all else None
        grad_params = [torch.zeros_like(p) if w else None for p, w in zip(params, want_params)]
        (device, (on, dtype)), = ctx.autocast.items()
        d = pos.shape[1]
        for a in range(0, q.shape[0], ctx.rows):
            b = min(a + ctx.rows, q.shape[0])
            nbr = index[a:b]
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=on):
                leaves = [q[a:b].detach().requires_grad_(want_q), kv_all[nbr].detach().requires_grad_(want_kv),
                          (pos_all[nbr] - pos[a:b, None, :]).detach().requires_grad_(want_rel)]
                ps = [p.detach().requires_grad_(bool(w)) for p, w in zip(params, want_params)]
                out = _attend_gathered(leaves[0], leaves[1], leaves[2], mask[a:b], ctx.heads, tuple(ps))
                inputs = [t for t in leaves + ps if t.requires_grad]
                grads = iter(torch.autograd.grad(out, inputs, grad_out[a:b].to(out.dtype), allow_unused=True))
            g_q = next(grads) if want_q else None
            g_kv = next(grads) if want_kv else None
            g_rel = next(grads) if want_rel else None
            if g_q is not None:
                grad_q[a:b] = g_q
            if g_kv is not None:
                grad_kv.index_add_(0, nbr.reshape(-1), g_kv.reshape(-1, g_kv.shape[-1]).to(grad_kv.dtype))
            if g_rel is not None:  # rel = pos_all[nbr] - pos: + to the neighbour's row, - to the point's
                if grad_pos_all is not None:
                    grad_pos_all.index_add_(0, nbr.reshape(-1), g_rel.reshape(-1, d).to(grad_pos_all.dtype))
                if grad_pos is not None:
                    grad_pos[a:b] -= g_rel.sum(1).to(grad_pos.dtype)
            for i, w in enumerate(want_params):
                if w:
                    g = next(grads)
                    if g is not None:
                        grad_params[i] += g.to(grad_params[i].dtype)
        return (grad_q, grad_kv, grad_pos, grad_pos_all, None, None, None, None, *grad_params)
