"""The process group itself: whether one is up, its backend and ranks, the plain collectives that
bookkeeping needs, and shutting it down.

The collectives of :mod:`._collectives` are autograd-aware and carry rows; the calls here are
plain ``torch.distributed`` calls (not autograd-aware, not recorded by :func:`count_collectives`)
for what the layers above need besides: a loss summed over the ranks, a parameter layout compared
across ranks, a barrier before a folder changes, one rank's error told to every rank. Keeping them
here keeps every rank-to-rank call of the package in ``comm``.

Each works in a world of one with no process group (it returns its local result at once), and on a
group of one rank inside a larger world it sends nothing either. ``group=None`` is the default
(world) group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ._collectives import communication_device

__all__ = [
    "agree_on_first_error",
    "all_gather_objects",
    "all_gather_stacked",
    "all_reduce_max",
    "all_reduce_sum",
    "backend_name",
    "barrier",
    "broadcast_tensor",
    "group_ranks",
    "is_distributed",
    "shutdown",
]


def is_distributed() -> bool:
    """Whether a default process group is up (``torch.distributed`` available and initialised)."""
    return dist.is_available() and dist.is_initialized()


def _sends(group: Any) -> bool:
    """Whether a collective on ``group`` involves another rank: a process group is up and the group
    has more than one rank (``get_world_size`` is -1 on a rank outside ``group``, which sends nothing)."""
    return is_distributed() and dist.get_world_size(group) > 1


def backend_name(group: Any = None) -> str | None:
    """``group``'s backend (``"gloo"``, ``"nccl"``), or ``None`` with no process group."""
    return dist.get_backend(group) if is_distributed() else None


def group_ranks(group: Any = None) -> list[int]:
    """The global ranks of ``group``'s members, in group-rank order (``group=None``: every rank of
    the world); ``[0]`` with no process group. Local, no communication."""
    if not is_distributed():
        return [0]
    return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))


class _Done:
    """The handle of an asynchronous reduction that had nothing to send: already complete."""

    def __init__(self, x: Tensor) -> None:
        self._x = x

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[Tensor]]:
        future: torch.futures.Future[list[Tensor]] = torch.futures.Future()
        future.set_result([self._x])
        return future


def all_reduce_sum(x: Tensor, *, group: Any = None, async_op: bool = False) -> Any:
    """Sum ``x`` over the ranks of ``group``, in place: afterwards every rank holds the sum.

    Not autograd-aware (see :func:`sum_to_replicated` for a differentiable global sum). Returns
    ``x``; with ``async_op=True``, a handle with ``wait()`` and ``get_future()`` (whose value is
    ``[x]``), as ``torch.distributed.all_reduce`` returns, already complete when nothing is sent.

    Shapes:
        x: any shape, the same on every rank of ``group``.

    Communication: one ``all_reduce`` on ``group``; none with no process group or a group of one.
    """
    if not _sends(group):
        return _Done(x) if async_op else x
    work = dist.all_reduce(x, group=group, async_op=async_op)
    return work if async_op else x


def all_reduce_max(x: Tensor, *, group: Any = None) -> Tensor:
    """The element-wise maximum of ``x`` over the ranks of ``group``, in place; returns ``x``.

    Communication: one ``all_reduce`` (``MAX``) on ``group``; none with no process group or a group
    of one.
    """
    if _sends(group):
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    return x


def broadcast_tensor(x: Tensor, *, src: int = 0, group: Any = None) -> Tensor:
    """Overwrite ``x`` on every rank of ``group`` with its value on ``src`` (a **global** rank, as in
    ``torch.distributed.broadcast``), in place; returns ``x``.

    Shapes:
        x: the same shape and dtype on every rank of ``group``.

    Communication: one ``broadcast`` on ``group``; none with no process group or a group of one.
    """
    if _sends(group):
        dist.broadcast(x, src=src, group=group)
    return x


def all_gather_stacked(x: Tensor, *, group: Any = None) -> Tensor:
    """Every rank's ``x``, stacked in rank order: ``(R, *x.shape)`` on every rank of ``group``.

    For small tensors of one shape on every rank (hashes, flags); rows of different counts go
    through :func:`all_gather_v`. Not autograd-aware.

    Communication: one ``all_gather`` on ``group``; none with no process group or a group of one
    (the result is then ``x[None]``, a copy).
    """
    if not _sends(group):
        return x[None].clone()
    everyone = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, x, group=group)
    return torch.stack(everyone)


def all_gather_objects(obj: Any, *, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank of ``group``.

    Communication: one ``all_gather_object`` on ``group`` (pickled; for small objects: a summary,
    a parameter layout); none with no process group or a group of one (``[obj]``).
    """
    if not _sends(group):
        return [obj]
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, obj, group=group)
    return everyone


def barrier(group: Any = None) -> None:
    """Wait until every rank of ``group`` has called it.

    Communication: one ``barrier`` on ``group``; none with no process group or a group of one.
    """
    if _sends(group):
        dist.barrier(group=group)


def agree_on_first_error(problem: str | None, group: Any = None) -> str | None:
    """Every rank of ``group`` gets the problem of its lowest rank that has one, prefixed with that
    rank (``"rank 2: ..."``), or ``None`` when none has; with no process group, ``problem`` as it is.

    For a check every rank makes on its own part (a model's output on its shard): when it fails
    on any rank, every rank raises the same error, instead of the others going on into a collective
    that waits for a rank that stopped.

    Communication: one ``all_reduce`` of ``R`` message lengths on ``group``, then, when some rank has
    a problem, one ``broadcast`` of its UTF-8 text from the lowest such rank.
    """
    if not is_distributed():
        return problem
    ranks = group_ranks(group)
    me = ranks.index(dist.get_rank())
    device = communication_device(group)
    flags = torch.zeros(len(ranks), dtype=torch.int64, device=device)
    text = problem.encode() if problem else b""
    flags[me] = len(text)
    dist.all_reduce(flags, group=group)  # each rank's message length, 0 where it has no problem
    bad = torch.nonzero(flags).flatten().tolist()
    if not bad:
        return None
    first = bad[0]
    buf = torch.zeros(int(flags[first]), dtype=torch.uint8, device=device)
    if me == first:
        buf.copy_(torch.frombuffer(bytearray(text), dtype=torch.uint8))
    dist.broadcast(buf, src=ranks[first], group=group)
    return f"rank {ranks[first]}: " + bytes(buf.cpu().tolist()).decode()


def shutdown() -> None:
    """Destroy the default process group, if one is up (a rank's clean end, after its last
    collective); nothing with no process group. Local: it waits for no other rank."""
    if is_distributed():
        dist.destroy_process_group()
