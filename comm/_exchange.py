"""numpy arrays between processes for offline work (a distributed partition): :class:`ArrayExchange`.

It is the ``Exchange`` a distributed ``meshshard partition`` takes (the protocol is described in
``meshshard.partition``, which this layer does not import): ``all_to_all`` of arrays of any dtype
(sent as their bytes, so ``uint64`` Morton codes and ``int8`` flags travel as they are),
``all_reduce`` of small arrays, ``all_gather`` of small objects and ``barrier``. Not autograd-aware:
for the model, use the collectives of :mod:`meshshard.comm._collectives`.

Each call is one or two ``torch.distributed`` collectives on the CPU (gloo, or any backend given a
device), bounded by the group's timeout (``MESHSHARD_TIMEOUT``), so a process that died fails the others
in that time, not never.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ._mpi_exchange import checked_chunks

__all__ = ["ArrayExchange"]

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


class ArrayExchange:
    """Collectives on numpy arrays among the ranks of ``group`` (default: the world), on ``device``.

    Args:
        group: The process group (``None``: the default group; with no process group, a world of one).
        device: Where the bytes are staged for the backend (default CPU, which gloo takes).
    """

    def __init__(self, group: Any = None, device: str | torch.device = "cpu") -> None:
        self.group = group
        self.device = torch.device(device)
        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)
        else:
            self.rank, self.size = 0, 1

    def __repr__(self) -> str:
        return f"ArrayExchange(rank={self.rank}, size={self.size})"

    def _counts(self, send: list[int]) -> list[int]:
        out = torch.empty(self.size, dtype=torch.int64, device=self.device)
        dist.all_to_all_single(out, torch.tensor(send, dtype=torch.int64, device=self.device), group=self.group)
        return out.tolist()

    def all_to_all(self, chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send ``chunks[q]`` to rank ``q``; return what each rank sent this one, by source.

        Every chunk of a call has one dtype and one shape past the first axis, on every rank.
        """
        arrays = checked_chunks(chunks, self.size, "rank")
        dtype, tail = arrays[0].dtype, arrays[0].shape[1:]
        if self.size == 1:
            return [arrays[0]]
        row = dtype.itemsize * int(np.prod(tail, dtype=np.int64))
        send = [len(c) * row for c in arrays]
        recv = self._counts(send)
        data = np.concatenate([c.reshape(-1).view(np.uint8) for c in arrays]) if sum(send) else np.zeros(0, np.uint8)
        out = torch.empty(sum(recv), dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(out, torch.from_numpy(data).to(self.device), recv, send, group=self.group)
        got = out.cpu().numpy()
        bounds = np.concatenate([[0], np.cumsum(recv)])
        return [got[bounds[q]:bounds[q + 1]].view(dtype).reshape(-1, *tail) for q in range(self.size)]

    def all_reduce(self, values: np.ndarray, op: str) -> np.ndarray:
        """The element-wise ``"sum"``, ``"min"`` or ``"max"`` of ``values`` (float64 or int64) over the ranks."""
        if op not in _OPS:
            raise ValueError(f"Expected op 'sum', 'min' or 'max' (got {op!r})")
        values = np.asarray(values)
        if self.size == 1:
            return values.copy()
        t = torch.from_numpy(np.ascontiguousarray(values)).clone().to(self.device)
        dist.all_reduce(t, op=_OPS[op], group=self.group)
        return t.cpu().numpy()

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's small ``value`` (picklable; lists, numbers, strings), by rank."""
        if self.size == 1:
            return [value]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def barrier(self) -> None:
        """Return when every rank has called it."""
        if self.size > 1:
            dist.barrier(group=self.group)
