"""The autograd Functions of :class:`~meshshard.ShardTensor`, and how to tell a value computed from a
global reduction.

- :class:`FullTensor`: the shards -> the whole tensor on every rank (``ShardTensor.full_tensor``).
- :class:`RowsUseReplicated`: a replicated value (from ``sum()``, ``mean()``, ``full_tensor()``) used
  on each rank's own rows; :func:`partial_to_whole` inserts it where a row-wise operation meets such
  a value, and :func:`from_replicated` finds those values. ``meshshard.nn.DomainParallel`` reads the
  autograd graph by the node names :data:`REPLICATING` and :data:`ROWS_USE_REPLICATED`.

Why the backward of each is correct is in the ``ShardTensor`` module docstring (replicated results).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function

from meshshard.comm import all_gather_v, all_reduce_sum, note_replicated_result

from ._spec import ShardSpec

__all__ = [
    "FullTensor", "RowsUseReplicated", "REPLICATING", "ROWS_USE_REPLICATED", "from_replicated",
    "partial_to_whole",
]


class FullTensor(Function):
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


class RowsUseReplicated(Function):
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


#: The autograd nodes (``type(grad_fn).__name__``) of the global reductions whose results are
#: replicated: :func:`meshshard.comm.sum_to_replicated`, ``ShardTensor.full_tensor`` (:class:`FullTensor`)
#: and ``GridTensor.full_tensor`` (its own ``_FullTensor``).
REPLICATING = frozenset({"_SumToReplicatedBackward", f"{FullTensor.__name__}Backward", "_FullTensorBackward"})
#: The autograd node of :class:`RowsUseReplicated`.
ROWS_USE_REPLICATED = f"{RowsUseReplicated.__name__}Backward"


def from_replicated(t: Tensor) -> bool:
    """Whether ``t`` is computed from a global reduction (its autograd graph holds one)."""
    stack, seen = [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        if type(node).__name__ in REPLICATING:
            return True
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    return False


def partial_to_whole(args: Any, spec: ShardSpec) -> Any:
    """Wrap the plain operands computed from global reductions (see :class:`RowsUseReplicated`)."""
    if isinstance(args, (list, tuple)):
        return type(args)(partial_to_whole(a, spec) for a in args)
    if isinstance(args, Tensor) and args.grad_fn is not None and from_replicated(args):
        return RowsUseReplicated.apply(args, spec.group)
    return args
