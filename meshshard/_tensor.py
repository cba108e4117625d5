"""``ShardTensor``: the owned rows of one node-indexed tensor, plus its :class:`ShardSpec`.

Why a plain container with a small ``__torch_function__``, not a ``torch.Tensor`` subclass:
a subclass inherits every tensor operation, so an operation nobody thought about (a ``sum``, an
``index_select``, a ``matmul`` over nodes) would run on the local rows and return a result that is
silently wrong on shards, the trap DTensor falls into with uneven layouts. Here, torch functions
reach :meth:`ShardTensor.__torch_function__`, which runs a short list of row-wise operations
(element-wise arithmetic, activations, ``F.linear``, feature-wise ``layer_norm``, ``torch.cat``
along features) on the local rows and keeps the spec; anything else raises a ``TypeError`` that
names the method to use. ``nn.Linear``, ``nn.LayerNorm`` and activation modules therefore accept a
``ShardTensor`` unchanged. Autograd runs on the plain local tensors: no subclass in the backward.

Replicated results (``full_tensor()``, ``sum()``, ``mean()``) are one logical value held by every
rank. Every rank must use them the same way (as a loss computed identically everywhere is): the
backward then hands each rank the gradient of its own rows, and the gradients equal those of the
single-process computation on the whole tensor.

Shapes: ``N`` global nodes, ``N_own`` owned rows, ``N_ghost`` ghost rows, ``...`` any trailing
(feature, batch) dimensions. The node dimension is always dimension 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function

from meshshard.comm import all_gather_v, gather_v, indexed_all_to_all_v, scatter_v, sum_to_replicated

from ._spec import ShardSpec

__all__ = ["ShardTensor"]

_ELEMENTWISE: set[Callable[..., Any]] = {
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div, torch.divide,
    torch.true_divide, torch.neg, torch.pow, torch.exp, torch.log, torch.sqrt, torch.rsqrt,
    torch.abs, torch.square, torch.tanh, torch.sigmoid, torch.relu, torch.sin, torch.cos,
    torch.clamp, torch.maximum, torch.minimum, torch.where,
    F.relu, F.gelu, F.silu, F.elu, F.leaky_relu, F.softplus, F.tanh, F.sigmoid, F.mish,
    Tensor.__add__, Tensor.__radd__, Tensor.__sub__, Tensor.__rsub__, Tensor.__mul__, Tensor.__rmul__,
    Tensor.__truediv__, Tensor.__rtruediv__, Tensor.__neg__, Tensor.__pow__,
}
_FEATURE_WISE: set[Callable[..., Any]] = {F.linear, F.layer_norm}

_HINTS = {
    "sum": "ShardTensor.sum() (a global sum over nodes)",
    "mean": "ShardTensor.mean() (a global mean over nodes)",
}
_DEFAULT_HINT = (
    "with_halo() for owned + ghost rows, full_tensor() or gather() for the whole tensor, "
    "redistribute() for another layout, or to_local() to work on the owned rows explicitly"
)


class _FullTensor(Function):
    """Shard -> replicated whole tensor. Backward: each rank keeps the gradient of its own rows."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, spec: ShardSpec) -> Tensor:
        ctx.spec = spec
        with torch.no_grad():
            rows = all_gather_v(local, list(spec.owned_counts), group=spec.group)
        ids = spec.all_global_ids().to(local.device)
        return torch.empty_like(rows).index_copy_(0, ids, rows)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad.index_select(0, ctx.spec._on("global_ids", grad.device)), None


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
        return self._local.dim()

    @property
    def ndim(self) -> int:
        return self._local.dim()

    def size(self, dim: int | None = None) -> Any:
        return self._local.size() if dim is None else self._local.size(dim)

    def requires_grad_(self, requires_grad: bool = True) -> ShardTensor:
        self._local.requires_grad_(requires_grad)
        return self

    def detach(self) -> ShardTensor:
        return ShardTensor(self._local.detach(), self._spec)

    def to(self, *args: Any, **kwargs: Any) -> ShardTensor:
        """``Tensor.to`` on the local rows (dtype and device; the layout is unchanged)."""
        return ShardTensor(self._local.to(*args, **kwargs), self._spec)

    def double(self) -> ShardTensor:
        return self.to(torch.float64)

    def float(self) -> ShardTensor:
        return self.to(torch.float32)

    def __len__(self) -> int:
        return self._local.shape[0]

    def __repr__(self) -> str:
        return f"ShardTensor(local={tuple(self._local.shape)}, global={tuple(self.global_shape)}, dtype={self.dtype}, {self._spec!r})"

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

    def sum(self, dim: int | None = None) -> Any:
        """Global sum. ``dim=None``: over everything (a replicated scalar); ``dim=0``: over nodes (a
        replicated ``(...)`` tensor); another ``dim``: row-wise, a ``ShardTensor``.

        Communication: one ``all_reduce`` forward for ``dim`` None or 0; none backward.
        """
        if dim is None:
            return sum_to_replicated(self._local.sum(), group=self._spec.group)
        if dim % self.ndim == 0:
            return sum_to_replicated(self._local.sum(0), group=self._spec.group)
        return ShardTensor(self._local.sum(dim), self._spec)

    def mean(self, dim: int | None = None) -> Any:
        """Global mean, with the same ``dim`` rules as :meth:`sum`: the mean over all ``N`` nodes."""
        if not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise TypeError(f"mean() needs a floating point ShardTensor (got {self.dtype})")
        if dim is None:
            return self.sum() / self._count_all()
        if dim % self.ndim == 0:
            return self.sum(0) / self._spec.num_nodes
        return ShardTensor(self._local.mean(dim), self._spec)

    def _count_all(self) -> int:
        n = self._spec.num_nodes
        for s in self._local.shape[1:]:
            n *= s
        return n

    # --- DTensor interop --------------------------------------------------------------------------

    def to_dtensor(self, placement: str = "shard", device_mesh: Any = None) -> Any:
        """A DTensor: ``"shard"`` (``Shard(0)``; needs the chunked layout) or ``"replicate"``."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        mesh = device_mesh if device_mesh is not None else _device_mesh(self._spec.group, self.device)
        if placement == "replicate":
            return DTensor.from_local(self.full_tensor(), mesh, [Replicate()], run_check=False)
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
        return DTensor.from_local(self._local, mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)

    @classmethod
    def from_dtensor(cls, dtensor: Any, spec: ShardSpec | None = None) -> ShardTensor:
        """From a DTensor on a 1-D mesh: ``Shard(0)`` (chunked rows) or ``Replicate()``.

        With ``spec``, the result is laid out by it (a redistribute for ``Shard(0)``, a local slice
        for ``Replicate()``, which needs ``spec``).
        """
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
            return cls.from_local(full.index_select(0, spec._on("global_ids", full.device)), spec)
        raise ValueError(f"Expected a DTensor on a 1-D mesh placed Shard(0) or Replicate() (got {placements})")

    # --- row-wise torch functions ------------------------------------------------------------------

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in _ELEMENTWISE:
            spec = _common_spec(name, args, kwargs)
            _check_plain_operands(name, spec, args, kwargs)
            return _wrap(func(*_unwrap(args), **_unwrap(kwargs)), spec)
        if func in _FEATURE_WISE:
            if not isinstance(args[0], ShardTensor) or any(isinstance(a, ShardTensor) for a in (*args[1:], *kwargs.values())):
                raise TypeError(f"{name}: only the input may be a ShardTensor (its weights are plain tensors)")
            spec = args[0]._spec
            if func is F.layer_norm and len(tuple(args[1])) >= args[0].ndim:
                raise TypeError("layer_norm over the node dimension mixes rows; normalise over features only")
            return _wrap(func(*_unwrap(args), **_unwrap(kwargs)), spec)
        if func is torch.cat:
            tensors = args[0]
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if not all(isinstance(t, ShardTensor) for t in tensors):
                raise TypeError("torch.cat: expected only ShardTensors (wrap plain tensors with ShardTensor.from_local)")
            spec = _common_spec(name, tuple(tensors), {})
            if dim % tensors[0].ndim == 0:
                raise TypeError("torch.cat along the node dimension changes the layout; concatenate along features")
            return ShardTensor(torch.cat([t._local for t in tensors], dim), spec)
        hint = _HINTS.get(name, _DEFAULT_HINT)
        raise TypeError(f"{name} is not a row-wise operation and would be wrong on shards of a ShardTensor; use {hint}")

    def __add__(self, other: Any) -> ShardTensor:
        return torch.add(self, other)

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


def _device_mesh(group: Any, device: torch.device) -> Any:
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
