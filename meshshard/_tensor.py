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
The rules are in ``_rowwise.py``, the autograd Functions in ``_tensor_functions.py``.

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

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from meshshard.comm import gather_v, indexed_all_to_all_v, scatter_v, sum_to_replicated

from ._rowwise import OwnedRows, dims_of, register_rowwise, torch_function
from ._spec import ShardSpec
from ._tensor_functions import FullTensor

__all__ = ["ShardTensor", "register_rowwise"]

def _inverse(ids: Tensor) -> Tensor:
    inv = torch.empty_like(ids)
    inv[ids] = torch.arange(ids.numel(), dtype=ids.dtype, device=ids.device)
    return inv


class ShardTensor(OwnedRows):
    """The owned rows ``(N_own, ...)`` of a node-indexed tensor, laid out by a :class:`ShardSpec`.

    Build it with :meth:`from_local` (no communication) or :meth:`scatter_tensor`; read it back with
    :meth:`to_local`, :meth:`full_tensor` or :meth:`gather`. (``ShardTensor(local, spec)`` is
    internal: callers have checked the rows.)
    """

    __slots__ = ()

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

        Communication: one ``indexed_all_to_all_v`` forward, one backward
        (:func:`meshshard.comm.append_halo`: the owned rows' gradient is not copied, and the owned
        rows are not either when the local tensor came from ``spec.halo.empty_owned(...)``).
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
        return FullTensor.apply(self._local, self._spec)

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
        dims = dims_of(dim, max(self.ndim, 1))
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
        dims = dims_of(dim, max(self.ndim, 1))
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
            device_mesh = device_mesh_of(self._spec.group, self.device)
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
        """A row-wise torch function on the owned rows, keeping the spec; any other raises a
        ``TypeError`` that names the method to use (the rules: ``meshshard._rowwise``)."""
        return torch_function(cls, func, args, kwargs or {})

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


def device_mesh_of(group: Any, device: torch.device) -> Any:
    """A 1-D ``DeviceMesh`` over ``group`` (the world when ``None``), for DTensor interop."""
    # DTensor interop: a DeviceMesh around a group that exists already (from_group makes none and
    # sends nothing), so these torch.distributed names stay here rather than in comm.
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device.type)

