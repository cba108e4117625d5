"""What a distributed partition asks of the processes it runs on: :class:`Exchange`, a few collectives
on numpy arrays, and the rendezvous built on them.

This layer never imports torch: a distributed partition is handed an :class:`Exchange`, which
``meshshard.comm.ArrayExchange`` implements over ``torch.distributed`` (gloo) and :class:`LocalExchange`
for one process. An MPI implementation (mpi4py, for PT-Scotch) plugs in the same way.

Rendezvous on global ids: node ``g`` of ``N`` is kept by the process whose block holds it,
``block_owner(g, N, P)`` (blocks of :func:`meshshard.partition._vtkhdf.block_start`), which is also
the process that read its point. :func:`route` sends rows to chosen processes; :func:`lookup` asks the
keepers for the values of any ids. Each moves only the rows asked for: memory ``O(rows)`` per process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ._vtkhdf import block_owner, block_start

__all__ = ["BATCH", "Exchange", "LocalExchange", "agree", "lookup", "route"]

BATCH = 1 << 18
"""The most rows a process sends in one exchange where it sends its block's rows in batches (the
graph's edges, the parts' edges): a bound on what the exchange copies at once."""


class Exchange(Protocol):
    """Collectives among ``size`` processes, this one being ``rank``; every process calls each in the
    same order.

    ``all_to_all(chunks)`` sends ``chunks[q]`` to process ``q`` and returns what each process sent this
    one, by source (every chunk of one call has one dtype and one shape past the first axis, on every
    process). ``all_reduce(values, op)`` is the element-wise ``"sum"``, ``"min"`` or ``"max"`` of a small
    float64 or int64 array. ``all_gather(value)`` returns every process's small JSON-like ``value``, by
    rank. ``barrier()`` returns when every process has called it.
    """

    rank: int
    size: int

    def all_to_all(self, chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send ``chunks[q]`` to process ``q``; return what each process sent this one, by source."""
        ...

    def all_reduce(self, values: np.ndarray, op: str) -> np.ndarray:
        """The element-wise ``"sum"``, ``"min"`` or ``"max"`` of ``values`` over the processes."""
        ...

    def all_gather(self, value: Any) -> list[Any]:
        """Every process's small ``value``, by rank."""
        ...

    def barrier(self) -> None:
        """Return when every process has called it."""
        ...


class LocalExchange:
    """The :class:`Exchange` of a world of one process (no communication)."""

    rank = 0
    size = 1

    def all_to_all(self, chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The one chunk, to this process itself."""
        if len(chunks) != 1:
            raise ValueError(f"Expected one chunk per process, 1 (got {len(chunks)})")
        return [np.asarray(chunks[0])]

    def all_reduce(self, values: np.ndarray, op: str) -> np.ndarray:
        """A copy of ``values`` (the reduction over one process)."""
        if op not in ("sum", "min", "max"):
            raise ValueError(f"Expected op 'sum', 'min' or 'max' (got {op!r})")
        return np.array(values, copy=True)

    def all_gather(self, value: Any) -> list[Any]:
        """``[value]``."""
        return [value]

    def barrier(self) -> None:
        """Nothing to wait for."""
        return None

    def __repr__(self) -> str:
        return "LocalExchange(rank=0, size=1)"


def agree(ex: Exchange, error: BaseException | None) -> None:
    """Raise on every process the first process's error (a ``ValueError`` with its one line), or return
    when none had one: one small all-gather, so that no process is left waiting for one that gave up."""
    said = None if error is None else (str(error).strip().splitlines() or [type(error).__name__])[0]
    found = [(rank, text) for rank, text in enumerate(ex.all_gather(said)) if text is not None]
    if found:
        if error is not None and found[0][0] == ex.rank:
            raise error
        raise ValueError(found[0][1])


def route(ex: Exchange, dest: np.ndarray, *columns: np.ndarray) -> list[np.ndarray]:
    """Send row ``i`` of every column to process ``dest[i]``; return the rows received, columns alike,
    by source process, in each source's order.

    Shapes:
        dest: ``(M,)`` in ``[0, P)``. columns: ``(M, ...)``. Returns one ``(M_in, ...)`` array per column.
    """
    dest = np.asarray(dest, dtype=np.int64)
    order = np.argsort(dest, kind="stable")
    bounds = np.searchsorted(dest[order], np.arange(ex.size + 1))
    out = []
    for column in columns:
        column = np.asarray(column)[order]
        received = ex.all_to_all([column[bounds[q]:bounds[q + 1]] for q in range(ex.size)])
        out.append(np.concatenate(received) if received else column[:0])
    return out


def lookup(ex: Exchange, ids: np.ndarray, kept: np.ndarray, total: int) -> np.ndarray:
    """The values of the global ids ``ids``, each kept by its block owner: ``kept`` are this process's
    values, for the ids ``[block_start(total, rank, P), block_start(total, rank + 1, P))``.

    Shapes:
        ids: ``(M,)``. kept: ``(block, ...)``. Returns ``(M, ...)``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    owner = block_owner(ids, total, ex.size)
    order = np.argsort(owner, kind="stable")
    (asked,) = route(ex, owner, ids)
    counts_in = ex.all_to_all([np.array([n], dtype=np.int64) for n in
                               np.bincount(owner, minlength=ex.size)])
    source = np.repeat(np.arange(ex.size, dtype=np.int64), np.concatenate(counts_in))
    answers = kept[asked - block_start(total, ex.rank, ex.size)]
    (back,) = route(ex, source, answers)
    out = np.empty((len(ids), *kept.shape[1:]), dtype=kept.dtype)
    out[order] = back
    return out
