"""Global sums, the reductions of the domain-parallel computation: :func:`sum_to_replicated` (one
logical value every rank holds), :func:`sum_of_parts` (partial sums each rank uses on its own
rows), :func:`sum_gradients` (replicated parameters' gradients), and the count of replicated
results that ``DomainParallel`` reads (:func:`note_replicated_result`, :func:`replicated_results`).

Each autograd Function is private, wrapped by a public function that checks its arguments; a
world of one communicates nothing. Every call is recorded for ``count_collectives``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd import Function

from ._counter import CollectiveCall, record
from ._validate import check_tensor

__all__ = ["note_replicated_result", "replicated_results", "sum_gradients", "sum_of_parts", "sum_to_replicated"]


#: How many replicated results (global reductions) this process has made: DomainParallel looks
#: for parameters used on them only when a forward made one (``[count]``, a mutable cell; read and
#: bumped through :func:`replicated_results` and :func:`note_replicated_result`).
REPLICATED_RESULTS = [0]


def note_replicated_result() -> None:
    """Count one more replicated result: a value made by a global reduction that every rank holds
    whole (:func:`sum_to_replicated` counts itself; ``ShardTensor.full_tensor`` calls this).

    Local, no communication. :func:`replicated_results` reads the count."""
    REPLICATED_RESULTS[0] += 1


def replicated_results() -> int:
    """How many replicated results this process has made so far (:func:`note_replicated_result`).

    ``DomainParallel`` compares it before and after a forward: only a forward that made one can
    have parameters used on globally reduced values, whose gradient it then counts once."""
    return REPLICATED_RESULTS[0]


class _SumToReplicated(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        note_replicated_result()
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        nbytes = x.numel() * x.element_size()
        record(
            CollectiveCall(
                "sum_to_replicated", "forward", nbytes if world > 1 else 0, nbytes if world > 1 else 0, world
            )
        )
        out = x.clone()
        if world > 1:
            dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad, None


class _SumOfParts(Function):
    """``y = sum_r x_r`` on every rank, each rank's ``y`` used on its own rows: the backward sums
    the ranks' gradients (``dL/dx_q = sum_r dL/dy_r``), the adjoint of the forward all-reduce."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _all_reduce_counted(x.clone(memory_format=torch.contiguous_format), group, "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return _all_reduce_counted(grad.clone(memory_format=torch.contiguous_format), ctx.group, "backward"), None


def _all_reduce_counted(x: Tensor, group: Any, phase: str) -> Tensor:
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    nbytes = x.numel() * x.element_size() if world > 1 else 0
    record(CollectiveCall("sum_of_parts", phase, nbytes, nbytes, world))
    if world > 1:
        dist.all_reduce(x, group=group)
    return x


def sum_gradients(parameters: Any, *, group: Any = None, scale: float = 1.0) -> None:
    """Replace each parameter's ``.grad`` by ``scale`` times its sum over the ranks of ``group``.

    For replicated parameters of a sharded model: each rank's gradient is its shard's contribution,
    and their sum is the gradient of the global loss. With data parallelism on top, sum over every
    rank and pass ``scale = 1 / data_parallel_size`` (the mean over samples of the per-sample sums).
    Parameters without a gradient on this rank get zeros, so every rank sends the same layout.

    Communication: one ``all_reduce`` of all gradients flattened together (not autograd-aware).
    """
    params = [p for p in parameters if p.requires_grad]
    if not params:
        return
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    nbytes = flat.numel() * flat.element_size()
    record(CollectiveCall("sum_gradients", "backward", nbytes if world > 1 else 0, nbytes if world > 1 else 0, world))
    if world > 1:
        dist.all_reduce(flat, group=group)
    if scale != 1.0:
        flat.mul_(scale)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def sum_to_replicated(x: Tensor, *, group: Any = None) -> Tensor:
    """The sum of every rank's ``x``, as one logical value held identically by every rank.

    Use it for global reductions (a loss over all nodes of a sharded mesh). The result is
    *replicated*: every rank must use it the same way, so every rank backpropagates the same
    gradient ``g``; the backward then hands ``g`` to each rank's ``x`` unchanged, which is the
    correct adjoint of ``y = sum_r x_r`` (``dy/dx_r = 1``). Summing the replicated gradients
    instead would count the loss once per rank.

    Shapes:
        x: any shape, the same on every rank; result: the same shape.

    Communication: one ``all_reduce`` forward; none backward.
    """
    x = check_tensor("x", x)
    return _SumToReplicated.apply(x, group)


def sum_of_parts(x: Tensor, *, group: Any = None) -> Tensor:
    """The sum of every rank's partial sum ``x``, which each rank then uses on its own rows.

    For a global statistic that feeds back into every rank's rows (the slice tokens of
    :class:`meshshard.nn.PhysicsAttention`, a batch norm's mean): the gradient that reaches the
    result on rank ``r`` is only the part from rank ``r``'s rows, so the backward sums those parts
    over the ranks, the correct adjoint of ``y_r = sum_q x_q`` for every ``r``
    (``dL/dx_q = sum_r dL/dy_r``). Contrast :func:`sum_to_replicated`, whose result every rank uses
    identically (a loss) and whose backward therefore sends nothing. Not a replicated result in
    :func:`replicated_results`' sense: parameters applied to it get each rank's part of their
    gradient, which the domain group sums as it does for parameters used on rows.

    Shapes:
        x: any shape, the same on every rank of ``group``; result: the same shape.

    Communication: one ``all_reduce`` of ``x.numel()`` values forward, one of as many backward
    (counted as ``"sum_of_parts"``); none in a world of one.
    """
    x = check_tensor("x", x)
    return _SumOfParts.apply(x, group)
