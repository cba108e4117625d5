"""Ball-query attention in chunks of points: memory linear in points x width, forward and backward.

The dense formulation gathers, for every point ``i``, the keys, values and relative-position
encodings of its ``K`` neighbours: several ``(N, K, width)`` tensors (and the position MLP's
``(N, K, hidden)``), all kept by autograd for the backward. That is most of a step's memory
(about 8 KB per point at width 16 and ``K = 8``).

Here the whole layer but its halo exchange (the projections ``q``, ``[k, v]`` and ``out``, the
position MLP, the masked softmax) is one autograd Function that takes the points in chunks of
``c`` rows (``c * K * width`` at most ``chunk_elements``). Each point's softmax runs over its own
neighbours only, so the chunks are independent. The forward projects the queries of the owned
points and the keys and values of all points once (``(N_all, 3 width)``), computes each chunk's
rows from them and frees them with the chunk's tensors: it saves for the backward only its input
(the halo'd ``[x, pos]``, ``(N_all, width + D)``, which nothing else keeps) and the weights: no
queries, keys or values, no attention output, nothing of size ``N * K * width``. The backward
(flash-attention style) projects the queries, keys and values once more (held during the backward
only, with their gradients: about ``6 width`` floats per point), recomputes one chunk at a time
under autograd, differentiates it, returns the gradients of the gathered rows to their rows with
``index_add_`` (the adjoint of the gather), and differentiates the projections once at the end.
Peak memory: the input, the projections, their gradients and one chunk's working set.

The per-point arithmetic is the dense formulation's, operation for operation (projection, gather,
position MLP, ``q . (k + e)``, masked softmax, weighted sum of ``v + e``, output projection): the
same numbers up to the rounding of batched matrix products. The gradients of a row gathered by
several chunks are summed in chunk order. (Projecting the keys and values from the gathered rows
inside each chunk instead keeps nothing per point in the backward either, but computes a row's
projection once per neighbour slot: at 200k points it made the training step 3.6x the one-pass
path's time, see ``docs/benchmarks.md``.)

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

#: Default bound on one chunk's ``points * neighbours * width`` (4M elements: 16 MB per float32
#: tensor of the chunk; the backward's working set is a few tens of them, a constant whatever the
#: points). Fewer, larger operations: at 100k points, width 16, 8 neighbours, on a 2-core machine at
#: load 7, forward + backward took 1.0x / 1.8x / 2.7x the time of 4eac3e7's chunked path with chunks
#: of 4M / 2M / 1M elements (1M chunks peak 300-450 MB lower at 200k points: docs/benchmarks.md).
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


def _project(both: Tensor, num_owned: int, weights: tuple) -> tuple[Tensor, Tensor]:
    """The queries of the owned rows ``(N_own, dim)`` and ``[keys, values]`` of all rows ``(N_all, 2 dim)``."""
    wq, bq, wkv, bkv = weights[:4]
    x_all = both[:, : wq.shape[1]]
    return F.linear(x_all[:num_owned], wq, bq), F.linear(x_all, wkv, bkv)


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

    Communication: none. Backward: the projections recomputed once, each chunk recomputed, the
    adjoint of the gathers (``index_add_``); not twice differentiable.
    """
    dim = weights[0].shape[1]
    rows = chunk_rows(index.shape[1], dim, chunk_elements)
    return _ChunkedBallAttention.apply(both, index.clamp(min=0), mask, num_owned, heads, rows, *weights)


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
        q, kv = _project(both, num_owned, weights)  # once per point; freed when the forward returns
        pos_all = both[:, dim:]
        pos_mlp = weights[4:8]
        pos_own = pos_all[:num_owned]
        parts = [attend_rows(q[a:a + rows], kv, pos_own[a:a + rows], pos_all, index[a:a + rows], mask[a:a + rows],
                             heads, pos_mlp) for a in range(0, num_owned, rows)]
        if not parts:
            parts = [q[:0]]
        attended = parts[0] if len(parts) == 1 else torch.cat(parts)
        return F.linear(attended, weights[8], weights[9])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        both, index, mask, *present = ctx.saved_tensors
        given = iter(present)
        weights = [next(given) if h else None for h in ctx.has]
        want_both = ctx.needs_input_grad[0]
        want_w = [w is not None and bool(n) for w, n in zip(weights, ctx.needs_input_grad[6:])]
        device, on, dtype = ctx.autocast
        n, dim = ctx.num_owned, weights[0].shape[1]
        with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=on):
            # the projections, recomputed once per point and differentiated once, after the chunks
            proj_in = [both.detach().requires_grad_(want_both)]
            proj_w = [w if w is None else w.detach().requires_grad_(want) for w, want in zip(weights[:4], want_w[:4])]
            q, kv = _project(proj_in[0], n, tuple(proj_w))
        grad_q, grad_kv = torch.zeros_like(q), torch.zeros_like(kv)
        grad_both = torch.zeros_like(both) if want_both else None
        grad_w = [torch.zeros_like(w) if want else None for w, want in zip(weights, want_w)]
        pos_all = both[:, dim:]
        for a in range(0, n, ctx.rows):
            b = min(a + ctx.rows, n)
            nbr = index[a:b]
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=on):
                leaves = [q[a:b].detach().requires_grad_(), kv.detach()[nbr].requires_grad_(),
                          (pos_all[nbr] - pos_all[a:b, None, :]).detach().requires_grad_(want_both)]
                ws = [w if w is None else w.detach().requires_grad_(want) for w, want in zip(weights[4:], want_w[4:])]
                out = F.linear(_attend_gathered(*leaves, mask[a:b], ctx.heads, tuple(ws[:4])), ws[4], ws[5])
                inputs = [t for t in leaves + ws if t is not None and t.requires_grad]
                grads = iter(torch.autograd.grad(out, inputs, grad_out[a:b].to(out.dtype), allow_unused=True))
            flat = nbr.reshape(-1)
            grad_q[a:b] = next(grads)
            grad_kv.index_add_(0, flat, next(grads).reshape(flat.numel(), -1).to(grad_kv.dtype))
            if want_both:  # rel = pos[nbr] - pos[row]: + to the neighbour's row, - to the point's
                g_rel = next(grads).to(both.dtype)
                grad_both[:, dim:].index_add_(0, flat, g_rel.reshape(flat.numel(), -1))
                grad_both[a:b, dim:] -= g_rel.sum(1)
            for i, want in enumerate(want_w[4:], 4):
                if want:
                    g = next(grads)
                    if g is not None:
                        grad_w[i] += g.to(grad_w[i].dtype)
        inputs = [t for t in proj_in + proj_w if t is not None and t.requires_grad]
        if inputs:
            with torch.enable_grad():
                grads = iter(torch.autograd.grad((q, kv), inputs, (grad_q, grad_kv), allow_unused=True))
            if want_both:
                grad_both += next(grads)
            for i, want in enumerate(want_w[:4]):
                if want:
                    g = next(grads)
                    if g is not None:
                        grad_w[i] += g.to(grad_w[i].dtype)
        return (grad_both, None, None, None, None, None, *grad_w)
