"""Ball-query attention in chunks of points: memory linear in points x width, forward and backward.

The dense formulation gathers, for every point ``i``, the keys, values and relative-position
encodings of its ``K`` neighbours: several ``(N, K, width)`` tensors (and the position MLP's
``(N, K, hidden)``), all kept by autograd for the backward. That is most of a step's memory
(about 8 KB per point at width 16 and ``K = 8``).

Here the whole layer but its halo exchange (the projections ``q``, ``[k, v]`` and ``out``, the
position MLP, the masked softmax) is one autograd Function that takes the points in chunks of
``c`` rows (``c * K * width`` at most ``chunk_elements``). Each point's softmax runs over its own
neighbours only, so the chunks are independent: the forward projects a chunk's queries, gathers its
neighbours' input rows and projects them to keys and values there, computes the chunk's output rows
``(c, out_dim)`` and frees everything else. It saves for the backward only its input (the halo'd
``[x, pos]``, ``(N_all, width + D)``, which nothing else keeps) and the weights: no queries, keys
or values of all points, no attention output, nothing of size ``N * K * width``. The backward (flash-attention
style) recomputes one chunk at a time under autograd, differentiates it, and returns the gradients
of the gathered rows to their rows with ``index_add_`` (the adjoint of the gather). Peak memory: the
input, its gradient and one chunk's working set, in the forward and in the backward alike.

The per-point arithmetic is the dense formulation's, operation for operation (projection, gather,
position MLP, ``q . (k + e)``, masked softmax, weighted sum of ``v + e``, output projection), except
that the keys and values are projected from the gathered rows (a row's projection is computed once
per neighbour slot that gathers it, not once): the same numbers up to the rounding of batched matrix
products. The gradients of a row gathered by several chunks are summed in chunk order.

Why chunks of points, not of neighbours: an online softmax over neighbour chunks (running maximum,
denominator and weighted sum, as flash attention does over keys) fits attention over *all* keys,
where a query's keys do not fit at once. Here a point has at most ``K`` neighbours (8 to 64), so a
chunk of points holds all of its points' neighbours, needs no running statistics or rescaling, and
bounds the working set by ``chunk_elements`` whatever ``N``; an online softmax would add an ``(N, H)``
state and an ``(N, width)`` accumulator for nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["chunked_ball_attention", "CHUNK_ELEMENTS"]

#: Default bound on one chunk's ``points * neighbours * width`` (1M elements: 4 MB per float32
#: tensor of the chunk; the backward's working set is a few tens of them, a constant whatever the
#: points). At 200k points, width 16, 8 neighbours: 4M elements peaked 300 MB higher, at the same
#: speed (1M: 8,192 points per chunk). Far smaller chunks run many small operations: on a 2-core
#: machine at load 25, 256K took 5x the time of 4M.
CHUNK_ELEMENTS = 1 << 20


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


def _chunk(x_own: Tensor, x_nbr: Tensor, rel: Tensor, mask: Tensor, heads: int, weights: tuple) -> Tensor:
    """One chunk's output rows from its own input rows, its neighbours' input rows and relative positions.

    Shapes: x_own ``(c, dim)``, x_nbr ``(c, K, dim)``, rel ``(c, K, D)``, mask ``(c, K)``; result
    ``(c, out_dim)``. ``weights``: ``(wq, bq, wkv, bkv, w1, b1, w2, b2, wo, bo)`` (biases may be None).
    """
    wq, bq, wkv, bkv, w1, b1, w2, b2, wo, bo = weights
    out = _attend_gathered(F.linear(x_own, wq, bq), F.linear(x_nbr, wkv, bkv), rel, mask, heads, (w1, b1, w2, b2))
    return F.linear(out, wo, bo)


def chunked_ball_attention(both: Tensor, num_owned: int, index: Tensor, mask: Tensor, heads: int,
                           weights: tuple[Tensor | None, ...], chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Ball-query attention of the owned rows, projections included, ``chunk_elements`` at a time.

    Args:
        both: ``[x, pos]`` of the owned then the ghost points (the halo'd input: features, then
            coordinates in the features' dtype); the first ``num_owned`` rows are the owned points.
        num_owned: ``N_own``.
        index, mask: the neighbour lists in local rows (``-1`` / False in padding slots).
        heads: attention heads.
        weights: ``(wq, bq, wkv, bkv, w1, b1, w2, b2, wo, bo)``: the query, key-value and output
            ``Linear``s and the position MLP's (``Linear``, GELU, ``Linear``); biases may be None.
        chunk_elements: the most ``points * K * dim`` of one chunk.

    Shapes:
        both ``(N_all, dim + D)``, index, mask ``(N_own, K)``; result ``(N_own, out_dim)``.

    Communication: none. Backward: the adjoint of the gathers (``index_add_``), each chunk
    recomputed; not twice differentiable.
    """
    dim = weights[0].shape[1]
    rows = chunk_rows(index.shape[1], dim, chunk_elements)
    return _ChunkedBallAttention.apply(both, index, mask, num_owned, heads, rows, *weights)


def _gather(both: Tensor, index: Tensor, a: int, b: int, dim: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rows ``a:b``: their features, their neighbours' features and relative positions, their neighbour rows."""
    nbr = index[a:b].clamp(min=0)
    gathered = both[nbr]  # (c, K, dim + D)
    return both[a:b, :dim], gathered[..., :dim], gathered[..., dim:] - both[a:b, None, dim:], nbr


class _ChunkedBallAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, both: Tensor, index: Tensor, mask: Tensor, num_owned: int, heads: int, rows: int,
                *weights: Tensor | None) -> Tensor:
        ctx.heads, ctx.rows, ctx.num_owned = heads, rows, num_owned
        ctx.autocast = (both.device.type, torch.is_autocast_enabled(both.device.type),
                        torch.get_autocast_dtype(both.device.type))
        ctx.has = [w is not None for w in weights]
        ctx.save_for_backward(both, index, mask, *[w for w in weights if w is not None])
        dim = weights[0].shape[1]
        parts = []
        for a in range(0, num_owned, rows):
            b = min(a + rows, num_owned)
            x_own, x_nbr, rel, _ = _gather(both, index, a, b, dim)
            parts.append(_chunk(x_own, x_nbr, rel, mask[a:b], heads, weights))
        if not parts:
            out_dim = weights[8].shape[0]
            dtype = torch.get_autocast_dtype(both.device.type) if ctx.autocast[1] else both.dtype
            return both.new_zeros(0, out_dim, dtype=dtype)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        both, index, mask, *present = ctx.saved_tensors
        given = iter(present)
        weights = [next(given) if h else None for h in ctx.has]
        want_both = ctx.needs_input_grad[0]
        want_w = [w is not None and bool(n) for w, n in zip(weights, ctx.needs_input_grad[6:])]
        grad_both = torch.zeros_like(both) if want_both else None
        grad_w = [torch.zeros_like(w) if want else None for w, want in zip(weights, want_w)]
        device, on, dtype = ctx.autocast
        dim = weights[0].shape[1]
        for a in range(0, ctx.num_owned, ctx.rows):
            b = min(a + ctx.rows, ctx.num_owned)
            x_own, x_nbr, rel, nbr = _gather(both, index, a, b, dim)
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=on):
                leaves = [t.detach().requires_grad_(want_both) for t in (x_own, x_nbr, rel)]
                ws = [w if w is None else w.detach().requires_grad_(want) for w, want in zip(weights, want_w)]
                out = _chunk(*leaves, mask[a:b], ctx.heads, tuple(ws))
                inputs = [t for t in leaves + ws if t is not None and t.requires_grad]
                grads = iter(torch.autograd.grad(out, inputs, grad_out[a:b].to(out.dtype), allow_unused=True))
            if want_both:
                g_own, g_nbr, g_rel = next(grads), next(grads), next(grads)
                flat = nbr.reshape(-1)
                grad_both[a:b, :dim] += g_own.to(both.dtype)
                grad_both.index_add_(0, flat, torch.cat([g_nbr, g_rel], -1).reshape(flat.numel(), -1).to(both.dtype))
                grad_both[a:b, dim:] -= g_rel.sum(1).to(both.dtype)  # rel = pos[nbr] - pos[row]
            for i, want in enumerate(want_w):
                if want:
                    g = next(grads)
                    if g is not None:
                        grad_w[i] += g.to(grad_w[i].dtype)
        return (grad_both, None, None, None, None, None, *grad_w)
