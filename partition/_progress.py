"""Step timing and progress bars (rich, on stderr) for the partition pipeline."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Steps"]


class Steps:
    """Times named steps; shows a spinner or a bar per step when enabled.

    Args:
        enabled: Show progress (only when stderr is a terminal, and not with ``--quiet``).

    ``with steps.step("plans", total=R) as advance: ... advance(1)`` records the wall time of
    the step in ``steps.seconds["plans"]``.
    """

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.seconds: dict[str, float] = {}
        self._progress: Any = None

    def __enter__(self) -> Steps:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)

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
            if task is not None:
                self._progress.update(task, total=total or 1, completed=total or 1)
