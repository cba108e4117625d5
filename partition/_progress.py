"""Step timing, peak memory per step, and progress bars (rich, on stderr) for the partition
pipeline."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Steps", "peak_rss_mb", "reset_peak_rss"]

_HWM = re.compile(r"VmHWM:\s+(\d+) kB")


def peak_rss_mb() -> float | None:
    """This process's peak resident memory (``VmHWM``) in MiB since the last
    :func:`reset_peak_rss`; ``None`` where ``/proc`` does not tell (not Linux)."""
    try:
        with open("/proc/self/status") as file:
            found = _HWM.search(file.read())
    except OSError:
        return None
    return int(found.group(1)) / 1024 if found else None


def reset_peak_rss() -> bool:
    """Reset the peak resident memory to the current one (Linux ``clear_refs`` 5); ``False``
    where that is not possible, and then peaks are since the process started."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
    except OSError:
        return False
    return True


class Steps:
    """Times named steps; shows a spinner or a bar per step when enabled.

    Args:
        enabled: Show progress (only when stderr is a terminal, and not with ``--quiet``).
        track_memory: Record each step's peak memory. This resets the process's peak
            resident memory (which ``getrusage`` also reports) at the start of every step, so
            only the command line and the benchmarks turn it on.

    ``with steps.step("plans", total=R) as advance: ... advance(1)`` records the wall time of
    the step in ``steps.seconds["plans"]`` and, with ``track_memory`` on Linux, the peak resident memory of the
    process during the step in ``steps.peak_mb["plans"]`` (MiB; the largest over repeats).
    """

    def __init__(self, enabled: bool = False, track_memory: bool = False) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.track_memory = track_memory
        self.seconds: dict[str, float] = {}
        self.peak_mb: dict[str, float] = {}
        self._progress: Any = None

    def __enter__(self) -> Steps:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description:<10}"), BarColumn(),
                MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True))
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def step(self, name: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """A timed step called ``name`` (a context manager): yields ``advance(n)`` for a progress
        bar of ``total`` units; its time (and peak memory, when tracked) is recorded on exit."""
        tracked = self.track_memory and reset_peak_rss()
        start = time.perf_counter()
        task = None
        if self._progress is not None:
            task = self._progress.add_task(name, total=total)

        def advance(n: int = 1) -> None:
            if task is not None:
                self._progress.advance(task, n)

        try:
            yield advance
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            peak = peak_rss_mb() if tracked else None
            if peak is not None:
                self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), peak)
            if task is not None:
                self._progress.update(task, total=total or 1, completed=total or 1)
