"""The MeshGraphNet edge MLP and the sum at destinations as autograd Functions that allocate little.

On CPU, each fresh ``(E, L)`` tensor costs its page faults on first touch (large blocks come
straight from ``mmap``), as much as an element-wise pass over it; the edge MLP under autograd makes
one per operation, twice when recomputed. These Functions do the same operations, in the same order
and with the same kernels as autograd, but into a few reused buffers:

- :func:`edge_mlp`: ``LayerNorm(... relu(W_2 relu(W_e e + b + P_s[src] + P_d[dst]) + b_2) ...)``
  keeps its inputs, the LayerNorm statistics and, unless ``recompute``, the hidden activations;
  with ``recompute`` the backward reruns the forward into its buffers first;
- :func:`edge_step`: a processor step's edge half, the edge MLP, the sum of its messages at each
  destination and the residual ``e + message`` in one Function, so that the gradients meeting there
  (of the message, of ``e``) are added into buffers rather than into fresh tensors;
- :func:`scatter_sum`: ``out[i] = sum of message[k] over k with index[k] == i``, which keeps only
  ``index`` (``index_add_`` under autograd keeps the whole ``(E, L)`` message as well).

Their temporaries come from a :class:`Scratch` shared by every edge MLP of one forward and
backward. On the 50k-node benchmark mesh (``bench/meshgraphnet_peers.py``) this took a training
step from about 11.5 s to about 8.5 s on 2 cores: the arithmetic is unchanged, the page faults are
gone.

On a GPU with TF32 products allowed, the MLP's forward (and its recomputation) is one Triton kernel
instead (:mod:`._edge_triton`); the backward is the same.

Sums at destinations take segment lengths (:func:`meshshard._graph.segment_lengths`) when ``dst``
is sorted (as a partition's CSR order leaves it): ``segment_reduce`` over runs of equal ``dst``,
about half the time of ``index_add_`` on CPU, the same values (each row's terms added in edge
order either way).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _edge_triton


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
    scratch: Scratch | None = None,
    release: bool = False,
    half: torch.dtype | None = None,
) -> Tensor:
    """An MLP on edges, ReLU between layers, LayerNorm at the end, its first layer in the lean form.

    ``params`` is ``[W_0, b_0, W_1, b_1, ..., W_k, b_k, gamma, beta]``: ``W_0`` the first layer's
    weight columns for ``e``; ``(W_i, b_i)`` the ``k >= 0`` layers after it. The first layer is
    ``P_s[src] + P_d[dst] + W_0 e`` with ``b_0=None`` (the bias is then in ``P_d``), or
    ``W_0 e + b_0`` with no node products (``src_proj=dst_proj=src=dst=None``: the edge encoder).
    Gradients equal those of the same operations under autograd (autograd's formulas, in its order).
    ``dst_lengths`` (from :func:`meshshard._graph.segment_lengths`, ``dst`` sorted) sums ``P_d``'s gradient by segments.
    Temporaries come from ``scratch`` (a :class:`Scratch` shared with the other edge MLPs of the
    forward); ``release`` clears it at the end of this MLP's backward (the last one to run).
    ``half`` (autocast's dtype, ``e`` and the parameters float32, the node products already in it):
    the linear layers run in it, forward and backward, as under autocast; the LayerNorm, the output
    and the gradients of ``e`` and of the parameters stay float32.

    Shapes:
        e: ``(E, F)``; src_proj: ``(N_rows, H)``; dst_proj: ``(N_dst, H)``; src, dst: ``(E,)``.
        Returns ``(E, H_out)``.
    """
    return _EdgeMLP.apply(e, src_proj, dst_proj, src, dst, dst_lengths, eps, recompute,
                          scratch if scratch is not None else Scratch(), release, half, *params)


def scatter_sum(message: Tensor, index: Tensor, num_rows: int, dtype: torch.dtype,
                lengths: Tensor | None = None) -> Tensor:
    """``zeros(num_rows, H, dtype).index_add_(0, index, message.to(dtype))``, by segments when
    ``lengths`` (:func:`meshshard._graph.segment_lengths`); the backward (``grad[index]``, in
    ``message``'s dtype) keeps only ``index``.

    Shapes:
        message: ``(E, H)``; index: ``(E,)`` in ``[0, num_rows)``. Returns ``(num_rows, H)``.
    """
    return _ScatterSum.apply(message, index, num_rows, dtype, lengths)


class _ScatterSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, message: Tensor, index: Tensor, num_rows: int, dtype: torch.dtype,
                lengths: Tensor | None) -> Tensor:
        ctx.save_for_backward(index)
        ctx.message_dtype = message.dtype
        return _sum_at(message.to(dtype), index, num_rows, lengths)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index).to(ctx.message_dtype), None, None, None, None


class Scratch:
    """Reusable ``(rows, cols)`` buffers for the temporaries of :func:`edge_mlp` and :func:`edge_step`.

    On CPU a fresh ``(E, H)`` tensor pays a page fault per 4 KiB page on first touch (large blocks
    come straight from ``mmap`` and go back to the system when freed), which costs as much as the
    operation that fills it. One ``Scratch`` shared by the edge MLPs of one forward and backward
    hands each temporary buffer to the next Function that needs one of its shape, so a step's
    working set is faulted in once. A buffer is given back only when nothing else refers to it
    (never an output, never a tensor saved for the backward). :meth:`clear` lets the buffers go;
    the last edge MLP of a backward (the edge encoder's) calls it.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[int, int, torch.dtype, torch.device], list[Tensor]] = {}
        self.handed: Tensor | None = None  # the gradient of e last handed down a chain of edge steps

    def take(self, rows: int, cols: int, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """A ``(rows, cols)`` buffer of ``like``'s device and of ``dtype`` (default ``like``'s),
        contents undefined."""
        dtype = like.dtype if dtype is None else dtype
        free = self._free.get((rows, cols, dtype, like.device))
        return free.pop() if free else like.new_empty(rows, cols, dtype=dtype)

    def give(self, *buffers: Tensor | None) -> None:
        """Hand back buffers that nothing else refers to any more."""
        for b in buffers:
            if b is not None:
                self._free.setdefault((b.shape[0], b.shape[1], b.dtype, b.device), []).append(b)

    def clear(self) -> None:
        self._free.clear()
        self.handed = None


def _first_layer(e: Tensor, src_proj: Tensor | None, dst_proj: Tensor | None, src: Tensor, dst: Tensor, w: Tensor,
                 b: Tensor | None, scratch: Scratch, half: torch.dtype | None = None) -> tuple[Tensor, Tensor | None]:
    """``P_s[src] + P_d[dst] + W_0 e`` (the GEMM accumulates into the gathered sum: no bias pass;
    ``b`` is then inside ``P_d``), or ``W_0 e + b`` without node products; and the spare buffer.
    With ``half`` (autocast's dtype; ``e`` and the node products already in it) ``W_0`` and ``b``
    are cast to it, as autocast runs ``F.linear``."""
    if half is not None:
        w, b = w.to(half), None if b is None else b.to(half)
    rows, cols = e.shape[0], w.shape[0]
    if src_proj is None:
        return torch.addmm(b, e, w.t(), out=scratch.take(rows, cols, e)), None
    z = torch.index_select(src_proj, 0, src, out=scratch.take(rows, cols, src_proj))
    spare = torch.index_select(dst_proj, 0, dst, out=scratch.take(rows, cols, dst_proj))
    return z.add_(spare).addmm_(e, w.t()), spare


def _hidden(z: Tensor, spare: Tensor | None, layers: list[tuple[Tensor, Tensor]], keep: bool,
            scratch: Scratch) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """ReLU then each ``(W_i, b_i)`` from the first layer's output ``z``: the last pre-LayerNorm
    values, the ReLU outputs (each in its own buffer when ``keep``, else ping-ponged between two)
    and the buffer left spare."""
    acts = []
    for w, b in layers:
        a = z.relu_()
        acts.append(a)
        out = spare if spare is not None else scratch.take(a.shape[0], w.shape[0], a)
        z = torch.addmm(b, a, w.t(), out=out)
        spare = None if keep else a
    return z, acts, spare


def _layers(params: tuple[Tensor | None, ...], half: torch.dtype | None) -> list[tuple[Tensor, Tensor]]:
    """The ``(W_i, b_i)`` after the first layer, cast to ``half`` when given (as autocast casts them)."""
    layers = list(zip(params[2:-2:2], params[3:-2:2]))
    return layers if half is None else [(w.to(half), b.to(half)) for w, b in layers]


def _as_float(z: Tensor, dtype: torch.dtype, scratch: Scratch) -> Tensor:
    """``z`` in ``dtype`` (a scratch copy when it differs): the LayerNorm runs in ``e``'s dtype."""
    return z if z.dtype == dtype else scratch.take(*z.shape, z, dtype).copy_(z)


def _forward(ctx: Any, e: Tensor, src_proj: Tensor | None, dst_proj: Tensor | None, src: Tensor | None,
             dst: Tensor | None, dst_lengths: Tensor | None, eps: float, recompute: bool, scratch: Scratch,
             params: tuple[Tensor | None, ...], half: torch.dtype | None = None) -> Tensor:
    """The MLP's forward (its output a fresh tensor), what the backward needs saved on ``ctx``.
    ``half``: the linear layers in that dtype (autocast's), the LayerNorm in ``e``'s; only ``e``
    cast to ``half`` is kept for the backward (all that the first layer's gradients need)."""
    w_e, b_0, gamma, beta = params[0], params[1], params[-2], params[-1]
    layers = _layers(params, half)
    ctx.e_dtype = e.dtype
    if half is not None:
        e = e.to(half)
    ctx.fused = _edge_triton.precision() if _edge_triton.applies(e, src_proj, dst_proj, params, half) else None
    if ctx.fused:  # one kernel on a GPU (see _edge_triton); saving its activations unless recompute
        kept = None if recompute else tuple(e.new_empty(e.shape[0], w_e.shape[0]) for _ in range(3))
        y, mean, rstd = _edge_triton.run(e, src_proj, dst_proj, src, dst, params, eps, True, kept, ctx.fused)
        z, acts = (None, []) if kept is None else (kept[2], list(kept[:2]))
    else:
        z, spare = _first_layer(e, src_proj, dst_proj, src, dst, w_e, b_0, scratch, half)
        z, acts, spare = _hidden(z, spare, layers, not recompute, scratch)
        z_norm = _as_float(z, ctx.e_dtype, scratch)
        y, mean, rstd = torch.native_layer_norm(z_norm, [z.shape[1]], gamma, beta, eps)
        if z_norm is not z:
            scratch.give(z_norm)
        if recompute:
            scratch.give(z, spare)  # the two buffers of the ping-pong (or z alone)
    ctx.eps, ctx.recompute, ctx.num_params, ctx.scratch, ctx.half = eps, recompute, len(params), scratch, half
    ctx.dst_lengths = dst_lengths  # (N_dst,) counts, or None
    ctx.save_for_backward(e, src_proj, dst_proj, src, dst, mean, rstd, *params, *(() if recompute else (z, *acts)))
    return y


def _backward(ctx: Any, saved: tuple[Tensor, ...], grad_y: Tensor, own_grad_y: bool, residual: Tensor | None = None,
              own_residual: bool = False) -> tuple[tuple[Tensor | None, ...], Tensor | None]:
    """The MLP's backward from ``grad_y`` (a :class:`Scratch` buffer to give back when
    ``own_grad_y``), ``saved`` being ``ctx.saved_tensors`` (read once): the gradients of
    ``(src_proj, dst_proj, *params)``, and the gradient of ``e``: ``residual + grad_z @ W_0``
    (``residual`` is the gradient reaching ``e`` by another path, or None), written into
    ``residual`` when ``own_residual``, else into a buffer taken from the scratch and not given back.
    With ``ctx.half`` the linear layers' gradients are computed in it (as under autocast) and the
    parameters' gradients returned in the parameters' dtype."""
    scratch, half = ctx.scratch, ctx.half
    e, src_proj, dst_proj, src, dst, mean, rstd = saved[:7]
    params = saved[7 : 7 + ctx.num_params]
    w_e, b_0, gamma, beta = params[0], params[1], params[-2], params[-1]
    layers = _layers(params, half)
    if ctx.recompute and ctx.fused:
        rows, width = e.shape[0], w_e.shape[0]
        a_1, a_2, z = (scratch.take(rows, width, e) for _ in range(3))
        _edge_triton.run(e, src_proj, dst_proj, src, dst, params, ctx.eps, False, (a_1, a_2, z), ctx.fused)
        acts = [a_1, a_2]
    elif ctx.recompute:
        z, spare = _first_layer(e, src_proj, dst_proj, src, dst, w_e, b_0, scratch, half)
        z, acts, _ = _hidden(z, spare, layers, True, scratch)
    else:
        z, acts = saved[7 + ctx.num_params], list(saved[8 + ctx.num_params :])
    need = ctx.needs_input_grad
    z_norm = _as_float(z, ctx.e_dtype, scratch)
    grad_z, grad_gamma, grad_beta = torch.ops.aten.native_layer_norm_backward(
        grad_y, z_norm, [z.shape[1]], mean, rstd, gamma, beta, [True, need[-2], need[-1]]
    )
    free = z if ctx.recompute else None  # the pre-LayerNorm buffer, no longer needed
    if z_norm is not z:  # back to the linear layers' dtype
        scratch.give(z_norm)
        grad_z = scratch.take(*grad_z.shape, grad_z, z.dtype).copy_(grad_z)
        if own_grad_y:
            scratch.give(grad_y)
    elif own_grad_y:
        free, spent = grad_y, free
        scratch.give(spent)
    grads_layers: list[Tensor | None] = []
    for (w, b), a in zip(reversed(layers), reversed(acts)):
        grads_layers[:0] = [grad_z.t().mm(a), grad_z.sum(0)]  # addmm's weight and bias gradients
        grad_a = torch.mm(grad_z, w,
                          out=free if free is not None else scratch.take(grad_z.shape[0], w.shape[1], grad_z))
        free = grad_z
        grad_z = torch.ops.aten.threshold_backward.grad_input(grad_a, a, 0, grad_input=grad_a)
    if not need[0]:
        grad_e = None
    elif half is not None:  # grad_z @ W_0 in half precision, added in e's dtype
        part = torch.mm(grad_z, w_e.to(half), out=scratch.take(grad_z.shape[0], w_e.shape[1], grad_z))
        if own_residual:
            grad_e = residual.add_(part)
        else:
            out = scratch.take(grad_z.shape[0], w_e.shape[1], grad_z, ctx.e_dtype)
            grad_e = out.copy_(part) if residual is None else torch.add(residual, part, out=out)
        scratch.give(part)
    elif own_residual:
        grad_e = residual.addmm_(grad_z, w_e)
    else:
        out = scratch.take(grad_z.shape[0], w_e.shape[1], grad_z)
        grad_e = torch.mm(grad_z, w_e, out=out) if residual is None else torch.addmm(residual, grad_z, w_e, out=out)
    grad_src = torch.zeros_like(src_proj).index_add_(0, src, grad_z) if need[1] else None
    grad_dst = _sum_at(grad_z, dst, dst_proj.shape[0], ctx.dst_lengths) if need[2] else None
    grad_w_e = e.t().mm(grad_z).t()  # (e^T grad_z)^T: 8x faster than grad_z^T e for a narrow e (4 edge features)
    grads_first = [grad_w_e, grad_z.sum(0) if need[-ctx.num_params + 1] else None]
    scratch.give(grad_z, free, *(acts if ctx.recompute else ()))
    grads = [*grads_first, *grads_layers, grad_gamma, grad_beta]
    if half is not None:  # as autocast's casts do in their backward: to the parameters' dtype
        grads = [g if g is None or p is None or g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(grads, params)]
    return (grad_src, grad_dst, *grads), grad_e


class _EdgeMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, e: Tensor, src_proj: Tensor | None, dst_proj: Tensor | None, src: Tensor | None,
                dst: Tensor | None, dst_lengths: Tensor | None, eps: float, recompute: bool, scratch: Scratch,
                release: bool, half: torch.dtype | None, *params: Tensor | None) -> Tensor:
        ctx.release = release
        with torch.autocast(e.device.type, enabled=False):  # the dtypes are chosen here (half), not by autocast
            return _forward(ctx, e, src_proj, dst_proj, src, dst, dst_lengths, eps, recompute, scratch, params, half)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        (grad_src, grad_dst, *grads_params), grad_e = _backward(ctx, ctx.saved_tensors, grad_y, own_grad_y=False)
        if ctx.release:
            ctx.scratch.clear()
        return (grad_e, grad_src, grad_dst, None, None, None, None, None, None, None, None, *grads_params)


class _EdgeStep(torch.autograd.Function):
    """``y = edge MLP``; returns ``(e + y, sum of y at dst)``. The backward builds the message's
    gradient ``grad_e_next + grad_aggregate[dst]`` in a scratch buffer (autograd would add the two
    into a fresh tensor, and gather into another) and the gradient of ``e`` as
    ``grad_e_next + grad_z @ W_0``: in a chain of steps (``chain``, see :func:`edge_step`), into
    ``grad_e_next`` itself when that is the buffer the step after this one handed back, and
    nothing but autograd holds it (:func:`_sole_holder`)."""

    @staticmethod
    def forward(ctx: Any, e: Tensor, src_proj: Tensor, dst_proj: Tensor, src: Tensor, dst: Tensor,
                dst_lengths: Tensor | None, num_dst: int, acc: torch.dtype, eps: float, recompute: bool,
                scratch: Scratch, chain: bool, half: torch.dtype | None,
                *params: Tensor | None) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.chain = chain
        with torch.autocast(e.device.type, enabled=False):  # the dtypes are chosen here (half), not by autocast
            y = _forward(ctx, e, src_proj, dst_proj, src, dst, dst_lengths, eps, recompute, scratch, params, half)
            aggregate = _sum_at(y.to(acc), dst, num_dst, dst_lengths)
            return y.add_(e), aggregate

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_next: Tensor | None, grad_aggregate: Tensor | None) -> tuple[Tensor | None, ...]:
        refs = sys.getrefcount(grad_next)  # first: before this frame adds any name for it
        none = (None,) * (13 + ctx.num_params)
        if grad_next is None and grad_aggregate is None:
            return none
        scratch = ctx.scratch
        handed = ctx.chain and grad_next is not None and grad_next is scratch.handed
        if handed and _CALIBRATION is not None:
            _CALIBRATION.append(refs)
        own_next = handed and _CALIBRATION is None and refs <= _sole_holder_refs() and grad_next.is_contiguous()
        saved = ctx.saved_tensors
        dst, dtype = saved[4], ctx.e_dtype  # the message's dtype: e's (saved[0] may be e in half precision)
        if grad_aggregate is None:
            grad_y = scratch.take(*grad_next.shape, grad_next).copy_(grad_next)
        elif grad_aggregate.dtype == dtype:
            grad_y = torch.index_select(grad_aggregate, 0, dst,
                                        out=scratch.take(len(dst), grad_aggregate.shape[1], grad_aggregate))
        else:  # half-precision messages, float32 sums: as autograd, gather then cast
            grad_y = (scratch.take(len(dst), grad_aggregate.shape[1], grad_aggregate, dtype)
                      .copy_(grad_aggregate.index_select(0, dst)))
        if grad_next is not None and grad_aggregate is not None:
            grad_y.add_(grad_next)
        (grad_src, grad_dst, *grads_params), grad_e = _backward(ctx, saved, grad_y, True, grad_next, own_next)
        if ctx.chain:
            scratch.handed = grad_e
        return (grad_e, grad_src, grad_dst, *none[3:13], *grads_params)


#: While :func:`_sole_holder_refs` measures: the reference counts seen, else None.
_CALIBRATION: list[int] | None = None


@functools.cache
def _sole_holder_refs() -> int:
    """``sys.getrefcount`` of the gradient of ``e`` on entry to :meth:`_EdgeStep.backward` when
    only autograd and the scratch hold it: measured once, on a chain of two tiny steps, because
    it depends on the Python and torch versions. A larger count at run time means someone else
    (a tensor hook that kept the gradient, say) holds it too, and it is then not written into."""
    global _CALIBRATION
    _CALIBRATION = []
    try:
        with torch.enable_grad(), torch.autocast("cpu", enabled=False):
            gen = torch.Generator().manual_seed(0)
            e = torch.randn(3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
            proj = torch.randn(2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
            params = [torch.randn(2, 2, generator=gen, dtype=torch.float64, requires_grad=True), None,
                      torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
            src, dst = torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1])
            scratch = Scratch()
            out, total = e, 0
            for _ in range(2):
                out, aggregate = edge_step(out, proj, proj, src, dst, 2, torch.float64, params, 1e-5, True, None,
                                           scratch, chain=True)
                total = total + aggregate.sum()
            total.backward()
        if not _CALIBRATION:
            raise RuntimeError("calibrating the edge-gradient chain: the gradient handed back was not seen")
        return _CALIBRATION[0]
    finally:
        _CALIBRATION = None


def edge_step(
    e: Tensor, src_proj: Tensor, dst_proj: Tensor, src: Tensor, dst: Tensor, num_dst: int, acc: torch.dtype,
    params: list[Tensor | None], eps: float, recompute: bool, dst_lengths: Tensor | None = None,
    scratch: Scratch | None = None,
    chain: bool = False,
    half: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """A processor step's edge half: the message ``y = edge_mlp(e, src_proj, dst_proj, ...)``
    (see :func:`edge_mlp`), returned as ``(e + y, sum of y at each destination in dtype acc)``.

    Equal, values and gradients, to ``y = edge_mlp(...)``, ``scatter_sum(y, dst, num_dst, acc)``,
    ``y + e`` under autograd, with two fewer fresh ``(E, H)`` tensors in the forward and about six
    fewer in the backward (buffers from ``scratch``). ``chain``: the steps sharing ``scratch`` form
    a chain in which each step's ``e + y`` is only the next step's ``e`` (MeshGraphNet's processor);
    the gradient of ``e`` is then one buffer, handed down the chain and added into. ``half``: as in
    :func:`edge_mlp`.

    Shapes:
        e: ``(E, L)``; src_proj: ``(N_rows, L)``; dst_proj: ``(num_dst, L)``; src, dst: ``(E,)``.
        Returns ``(E, L)`` and ``(num_dst, L)``.
    """
    if chain and torch.is_grad_enabled() and _CALIBRATION is None:
        _sole_holder_refs()  # measured once per process, here rather than inside a backward
    return _EdgeStep.apply(e, src_proj, dst_proj, src, dst, dst_lengths, num_dst, acc, eps, recompute,
                           scratch if scratch is not None else Scratch(), chain, half, *params)
