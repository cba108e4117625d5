"""The edge MLP of a MeshGraphNet processor step as one Triton kernel, on CUDA GPUs, with TF32 products.

On a GPU the edge MLP is bound by memory traffic, not arithmetic: at latent 64 each of its
operations (two gathers, three GEMMs, two ReLUs, the bias adds, the LayerNorm) reads and writes
an ``(E, 64)`` tensor, about 18 passes over ``E`` rows per forward, and the recomputation in the
backward (:mod:`._edge_mlp`, ``recompute=True``) pays them again. This kernel runs the whole MLP on
a block of edges in registers::

    z = P_s[src] + P_d[dst] + e W_0^T;  a_1 = relu(z);  a_2 = relu(a_1 W_1^T + b_1)
    y = LayerNorm(a_2 W_2^T + b_2)

reading ``e``, the two gathered rows and the weights, and writing ``y`` with the LayerNorm's mean
and ``1/std`` (the forward), or the activations ``a_1, a_2`` and the pre-LayerNorm values that the
backward needs (the backward's recomputation, or a forward that saves them). The backward itself
stays in :mod:`._edge_mlp` (cuBLAS GEMMs).

Its products run on the tensor cores in TF32, so it runs only where the user allowed TF32 for
float32 products (:func:`precision`: ``torch.set_float32_matmul_precision("high")``, which
``train --precision tf32`` sets). In exact float32 Triton computes products on the FMA units, and
the kernel was 3.5x slower than the unfused path on an H200 (``bench/edge_mlp.py``); there it runs
only when asked (``MESHSHARD_TRITON=ieee``, for tests and measurements). Each edge's row is
computed on its own, whatever the block, so a sharded run equals the single-process run to the
precision's rounding.

Used by :func:`~meshshard.nn._edge_mlp.edge_step` and :func:`~meshshard.nn._edge_mlp.edge_mlp`
when :func:`applies`: CUDA tensors (or ``TRITON_INTERPRET=1``, as the tests run it on the CPU),
float32 outside autocast, the node products given (a processor step, not the edge encoder), two
layers after the first (the paper's MLP), widths powers of two from 16 to 128, ``triton``
importable, and a :func:`precision` (``MESHSHARD_TRITON=0`` keeps the unfused path).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
from torch import Tensor

_WIDTHS = (16, 32, 64, 128)


def precision() -> str | None:
    """The precision of the kernel's products, or None where it does not run: ``"tf32"`` where
    float32 matrix products may use TF32 (``torch.set_float32_matmul_precision("high")``, what cuBLAS
    then does too); ``"ieee"`` (exact float32) only when ``MESHSHARD_TRITON=ieee``, since Triton's
    exact float32 products run on the FMA units, not the tensor cores, and the kernel is then slower
    than the unfused path (3.9x on an H200, ``bench/edge_mlp.py``); None with ``MESHSHARD_TRITON=0``
    or in exact float32 otherwise."""
    mode = os.environ.get("MESHSHARD_TRITON", "auto")
    if mode == "0":
        return None
    if mode == "ieee":
        return "ieee"
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _triton() -> Any:
    """The compiled kernel (autotuned over block sizes on a GPU), or None without ``triton``."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def edge_mlp_kernel(
        e_ptr, ps_ptr, pd_ptr, src_ptr, dst_ptr, w0_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, g_ptr, bt_ptr,
        y_ptr, mean_ptr, rstd_ptr, a1_ptr, a2_ptr, z_ptr,
        num_edges, eps, stride_e, stride_ps, stride_pd, stride_w0, stride_w1, stride_w2,
        F: tl.constexpr, H: tl.constexpr, NORM: tl.constexpr, SAVE: tl.constexpr, PREC: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = rows < num_edges
        cols_f = tl.arange(0, F)
        cols_h = tl.arange(0, H)
        live2 = live[:, None]
        out_rows = rows[:, None] * H + cols_h[None, :]
        src = tl.load(src_ptr + rows, mask=live, other=0)
        dst = tl.load(dst_ptr + rows, mask=live, other=0)
        z = tl.load(ps_ptr + src[:, None] * stride_ps + cols_h[None, :], mask=live2, other=0.0)
        z += tl.load(pd_ptr + dst[:, None] * stride_pd + cols_h[None, :], mask=live2, other=0.0)
        e = tl.load(e_ptr + rows[:, None] * stride_e + cols_f[None, :], mask=live2, other=0.0)
        w0t = tl.load(w0_ptr + cols_h[None, :] * stride_w0 + cols_f[:, None])  # (F, H) = W_0^T
        z = tl.dot(e, w0t, acc=z, input_precision=PREC)
        a = tl.maximum(z, 0.0, propagate_nan=tl.PropagateNan.ALL)
        if SAVE:
            tl.store(a1_ptr + out_rows, a, mask=live2)
        w1t = tl.load(w1_ptr + cols_h[None, :] * stride_w1 + cols_h[:, None])
        z = tl.dot(a, w1t, input_precision=PREC) + tl.load(b1_ptr + cols_h)[None, :]
        a = tl.maximum(z, 0.0, propagate_nan=tl.PropagateNan.ALL)
        if SAVE:
            tl.store(a2_ptr + out_rows, a, mask=live2)
        w2t = tl.load(w2_ptr + cols_h[None, :] * stride_w2 + cols_h[:, None])
        z = tl.dot(a, w2t, input_precision=PREC) + tl.load(b2_ptr + cols_h)[None, :]
        if SAVE:
            tl.store(z_ptr + out_rows, z, mask=live2)
        if NORM:
            mean = tl.sum(z, axis=1) / H
            centred = z - mean[:, None]
            rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / H + eps)
            y = centred * rstd[:, None] * tl.load(g_ptr + cols_h)[None, :] + tl.load(bt_ptr + cols_h)[None, :]
            tl.store(y_ptr + out_rows, y, mask=live2)
            tl.store(mean_ptr + rows, mean, mask=live)
            tl.store(rstd_ptr + rows, rstd, mask=live)

    if _interpreting():
        return edge_mlp_kernel, None
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 4), (64, 4), (64, 8), (128, 8))]
    # one block size per width and precision, chosen at the first call (a forward): the backward's
    # recomputation then runs the same blocks, so its pre-LayerNorm values are the forward's
    tuned = triton.autotune(configs, key=["F", "H", "PREC"])(edge_mlp_kernel)
    return edge_mlp_kernel, tuned


def applies(e: Tensor, src_proj: Tensor | None, dst_proj: Tensor | None, params: tuple[Tensor | None, ...],
            half: torch.dtype | None) -> bool:
    """Whether the edge MLP with these inputs runs as the fused kernel (see the module docstring).
    ``params`` as :func:`~meshshard.nn._edge_mlp.edge_mlp` takes them."""
    if half is not None or src_proj is None or dst_proj is None or len(params) != 8 or params[1] is not None:
        return False
    if not (e.is_cuda or _interpreting()) or precision() is None:
        return False
    tensors = (e, src_proj, dst_proj, *(p for p in params if p is not None))
    if any(t.dtype != torch.float32 or t.device != e.device for t in tensors):
        return False
    width, hidden = e.shape[1], params[0].shape[0]
    w0, w1, b1, w2, b2, gamma, beta = (params[0], *params[2:])
    if width not in _WIDTHS or hidden not in _WIDTHS or w0.shape != (hidden, width):
        return False
    if w1.shape != (hidden, hidden) or w2.shape != (hidden, hidden) or any(
            v.shape != (hidden,) or not v.is_contiguous() for v in (b1, b2, gamma, beta)):
        return False
    if src_proj.shape[1] != hidden or dst_proj.shape[1] != hidden:
        return False
    if any(t.stride(1) != 1 for t in (e, src_proj, dst_proj, w0, w1, w2)):
        return False
    return _triton() is not None


def run(e: Tensor, src_proj: Tensor, dst_proj: Tensor, src: Tensor, dst: Tensor, params: tuple[Tensor | None, ...],
        eps: float, norm: bool, save: tuple[Tensor, Tensor, Tensor] | None,
        prec: str) -> tuple[Tensor, Tensor, Tensor] | None:
    """The kernel on every edge: with ``norm``, returns ``(y, mean, rstd)`` (fresh; mean and rstd
    ``(E, 1)``, as ``native_layer_norm`` gives them); with ``save = (a_1, a_2, z)``, ``(E, H)``
    contiguous buffers, writes the activations and the pre-LayerNorm values into them. ``prec``:
    the products' precision (:func:`precision`, taken once per forward, so that the backward's
    recomputation is the forward's). ``applies`` must hold. Shapes as in :func:`~meshshard.nn._edge_mlp.edge_mlp`."""
    plain, tuned = _triton()
    num_edges, width, hidden = e.shape[0], e.shape[1], params[0].shape[0]
    w0, w1, b1, w2, b2, gamma, beta = (params[0], *params[2:])
    out = None
    if norm:
        out = (e.new_empty(num_edges, hidden), e.new_empty(num_edges, 1), e.new_empty(num_edges, 1))
    if num_edges == 0:
        return out
    y, mean, rstd = out if out is not None else (e, e, e)  # not written without norm
    a1, a2, z = save if save is not None else (e, e, e)  # not written without save
    args = (e, src_proj, dst_proj, src, dst, w0, w1, b1, w2, b2, gamma, beta, y, mean, rstd, a1, a2, z,
            num_edges, eps, e.stride(0), src_proj.stride(0), dst_proj.stride(0), w0.stride(0), w1.stride(0),
            w2.stride(0))
    if tuned is None:  # the interpreter: one block size
        plain[(-(-num_edges // 32),)](*args, F=width, H=hidden, NORM=norm, SAVE=save is not None, PREC=prec, BLOCK=32)
    else:
        with torch.cuda.device(e.device):
            tuned[lambda meta: (-(-num_edges // meta["BLOCK"]),)](*args, F=width, H=hidden, NORM=norm,
                                                                  SAVE=save is not None, PREC=prec)
    return out
