"""DDP and FSDP2 over the data-parallel dimension of a ``data x domain`` device mesh, with domain
parallelism inside: :func:`ddp_comm_hook` (``ddp.register_comm_hook(mesh, ddp_comm_hook)``),
:func:`fsdp_device_mesh` and :func:`fully_shard_data_parallel`. Each equals single-process training
on the same batch, as :class:`~meshshard.nn.DomainParallel` does (:mod:`._parallel` says why).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.distributed import GradBucket  # the type DDP hands its hooks (it checks the annotation); sends nothing

from meshshard.comm import (
    CollectiveCall,
    DeviceMesh2D,
    all_reduce_sum,
    group_rank_and_size,
    record_collective,
    torch_device_mesh,
)

from ._parallel import data_size

__all__ = ["ddp_comm_hook", "fsdp_device_mesh", "fully_shard_data_parallel"]

def ddp_comm_hook(mesh: DeviceMesh2D | None, bucket: GradBucket) -> torch.futures.Future[Tensor]:
    """A DDP communication hook: sum over the domain group, mean over the data group.

    Use with DDP over the data-parallel dimension::

        ddp = DistributedDataParallel(model, process_group=mesh.data_group)
        ddp.register_comm_hook(mesh, ddp_comm_hook)

    DDP's default hook averages each bucket over its process group (the data group); this one
    all-reduces the bucket over the whole ``data x domain`` mesh (the world) and divides by
    ``mesh.data_parallel_size``, which adds the domain group's sum. ``mesh=None``: pure domain
    parallelism (a sum over the world).

    Communication: one asynchronous ``all_reduce`` of the bucket over the world.
    """
    dp = data_size(mesh)
    buffer = bucket.buffer()
    _, world = group_rank_and_size()
    nbytes = buffer.numel() * buffer.element_size()
    record_collective(CollectiveCall("ddp_comm_hook", "backward", nbytes, nbytes, world))
    future = all_reduce_sum(buffer, async_op=True).get_future()

    def scale(fut: torch.futures.Future[list[Tensor]]) -> Tensor:
        value = fut.value()[0]
        return value.div_(dp) if dp > 1 else value

    return future.then(scale)


# DDP checks the hook's annotations as objects; with postponed evaluation they would be strings.
ddp_comm_hook.__annotations__ = {
    "mesh": DeviceMesh2D | None, "bucket": GradBucket, "return": torch.futures.Future[torch.Tensor],
}


def fsdp_device_mesh(mesh: DeviceMesh2D | None, device_type: str = "cpu") -> Any:
    """The torch ``DeviceMesh`` for FSDP2 over the data-parallel dimension: dims ``("domain", "data")``.

    FSDP2 shards over the last dimension and replicates over the first (HSDP): parameters are
    sharded across the data group and replicated across the domain group. Collective: every rank
    must call it (it creates process groups). ``mesh=None``: pure domain parallelism, ``(R, 1)``.
    """
    data_size(mesh)
    return torch_device_mesh(mesh, device_type)


def fully_shard_data_parallel(
    model: nn.Module,
    mesh: DeviceMesh2D | None,
    *,
    modules: Iterable[nn.Module] = (),
    forward_methods: Iterable[str] = (),
    device_type: str = "cpu",
    **kwargs: Any,
) -> nn.Module:
    """Apply FSDP2 (``fully_shard``) over the data-parallel dimension, domain parallelism inside.

    ``fully_shard`` is applied to each of ``modules`` (e.g. the processor blocks), then to
    ``model``, on :func:`fsdp_device_mesh`; every FSDP unit's gradient divide factor is set to
    ``mesh.data_parallel_size``, so FSDP2's reduction (reduce-scatter over the data group,
    all-reduce over the domain group) gives the domain sum of the data mean. Returns ``model``
    (now an ``FSDPModule``; its parameters are ``DTensor`` shards). ``kwargs`` go to
    ``fully_shard`` (e.g. ``reshard_after_forward``). Do not also wrap it in :class:`DomainParallel`.

    FSDP2 gathers a unit's parameters when the unit's ``forward`` runs. A module whose parameters
    are used through other methods called from outside its ``forward`` needs them named in
    ``forward_methods`` (registered with ``torch.distributed.fsdp.register_fsdp_forward_method`` on
    each of ``modules`` that has them). MeshGraphNet runs each processor step inside its block's
    ``forward``, so ``modules=model.processor`` needs none.

    A unit, and a method named in ``forward_methods``, may take and return ``ShardTensor`` /
    ``GridTensor``: hooks around FSDP2's own let it see the tensor inside (:class:`_ShardedIO`),
    which plain ``fully_shard`` does not.
    """
    # torch's FSDP2 API: it communicates inside torch, over the process groups of the DeviceMesh
    # that comm made (fsdp_device_mesh); nothing here sends by itself.
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    dp = data_size(mesh)
    device_mesh = fsdp_device_mesh(mesh, device_type)
    methods = list(forward_methods)
    for sub in modules:
        fully_shard(sub, mesh=device_mesh, **kwargs)
        for name in methods:
            if callable(getattr(sub, name, None)):
                _ShardedIO.around_method(sub, name, register_fsdp_forward_method)
    fully_shard(model, mesh=device_mesh, **kwargs)
    for sub in model.modules():
        if isinstance(sub, FSDPModule):
            sub.set_gradient_divide_factor(float(dp))
            _ShardedIO(sub)
    return model


class _Exposed(NamedTuple):
    """A ShardTensor or GridTensor as FSDP2 can see inside it (a named tuple, one tensor in it)."""

    local: Tensor
    slot: int  # where the wrapper it came from is kept (the wrapper itself stays out of FSDP's sight)


class _ShardedIO:
    """Lets FSDP2 see the tensors inside the ShardTensor / GridTensor inputs and outputs of a unit.

    FSDP2 finds a unit's tensors by walking tuples, lists, dicts, named tuples and dataclasses. It
    hooks the output's tensors, to gather the parameters again for backward and to start the
    unit's gradient reduction; it misses a tensor inside a ShardTensor. A unit returning one then
    was never reduced (the gradients stayed per rank, silently) or ran backward on freed
    parameters. Four hooks around FSDP2's own (which ``fully_shard`` registered first) swap each
    ShardTensor / GridTensor for an :class:`_Exposed` just before FSDP2's hook and back just
    after it, so the module's ``forward`` and its caller see the same objects as without FSDP2.
    A method named in ``forward_methods`` gets the same four steps around the pre- and
    post-forward that ``register_fsdp_forward_method`` puts around it (:meth:`around_method`).
    """

    def __init__(self, module: nn.Module) -> None:
        self.kept: list[Any] = []
        module.register_forward_pre_hook(self._expose_inputs, prepend=True, with_kwargs=True)  # before FSDP2's
        module.register_forward_pre_hook(self._restore_inputs, with_kwargs=True)  # after FSDP2's
        module.register_forward_hook(self._expose_output, prepend=True)
        module.register_forward_hook(self._restore_output, always_call=True)

    @classmethod
    def around_method(cls, module: nn.Module, name: str, register: Callable[[nn.Module, str], None]) -> None:
        """Register ``module.name`` as an FSDP2 forward method (``register``), with the sharded
        tensors of its arguments and result exposed to FSDP2's pre- and post-forward, as for
        ``forward``: expose, [FSDP2's pre-forward], restore, the method, expose,
        [FSDP2's post-forward], restore."""
        io = cls.__new__(cls)
        io.kept = []
        method = getattr(module, name)

        def inside(*args: Any, **kwargs: Any) -> Any:  # between FSDP2's pre- and post-forward
            restored = io._restore_inputs(module, args, kwargs)
            if restored is not None:
                args, kwargs = restored
            return io._expose_output(module, args, method(*args, **kwargs))

        setattr(module, name, inside)
        register(module, name)  # wraps ``inside`` in FSDP2's pre- and post-forward
        wrapped = getattr(module, name)

        @functools.wraps(method)
        def outside(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = io._expose_inputs(module, args, kwargs)
            out = wrapped(*args, **kwargs)
            restored = io._restore_output(module, args, out)
            return out if restored is None else restored

        setattr(module, name, outside)

    def _expose(self, obj: Any) -> Any:
        from .._grid_tensor import GridTensor
        from .._tensor import ShardTensor

        if isinstance(obj, ShardTensor | GridTensor):
            self.kept.append(obj)
            return _Exposed(obj.to_local(), len(self.kept) - 1)
        if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
            items = [self._expose(v) for v in obj]
            return obj if all(a is b for a, b in zip(items, obj)) else type(obj)(items)
        if isinstance(obj, dict):
            new = {k: self._expose(v) for k, v in obj.items()}
            return obj if all(new[k] is v for k, v in obj.items()) else type(obj)(new)
        return obj

    def _restore(self, obj: Any) -> Any:
        if isinstance(obj, _Exposed):
            old = self.kept[obj.slot]
            return old if obj.local is old.to_local() else _rewrap(old, obj.local)
        if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
            return type(obj)(self._restore(v) for v in obj)
        if isinstance(obj, dict):
            return type(obj)({k: self._restore(v) for k, v in obj.items()})
        return obj

    def _expose_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self.kept = []
        return self._expose(args), self._expose(kwargs)

    def _restore_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not self.kept:
            return None
        args, kwargs = self._restore(args), self._restore(kwargs)
        self.kept = []
        return args, kwargs

    def _expose_output(self, module: nn.Module, args: tuple, output: Any) -> Any:
        self.kept = []
        return self._expose(output)

    def _restore_output(self, module: nn.Module, args: tuple, output: Any) -> Any:
        if not self.kept:
            return None
        output, self.kept = self._restore(output), []
        return output


def _rewrap(old: Any, local: Tensor) -> Any:
    """``old``'s kind of sharded tensor, with the same layout, around ``local``."""
    from .._grid_tensor import GridTensor
    from .._tensor import ShardTensor

    if isinstance(old, ShardTensor):
        return ShardTensor(local, old.spec)
    return GridTensor.from_local(local, old.layout, old.group)
