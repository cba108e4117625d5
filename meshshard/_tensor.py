"""``ShardTensor``: the owned rows of one node-indexed tensor, plus its :class:`ShardSpec`.

Why a plain container with a small ``__torch_function__``, not a ``torch.Tensor`` subclass:
a subclass inherits every tensor operation, so an operation nobody thought about (a ``sum``, an
``index_select``, a ``matmul`` over nodes) would run on the local rows and return a result that is
silently wrong on shards, the trap DTensor falls into with uneven layouts. Here, torch functions
reach :meth:`ShardTensor.__torch_function__`, which runs a list of row-wise operations on the
local rows and keeps the spec; anything else raises a ``TypeError`` that names the method to use.
Row-wise are: element-wise arithmetic, comparisons and logic (and their operators), rounding,
activations, dropout, ``F.linear``, feature-wise ``layer_norm`` / ``group_norm``, softmax,
log_softmax, normalize and reductions over feature dimensions, indexing and reshaping that keep
dimension 0, ``torch.cat`` / ``torch.stack`` / ``chunk`` / ``split`` / ``unbind`` along features,
``zeros_like`` and its kin, and functions registered with :func:`register_rowwise`.
Tensor methods of those operations work too (``x.relu()``, ``x.clone()``, ``x[:, :3]``). Tensor
methods reach the same list (``x.index_select(...)`` is refused like ``torch.index_select``).
``nn.Linear``, ``nn.LayerNorm``, ``nn.Dropout`` and activation modules therefore accept a
``ShardTensor`` unchanged. Autograd runs on the plain local tensors: no subclass in the backward.

Batch normalisation (``F.batch_norm``: ``nn.BatchNorm1d``, PyG's ``BatchNorm`` and ``MLP``) is
global: in training, the batch statistics are sums over every node of every rank (two
``all_reduce``), and the running statistics are updated with them, so they equal one process. In
eval mode it uses the running statistics and is row-wise.

Dropout draws each rank's mask from that rank's generator: the same distribution as one process
dropping the whole tensor, not the same numbers (a mask bitwise equal to one process would need
every rank to draw all ``N`` rows and keep its own, an ``O(N)`` cost per call we do not pay). Seed
each rank differently (``torch.manual_seed(seed + rank)``) so that ranks do not repeat one mask, or
compare with one process in eval mode.

Replicated results (``full_tensor()``, ``sum()``, ``mean()``) are one logical value held by every
rank. Used the same way on every rank (as a loss computed identically everywhere is), the backward
hands each rank the gradient of its own rows. Used on each rank's own rows (``x - x.mean(0)``, PyG's
``PairNorm``), each rank's gradient is only its rows' part: a row-wise operation that mixes a
``ShardTensor`` with a plain tensor computed from a global reduction sums those parts over the ranks
in the backward (one ``all_reduce``), so both uses, and their mixtures, give the gradients of the
single-process computation on the whole tensor. (Trainable parameters used in replicated
computations, such as a head on globally pooled features or a scale applied to a global mean
before it meets the rows, receive the whole gradient on every rank: :class:`meshshard.nn.DomainParallel`
finds them and counts it once; :func:`meshshard.comm.sum_gradients` would count it once per rank.)

Shapes: ``N`` global nodes, ``N_own`` owned rows, ``N_ghost`` ghost rows, ``...`` any trailing
(feature, batch) dimensions. The node dimension is always dimension 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function

from meshshard.comm import (
    all_gather_v,
    all_reduce_sum,
    gather_v,
    indexed_all_to_all_v,
    note_replicated_result,
    scatter_v,
    sum_to_replicated,
)

from ._spec import ShardSpec

__all__ = ["ShardTensor", "register_rowwise"]

_ELEMENTWISE: set[Callable[..., Any]] = {
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
        if not any(isinstance(a, ShardTensor) for a in _flat(list(args) + list(kwargs.values()))):
            return fn(*args, **kwargs)
        spec = _common_spec(getattr(fn, "__name__", "fn"), args, kwargs)
        return _wrap(fn(*_unwrap(args), **_unwrap(kwargs)), spec)

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


class _FullTensor(Function):
    """Shard -> replicated whole tensor. Backward: each rank keeps the gradient of its own rows."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, spec: ShardSpec) -> Tensor:
        note_replicated_result()
        ctx.spec = spec
        with torch.no_grad():
            rows = all_gather_v(local, list(spec.owned_counts), group=spec.group)
        ids = spec.all_global_ids().to(local.device)
        return torch.empty_like(rows).index_copy_(0, ids, rows)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad.index_select(0, ctx.spec._on("owned_ids", grad.device)), None


class _SumOfParts(Function):
    """Sum over the ranks of a statistic each rank then uses on its own rows (a batch norm's mean).

    Unlike :func:`meshshard.comm.sum_to_replicated` (whose result every rank uses identically, as a
    loss), each rank's gradient here is its own rows' part, so the backward sums the parts too.
    Communication: one ``all_reduce`` forward, one backward.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return all_reduce_sum(x.clone(), group=group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return all_reduce_sum(grad.clone(), group=ctx.group), None


class _RowsUseReplicated(Function):
    """A replicated value (from a global reduction) used on each rank's own rows.

    The gradient that reaches it on each rank is that rank's part; the backward sums the parts, so
    that what flows on into the reduction is the whole gradient, as every rank's copy expects (see
    :func:`meshshard.comm.sum_to_replicated`). Communication: one ``all_reduce`` backward.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return all_reduce_sum(grad.clone(), group=ctx.group), None


_REPLICATING = frozenset({"_SumToReplicatedBackward", "_FullTensorBackward"})


def _from_replicated(t: Tensor) -> bool:
    """Whether ``t`` is computed from a global reduction (its autograd graph holds one)."""
    stack, seen = [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        if type(node).__name__ in _REPLICATING:
            return True
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    return False


def _partial_to_whole(args: Any, spec: ShardSpec) -> Any:
    """Wrap the plain operands computed from global reductions (see :class:`_RowsUseReplicated`)."""
    if isinstance(args, (list, tuple)):
        return type(args)(_partial_to_whole(a, spec) for a in args)
    if isinstance(args, Tensor) and args.grad_fn is not None and _from_replicated(args):
        return _RowsUseReplicated.apply(args, spec.group)
    return args


def _inverse(ids: Tensor) -> Tensor:
    inv = torch.empty_like(ids)
    inv[ids] = torch.arange(ids.numel(), dtype=ids.dtype, device=ids.device)
    return inv


class ShardTensor:
    """The owned rows ``(N_own, ...)`` of a node-indexed tensor, laid out by a :class:`ShardSpec`.

    Build it with :meth:`from_local` (no communication) or :meth:`scatter_tensor`; read it back with
    :meth:`to_local`, :meth:`full_tensor` or :meth:`gather`.
    """

    __slots__ = ("_local", "_spec")

    def __init__(self, local: Tensor, spec: ShardSpec) -> None:
        # Internal: callers have checked the rows. Users call from_local.
        self._local = local
        self._spec = spec

    # --- construction and access ----------------------------------------------------------------

    @classmethod
    def from_local(cls, local: Tensor, spec: ShardSpec) -> ShardTensor:
        """Wrap this rank's owned rows. No communication.

        Raises:
            ValueError: if ``local`` does not have ``spec.num_owned`` rows.
        """
        if not isinstance(local, Tensor):
            raise TypeError(f"Expected 'local' to be a torch.Tensor (got {type(local).__name__})")
        if not isinstance(spec, ShardSpec):
            raise TypeError(f"Expected 'spec' to be a ShardSpec (got {type(spec).__name__})")
        if local.dim() == 0 or local.shape[0] != spec.num_owned:
            got = "a 0-d tensor" if local.dim() == 0 else f"{local.shape[0]} rows"
            raise ValueError(
                f"Expected 'local' to have spec.num_owned = {spec.num_owned} rows on rank {spec.rank} (got {got})"
            )
        return cls(local, spec)

    def to_local(self) -> Tensor:
        """The owned rows ``(N_own, ...)``, part of the autograd graph."""
        return self._local

    @property
    def spec(self) -> ShardSpec:
        return self._spec

    @property
    def shape(self) -> torch.Size:
        """The local shape ``(N_own, ...)``."""
        return self._local.shape

    @property
    def global_shape(self) -> torch.Size:
        return torch.Size((self._spec.num_nodes, *self._local.shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self._local.dtype

    @property
    def device(self) -> torch.device:
        return self._local.device

    @property
    def requires_grad(self) -> bool:
        return self._local.requires_grad

    @property
    def grad(self) -> ShardTensor | None:
        g = self._local.grad
        return None if g is None else ShardTensor(g, self._spec)

    def dim(self) -> int:
        """The number of dimensions (of the local rows; the global tensor has as many)."""
        return self._local.dim()

    @property
    def ndim(self) -> int:
        return self._local.dim()

    def size(self, dim: int | None = None) -> Any:
        """The local size (``N_own`` along the node dimension), as ``Tensor.size``."""
        return self._local.size() if dim is None else self._local.size(dim)

    def requires_grad_(self, requires_grad: bool = True) -> ShardTensor:
        """Record gradients of the local rows (in place), as ``Tensor.requires_grad_``."""
        self._local.requires_grad_(requires_grad)
        return self

    def detach(self) -> ShardTensor:
        """The same rows and spec, cut from the autograd graph."""
        return ShardTensor(self._local.detach(), self._spec)

    def to(self, *args: Any, **kwargs: Any) -> ShardTensor:
        """``Tensor.to`` on the local rows (dtype and device; the layout is unchanged)."""
        return ShardTensor(self._local.to(*args, **kwargs), self._spec)

    def double(self) -> ShardTensor:
        """The rows in float64 (same spec)."""
        return self.to(torch.float64)

    def float(self) -> ShardTensor:
        """The rows in float32 (same spec)."""
        return self.to(torch.float32)

    def __len__(self) -> int:
        return self._local.shape[0]

    def __repr__(self) -> str:
        return (f"ShardTensor(local={tuple(self._local.shape)}, global={tuple(self.global_shape)}, "
                f"dtype={self.dtype}, {self._spec!r})")

    # --- work that mixes rows ---------------------------------------------------------------------

    def with_halo(self) -> Tensor:
        """Owned rows followed by the ghost rows, ``(N_own + N_ghost, ...)``, in local numbering.

        Differentiable: the ghost rows' gradients flow back to their owners and accumulate there.

        Communication: one ``indexed_all_to_all_v`` forward, one backward (fused with the
        concatenation: :func:`meshshard.comm.append_halo`).
        """
        spec = self._spec
        if not spec.has_halo:
            raise ValueError(f"{spec!r} has no halo plan; build the spec with ShardSpec.from_partition(...)")
        return spec.halo.append(self._local)

    def full_tensor(self) -> Tensor:
        """The whole tensor ``(N, ...)`` in global id order, on every rank (replicated).

        Communication: one ``all_gather_v`` forward (plus one, once, for the global ids); none
        backward: each rank takes the gradient of its own rows.
        """
        return _FullTensor.apply(self._local, self._spec)

    def gather(self, dst: int = 0) -> Tensor:
        """The whole tensor ``(N, ...)`` in global id order on rank ``dst``; zero rows elsewhere.

        Every rank must backpropagate through its result (on other ranks, an empty tensor).

        Communication: one ``gather_v`` forward (plus one ``all_gather_v``, once, for the global
        ids); the gradient is scattered back to the owners in the backward.
        """
        spec = self._spec
        ids = spec.all_global_ids()
        rows = gather_v(self._local, list(spec.owned_counts), dst=dst, group=spec.group)
        if spec.rank != dst:
            return rows
        if "inverse_ids" not in spec._cache:
            spec._cache["inverse_ids"] = _inverse(ids)
        return rows.index_select(0, spec._cache["inverse_ids"].to(rows.device))

    @classmethod
    def scatter_tensor(cls, full: Tensor | None, spec: ShardSpec, src: int = 0) -> ShardTensor:
        """Split the whole tensor ``(N, ...)``, held by rank ``src`` (others pass ``None``).

        Communication: one ``scatter_v`` (plus one ``all_gather_v``, once, for the global ids);
        backward: the gradient is gathered to ``src``.
        """
        ids = spec.all_global_ids()
        ordered = error = None
        if spec.rank == src:  # a check only src can make: scatter_v raises it on every rank
            if not isinstance(full, Tensor) or full.dim() == 0 or full.shape[0] != spec.num_nodes:
                got = tuple(full.shape) if isinstance(full, Tensor) else type(full).__name__
                error = ValueError(f"Expected 'full' on rank {src} to have {spec.num_nodes} rows (got {got})")
            else:
                ordered = full.index_select(0, ids.to(full.device))
        local = scatter_v(ordered, list(spec.owned_counts), src=src, group=spec.group, error=error)
        return cls(local, spec)

    def redistribute(self, spec: ShardSpec) -> ShardTensor:
        """The same global rows, laid out by ``spec`` (for example chunked -> METIS and back).

        Communication: one ``indexed_all_to_all_v`` forward and one backward (the plan is built once
        per pair of layouts, with a few small collectives, and cached).
        """
        if spec == self._spec:
            return self
        if spec.group is not self._spec.group:
            raise ValueError("Expected a target layout on the same process group")
        send_index, send_counts, recv_counts, gather_index = self._spec.redistribute_plan(spec)
        device = self.device
        received = indexed_all_to_all_v(
            self._local, send_index.to(device), send_counts, recv_counts, group=spec.group, check_index=False
        )
        return ShardTensor(received.index_select(0, gather_index.to(device)), spec)

    def sum(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Global sum. ``dim=None``: over everything (a replicated scalar); ``dim`` including 0: over
        nodes (a replicated tensor); feature dimensions only: row-wise, a ``ShardTensor``.

        The result may be used identically on every rank (a loss) or on each rank's rows
        (``x - x.mean(0)``): see the module docstring.

        Communication: one ``all_reduce`` forward when the nodes are summed; none backward.
        """
        dims = _dims(dim, max(self.ndim, 1))
        if dims is None:
            total = sum_to_replicated(self._local.sum(), group=self._spec.group)
            return total.reshape([1] * self.ndim) if keepdim else total
        if 0 in dims:
            return sum_to_replicated(self._local.sum(dims, keepdim=keepdim), group=self._spec.group)
        return ShardTensor(self._local.sum(dims, keepdim=keepdim), self._spec)

    def mean(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Global mean, with the same ``dim`` rules as :meth:`sum`: over nodes it divides by all ``N``."""
        if not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise TypeError(f"mean() needs a floating point ShardTensor (got {self.dtype})")
        dims = _dims(dim, max(self.ndim, 1))
        if dims is None:
            return self.sum(None, keepdim) / self._count_all()
        if 0 in dims:
            count = self._spec.num_nodes * math.prod(self._local.shape[d] for d in set(dims) if d != 0)
            return self.sum(dims, keepdim) / count
        return ShardTensor(self._local.mean(dims, keepdim=keepdim), self._spec)

    def clone(self) -> ShardTensor:
        """A copy of the local rows (same spec), differentiable as ``Tensor.clone``."""
        return ShardTensor(self._local.clone(), self._spec)

    def _count_all(self) -> int:
        n = self._spec.num_nodes
        for s in self._local.shape[1:]:
            n *= s
        return n

    # --- DTensor interop --------------------------------------------------------------------------

    def to_dtensor(self, placement: str = "shard", device_mesh: Any = None) -> Any:
        """A DTensor: ``"shard"`` (``Shard(0)``; needs the chunked layout) or ``"replicate"``."""
        # DTensor interop: torch's DTensor types and placements; nothing is sent by importing them
        from torch.distributed.tensor import DTensor, Replicate, Shard

        if device_mesh is None:
            device_mesh = _device_mesh(self._spec.group, self.device)
        if placement == "replicate":
            return DTensor.from_local(self.full_tensor(), device_mesh, [Replicate()], run_check=False)
        if placement != "shard":
            raise ValueError(f"Expected 'placement' to be 'shard' or 'replicate' (got {placement!r})")
        chunked = ShardSpec.chunked(self._spec.num_nodes, self._spec.group)
        if self._spec != chunked:
            raise ValueError(
                f"DTensor's Shard(0) holds torch.chunk-sized contiguous rows, not {self._spec!r}; "
                "use .redistribute(ShardSpec.chunked(N, group)).to_dtensor() or placement='replicate'"
            )
        shape = self.global_shape
        stride = torch.empty(0).new_empty(shape, device="meta").stride()
        return DTensor.from_local(self._local, device_mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)

    @classmethod
    def from_dtensor(cls, dtensor: Any, spec: ShardSpec | None = None) -> ShardTensor:
        """From a DTensor on a 1-D mesh: ``Shard(0)`` (chunked rows) or ``Replicate()``.

        With ``spec``, the result is laid out by it (a redistribute for ``Shard(0)``, a local slice
        for ``Replicate()``, which needs ``spec``).
        """
        # DTensor interop: torch's DTensor types and placements; nothing is sent by importing them
        from torch.distributed.tensor import Replicate, Shard

        placements = tuple(dtensor.placements)
        group = None if spec is None else spec.group
        if placements == (Shard(0),):
            st = cls(dtensor.to_local(), ShardSpec.chunked(dtensor.shape[0], group))
            return st if spec is None else st.redistribute(spec)
        if placements == (Replicate(),):
            if spec is None:
                raise ValueError("Expected a 'spec' to shard a replicated DTensor by")
            full = dtensor.to_local()
            return cls.from_local(full.index_select(0, spec._on("owned_ids", full.device)), spec)
        raise ValueError(f"Expected a DTensor on a 1-D mesh placed Shard(0) or Replicate() (got {placements})")

    # --- row-wise torch functions ------------------------------------------------------------------

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in _ELEMENTWISE or func in _USER_ROWWISE:
            spec = _common_spec(name, args, kwargs)
            _check_plain_operands(name, spec, args, kwargs)
            if torch.is_grad_enabled():
                args, kwargs = (_partial_to_whole(args, spec),
                                {k: _partial_to_whole(v, spec) for k, v in kwargs.items()})
            return _wrap(func(*_unwrap(args), **_unwrap(kwargs)), spec)
        if func in _FEATURE_WISE:
            if (not isinstance(args[0], ShardTensor)
                    or any(isinstance(a, ShardTensor) for a in (*args[1:], *kwargs.values()))):
                raise TypeError(f"{name}: only the input may be a ShardTensor (its weights are plain tensors)")
            spec = args[0]._spec
            if func is F.layer_norm and len(tuple(args[1])) >= args[0].ndim:
                raise TypeError("layer_norm over the node dimension mixes rows; normalise over features only")
            return _wrap(func(*_unwrap(args), **_unwrap(kwargs)), spec)
        if func is F.batch_norm:
            return _batch_norm(*args, **kwargs)
        if func in _DIM_WISE:
            return _dim_wise(func, name, args, kwargs)
        if func in _SHAPE:
            return _reshape(func, name, args, kwargs)
        if (func in _MATMUL and len(args) == 2 and not kwargs and isinstance(args[0], ShardTensor) and args[0].ndim >= 2
                and isinstance(args[1], Tensor) and args[1].dim() in (1, 2)):
            return _wrap(torch.matmul(args[0]._local, args[1]), args[0]._spec)  # rows times a weight: row-wise
        if func in _MATMUL:
            name = "matmul"
        if func in _SPLIT:
            x = args[0]
            if not isinstance(x, ShardTensor) or any(isinstance(a, ShardTensor) for a in (*args[1:], *kwargs.values())):
                raise TypeError(f"{name}: only the input may be a ShardTensor")
            position, default = _SPLIT[func]
            dim = args[position] if len(args) > position else kwargs.get("dim", default)
            if dim % x.ndim == 0:
                raise TypeError(f"{name} along the node dimension (0) changes the layout; "
                                "split along features (dim=-1)")
            return tuple(ShardTensor(t, x._spec) for t in func(x._local, *args[1:], **kwargs))
        if func in _LIKE and isinstance(args[0], ShardTensor):
            if any(isinstance(a, ShardTensor) for a in (*args[1:], *kwargs.values())):
                raise TypeError(f"{name}: only the input may be a ShardTensor")
            return ShardTensor(func(args[0]._local, *args[1:], **kwargs), args[0]._spec)
        if func is torch.cat or func is torch.stack:
            tensors, stack = args[0], func is torch.stack
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if not all(isinstance(t, ShardTensor) for t in tensors):
                raise TypeError(f"torch.{name}: expected only ShardTensors "
                                "(wrap plain tensors with ShardTensor.from_local)")
            spec = _common_spec(name, tuple(tensors), {})
            if dim % (tensors[0].ndim + stack) == 0:
                raise TypeError(f"torch.{name} along the node dimension changes the layout; "
                                f"{'stack along features (dim=-1)' if stack else 'concatenate along features'}")
            return ShardTensor(func([t._local for t in tensors], dim), spec)
        hint = _HINTS.get(name, _DEFAULT_HINT)
        raise TypeError(f"{name} is not a row-wise operation and would be wrong on shards of a ShardTensor; use {hint}")

    def __getattr__(self, name: str) -> Any:
        # Tensor methods (x.relu(), x.softmax(-1), x.index_select(...)) go through __torch_function__,
        # which runs the row-wise ones and refuses the others with the method to use.
        method = getattr(Tensor, name, None) if not name.startswith("_") else None
        if method is None or not callable(method):
            raise AttributeError(f"'ShardTensor' object has no attribute {name!r}")
        return _BoundMethod(self, method)

    __hash__ = object.__hash__

    def __add__(self, other: Any) -> ShardTensor:
        return torch.add(self, other)

    def __matmul__(self, other: Any) -> ShardTensor:
        return torch.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return torch.matmul(other, self)

    def __radd__(self, other: Any) -> ShardTensor:
        return torch.add(other, self)

    def __sub__(self, other: Any) -> ShardTensor:
        return torch.sub(self, other)

    def __rsub__(self, other: Any) -> ShardTensor:
        return torch.sub(other, self)

    def __mul__(self, other: Any) -> ShardTensor:
        return torch.mul(self, other)

    def __rmul__(self, other: Any) -> ShardTensor:
        return torch.mul(other, self)

    def __truediv__(self, other: Any) -> ShardTensor:
        return torch.div(self, other)

    def __rtruediv__(self, other: Any) -> ShardTensor:
        return torch.div(other, self)

    def __neg__(self) -> ShardTensor:
        return torch.neg(self)

    def __pow__(self, other: Any) -> ShardTensor:
        return torch.pow(self, other)

    def __rpow__(self, other: Any) -> ShardTensor:
        return self._method(Tensor.__rpow__, other)

    def __gt__(self, other: Any) -> ShardTensor:  # type: ignore[override]
        return torch.gt(self, other)

    def __ge__(self, other: Any) -> ShardTensor:
        return torch.ge(self, other)

    def __lt__(self, other: Any) -> ShardTensor:
        return torch.lt(self, other)

    def __le__(self, other: Any) -> ShardTensor:
        return torch.le(self, other)

    def __eq__(self, other: Any) -> ShardTensor:  # type: ignore[override]
        return torch.eq(self, other)

    def __ne__(self, other: Any) -> ShardTensor:  # type: ignore[override]
        return torch.ne(self, other)

    def __and__(self, other: Any) -> ShardTensor:
        return self._method(Tensor.__and__, other)

    def __or__(self, other: Any) -> ShardTensor:
        return self._method(Tensor.__or__, other)

    def __xor__(self, other: Any) -> ShardTensor:
        return self._method(Tensor.__xor__, other)

    def __invert__(self) -> ShardTensor:
        return self._method(Tensor.__invert__)

    def __abs__(self) -> ShardTensor:
        return torch.abs(self)

    def __floordiv__(self, other: Any) -> ShardTensor:
        return self._method(Tensor.__floordiv__, other)

    def __mod__(self, other: Any) -> ShardTensor:
        return self._method(Tensor.__mod__, other)

    def __getitem__(self, index: Any) -> ShardTensor:
        return self._method(Tensor.__getitem__, index)

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a ShardTensor is ambiguous (each rank holds different rows); "
                        "reduce it first, e.g. bool((x > 0).sum())")

    def _method(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return ShardTensor.__torch_function__(method, (ShardTensor,), (self, *args), kwargs)


class _BoundMethod:
    """``x.method`` for a Tensor method, dispatched through ``ShardTensor.__torch_function__``."""

    __slots__ = ("_self", "_method")

    def __init__(self, obj: ShardTensor, method: Callable[..., Any]) -> None:
        self._self = obj
        self._method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._self._method(self._method, *args, **kwargs)


# --- row-wise work with rules -----------------------------------------------------------------------


def _dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return None
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(int(d) % ndim for d in dims)


def _dim_wise(func: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
    """softmax / normalize / reductions: fine over feature dimensions, refused over nodes."""
    x = args[0]
    if not isinstance(x, ShardTensor) or any(isinstance(a, ShardTensor) for a in (*args[1:], *kwargs.values())):
        raise TypeError(f"{name}: only the input may be a ShardTensor")
    position, default = _DIM_WISE[func]
    dim = args[position] if len(args) > position else kwargs.get("dim", default)
    dims = _dims(dim, max(x.ndim, 1))
    if dims is None or 0 in dims:
        over = "every dimension" if dims is None else "the node dimension (0)"
        hint = "ShardTensor.sum() / .mean() (global, replicated)" if name in ("sum", "mean") else (
            "a feature dimension (dim=-1), or full_tensor() for the whole tensor")
        raise TypeError(f"{name} over {over} mixes rows and would be wrong on shards of a ShardTensor; use {hint} "
                        "(a PyG normalisation layer, GraphNorm or LayerNorm(mode='graph'), is exact on shards "
                        "inside meshshard.nn.ShardNorm)")
    result = func(*_unwrap(args), **_unwrap(kwargs))
    if isinstance(result, tuple):  # max / min with dim: (values, indices)
        return type(result)([ShardTensor(r, x._spec) for r in result])
    return ShardTensor(result, x._spec)


def _reshape(func: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
    """Reshaping and indexing that keep the owned rows in dimension 0; anything else is refused."""
    x = args[0]
    if not isinstance(x, ShardTensor) or any(isinstance(a, ShardTensor) for a in _flat([*args[1:], *kwargs.values()])):
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
    return ShardTensor(func(local, *rest, **kwargs), x._spec)


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
        dims = _dims(rest[0] if rest else kwargs.get("dim"), ndim)
        return dims is not None and 0 not in dims
    if func in (Tensor.transpose, torch.transpose):
        return 0 not in _dims(rest[:2], ndim)
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
    return type(item).__name__ if isinstance(item, (Tensor, ShardTensor, list)) else repr(item)


def _batch_norm(
    x: Any, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
    bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
) -> ShardTensor:
    """``F.batch_norm`` over every node of every rank; eval mode (running statistics) is row-wise.

    Communication (training): two ``all_reduce`` forward (the sum, then the squared deviations), two
    backward (each rank's part of the statistics' gradient, summed).
    """
    if not isinstance(x, ShardTensor):
        raise TypeError("batch_norm: only the input may be a ShardTensor")
    local, spec = x._local, x._spec
    if not training:
        return ShardTensor(F.batch_norm(local, running_mean, running_var, weight, bias, False, momentum, eps), spec)
    dims = [d for d in range(local.dim()) if d != 1]
    shape = [1, local.shape[1]] + [1] * (local.dim() - 2)
    count = spec.num_nodes * math.prod(local.shape[2:])
    if count <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training batch_norm (got {count})")
    mean = _SumOfParts.apply(local.sum(dims), spec.group) / count
    centred = local - mean.view(shape)
    var = _SumOfParts.apply(centred.square().sum(dims), spec.group) / count
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
    return ShardTensor(out, spec)


def _device_mesh(group: Any, device: torch.device) -> Any:
    # DTensor interop: a DeviceMesh around a group that exists already (from_group makes none and
    # sends nothing), so these torch.distributed names stay here rather than in comm.
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device.type)


def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out += _flat(a)
        else:
            out.append(a)
    return out


def _common_spec(name: str, args: Any, kwargs: dict) -> ShardSpec:
    specs = [a._spec for a in _flat(list(args) + list(kwargs.values())) if isinstance(a, ShardTensor)]
    for s in specs[1:]:
        if s != specs[0]:
            raise ValueError(
                f"{name}: ShardTensors of different layouts mixed ({specs[0]!r} and {s!r}); "
                "bring one to the other's layout with .redistribute(spec)"
            )
    return specs[0]


def _check_plain_operands(name: str, spec: ShardSpec, args: tuple, kwargs: dict) -> None:
    """A plain tensor may broadcast over features, never supply rows of its own."""
    shards = [a for a in _flat(list(args) + list(kwargs.values())) if isinstance(a, ShardTensor)]
    ndim = max(s.ndim for s in shards)
    for a in _flat(list(args) + list(kwargs.values())):
        if isinstance(a, Tensor) and a.dim() >= ndim and a.shape[a.dim() - ndim] != 1:
            raise TypeError(
                f"{name}: a plain tensor of shape {tuple(a.shape)} would line up with the node rows; "
                "wrap owned rows with ShardTensor.from_local(t, spec), or pass a feature vector"
            )


def _unwrap(x: Any) -> Any:
    if isinstance(x, ShardTensor):
        return x._local
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(result: Any, spec: ShardSpec) -> Any:
    if isinstance(result, Tensor) and result.dim() > 0 and result.shape[0] == spec.num_owned:
        return ShardTensor(result, spec)
    return result
