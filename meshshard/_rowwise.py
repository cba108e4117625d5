"""The row-wise rules of :class:`~meshshard.ShardTensor`: which torch functions run on the owned rows.

``ShardTensor.__torch_function__`` hands every torch function (and every ``Tensor`` method reached
through the container) to :func:`torch_function`, which sorts it by the tables below: element-wise
operations and :func:`register_rowwise` functions (any operands of one layout, plain tensors only
broadcast over features), feature-wise ones (``F.linear``, ``layer_norm``...: only the input is
sharded), reductions and softmax over feature dimensions, reshaping and indexing that keep dimension
0, splits and concatenations along features, ``*_like``, a matmul by a plain weight and the global
``F.batch_norm``. Anything else raises a ``TypeError`` that names the method to use instead. Why a
plain container and not a ``Tensor`` subclass, and what the replicated operands mean, is in the
module docstring of ``meshshard._tensor``.

The rules see a ``ShardTensor`` through its base :class:`OwnedRows` (the owned rows in ``_local``,
their spec in ``_spec``) and build results with ``type(x)(rows, spec)``, or with the class that
``__torch_function__`` is called on, so this module never imports the class built on it.

Shapes: ``N_own`` owned rows, ``...`` any trailing (feature, batch) dimensions; the node dimension
is always dimension 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from meshshard.comm import sum_of_parts

from ._spec import ShardSpec
from ._tensor_functions import partial_to_whole

__all__ = ["OwnedRows", "ELEMENTWISE", "register_rowwise", "torch_function", "dims_of"]


class OwnedRows:
    """The base of ``ShardTensor`` the rules see: this rank's owned rows ``(N_own, ...)`` and their
    :class:`ShardSpec`. Holds nothing else and does nothing else."""

    __slots__ = ("_local", "_spec")

    def __init__(self, local: Tensor, spec: ShardSpec) -> None:
        # Internal: callers have checked the rows. Users call ShardTensor.from_local.
        self._local = local
        self._spec = spec


#: Element-wise work (arithmetic, comparisons, logic, rounding, activations, dropout, dtype and device
#: casts): any operands of one layout; plain tensors broadcast over features only.
ELEMENTWISE: set[Callable[..., Any]] = {
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div, torch.divide,
    torch.true_divide, torch.neg, torch.pow, torch.exp, torch.log, torch.sqrt, torch.rsqrt,
    torch.abs, torch.square, torch.tanh, torch.sigmoid, torch.relu, torch.sin, torch.cos,
    torch.clamp, torch.maximum, torch.minimum, torch.where,
    torch.gt, torch.ge, torch.lt, torch.le, torch.eq, torch.ne, torch.greater, torch.greater_equal,
    torch.less, torch.less_equal, torch.not_equal, torch.logical_and, torch.logical_or,
    torch.logical_xor, torch.logical_not, torch.sign, torch.floor, torch.ceil, torch.round,
    torch.trunc, torch.isfinite, torch.isnan, torch.isinf, torch.nan_to_num, torch.erf, torch.log1p,
    torch.expm1, torch.reciprocal, torch.dropout,
    F.relu, F.gelu, F.silu, F.elu, F.leaky_relu, F.softplus, F.tanh, F.sigmoid, F.mish, F.relu6,
    F.hardtanh, F.selu, F.celu, F.prelu, F.dropout, F.alpha_dropout,
    Tensor.__add__, Tensor.__radd__, Tensor.__sub__, Tensor.__rsub__, Tensor.__mul__, Tensor.__rmul__,
    Tensor.__truediv__, Tensor.__rtruediv__, Tensor.__neg__, Tensor.__pow__, Tensor.__rpow__,
    Tensor.__gt__, Tensor.__ge__, Tensor.__lt__, Tensor.__le__, Tensor.__eq__, Tensor.__ne__,
    Tensor.__and__, Tensor.__or__, Tensor.__xor__, Tensor.__invert__, Tensor.__abs__,
    Tensor.__floordiv__, Tensor.__mod__,
    # tensor methods (reached through ShardTensor.__getattr__)
    Tensor.add, Tensor.sub, Tensor.mul, Tensor.div, Tensor.neg, Tensor.pow, Tensor.exp, Tensor.log,
    Tensor.sqrt, Tensor.rsqrt, Tensor.abs, Tensor.square, Tensor.tanh, Tensor.sigmoid, Tensor.relu,
    Tensor.sin, Tensor.cos, Tensor.clamp, Tensor.clip, Tensor.gt, Tensor.ge, Tensor.lt, Tensor.le,
    Tensor.eq, Tensor.ne, Tensor.logical_and, Tensor.logical_or, Tensor.logical_xor,
    Tensor.logical_not, Tensor.sign, Tensor.floor, Tensor.ceil, Tensor.round, Tensor.trunc,
    Tensor.isfinite, Tensor.isnan, Tensor.isinf, Tensor.nan_to_num, Tensor.erf, Tensor.reciprocal,
    Tensor.clone, Tensor.contiguous, Tensor.type_as, Tensor.half, Tensor.bfloat16, Tensor.long,
    Tensor.int, Tensor.bool, Tensor.cpu, Tensor.cuda, Tensor.masked_fill,
}
_FEATURE_WISE: set[Callable[..., Any]] = {F.linear, F.layer_norm, F.group_norm, F.rms_norm}

# functions over a feature dimension: func -> (position of ``dim``, its default; None = every dim)
_DIM_WISE: dict[Callable[..., Any], tuple[int, Any]] = {
    F.softmax: (1, None), F.log_softmax: (1, None), torch.softmax: (1, None), torch.log_softmax: (1, None),
    Tensor.softmax: (1, None), Tensor.log_softmax: (1, None), F.normalize: (2, 1),
    torch.sum: (1, None), torch.mean: (1, None), torch.prod: (1, None), torch.amax: (1, ()),
    torch.amin: (1, ()), torch.logsumexp: (1, None), torch.std: (1, None), torch.var: (1, None),
    torch.argmax: (1, None), torch.argmin: (1, None), torch.cumsum: (1, None), torch.all: (1, None),
    torch.any: (1, None), torch.max: (1, None), torch.min: (1, None), torch.norm: (2, None),
    Tensor.prod: (1, None), Tensor.amax: (1, ()), Tensor.amin: (1, ()), Tensor.logsumexp: (1, None),
    Tensor.std: (1, None), Tensor.var: (1, None), Tensor.argmax: (1, None), Tensor.argmin: (1, None),
    Tensor.cumsum: (1, None), Tensor.all: (1, None), Tensor.any: (1, None), Tensor.max: (1, None),
    Tensor.min: (1, None), Tensor.norm: (2, None), torch.linalg.vector_norm: (2, None),
}

# reshaping that must keep dimension 0
_SHAPE: set[Callable[..., Any]] = {
    Tensor.view, Tensor.reshape, torch.reshape, Tensor.flatten, torch.flatten, Tensor.unsqueeze,
    torch.unsqueeze, Tensor.squeeze, torch.squeeze, Tensor.transpose, torch.transpose, Tensor.permute,
    torch.permute, Tensor.__getitem__, Tensor.expand, Tensor.repeat,
}

#: Splitting along a feature dimension: (the position of ``dim``, its default).
_SPLIT: dict[Callable[..., Any], tuple[int, int]] = {
    torch.chunk: (2, 0), Tensor.chunk: (2, 0), torch.split: (2, 0), Tensor.split: (2, 0),
    torch.tensor_split: (2, 0), Tensor.tensor_split: (2, 0), torch.unbind: (1, 0), Tensor.unbind: (1, 0),
}
#: A new tensor of the input's shape: the same rows.
_LIKE: set[Callable[..., Any]] = {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like}

_USER_ROWWISE: set[Callable[..., Any]] = set()


def register_rowwise(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Declare ``fn`` row-wise: row ``i`` of its result depends only on row ``i`` of its inputs.

    For a torch function or ``Tensor`` method (``register_rowwise(torch.erf)``), the
    ``ShardTensor`` whitelist gains it. For your own function (usable as a decorator), the returned
    function runs ``fn`` on the owned rows of its ``ShardTensor`` arguments (which must share one
    layout) and wraps a result with ``N_own`` rows; on plain tensors it is ``fn`` unchanged.
    Declaring a function row-wise that is not gives wrong results on shards.
    """
    if not callable(fn):
        raise TypeError(f"Expected 'fn' to be callable (got {type(fn).__name__})")
    _USER_ROWWISE.add(fn)

    @functools.wraps(fn)
    def rowwise(*args: Any, **kwargs: Any) -> Any:
        shards = [a for a in _flat(list(args) + list(kwargs.values())) if isinstance(a, OwnedRows)]
        if not shards:
            return fn(*args, **kwargs)
        spec = _common_spec(getattr(fn, "__name__", "fn"), args, kwargs)
        return _wrap(fn(*_unwrap(args), **_unwrap(kwargs)), spec, type(shards[0]))

    return rowwise


_HINTS = {
    "sum": "ShardTensor.sum() (a global sum over nodes)",
    "mean": "ShardTensor.mean() (a global mean over nodes)",
    "matmul": "x @ W with the ShardTensor x on the left and a plain weight W of 1 or 2 dims (row-wise), or "
              "full_tensor() for the whole tensor",
}
_MATMUL = {torch.matmul, Tensor.matmul, Tensor.__matmul__}
_DEFAULT_HINT = (
    "with_halo() for owned + ghost rows, full_tensor() or gather() for the whole tensor, "
    "redistribute() for another layout, or to_local() to work on the owned rows explicitly"
)


def torch_function(cls: type[OwnedRows], func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` on the owned rows when it is row-wise (a result with ``N_own`` rows
    wrapped as ``cls``, the class whose ``__torch_function__`` is called); else a ``TypeError`` that
    names the method to use."""
    name = getattr(func, "__name__", str(func))
    if func in ELEMENTWISE or func in _USER_ROWWISE:
        spec = _common_spec(name, args, kwargs)
        _check_plain_operands(name, spec, args, kwargs)
        if torch.is_grad_enabled():
            args, kwargs = (partial_to_whole(args, spec),
                            {k: partial_to_whole(v, spec) for k, v in kwargs.items()})
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)), spec, cls)
    if func in _FEATURE_WISE:
        if (not isinstance(args[0], OwnedRows)
                or any(isinstance(a, OwnedRows) for a in (*args[1:], *kwargs.values()))):
            raise TypeError(f"{name}: only the input may be a ShardTensor (its weights are plain tensors)")
        spec = args[0]._spec
        if func is F.layer_norm and len(tuple(args[1])) >= args[0]._local.dim():
            raise TypeError("layer_norm over the node dimension mixes rows; normalise over features only")
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)), spec, cls)
    if func is F.batch_norm:
        return _batch_norm(*args, **kwargs)
    if func in _DIM_WISE:
        return _dim_wise(func, name, args, kwargs)
    if func in _SHAPE:
        return _reshape(func, name, args, kwargs)
    if (func in _MATMUL and len(args) == 2 and not kwargs and isinstance(args[0], OwnedRows)
            and args[0]._local.dim() >= 2
            and isinstance(args[1], Tensor) and args[1].dim() in (1, 2)):
        return _wrap(torch.matmul(args[0]._local, args[1]), args[0]._spec, cls)  # rows times a weight: row-wise
    if func in _MATMUL:
        name = "matmul"
    if func in _SPLIT:
        x = args[0]
        if not isinstance(x, OwnedRows) or any(isinstance(a, OwnedRows) for a in (*args[1:], *kwargs.values())):
            raise TypeError(f"{name}: only the input may be a ShardTensor")
        position, default = _SPLIT[func]
        dim = args[position] if len(args) > position else kwargs.get("dim", default)
        if dim % x._local.dim() == 0:
            raise TypeError(f"{name} along the node dimension (0) changes the layout; "
                            "split along features (dim=-1)")
        return tuple(cls(t, x._spec) for t in func(x._local, *args[1:], **kwargs))
    if func in _LIKE and isinstance(args[0], OwnedRows):
        if any(isinstance(a, OwnedRows) for a in (*args[1:], *kwargs.values())):
            raise TypeError(f"{name}: only the input may be a ShardTensor")
        return cls(func(args[0]._local, *args[1:], **kwargs), args[0]._spec)
    if func is torch.cat or func is torch.stack:
        tensors, stack = args[0], func is torch.stack
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not all(isinstance(t, OwnedRows) for t in tensors):
            raise TypeError(f"torch.{name}: expected only ShardTensors "
                            "(wrap plain tensors with ShardTensor.from_local)")
        spec = _common_spec(name, tuple(tensors), {})
        if dim % (tensors[0]._local.dim() + stack) == 0:
            raise TypeError(f"torch.{name} along the node dimension changes the layout; "
                            f"{'stack along features (dim=-1)' if stack else 'concatenate along features'}")
        return cls(func([t._local for t in tensors], dim), spec)
    hint = _HINTS.get(name, _DEFAULT_HINT)
    raise TypeError(f"{name} is not a row-wise operation and would be wrong on shards of a ShardTensor; use {hint}")


# --- row-wise work with rules -----------------------------------------------------------------------


def dims_of(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """A ``dim`` argument as non-negative dimensions of ``ndim``; ``None`` for every dimension."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return None
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(int(d) % ndim for d in dims)


def _dim_wise(func: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
    """softmax / normalize / reductions: fine over feature dimensions, refused over nodes."""
    x = args[0]
    if not isinstance(x, OwnedRows) or any(isinstance(a, OwnedRows) for a in (*args[1:], *kwargs.values())):
        raise TypeError(f"{name}: only the input may be a ShardTensor")
    position, default = _DIM_WISE[func]
    dim = args[position] if len(args) > position else kwargs.get("dim", default)
    dims = dims_of(dim, max(x._local.dim(), 1))
    if dims is None or 0 in dims:
        over = "every dimension" if dims is None else "the node dimension (0)"
        hint = "ShardTensor.sum() / .mean() (global, replicated)" if name in ("sum", "mean") else (
            "a feature dimension (dim=-1), or full_tensor() for the whole tensor")
        raise TypeError(f"{name} over {over} mixes rows and would be wrong on shards of a ShardTensor; use {hint} "
                        "(a PyG normalisation layer, GraphNorm or LayerNorm(mode='graph'), is exact on shards "
                        "inside meshshard.nn.ShardNorm)")
    result = func(*_unwrap(args), **_unwrap(kwargs))
    if isinstance(result, tuple):  # max / min with dim: (values, indices)
        return type(result)([type(x)(r, x._spec) for r in result])
    return type(x)(result, x._spec)


def _reshape(func: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
    """Reshaping and indexing that keep the owned rows in dimension 0; anything else is refused."""
    x = args[0]
    if not isinstance(x, OwnedRows) or any(isinstance(a, OwnedRows) for a in _flat([*args[1:], *kwargs.values()])):
        raise TypeError(f"{name}: only the input may be a ShardTensor; select rows with to_local() on the owned rows")
    local, rest = x._local, list(args[1:])
    if func in (Tensor.view, Tensor.reshape, torch.reshape):
        rest = [_keep_rows(name, local, rest[0] if len(rest) == 1 and not isinstance(rest[0], int)
                           else rest or kwargs.pop("shape"))]
    elif func is Tensor.__getitem__:
        _check_index(local.dim(), rest[0])
    elif not _keeps_rows(func, local.dim(), rest, kwargs):
        raise TypeError(f"{name} would move or merge the node dimension (0) of a ShardTensor; "
                        "reshape feature dimensions only")
    return type(x)(func(local, *rest, **kwargs), x._spec)


def _keep_rows(name: str, local: Tensor, shape: Any) -> tuple[int, ...]:
    shape = [int(s) for s in shape]
    features = math.prod(local.shape[1:])
    if shape and shape[0] == -1 and -1 not in shape[1:]:
        shape[0] = local.shape[0]
    if -1 in shape[1:] and shape[0] == local.shape[0]:
        known = math.prod(s for s in shape[1:] if s != -1)
        shape[shape.index(-1, 1)] = features // known if known else 0
    if not shape or shape[0] != local.shape[0] or math.prod(shape[1:]) != features:
        raise TypeError(
            f"{name} to {tuple(shape)} would change the node dimension of a ShardTensor with {local.shape[0]} "
            f"owned rows; keep dimension 0 (x.{name}(x.shape[0], ...)) and reshape features only"
        )
    return tuple(shape)


def _keeps_rows(func: Callable[..., Any], ndim: int, rest: list, kwargs: dict) -> bool:
    if func in (Tensor.flatten, torch.flatten):
        start = rest[0] if rest else kwargs.get("start_dim", 0)
        end = rest[1] if len(rest) > 1 else kwargs.get("end_dim", -1)
        return start % ndim != 0 or end % ndim == 0
    if func in (Tensor.unsqueeze, torch.unsqueeze):
        d = rest[0] if rest else kwargs["dim"]
        return d % (ndim + 1) != 0
    if func in (Tensor.squeeze, torch.squeeze):
        dims = dims_of(rest[0] if rest else kwargs.get("dim"), ndim)
        return dims is not None and 0 not in dims
    if func in (Tensor.transpose, torch.transpose):
        return 0 not in dims_of(rest[:2], ndim)
    if func in (Tensor.permute, torch.permute):
        order = rest[0] if len(rest) == 1 and not isinstance(rest[0], int) else rest
        return int(order[0]) % ndim == 0
    if func in (Tensor.expand, Tensor.repeat):
        sizes = rest[0] if len(rest) == 1 and not isinstance(rest[0], int) else rest
        return len(sizes) == ndim and int(sizes[0]) in ((-1, 1) if func is Tensor.repeat else (-1,))
    return False


def _check_index(ndim: int, index: Any) -> None:
    items = index if isinstance(index, tuple) else (index,)
    first = items[0] if items else slice(None)
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    whole = isinstance(first, slice) and first == slice(None)
    if whole or (first is Ellipsis and consumed < ndim):
        return
    raise TypeError(
        f"indexing the node dimension (0) of a ShardTensor (got [{_describe(first)}, ...]) selects rows of one rank; "
        "index features only (x[:, :3], x[..., 0]), or use x.to_local()[...] on the owned rows or x.full_tensor()[...]"
    )


def _describe(item: Any) -> str:
    return type(item).__name__ if isinstance(item, (Tensor, OwnedRows, list)) else repr(item)


def _batch_norm(
    x: Any, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
    bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
) -> OwnedRows:
    """``F.batch_norm`` over every node of every rank; eval mode (running statistics) is row-wise.

    Communication (training): two ``all_reduce`` forward (the sum, then the squared deviations), two
    backward (each rank's part of the statistics' gradient, summed): :func:`meshshard.comm.sum_of_parts`.
    """
    if not isinstance(x, OwnedRows):
        raise TypeError("batch_norm: only the input may be a ShardTensor")
    local, spec = x._local, x._spec
    if not training:
        return type(x)(F.batch_norm(local, running_mean, running_var, weight, bias, False, momentum, eps), spec)
    dims = [d for d in range(local.dim()) if d != 1]
    shape = [1, local.shape[1]] + [1] * (local.dim() - 2)
    count = spec.num_nodes * math.prod(local.shape[2:])
    if count <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training batch_norm (got {count})")
    mean = sum_of_parts(local.sum(dims), group=spec.group) / count
    centred = local - mean.view(shape)
    var = sum_of_parts(centred.square().sum(dims), group=spec.group) / count
    out = centred * (var + eps).rsqrt().view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(var.detach().to(running_var.dtype) * (count / (count - 1)),
                                                alpha=momentum)
    return type(x)(out, spec)



def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out += _flat(a)
        else:
            out.append(a)
    return out


def _common_spec(name: str, args: Any, kwargs: dict) -> ShardSpec:
    specs = [a._spec for a in _flat(list(args) + list(kwargs.values())) if isinstance(a, OwnedRows)]
    for s in specs[1:]:
        if s != specs[0]:
            raise ValueError(
                f"{name}: ShardTensors of different layouts mixed ({specs[0]!r} and {s!r}); "
                "bring one to the other's layout with .redistribute(spec)"
            )
    return specs[0]


def _check_plain_operands(name: str, spec: ShardSpec, args: tuple, kwargs: dict) -> None:
    """A plain tensor may broadcast over features, never supply rows of its own."""
    shards = [a for a in _flat(list(args) + list(kwargs.values())) if isinstance(a, OwnedRows)]
    ndim = max(s._local.dim() for s in shards)
    for a in _flat(list(args) + list(kwargs.values())):
        if isinstance(a, Tensor) and a.dim() >= ndim and a.shape[a.dim() - ndim] != 1:
            raise TypeError(
                f"{name}: a plain tensor of shape {tuple(a.shape)} would line up with the node rows; "
                "wrap owned rows with ShardTensor.from_local(t, spec), or pass a feature vector"
            )


def _unwrap(x: Any) -> Any:
    if isinstance(x, OwnedRows):
        return x._local
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(result: Any, spec: ShardSpec, cls: type[OwnedRows]) -> Any:
    """``result`` as a ``cls`` laid out by ``spec`` when it has the owned rows, else unchanged."""
    if isinstance(result, Tensor) and result.dim() > 0 and result.shape[0] == spec.num_owned:
        return cls(result, spec)
    return result
