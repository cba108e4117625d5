"""Differentiable variable-size collectives, built on ``all_to_all_single`` with split sizes.

Why one primitive: gloo rejects the list form of ``all_to_all`` and uneven ``all_gather``, and
``all_to_all_single`` with split sizes takes any per-rank sizes (zeros included) on both gloo and
NCCL. Every function here is that exchange plus bookkeeping, so they all share one code path, one
set of checks and one way of counting.

Conventions (glossary of STYLE.md): ``R`` ranks in ``group``; ``N`` rows of ``x`` along ``dim``;
``send_counts[r]`` rows go to rank ``r`` and ``recv_counts[r]`` come from it, in rank order. The part
a rank sends itself is copied locally and never handed to the backend. In a world of one (no process
group initialised and ``group=None``) nothing is communicated.

Autograd: every collective is linear, and its backward is the adjoint exchange: the same
``all_to_all_single`` with send and receive counts swapped. Every rank must therefore run the
backward through a result it received (in practice, every rank's loss depends on it), exactly as
every rank must call the forward. Half-precision gradients that accumulate over several rows
(duplicate indices, ``all_gather_v``) are summed in float32 and cast back.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd import Function

from ._counter import CollectiveCall, record
from ._recycle import Recycler
from ._validate import (
    MESSAGE_WORDS,
    Counts,
    as_counts,
    check_dim,
    check_rank,
    check_self_counts,
    check_tensor,
    decode_problem,
    encode_problem,
)
from ._validate import (
    check_index as _check_index,
)

__all__ = [
    "indexed_all_to_all_v",
    "all_to_all_v",
    "all_gather_v",
    "gather_v",
    "scatter_v",
    "set_debug",
    "debug_enabled",
    "group_rank_and_size",
    "release_workspace",
    "communication_device",
]

_debug: bool | None = None  # set_debug's choice; None: MESHSHARD_DEBUG, read at each call


def set_debug(enabled: bool) -> None:
    """Turn the cross-rank argument check on or off (default: ``MESHSHARD_DEBUG`` env var).

    When on, each collective first gathers every rank's counts, dtype and row shape and checks that
    they match (``recv_counts[q]`` on rank ``r`` equals ``send_counts[r]`` on rank ``q``); on a
    mismatch every rank raises the same ``ValueError`` instead of waiting or receiving garbage.
    It costs one extra small collective per call, so it is off by default.
    """
    global _debug
    _debug = bool(enabled)


def debug_enabled() -> bool:
    """Whether the cross-rank argument check is on (:func:`set_debug`, else ``MESHSHARD_DEBUG``),
    read at call time: for layers above that run checks of their own under the same switch
    (``DomainParallel`` compares parameters across ranks), and for a process that got its
    environment after this module was imported (a rank forked from a fork server)."""
    if _debug is not None:
        return _debug
    return os.environ.get("MESHSHARD_DEBUG", "") not in ("", "0")


def group_rank_and_size(group: Any = None) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size; ``(0, 1)`` with no process group."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class _Workspace:
    """Reusable flat buffers for tensors that never leave this module.

    The send buffer of a forward exchange and the receive buffer of a backward exchange live only
    for the length of one call: reusing them avoids allocating (and, on CPU, page-faulting) fresh
    memory at every exchange. Results handed to the caller or to autograd are never pooled.
    Collectives are synchronous with respect to the current stream, so a buffer is free again as
    soon as the call that used it returns. One buffer per (purpose, device, dtype), grown on demand;
    :func:`release_workspace` frees them.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.device, torch.dtype], Tensor] = {}

    def get(self, purpose: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        numel = math.prod(shape)
        key = (purpose, device, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)

    def clear(self) -> None:
        self._buffers.clear()


_workspace = _Workspace()
_recycler = Recycler()  # the results handed out (rows received, gradients): see _recycle.py


_overlap = True  # run an exchange's local share (``meanwhile``) while its rows are in flight


@contextlib.contextmanager
def _reference_path() -> Iterator[None]:
    """The exchanges as they ran before issue 37, for the benchmarks' BEFORE column: every result
    and gradient a fresh ``torch.empty``, nothing overlapped with a transfer."""
    global _overlap
    _recycler.enabled, _overlap = False, False
    try:
        yield
    finally:
        _recycler.enabled, _overlap = True, True


def release_workspace() -> None:
    """Free the buffers the collectives keep for reuse (they grow to the largest exchange) and the
    storages of their results that nobody holds any more (a few, at most 128 MiB each)."""
    _workspace.clear()
    _recycler.clear()


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def communication_device(group: Any = None) -> torch.device:
    """Where tensors handed to ``group``'s collectives must live: the current CUDA device for
    NCCL, the CPU for gloo or a world of one."""
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _cross_rank_check(op: str, x: Tensor, send_counts: list[int], recv_counts: list[int], group: Any) -> None:
    world = len(send_counts)
    mine = (send_counts, recv_counts, str(x.dtype), tuple(x.shape[1:]))
    everyone: list[Any] = [None] * world
    record(CollectiveCall("debug_check", "forward", 0, 0, world))
    dist.all_gather_object(everyone, mine, group=group)
    problems = []
    for r, (_, recv_r, dtype_r, rest_r) in enumerate(everyone):
        for q, (send_q, _, dtype_q, rest_q) in enumerate(everyone):
            if recv_r[q] != send_q[r]:
                problems.append(f"rank {r} expects {recv_r[q]} rows from rank {q}, which sends {send_q[r]}")
        if (dtype_r, rest_r) != (everyone[0][2], everyone[0][3]):
            problems.append(
                f"rank {r} has rows of dtype {dtype_r}, shape {rest_r}; rank 0 has {everyone[0][2]}, "
                f"shape {everyone[0][3]}"
            )
    if problems:
        raise ValueError(f"{op}: arguments disagree across ranks: " + "; ".join(problems[:4]))


def _exchange(send: Tensor, keep: Tensor | None, send_counts: list[int], recv_counts: list[int], rank: int,
              group: Any, op: str, phase: str, pooled_result: bool = False, out: Tensor | None = None,
              meanwhile: Callable[[], None] | None = None) -> Tensor:
    """Send ``send`` (rows for other ranks, in rank order) and place ``keep`` (own part) in the result.

    Returns ``(sum(recv_counts), *send.shape[1:])``, rows grouped by source rank; with
    ``pooled_result`` the result may be a workspace buffer, to be consumed before the next exchange;
    with ``out`` (contiguous, no own part), the rows are received into it. ``meanwhile`` (local
    work that touches neither buffer: a gradient's zero fill) runs while the rows are in flight.
    """
    world = len(send_counts)
    rest = tuple(send.shape[1:])
    send_split = list(send_counts)
    send_split[rank] = 0
    recv_split = list(recv_counts)
    recv_split[rank] = 0
    row_bytes = send.element_size() * math.prod(rest)
    record(CollectiveCall(op, phase, sum(send_split) * row_bytes, sum(recv_split) * row_bytes, world))
    if world == 1:
        if meanwhile is not None:
            meanwhile()
        if out is not None:
            return out
        return keep.clone() if keep is not None else send.new_empty((0, *rest))
    if phase == "forward" and debug_enabled():
        _cross_rank_check(op, send, send_counts, recv_counts, group)
    shape = (sum(recv_split), *rest)
    pooled = pooled_result and (keep is None or keep.shape[0] == 0)
    if out is not None:
        received = out
    elif pooled:
        received = _workspace.get("recv", shape, send.dtype, send.device)
    else:
        received = _recycler.empty(shape, send.dtype, send.device)
    if meanwhile is not None and not _overlap:
        meanwhile()
        meanwhile = None
    work = dist.all_to_all_single(received, send.contiguous(), recv_split, send_split, group=group,
                                  async_op=meanwhile is not None)
    if meanwhile is not None:
        meanwhile()
        work.wait()
    if keep is None or keep.shape[0] == 0:
        return received
    at = sum(recv_counts[:rank])
    return torch.cat([received[:at], keep, received[at:]])


def _exchange_rows(x0: Tensor, send_counts: list[int], recv_counts: list[int], rank: int, group: Any, op: str,
                   phase: str, pooled_result: bool = False, meanwhile: Callable[[], None] | None = None) -> Tensor:
    """All-to-all of the rows of ``x0`` (dim 0), split by ``send_counts``, own part kept locally."""
    start = sum(send_counts[:rank])
    stop = start + send_counts[rank]
    if stop > start:
        send = torch.cat([x0[:start], x0[stop:]])
        keep: Tensor | None = x0[start:stop]
    else:
        send, keep = x0, None
    return _exchange(send, keep, send_counts, recv_counts, rank, group, op, phase, pooled_result, meanwhile=meanwhile)


class _AllToAllV(Function):
    @staticmethod
    def forward(ctx: Any, x0: Tensor, send_counts: list[int], recv_counts: list[int], rank: int, group: Any) -> Tensor:
        ctx.args = (send_counts, recv_counts, rank, group)
        return _exchange_rows(x0, send_counts, recv_counts, rank, group, "all_to_all_v", "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        send_counts, recv_counts, rank, group = ctx.args
        grad_x = _exchange_rows(grad.contiguous(), recv_counts, send_counts, rank, group, "all_to_all_v", "backward")
        return grad_x, None, None, None, None


def _send_back_and_add(
    grad_received: Tensor,
    index: Tensor,
    make_base: Callable[[], Tensor],
    send_counts: list[int],
    recv_counts: list[int],
    rank: int,
    group: Any,
    phase: str = "backward",
) -> Tensor:
    """The adjoint of an indexed exchange: send the received rows' gradients back to the ranks
    they came from, then ``index_add`` them into ``make_base()`` (in its, accumulation, dtype) at
    the rows that were sent. ``make_base`` (a zero fill, or a copy of the owned rows' gradient) runs
    while the rows are in flight. Returns the result in ``grad_received``'s dtype."""
    made: list[Tensor] = []
    grad_sent = _exchange_rows(
        grad_received, recv_counts, send_counts, rank, group, "indexed_all_to_all_v", phase, pooled_result=True,
        meanwhile=lambda: made.append(make_base()),
    )
    base = made[0] if made else make_base()  # a world of one: nothing was in flight
    base.index_add_(0, index, grad_sent.to(base.dtype))
    return base.to(grad_received.dtype)


def _select_into_workspace(x0: Tensor, index: Tensor) -> Tensor:
    """``x0.index_select(0, index)`` into the reusable send buffer (world > 1 only)."""
    if not dist.is_initialized():
        return x0.index_select(0, index)
    out = _workspace.get("send", (index.numel(), *x0.shape[1:]), x0.dtype, x0.device)
    return torch.index_select(x0, 0, index, out=out)


class _IndexedAllToAllV(Function):
    @staticmethod
    def forward(ctx: Any, x0: Tensor, index: Tensor, send_counts: list[int], recv_counts: list[int], rank: int,
                group: Any) -> Tensor:
        ctx.save_for_backward(index)
        ctx.args = (x0.shape, send_counts, recv_counts, rank, group)
        start = sum(send_counts[:rank])
        stop = start + send_counts[rank]
        if stop > start:
            send = x0.index_select(0, torch.cat([index[:start], index[stop:]]))
            keep: Tensor | None = x0.index_select(0, index[start:stop])
        else:
            send, keep = _select_into_workspace(x0, index), None
        return _exchange(send, keep, send_counts, recv_counts, rank, group, "indexed_all_to_all_v", "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        shape, send_counts, recv_counts, rank, group = ctx.args
        def zeros() -> Tensor:
            return _recycler.zeros(tuple(shape), _accumulation_dtype(grad.dtype), grad.device)

        grad_x = _send_back_and_add(grad.contiguous(), index, zeros, send_counts, recv_counts, rank, group)
        return grad_x, None, None, None, None, None


def _append_ghosts(
    x0: Tensor, index: Tensor, send_counts: list[int], recv_counts: list[int], rank: int, group: Any, phase: str
) -> Tensor:
    """``(N_own, ...)`` -> ``(N_own + N_ghost, ...)``: the owned rows, then the rows received."""
    n = x0.shape[0]
    result = _recycler.empty((n + sum(recv_counts), *x0.shape[1:]), x0.dtype, x0.device)
    send = _select_into_workspace(x0, index)
    _exchange(send, None, send_counts, recv_counts, rank, group, "indexed_all_to_all_v", phase, out=result[n:],
              meanwhile=lambda: result[:n].copy_(x0))  # the owned rows are copied while the ghost rows travel
    return result


def _sum_ghosts_to_owners(
    rows: Tensor, index: Tensor, send_counts: list[int], recv_counts: list[int], rank: int, group: Any, phase: str
) -> Tensor:
    """``(N_own + N_ghost, ...)`` -> ``(N_own, ...)``, the adjoint of :func:`_append_ghosts`: the
    owned rows (copied once) plus the ghost rows sent back to their owners and ``index_add``ed at the
    rows they came from (half precision accumulates in float32)."""
    n = rows.shape[0] - sum(recv_counts)
    rows = rows.contiguous()
    def owned() -> Tensor:
        return _recycler.empty(tuple(rows[:n].shape), _accumulation_dtype(rows.dtype), rows.device).copy_(rows[:n])

    return _send_back_and_add(rows[n:], index, owned, send_counts, recv_counts, rank, group, phase)


class _HaloPass(Function):
    """The halo exchange one way and its adjoint the other. ``reverse=False``: the owned rows then
    the ghost rows (:func:`append_halo`), whose backward sums the ghost rows' gradients back to their
    owners; ``reverse=True``: that sum run forward (``HaloPlan.sum_to_owners``), whose backward appends."""

    @staticmethod
    def forward(ctx: Any, x0: Tensor, index: Tensor, send_counts: list[int], recv_counts: list[int], rank: int,
                group: Any, reverse: bool) -> Tensor:
        ctx.save_for_backward(index)
        ctx.args = (send_counts, recv_counts, rank, group)
        ctx.reverse = reverse
        return (_sum_ghosts_to_owners if reverse else _append_ghosts)(x0, index, *ctx.args, "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        grad_x = (_append_ghosts if ctx.reverse else _sum_ghosts_to_owners)(grad, index, *ctx.args, "backward")
        return grad_x, None, None, None, None, None, None


class _AllGatherV(Function):
    @staticmethod
    def forward(ctx: Any, x0: Tensor, counts: list[int], rank: int, group: Any) -> Tensor:
        world = len(counts)
        ctx.args = (counts, rank, group)
        send = x0.repeat(world - 1, *([1] * (x0.dim() - 1))) if world > 1 else x0[:0]
        return _exchange(send, x0, [counts[rank]] * world, counts, rank, group, "all_gather_v", "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        counts, rank, group = ctx.args
        world, n = len(counts), counts[rank]
        parts = _exchange_rows(grad.contiguous(), counts, [n] * world, rank, group, "all_gather_v", "backward")
        acc = _accumulation_dtype(grad.dtype)
        grad_x = parts.reshape(world, n, *grad.shape[1:]).to(acc).sum(0)
        return grad_x.to(grad.dtype), None, None, None


def _one_way_counts(counts: list[int], root: int, rank: int) -> tuple[list[int], list[int]]:
    """Counts for gathering to ``root``: each rank sends its rows to root, root receives all."""
    world = len(counts)
    send = [0] * world
    send[root] = counts[rank]
    recv = list(counts) if rank == root else [0] * world
    return send, recv


class _GatherV(Function):
    @staticmethod
    def forward(ctx: Any, x0: Tensor, counts: list[int], dst: int, rank: int, group: Any) -> Tensor:
        send, recv = _one_way_counts(counts, dst, rank)
        ctx.args = (send, recv, rank, group)
        return _exchange_rows(x0, send, recv, rank, group, "gather_v", "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        send, recv, rank, group = ctx.args
        return (
            _exchange_rows(grad.contiguous(), recv, send, rank, group, "gather_v", "backward"), None, None, None, None
        )


class _ScatterV(Function):
    @staticmethod
    def forward(ctx: Any, x0: Tensor, counts: list[int], src: int, rank: int, group: Any) -> Tensor:
        # Scatter is gather run backwards: swap the gather counts.
        recv, send = _one_way_counts(counts, src, rank)
        ctx.args = (send, recv, rank, group, x0.shape[0])
        return _exchange_rows(x0, send, recv, rank, group, "scatter_v", "forward")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        send, recv, rank, group, _ = ctx.args
        grad_x = _exchange_rows(grad.contiguous(), recv, send, rank, group, "scatter_v", "backward")
        return grad_x, None, None, None, None


# --- public functions: validate everything locally, then one autograd Function -----------------


def _checked_exchange(x: Tensor, send_counts: Counts, recv_counts: Counts, dim: int,
                      group: Any) -> tuple[Tensor, int, int, list[int], list[int]]:
    """The checks every exchange makes first, locally: ``x`` a tensor, ``dim`` one of its dims, one
    non-negative count per rank each way, this rank's own counts equal. Returns ``(x, rank, dim,
    send_counts, recv_counts)``."""
    x = check_tensor("x", x)
    rank, world = group_rank_and_size(group)
    dim = check_dim(dim, x.dim())
    sc = as_counts("send_counts", send_counts, world)
    rc = as_counts("recv_counts", recv_counts, world)
    check_self_counts(sc, rc, rank)
    return x, rank, dim, sc, rc


def indexed_all_to_all_v(
    x: Tensor,
    send_index: Tensor,
    send_counts: Counts,
    recv_counts: Counts,
    *,
    dim: int = 0,
    group: Any = None,
    check_index: bool = True,
) -> Tensor:
    """Send selected rows of ``x`` to other ranks; return the rows received, grouped by source rank.

    Rank ``r`` sends ``x.index_select(dim, send_index)``, whose first ``send_counts[0]`` rows go to
    rank 0, the next ``send_counts[1]`` to rank 1, and so on. This is the halo exchange: with the plan
    of a partition, the result is exactly the ghost rows in local order.

    Shapes:
        x: ``(..., N, ...)`` with ``N`` along ``dim``; any dtype.
        send_index: ``(sum(send_counts),)`` int64 / int32 indices into ``x`` along ``dim``, duplicates
            allowed.
        send_counts, recv_counts: ``R`` non-negative ints each.
        result: ``x``'s shape with ``sum(recv_counts)`` along ``dim``.

    Communication: one ``all_to_all_single`` forward; one backward. The backward is the correct
    adjoint: the same exchange with the counts swapped, then ``index_add`` into ``x``'s gradient
    (rows sent several times accumulate; float16 / bfloat16 accumulate in float32).

    ``check_index=False`` skips the range check of ``send_index`` (a reduction over the index, a
    device synchronisation on GPU): for plans validated once, such as a ``ShardSpec``'s.

    Raises:
        ValueError: before any communication, on wrong numbers of counts, negative counts,
            ``len(send_index) != sum(send_counts)``, an index out of range, or a rank whose own
            send and receive counts differ.
    """
    x, rank, dim, sc, rc = _checked_exchange(x, send_counts, recv_counts, dim, group)
    index = _check_index(send_index, sc, x.shape[dim] if check_index else None, x, dim)
    return _IndexedAllToAllV.apply(x.movedim(dim, 0), index, sc, rc, rank, group).movedim(0, dim)


def all_to_all_v(x: Tensor, send_counts: Counts, recv_counts: Counts, *, dim: int = 0, group: Any = None) -> Tensor:
    """Variable-size all-to-all: consecutive blocks of ``x`` along ``dim`` go to ranks 0, 1, ...

    Shapes:
        x: ``(..., sum(send_counts), ...)``; result: ``(..., sum(recv_counts), ...)`` grouped by
        source rank.

    Communication: one ``all_to_all_single`` forward; the adjoint (counts swapped) backward.
    """
    x, rank, dim, sc, rc = _checked_exchange(x, send_counts, recv_counts, dim, group)
    if x.shape[dim] != sum(sc):
        raise ValueError(f"Expected 'x' to have sum(send_counts) = {sum(sc)} rows along dim {dim} (got {x.shape[dim]})")
    return _AllToAllV.apply(x.movedim(dim, 0), sc, rc, rank, group).movedim(0, dim)


def _check_own_count(x: Tensor, counts: list[int], rank: int, dim: int) -> None:
    if x.shape[dim] != counts[rank]:
        raise ValueError(
            f"Expected 'x' to have counts[{rank}] = {counts[rank]} rows along dim {dim} (got {x.shape[dim]})"
        )


def all_gather_v(x: Tensor, counts: Counts, *, dim: int = 0, group: Any = None) -> Tensor:
    """Every rank gets every rank's ``x``, concatenated in rank order along ``dim``.

    Shapes:
        x: ``counts[rank]`` rows along ``dim``; result: ``sum(counts)`` rows.

    Communication: one ``all_to_all_single`` forward. Backward: a reduce-scatter (one
    ``all_to_all_single``, then a sum over the ``R`` received copies, in float32 for half types).
    """
    x = check_tensor("x", x)
    rank, world = group_rank_and_size(group)
    dim = check_dim(dim, x.dim())
    c = as_counts("counts", counts, world)
    _check_own_count(x, c, rank, dim)
    return _AllGatherV.apply(x.movedim(dim, 0), c, rank, group).movedim(0, dim)


def gather_v(x: Tensor, counts: Counts, *, dst: int = 0, dim: int = 0, group: Any = None) -> Tensor:
    """Concatenate every rank's ``x`` on rank ``dst``; other ranks get zero rows along ``dim``.

    Shapes:
        x: ``counts[rank]`` rows along ``dim``; result on ``dst``: ``sum(counts)`` rows, elsewhere 0.

    Communication: one ``all_to_all_single`` forward; backward scatters the gradient from ``dst``
    (every rank must backpropagate through its, possibly empty, result).
    """
    x = check_tensor("x", x)
    rank, world = group_rank_and_size(group)
    dim = check_dim(dim, x.dim())
    c = as_counts("counts", counts, world)
    check_rank("dst", dst, world)
    _check_own_count(x, c, rank, dim)
    return _GatherV.apply(x.movedim(dim, 0), c, dst, rank, group).movedim(0, dim)


_DTYPES = (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)
_MAX_DIMS = 8


def _scatter_metadata(
    x: Tensor | None, problem: Exception | None, src: int, rank: int, world: int, group: Any
) -> tuple[torch.Size, torch.dtype, bool]:
    """Tell every rank the shape, dtype and requires_grad of ``x`` on ``src`` (one small exchange),
    or the problem ``src`` found with its arguments, which every rank then raises."""
    recv_counts = [0] * world
    recv_counts[src] = 1
    if rank == src:
        if problem is None:
            assert x is not None
            fields = [x.dim(), _DTYPES.index(x.dtype), int(x.requires_grad), *x.shape, *[0] * (_MAX_DIMS - x.dim())]
        else:
            fields = [0] * (3 + _MAX_DIMS)
        meta = torch.tensor([fields + encode_problem(problem)], dtype=torch.int64, device=communication_device(group))
        send, keep, send_counts = meta.expand(world - 1, -1).contiguous(), meta, [1] * world
    else:
        send = torch.empty(0, 5 + _MAX_DIMS + MESSAGE_WORDS, dtype=torch.int64, device=communication_device(group))
        keep, send_counts = None, [0] * world
    row = _exchange(send, keep, send_counts, recv_counts, rank, group, "scatter_v_metadata", "forward")[0].tolist()
    shared = decode_problem(row[3 + _MAX_DIMS :])
    if shared is not None:
        raise shared
    return torch.Size(row[3 : 3 + row[0]]), _DTYPES[row[1]], bool(row[2])


def _scatter_source_problem(x: object, counts: list[int], src: int, dim: int) -> Exception | None:
    """What is wrong with ``x`` on ``src`` (a check only ``src`` can make), or ``None``."""
    try:
        x = check_tensor("x", x)
        dim = check_dim(dim, x.dim())
        if x.shape[dim] != sum(counts):
            raise ValueError(
                f"Expected 'x' on src to have sum(counts) = {sum(counts)} rows along dim {dim} (got {x.shape[dim]})"
            )
        if x.dim() > _MAX_DIMS or x.dtype not in _DTYPES:
            raise ValueError(
                f"scatter_v supports up to {_MAX_DIMS} dims and dtypes {_DTYPES} (got {x.dim()}, {x.dtype})"
            )
    except (TypeError, ValueError) as err:
        return type(err)(f"{err} (on rank {src})")
    return None


def scatter_v(
    x: Tensor | None, counts: Counts, *, src: int = 0, dim: int = 0, group: Any = None, error: Exception | None = None
) -> Tensor:
    """Split ``x`` (needed on ``src`` only) along ``dim``: rank ``r`` gets ``counts[r]`` rows.

    Other ranks may pass ``None``; they learn the dtype and row shape from ``src`` through one small
    exchange. If ``x`` requires grad on ``src``, every rank's result does, and the backward gathers
    the gradient back to ``src`` (so every rank must backpropagate through its result).

    Checks that only ``src`` can make (``x``'s type and size) fail every rank: ``src`` sends the
    problem instead of the metadata, and every rank raises the same error, so none is left
    waiting. A caller with a check of its own passes ``error`` on ``src`` (an exception to raise
    on every rank instead of scattering).

    Shapes:
        x on src: ``sum(counts)`` rows along ``dim``; result: ``counts[rank]`` rows.

    Communication: two ``all_to_all_single`` forward (metadata, rows) in a world of more than one;
    one backward.

    Raises:
        ValueError, TypeError: on every rank, when ``x`` on ``src`` is not a tensor of
            ``sum(counts)`` rows along ``dim``, or ``error`` was given on ``src``.
    """
    rank, world = group_rank_and_size(group)
    c = as_counts("counts", counts, world)
    check_rank("src", src, world)
    problem = (error or _scatter_source_problem(x, c, src, dim)) if rank == src else None
    if world == 1:
        if problem is not None:
            raise problem
        assert isinstance(x, Tensor)
        dim = check_dim(dim, x.dim())
        return _ScatterV.apply(x.movedim(dim, 0), c, src, rank, group).movedim(0, dim)
    shape, dtype, requires_grad = _scatter_metadata(x if rank == src else None, problem, src, rank, world, group)
    dim = check_dim(dim, len(shape))
    if rank == src:
        assert isinstance(x, Tensor)
        x0 = x.movedim(dim, 0)
    else:
        rest = tuple(s for i, s in enumerate(shape) if i != dim)
        x0 = torch.empty((0, *rest), dtype=dtype, device=communication_device(group), requires_grad=requires_grad)
    return _ScatterV.apply(x0, c, src, rank, group).movedim(0, dim)
