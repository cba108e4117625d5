"""Gradient reduction for replicated parameters: :class:`DomainParallel`, and the DDP / FSDP2 recipes.

On a domain-parallel run every rank holds the same parameters and computes its shard's part of
their gradient; the gradient of the global loss is the **sum** of those parts over the domain
group. With data parallelism on top (a ``data x domain`` :class:`~meshshard.comm.DeviceMesh2D`),
each data group trains on another sample and the batch gradient is the **mean** over the data
group of the per-sample sums. Since every rank of the device mesh takes part, both are one
``all_reduce`` over the world followed by a division by ``data_parallel_size``.

In this module ``mesh`` (the keyword of :class:`DomainParallel`, :func:`ddp_comm_hook`,
:func:`fsdp_device_mesh` and :func:`fully_shard_data_parallel`, as in torch's ``fully_shard``)
is always a *device mesh*, the ranks' ``data x domain`` layout from
:func:`~meshshard.comm.init_device_mesh_2d`; code that holds one calls it ``device_mesh``, and
``mesh`` elsewhere (a dataset's ``sample_mesh(s)``) is the index of a geometric mesh.

Three ways to get it, each equal to single-process training on the same batch:

- :class:`DomainParallel` (``model = DomainParallel(model, mesh)``): the reduction runs during
  ``loss.backward()``, bucketed and overlapped with it; nothing else to call;
- DDP over the data-parallel dimension: ``DDP(model, process_group=mesh.data_group)`` with
  ``ddp.register_comm_hook(mesh, ddp_comm_hook)``;
- FSDP2 over the data-parallel dimension with domain parallelism inside:
  :func:`fully_shard_data_parallel` (``fully_shard`` on a ``(domain, data)`` device mesh: sharded
  over the data group, replicated over the domain group, gradients divided by the data size only).

The DDP and FSDP2 recipes are in :mod:`._data_parallel`. See ``docs/parallelism.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from meshshard.comm import (
    CollectiveCall,
    DeviceMesh2D,
    all_gather_objects,
    all_gather_stacked,
    all_reduce_sum,
    broadcast_tensor,
    communication_device,
    debug_enabled,
    group_rank_and_size,
    record_collective,
    replicated_results,
)

__all__ = ["DomainParallel", "data_size"]

_PREFIX = "module."


def data_size(mesh: DeviceMesh2D | None) -> int:
    """The divisor of the world-wide gradient sum: the data-parallel size (1 for ``mesh=None``)."""
    _, world = group_rank_and_size()
    if mesh is None:
        return 1
    if not isinstance(mesh, DeviceMesh2D):
        raise TypeError(
            f"Expected 'mesh' to be a DeviceMesh2D from init_device_mesh_2d or None (got {type(mesh).__name__})"
        )
    size = mesh.data_parallel_size * mesh.domain_parallel_size
    if size != world:
        raise ValueError(
            f"Expected 'mesh' to cover the world of {world} ranks (got {mesh.data_parallel_size} data x "
            f"{mesh.domain_parallel_size} domain = {size} ranks)"
        )
    return mesh.data_parallel_size


class _Bucket:
    """Parameters whose gradients travel in one ``all_reduce``, flattened into ``buffer``."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.buffer = torch.zeros(self.offsets[-1], dtype=params[0].dtype, device=params[0].device)
        self.ready = [False] * len(params)
        self.pending = len(params)
        self.work: Any = None

    def view(self, i: int) -> Tensor:
        return self.buffer[self.offsets[i] : self.offsets[i + 1]]

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.pending = len(self.params)
        self.work = None


def _make_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[_Bucket]:
    """Buckets in reverse registration order (roughly the order gradients arrive in backward),
    one (device, dtype) each, at most ``cap_bytes`` each unless a single parameter is larger."""
    buckets: list[_Bucket] = []
    open_: dict[tuple[torch.device, torch.dtype], tuple[list[nn.Parameter], int]] = {}
    order: list[list[nn.Parameter]] = []
    for p in reversed(params):
        key = (p.device, p.dtype)
        members, size = open_.get(key, ([], 0))
        nbytes = p.numel() * p.element_size()
        if members and size + nbytes > cap_bytes:
            members, size = [], 0
        if not members:
            order.append(members)
        members.append(p)
        open_[key] = (members, size + nbytes)
    for members in order:
        buckets.append(_Bucket(members))
    return buckets


class DomainParallel(nn.Module):
    """Wrap a model whose parameters are replicated on every rank; reduce their gradients in backward.

    After ``loss.backward()`` every replicated parameter's ``.grad`` holds the gradient of the
    global loss: the sum over the domain group (each rank's shard contributes its part) and the
    mean over the data group (each data group trains on another sample), equal to single-process
    training on the whole batch. ``optimizer.step()`` follows with no extra call, and every rank
    applies the same update.

    How: a post-accumulate-grad hook on each parameter copies its gradient into a bucket (about
    ``bucket_cap_mb`` each, filled in reverse registration order, which is roughly the order
    gradients arrive). A full bucket starts an asynchronous ``all_reduce`` at once, so the
    communication overlaps the rest of the backward; buckets start in index order on every rank
    (a bucket that fills early waits for the ones before it). A callback queued on the autograd
    engine waits for them all at the end of the backward, divides by the data-parallel size and
    writes the results back into ``.grad``.

    Parameters used only on replicated values (a head on globally pooled features: the result of
    ``ShardTensor.sum`` / ``mean`` / ``full_tensor``) get the whole gradient on every rank, not one
    rank's part; after a forward that made such a value, the wrapper finds them in the output's
    autograd graph and divides their sum by the domain size, so they too equal one process. A
    parameter used both on rows and on a replicated value is refused (``ValueError``, in forward).

    Parameters that get no gradient on a rank in some backward (an unused branch, a rank whose
    shard skips a layer) contribute their current ``.grad``, or zeros when it is ``None``: every
    rank sends every bucket, in the same order, in every backward. So after a backward *every*
    parameter with ``requires_grad`` has a ``.grad`` (zeros where no rank contributed). Each rank
    must run a backward through the model (through at least one parameter) whenever the others
    do, as it must run the forward's halo exchanges.

    Reentrant activation checkpointing (``use_reentrant=True``) would end a nested backward, and
    reduce, before the outer one is done: a gradient arriving in a backward other than the one that
    started at the wrapper's output raises ``RuntimeError`` (use ``use_reentrant=False``).

    Args:
        module: the model, already on its device and in its dtype (the buckets are allocated here);
            its parameters must be the same on every rank (they are broadcast from rank 0 at
            construction unless ``broadcast_parameters=False``).
        mesh: a :class:`~meshshard.comm.DeviceMesh2D` (``data x domain``) covering the world, or
            ``None``: the whole world is one domain group (pure domain parallelism). A world of one
            needs no process group and reduces nothing.
        bucket_cap_mb: bucket size in MiB (like DDP's ``bucket_cap_mb``).
        broadcast_parameters: broadcast parameters and buffers from global rank 0 at construction.

    Attributes and checkpoints: attribute access falls through to ``module``, calling the wrapper
    calls ``module``, and ``state_dict()`` / ``load_state_dict()`` use the wrapped model's keys (no
    ``module.`` prefix), so a checkpoint loads into the bare model and back. ``named_parameters()``
    does show the ``module.`` prefix; ``.module`` is the wrapped model.

    ``MESHSHARD_DEBUG=1`` (or :func:`meshshard.comm.set_debug`): the first forward and every forward
    after a gradient reduction first call :meth:`check_parameters`, which fails on every rank with
    the same one-line error naming the first parameter that differs across ranks.

    Communication: at construction one ``all_gather_object`` (the parameter layout, checked on every
    rank) and one ``broadcast`` per dtype; in each backward one ``all_reduce`` per bucket over the
    world (``count_collectives`` records them as ``"DomainParallel"``, phase ``"backward"``).
    """

    def __init__(
        self,
        module: nn.Module,
        mesh: DeviceMesh2D | None = None,
        *,
        bucket_cap_mb: float = 25.0,
        broadcast_parameters: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"Expected 'module' to be a torch.nn.Module (got {type(module).__name__})")
        if not bucket_cap_mb > 0:
            raise ValueError(f"Expected 'bucket_cap_mb' > 0 (got {bucket_cap_mb})")
        self.module = module
        self.mesh = mesh
        self._data_size = data_size(mesh)
        self._rank, self._world = group_rank_and_size()
        named = _unique_parameters(module)
        self._names = [name for name, _ in named]
        self._params = [p for _, p in named]
        self._require_sync = True
        self._queued = False
        self._task: int | None = None  # the graph task (backward) this reduction belongs to
        self._next_bucket = 0
        self._needs_check = True
        self._buckets: list[_Bucket] = []
        self._hooks: list[Any] = []
        self._on_replicated: set[int] = set()  # parameters used only on replicated values since the last reduction
        self.register_state_dict_post_hook(_strip_prefix)
        self.register_load_state_dict_pre_hook(_add_prefix)
        if self._world == 1:
            return
        _check_layout(self._names, self._params, module)
        if broadcast_parameters:
            _broadcast(list(module.parameters()) + list(module.buffers()))
        self._buckets = _make_buckets(self._params, int(bucket_cap_mb * 2**20))
        for b, bucket in enumerate(self._buckets):
            for i, p in enumerate(bucket.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(b, i)))

    # --- forwarding ---------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's forward; the replicated parameters' gradients are reduced during
        the backward that follows (summed over the domain group, averaged over the data group)."""
        if self._queued:  # a backward stopped half-way (an error): drop its reduction
            self._abandon()
        if self._needs_check and self._world > 1 and debug_enabled():
            self.check_parameters()
        made = replicated_results()
        out = self.module(*args, **kwargs)
        if self._world > 1 and torch.is_grad_enabled():
            if replicated_results() != made:  # a global reduction ran: any parameter on its result?
                self._on_replicated |= self._used_on_replicated(out)
            out = _mark_backward_start(out, self)
        return out

    def _used_on_replicated(self, out: Any) -> set[int]:
        """The parameters (ids) that ``out`` uses only on replicated values (a head on globally
        pooled features): their gradient is whole on every rank, so the reduction counts it once.
        A parameter used both there and on the rows is refused (its two parts cannot be told apart)."""
        on_replicated, on_rows = _parameter_uses(out)
        both = on_replicated & on_rows
        if both:
            names = [self._name_of(p) for p in self._params if id(p) in both]
            raise ValueError(
                f"DomainParallel: parameter(s) {', '.join(names)} are used both on the mesh's rows and on globally "
                "reduced values (a graph-level head sharing weights with a node-level layer); their gradient cannot "
                "be reduced exactly: give the computation on the reduced values its own parameters"
            )
        return on_replicated

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip the reduction for the backwards inside the block (gradient accumulation).

        Gradients accumulate locally in ``.grad``; the first backward outside the block reduces
        the accumulated sum (reduction is linear, so this equals reducing each backward)::

            with model.no_sync():
                model(x1, graph, e).mean().backward()
            model(x2, graph, e).mean().backward()     # reduces the sum of both
        """
        previous = self._require_sync
        self._require_sync = False
        try:
            yield
        finally:
            self._require_sync = previous

    # --- the reduction ------------------------------------------------------------------------

    def _make_hook(self, b: int, i: int) -> Any:
        def hook(param: Tensor) -> None:
            self._on_gradient(b, i, param)

        return hook

    def _on_gradient(self, b: int, i: int, param: Tensor) -> None:
        if not self._require_sync:
            return
        task = _graph_task_id()
        if self._task is None:
            self._task = task
        elif task != self._task:
            raise RuntimeError(
                f"DomainParallel: parameter {self._name_of(param)!r} got its gradient in a nested backward (reentrant "
                "activation checkpointing?), which would reduce it twice; use checkpoint(..., use_reentrant=False)"
            )
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            self._queued = True
        bucket = self._buckets[b]
        if bucket.work is not None:
            raise RuntimeError(
                f"DomainParallel: parameter {self._name_of(param)!r} received a second gradient in one backward after "
                "its bucket was sent; every parameter must get its gradient once per backward"
            )
        grad = param.grad
        if grad is None:  # the hook runs after accumulation, so this does not happen; be safe
            bucket.view(i).zero_()
        else:
            if grad.is_sparse:
                raise RuntimeError(
                    f"DomainParallel: sparse gradients are not supported (parameter {self._name_of(param)!r})"
                )
            bucket.view(i).copy_(grad.reshape(-1))
        if not bucket.ready[i]:
            bucket.ready[i] = True
            bucket.pending -= 1
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._next_bucket)
            self._next_bucket += 1

    def _launch(self, b: int) -> None:
        bucket = self._buckets[b]
        nbytes = bucket.buffer.numel() * bucket.buffer.element_size()
        record_collective(CollectiveCall("DomainParallel", "backward", nbytes, nbytes, self._world))
        bucket.work = all_reduce_sum(bucket.buffer, async_op=True)

    def _finalize(self) -> None:
        """End of backward: send the buckets not yet sent (in order), wait, write ``.grad`` back."""
        try:
            for b in range(self._next_bucket, len(self._buckets)):
                bucket = self._buckets[b]
                for i, p in enumerate(bucket.params):
                    if not bucket.ready[i]:
                        if p.grad is None:
                            bucket.view(i).zero_()
                        else:
                            bucket.view(i).copy_(p.grad.reshape(-1))
                        bucket.ready[i] = True
                bucket.pending = 0
                self._launch(b)
            self._next_bucket = len(self._buckets)
            for bucket in self._buckets:
                bucket.work.wait()
                if self._data_size > 1:
                    bucket.buffer.div_(self._data_size)
                for i, p in enumerate(bucket.params):
                    reduced = bucket.view(i).view_as(p)
                    if id(p) in self._on_replicated:  # whole on every rank: counted once per domain rank
                        reduced.div_(self._world // self._data_size)
                    if p.grad is None:
                        p.grad = reduced.clone()
                    else:
                        p.grad.copy_(reduced)
            self._on_replicated = set()
        finally:
            self._reset()
        self._needs_check = True

    def _forget_task(self) -> None:
        self._task = None

    def _abandon(self) -> None:
        for bucket in self._buckets:
            if bucket.work is not None:
                bucket.work.wait()
        self._reset()

    def _reset(self) -> None:
        for bucket in self._buckets:
            bucket.reset()
        self._next_bucket = 0
        self._queued = False
        self._task = None

    def _name_of(self, param: Tensor) -> str:
        for name, p in zip(self._names, self._params):
            if p is param:
                return name
        return "?"

    # --- the debug check ----------------------------------------------------------------------

    def check_parameters(self) -> None:
        """Check that every rank holds bit-identical parameters; raise the same error on every rank if not.

        Collective: every rank must call it (the forward does, under ``MESHSHARD_DEBUG=1``).
        Each rank hashes each parameter's bytes (BLAKE2b, 8 bytes); one ``all_gather`` of the
        ``(P,)`` hashes; the first parameter (in ``named_parameters`` order of the wrapped model)
        whose hash differs on some rank is named, with those ranks.

        Raises:
            RuntimeError: ``DomainParallel: parameter 'name' differs across ranks ...``.
        """
        self._needs_check = False
        if self._world == 1:
            return
        mine = torch.tensor([_fingerprint(p) for p in self._params], dtype=torch.int64, device=communication_device())
        record_collective(CollectiveCall("DomainParallel.check_parameters", "forward", 0, 0, self._world))
        table = all_gather_stacked(mine).cpu()  # (R, P)
        differs = (table != table[0]).any(dim=0).nonzero().flatten()
        if len(differs):
            k = int(differs[0])
            ranks = (table[:, k] != table[0, k]).nonzero().flatten().tolist()
            raise RuntimeError(
                f"DomainParallel: parameter {self._names[k]!r} differs across ranks: ranks {ranks} hold other values "
                f"than rank 0 ({len(differs)} of {len(self._names)} parameters differ); were gradients reduced on "
                "every rank, and does every rank run the same optimizer steps?"
            )


def _graph_task_id() -> int:
    """The running backward's id (-1 outside one; 0 when torch does not expose it)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return int(current()) if current is not None else 0


class _BackwardStart(torch.autograd.Function):
    """Identity on the model's outputs; its backward tells the wrapper which backward is the outer one."""

    @staticmethod
    def forward(ctx: Any, owner: DomainParallel, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.owner = owner
        return tuple(t.clone() for t in tensors)  # not views: the caller may modify them in place

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Any, ...]:
        owner = ctx.owner
        owner._task = _graph_task_id()  # the outer backward: parameter gradients must arrive in it
        torch.autograd.Variable._execution_engine.queue_callback(owner._forget_task)
        return (None, *grads)


def _mark_backward_start(out: Any, owner: DomainParallel) -> Any:
    """Pass the output's tensors (plain, or a ShardTensor's local rows; in tuples, lists, dicts) through
    :class:`_BackwardStart`, so that a gradient arriving in a nested backward can be recognised."""
    from .._tensor import ShardTensor

    found: list[Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, Tensor) and value.requires_grad:
            found.append(value)
        elif isinstance(value, ShardTensor) and value.to_local().requires_grad:
            found.append(value.to_local())
        elif isinstance(value, (tuple, list)):
            for v in value:
                collect(v)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)

    collect(out)
    if not found:
        return out
    marked = dict(zip(map(id, found), _BackwardStart.apply(owner, *found)))

    def rebuild(value: Any) -> Any:
        if isinstance(value, Tensor):
            return marked.get(id(value), value)
        if isinstance(value, ShardTensor):
            local = value.to_local()
            return ShardTensor(marked[id(local)], value.spec) if id(local) in marked else value
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(rebuild(v) for v in value)
        if isinstance(value, list):
            return [rebuild(v) for v in value]
        if isinstance(value, dict):
            return type(value)((k, rebuild(v)) for k, v in value.items())
        return value

    return rebuild(out)


def _unique_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Named parameters that need a gradient, each shared parameter once."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def _check_layout(names: list[str], params: list[nn.Parameter], module: nn.Module) -> None:
    """Every rank must bucket the same parameters: compare names, shapes and dtypes across ranks."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(names, params)]
    mine_buffers = [(n, tuple(b.shape), str(b.dtype)) for n, b in module.named_buffers()]
    everyone = all_gather_objects((mine, mine_buffers))
    for r, layout in enumerate(everyone):
        if layout != everyone[0]:
            first = next(
                (a, b)
                for a, b in zip(layout[0] + layout[1] + [None], everyone[0][0] + everyone[0][1] + [None])
                if a != b
            )
            raise ValueError(
                f"Expected the same parameters on every rank (rank {r} has {first[0]}, rank 0 has {first[1]})"
            )


def _broadcast(tensors: list[Tensor]) -> None:
    """Broadcast from global rank 0, one flat tensor per (device, dtype)."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    with torch.no_grad():
        for members in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            broadcast_tensor(flat, src=0)
            offset = 0
            for t in members:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def _fingerprint(t: Tensor) -> int:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True)


def _strip_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """state_dict post-hook: ``{prefix}module.x`` -> ``{prefix}x``, order kept."""
    inner = prefix + _PREFIX
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner) :]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if k.startswith(inner) or k == inner[:-1]]:
            value = metadata.pop(key)
            if key != inner[:-1]:
                metadata[prefix + key[len(inner) :]] = value


def _add_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: ``{prefix}x`` -> ``{prefix}module.x`` (both spellings accepted)."""
    inner = prefix + _PREFIX
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix) :]] = state_dict.pop(key)


def _parameter_uses(out: Any) -> tuple[set[int], set[int]]:
    """The leaf tensors (ids) that ``out``'s autograd graph reaches (1) through replicated values
    only, (2) through rows. Replicated: a plain output computed from a global reduction, and what
    lies between a replicated value used on rows (``RowsUseReplicated``) and the reduction that
    made it; the reduction's own inputs are rows again."""
    from .._tensor import ShardTensor
    from .._tensor_functions import REPLICATING, ROWS_USE_REPLICATED, from_replicated

    starts: list[tuple[Any, bool]] = []

    def collect(obj: Any) -> None:
        if isinstance(obj, ShardTensor):
            starts.append((obj.to_local().grad_fn, False))
        elif isinstance(obj, Tensor):
            if obj.grad_fn is not None:
                starts.append((obj.grad_fn, from_replicated(obj)))
        elif isinstance(obj, dict):
            for v in obj.values():
                collect(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                collect(v)

    collect(out)
    on_replicated: set[int] = set()
    on_rows: set[int] = set()
    seen: set[tuple[Any, bool]] = set()
    while starts:
        node, replicated = starts.pop()
        if node is None or (node, replicated) in seen:
            continue
        seen.add((node, replicated))
        kind = type(node).__name__
        if kind == "AccumulateGrad":
            (on_replicated if replicated else on_rows).add(id(node.variable))
            continue
        if kind in REPLICATING:
            replicated = False
        elif kind == ROWS_USE_REPLICATED:
            replicated = True
        starts.extend((n, replicated) for n, _ in node.next_functions)
    return on_replicated, on_rows
