"""Grid layers on :class:`~meshshard.GridTensor`: convolutions, pools and upsampling, each the
ordinary ``torch.nn`` layer run on a rank's box grown by a halo.

Each wrapper holds the very parameters of the layer it wraps, under the same names, so a model's
``state_dict`` is unchanged by :func:`shard_grid_layers`, and on a plain tensor it runs the
wrapped layer's computation. On a :class:`~meshshard.GridTensor` it reads the window of input
points its owned outputs need (one halo exchange, padding applied where the window leaves the
grid), then runs the layer's function with no padding on the window (a convolution: on the box
itself for the interior, on thin windows for the frame around it). So the result and every
gradient equal the layer on the whole grid; the adjoint of the exchange returns the gradients of
ghost copies to their owners. Replicated parameters get each rank's contribution to their
gradient: sum them over ranks (:func:`meshshard.comm.sum_gradients`).

Output layouts: rank ``r`` computes the outputs of its own box. A stride ``s`` (pools) needs
``s`` to divide every shard size; an output smaller or larger than the input (a ``"valid"`` or an
even-sized kernel) changes the last box along that dim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from meshshard.partition import GridLayout

from .._grid_tensor import GridTensor, _Place

__all__ = ["GridConv", "GridPool", "GridUpsample", "shard_grid_layers"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _tuple(value: Any, d: int) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, (tuple, list)) else (int(value),) * d


def _check_dims(layer: str, x: GridTensor, d: int) -> None:
    if x.layout.ndim != d:
        raise ValueError(f"Expected a GridTensor with {d} spatial dims for {layer} "
                         f"(got {x.layout.ndim}, local shape {tuple(x.shape)})")


def _windows(layout: GridLayout, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilation: tuple[int, ...], lo: tuple[int, ...], hi: tuple[int, ...], layer: str
             ) -> tuple[np.ndarray, np.ndarray, GridLayout]:
    """Every rank's input window and the output layout of a sliding-window layer."""
    out_splits = []
    for k, n in enumerate(layout.shape):
        extent = dilation[k] * (kernel[k] - 1) + 1
        n_out = (n + lo[k] + hi[k] - extent) // stride[k] + 1
        if n_out < 1:
            raise ValueError(f"Expected {layer}'s window ({extent} points) to fit the grid plus "
                             f"padding along spatial dim {k} (size {n})")
        sizes = list(layout.splits[k])
        if stride[k] > 1 and any(s % stride[k] for s in sizes):
            raise ValueError(f"Expected {layer}'s stride {stride[k]} to divide every shard size "
                             f"along spatial dim {k} (got sizes {sizes})")
        out = [s // stride[k] for s in sizes[:-1]]
        last = n_out - sum(out)
        if last < 0:
            raise ValueError(f"Expected {layer}'s output along spatial dim {k} ({n_out} points) to "
                             f"cover the ranks before the last one ({sum(out)} points); pad the input")
        out_splits.append(tuple(out + [last]))
    out_layout = GridLayout(shape=tuple(sum(s) for s in out_splits), proc_grid=layout.proc_grid,
                            splits=tuple(out_splits))
    R, d = layout.num_parts, layout.ndim
    starts, stops = np.zeros((R, d), np.int64), np.zeros((R, d), np.int64)
    for r in range(R):
        o_lo, o_hi = out_layout.box(r)
        for k in range(d):
            starts[r, k] = o_lo[k] * stride[k] - lo[k]
            stops[r, k] = (o_hi[k] - 1) * stride[k] - lo[k] + dilation[k] * (kernel[k] - 1) + 1 \
                if o_hi[k] > o_lo[k] else starts[r, k]
    return starts, stops, out_layout


def _run(x: GridTensor, window: Tensor, out_layout: GridLayout, channels: int,
         fn: Any) -> GridTensor:
    """``fn(window)`` as the output box; an empty box still depends on the window, so that its
    rank joins the backward exchange."""
    box = out_layout.box_shape(x.rank)
    if min(box) == 0 or min(window.shape[2:]) == 0:
        out = window.sum() * 0 + window.new_zeros((window.shape[0], channels, *box))
    else:
        out = fn(window)
    return GridTensor(out, out_layout, x.group)


class GridConv(nn.Module):
    """A ``nn.Conv1d`` / ``Conv2d`` / ``Conv3d`` that also runs on a :class:`~meshshard.GridTensor`.

    Any kernel size, dilation, groups, ``padding`` (numbers, ``"same"``, ``"valid"``) and
    ``padding_mode`` (``zeros``, ``reflect``, ``replicate``, ``circular``); stride 1.

    Args:
        conv: The layer; its ``weight`` and ``bias`` become this module's (shared, same names).

    Shapes:
        x: ``(B, C_in, n_0, ..., n_{d-1})`` local box; result: ``(B, C_out, m_0, ...)``, the
        output box (``m = n`` for a "same" convolution).

    Communication: one ``indexed_all_to_all_v`` forward (the window: a band of ``lo``/``hi``
    points per side, edges and corners included), its adjoint backward.

    Memory: the interior of the output box (receptive field inside the box) is convolved on the
    box itself, the frame around it on thin windows, so no copy of the input is kept for the
    backward beyond those windows.
    """

    def __init__(self, conv: nn.Module) -> None:
        if not isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            raise TypeError(f"Expected an nn.Conv1d, Conv2d or Conv3d (got {type(conv).__name__})")
        super().__init__()
        self.__dict__["conv"] = conv  # not a child: its parameters are registered here directly
        self.weight = conv.weight
        self.register_parameter("bias", conv.bias)
        if any(s != 1 for s in conv.stride):
            raise ValueError(f"Expected stride 1 for a sharded convolution (got stride {conv.stride}); "
                             "follow it with a GridPool to downsample")

    def extra_repr(self) -> str:
        """The wrapped convolution, for ``print(module)``."""
        return repr(self.conv)

    def forward(self, x: Any) -> Any:
        """The convolution of ``x``: a plain tensor as ``nn.Conv*d`` takes it, or a ``GridTensor``
        (this rank's box, the window exchanged first; see the class docstring)."""
        conv = self.conv
        if not isinstance(x, GridTensor):
            return conv._conv_forward(x, self.weight, self.bias)
        d = len(conv.kernel_size)
        _check_dims(type(conv).__name__, x, d)
        pads = conv._reversed_padding_repeated_twice
        lo = tuple(int(pads[2 * (d - 1 - k)]) for k in range(d))
        hi = tuple(int(pads[2 * (d - 1 - k) + 1]) for k in range(d))
        starts, stops, out_layout = _windows(x.layout, conv.kernel_size, (1,) * d, conv.dilation,
                                             lo, hi, type(conv).__name__)
        extent = tuple(dl * (k - 1) + 1 for dl, k in zip(conv.dilation, conv.kernel_size))
        plan = x._window_plan(starts, stops, conv.padding_mode, extent)
        pieces, ghosts = x._assemble(plan)
        fn = lambda w: _CONV[d](w, self.weight, self.bias, 1, 0, conv.dilation, conv.groups)  # noqa: E731
        if plan.interior is None:  # the box is thinner than the kernel: convolve the whole window
            return _run(x, pieces[0], out_layout, conv.out_channels, fn)
        # The interior from the box itself (no copy of it is kept), the frame from its windows.
        out_slices, in_slices = plan.interior
        inner = fn(x.to_local()[(..., *in_slices)])
        shape = (inner.shape[0], conv.out_channels, *out_layout.box_shape(x.rank))
        out = _Place.apply(shape, (out_slices, *plan.frames), ghosts, inner, *(fn(p) for p in pieces))
        return GridTensor(out, out_layout, x.group)


_POOLS: dict[type, tuple[int, str]] = {
    nn.MaxPool1d: (1, "max"), nn.MaxPool2d: (2, "max"), nn.MaxPool3d: (3, "max"),
    nn.AvgPool1d: (1, "avg"), nn.AvgPool2d: (2, "avg"), nn.AvgPool3d: (3, "avg"),
}


class GridPool(nn.Module):
    """A ``nn.MaxPool{1,2,3}d`` / ``nn.AvgPool{1,2,3}d`` that also runs on a
    :class:`~meshshard.GridTensor`, when its stride divides every shard size.

    Kernel, stride, padding and (max) dilation as the layer says; ``ceil_mode``,
    ``return_indices`` and, with padding, ``count_include_pad=False`` are refused.

    Shapes:
        x: ``(B, C, n_0, ...)``; result: ``(B, C, n_0 / s_0, ...)`` (the last box along a dim
        may differ when the global output does).

    Communication: none when kernel = stride and no padding (no rank's window leaves its box);
    otherwise one ``indexed_all_to_all_v`` forward and its adjoint backward.
    """

    def __init__(self, pool: nn.Module) -> None:
        if type(pool) not in _POOLS:
            raise TypeError(f"Expected an nn.MaxPool or nn.AvgPool of 1 to 3 dims (got {type(pool).__name__})")
        super().__init__()
        self.pool = pool
        d, kind = _POOLS[type(pool)]
        if pool.ceil_mode:
            raise ValueError("Expected ceil_mode=False for a sharded pool")
        if kind == "max" and pool.return_indices:
            raise ValueError("Expected return_indices=False for a sharded max pool")
        if kind == "avg" and not pool.count_include_pad and any(_tuple(pool.padding, d)):
            raise ValueError("Expected count_include_pad=True for a sharded average pool with padding")

    def forward(self, x: Any) -> Any:
        """The pooling of ``x``: a plain tensor, or a ``GridTensor`` (see the class docstring)."""
        pool = self.pool
        if not isinstance(x, GridTensor):
            return pool(x)
        d, kind = _POOLS[type(pool)]
        name = type(pool).__name__
        _check_dims(name, x, d)
        kernel = _tuple(pool.kernel_size, d)
        stride = _tuple(pool.stride if pool.stride is not None else pool.kernel_size, d)
        padding = _tuple(pool.padding, d)
        dilation = _tuple(pool.dilation, d) if kind == "max" else (1,) * d
        starts, stops, out_layout = _windows(x.layout, kernel, stride, dilation, padding, padding, name)
        window = x.window(starts, stops, "zeros", fill=-float("inf") if kind == "max" else 0.0)
        if kind == "max":
            fn = lambda w: _MAX[d](w, kernel, stride, 0, dilation)  # noqa: E731
        elif d == 1:
            fn = lambda w: F.avg_pool1d(w, kernel, stride, 0)  # noqa: E731
        else:
            fn = lambda w: _AVG[d](w, kernel, stride, 0, False, True, pool.divisor_override)  # noqa: E731
        return _run(x, window, out_layout, x.shape[1], fn)


_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}


class GridUpsample(nn.Module):
    """A ``nn.Upsample`` with integer ``scale_factor`` that also runs on a
    :class:`~meshshard.GridTensor`: ``nearest`` (local, no exchange) or ``linear`` /
    ``bilinear`` / ``trilinear`` with ``align_corners=False`` (a halo of 1 input point,
    replicated at the grid's edges as torch clamps there).

    Shapes:
        x: ``(B, C, n_0, ...)``; result: ``(B, C, f_0 n_0, ...)``.

    Communication: ``nearest`` none; linear modes one ``indexed_all_to_all_v`` forward and its
    adjoint backward.
    """

    def __init__(self, upsample: nn.Module) -> None:
        if not isinstance(upsample, nn.Upsample):
            raise TypeError(f"Expected an nn.Upsample (got {type(upsample).__name__})")
        super().__init__()
        self.upsample = upsample
        if upsample.mode not in ("nearest", *_LINEAR):
            raise ValueError(f"Expected an nn.Upsample mode in nearest, linear, bilinear, trilinear "
                             f"(got {upsample.mode!r})")
        if upsample.mode in _LINEAR and upsample.align_corners:
            raise ValueError("Expected align_corners=False for a sharded linear upsample (True "
                             "depends on the global size)")
        factors = upsample.scale_factor
        if upsample.size is not None or factors is None or any(
                float(f) != int(f) or f < 1 for f in (factors if isinstance(factors, tuple) else (factors,))):
            raise ValueError(f"Expected nn.Upsample(scale_factor=<positive integers>) for a sharded "
                             f"upsample (got size={upsample.size}, scale_factor={factors})")

    def forward(self, x: Any) -> Any:
        """The upsampling of ``x``: a plain tensor, or a ``GridTensor`` (see the class docstring)."""
        up = self.upsample
        if not isinstance(x, GridTensor):
            return up(x)
        d = x.layout.ndim
        if up.mode in _LINEAR:
            _check_dims(f"{up.mode} upsampling", x, _LINEAR[up.mode])
        f = _tuple(tuple(int(v) for v in up.scale_factor) if isinstance(up.scale_factor, tuple)
                   else int(up.scale_factor), d)
        lay = x.layout
        out_layout = GridLayout(shape=tuple(n * s for n, s in zip(lay.shape, f)), proc_grid=lay.proc_grid,
                                splits=tuple(tuple(v * s for v in sp) for sp, s in zip(lay.splits, f)))
        if up.mode == "nearest":
            window = x.to_local()
            fn = lambda w: F.interpolate(w, scale_factor=f, mode="nearest")  # noqa: E731
        else:
            window = x.halo(1, "replicate")
            crop = (slice(None), slice(None), *(slice(s, s * (n + 1)) for s, n in zip(f, x.shape[2:])))
            fn = lambda w: F.interpolate(w, scale_factor=f, mode=up.mode, align_corners=False)[crop]  # noqa: E731
        return _run(x, window, out_layout, x.shape[1], fn)


_WRAPPERS: list[tuple[tuple[type, ...], type]] = [
    ((nn.Conv1d, nn.Conv2d, nn.Conv3d), GridConv),
    (tuple(_POOLS), GridPool),
    ((nn.Upsample,), GridUpsample),
]


def shard_grid_layers(model: nn.Module) -> nn.Module:
    """Replace, in place, every convolution, pool and upsample of ``model`` by its grid wrapper;
    returns ``model``. Parameters and ``state_dict`` keys of the convolutions are unchanged (pools
    and upsamples have none), and the model still runs on plain tensors. The model's own
    ``forward`` must use only these layers and element-wise functions / ``torch.cat`` along
    channels between them (what :class:`~meshshard.GridTensor` allows).
    """
    for name, child in list(model.named_children()):
        for types, wrapper in _WRAPPERS:
            if type(child) in types:
                setattr(model, name, wrapper(child))
                break
        else:
            shard_grid_layers(child)
    return model
