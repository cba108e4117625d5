"""Files written by a background thread while the next step computes (a rollout's series).

A rollout's step ``k`` is gathered (the collectives stay on the main thread, in the same order on
every rank) and handed to :class:`BackgroundWriter` as a call that writes one file; the writer's
thread compresses and writes it while the main thread computes step ``k + 1``. zlib, lz4 and
numpy release the GIL, so the two overlap. The queue is bounded (:data:`QUEUE_DEPTH` files), so
at most that many steps' arrays wait in memory; a full queue makes the main thread wait, and that
wait is counted as writing.

A file that cannot be written stops the rollout: the next :meth:`BackgroundWriter.submit` (or
:meth:`BackgroundWriter.close`) raises one line naming the file, and nothing waits on a writer that
has stopped (after a failure it drops what is queued). Leaving the ``with`` block, normally or by
an exception, flushes every queued file and joins the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._recipe import first_line

__all__ = ["QUEUE_DEPTH", "BackgroundWriter", "WriteFailed", "write_now"]

#: Files (steps) that may wait to be written; the main thread waits when the queue is full.
QUEUE_DEPTH = 2


class WriteFailed(OSError):
    """A file the background writer could not write: one line naming it (``filename``: the file)."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.message = message
        self.filename = str(path)

    def __str__(self) -> str:
        return self.message


def write_now(write: Callable[..., Any], path: Path, *args: Any) -> None:
    """Write at once, on this thread (what the writers do without a :class:`BackgroundWriter`)."""
    write(path, *args)


class BackgroundWriter:
    """A thread writing files in the order given, at most ``depth`` queued (see the module docstring).

    Use it as a context manager; ``submit`` has the signature of :func:`write_now`."""

    def __init__(self, depth: int = QUEUE_DEPTH) -> None:
        self._queue: queue.Queue[tuple[Callable[..., Any], Path, tuple[Any, ...]] | None] = queue.Queue(maxsize=depth)
        self._failed: tuple[Path, BaseException] | None = None
        self._thread = threading.Thread(target=self._run, name="meshshard-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            write, path, args = item
            if self._failed is None:  # after a failure the rest is dropped, so a full queue never blocks
                try:
                    write(path, *args)
                except BaseException as err:  # noqa: BLE001 - reported on the main thread, naming the file
                    self._failed = (path, err)

    def _raise(self) -> None:
        if self._failed is not None:
            path, err = self._failed
            message = f"{path}: could not write the file ({type(err).__name__}: {first_line(err)})"
            raise WriteFailed(message, path) from err

    def submit(self, write: Callable[..., Any], path: Path, *args: Any) -> None:
        """Queue ``write(path, *args)``; waits while the queue is full. Raises the error of a file
        that failed before (one line naming it)."""
        self._raise()
        if not self._thread.is_alive():
            raise RuntimeError(f"{path}: the background writer has stopped")
        self._queue.put((write, path, args))

    def close(self) -> None:
        """Write every queued file, join the thread, then raise the error of a file that failed."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._raise()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.close()
            return
        try:  # an exception in the rollout: the queued files are still written, the thread joined,
            self.close()
        except OSError:  # and the rollout's own exception is the one raised
            pass
