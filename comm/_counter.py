"""Counting the collectives a piece of code issues, forward and backward.

Tests use it to assert communication patterns ("one halo exchange per processor step, one more in
the backward"); users can use it to see what a model sends::

    from meshshard.comm import count_collectives

    with count_collectives() as log:
        loss = model(x).sum()
        loss.backward()
    log.count("indexed_all_to_all_v", phase="forward")   # -> number of calls
    log.bytes_sent()                                     # -> bytes this rank sent to other ranks

Every call of a public collective is recorded once, as a logical call: in a world of one, calls are
recorded too (with ``world_size=1`` and no bytes sent), so a count does not depend on the number of
ranks. Recording is process-wide and thread-safe (CUDA backward passes run on autograd's device
threads), and logs may nest. A layer that sends through comm's plain calls under a name of its own
(``DomainParallel``'s gradient buckets) records that call with :func:`record_collective`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["CollectiveCall", "CollectiveLog", "count_collectives", "record_collective"]


@dataclass(frozen=True)
class CollectiveCall:
    """One logical collective call on this rank.

    Attributes:
        op: the public function, e.g. ``"indexed_all_to_all_v"``.
        phase: ``"forward"`` or ``"backward"``.
        bytes_sent: bytes this rank sent to other ranks (its own part, copied locally, excluded).
        bytes_received: bytes this rank received from other ranks.
        world_size: size of the group the call ran on.
    """

    op: str
    phase: str
    bytes_sent: int
    bytes_received: int
    world_size: int


@dataclass
class CollectiveLog:
    """The calls recorded while a :func:`count_collectives` block was open."""

    calls: list[CollectiveCall] = field(default_factory=list)

    def _select(self, op: str | None, phase: str | None) -> list[CollectiveCall]:
        return [c for c in self.calls if (op is None or c.op == op) and (phase is None or c.phase == phase)]

    def count(self, op: str | None = None, phase: str | None = None) -> int:
        """Number of calls, optionally only of one ``op`` and / or one ``phase``."""
        return len(self._select(op, phase))

    def bytes_sent(self, op: str | None = None, phase: str | None = None) -> int:
        """Bytes this rank sent to other ranks, over the selected calls."""
        return sum(c.bytes_sent for c in self._select(op, phase))

    def bytes_received(self, op: str | None = None, phase: str | None = None) -> int:
        """Bytes this rank received from other ranks, over the selected calls."""
        return sum(c.bytes_received for c in self._select(op, phase))

    def __repr__(self) -> str:
        ops: dict[tuple[str, str], int] = {}
        for c in self.calls:
            ops[(c.op, c.phase)] = ops.get((c.op, c.phase), 0) + 1
        inner = ", ".join(f"{op}/{phase}: {n}" for (op, phase), n in ops.items())
        return f"CollectiveLog({inner or 'no calls'})"


_lock = threading.Lock()
_active: list[CollectiveLog] = []


@contextmanager
def count_collectives() -> Iterator[CollectiveLog]:
    """Record every collective issued (on any thread) while the block is open."""
    log = CollectiveLog()
    with _lock:
        _active.append(log)
    try:
        yield log
    finally:
        with _lock:
            _active.remove(log)


def record(call: CollectiveCall) -> None:
    """Add ``call`` to every open log (a no-op when none is open)."""
    if not _active:
        return
    with _lock:
        for log in _active:
            log.calls.append(call)


def record_collective(call: CollectiveCall) -> None:
    """Add ``call`` to every open :func:`count_collectives` log (a no-op when none is open).

    For a logical call that a layer above comm builds from comm's plain collectives and counts under
    a name of its own (``DomainParallel``'s gradient buckets, ``ddp_comm_hook``). Local, no
    communication."""
    record(call)
