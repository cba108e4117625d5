"""A training run's log: ``RUN/log.jsonl`` (a record per step, validation and event, strict JSON),
what rank 0 prints as it trains (a progress bar on a terminal, a line every ``log_every`` steps
otherwise) and ``RUN/loss.png``, redrawn at most every :data:`PLOT_EVERY_S` seconds while training
(a drawing takes 0.3 s of rank 0, while the other ranks wait for it at the next step: drawn every
10 steps, it was about a fifth of a 5,000-step run of 0.1 s steps) and always at the end.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from meshshard.partition import dumps_json
from meshshard.partition.files import open_own

from . import _folder, _report
from ._folder import LOG, LOSS_PLOT

__all__ = ["PLOT_EVERY_S", "TrainLog", "log_line", "rewrite_log"]

#: While training, ``loss.png`` is redrawn at a logged step at least this many seconds after its last drawing.
PLOT_EVERY_S = 30.0


def log_line(record: dict[str, Any]) -> str:
    """One line of log.jsonl: the record as strict JSON (``meshshard.partition.dumps_json``), a
    value that is not finite (a NaN validation loss) written as null, since JSON has no NaN."""
    def finite(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return dumps_json({key: finite(value) for key, value in record.items()}) + "\n"


def rewrite_log(path: Path, losses: list[float]) -> None:
    """log.jsonl as of the checkpoint: its earlier records (with memory, evaluations) where they
    agree with the checkpoint's losses, else one line per loss."""
    kept = [r for r in _folder.read_log(path) if isinstance(r.get("step"), int) and r["step"] < len(losses)]
    if [r["loss"] for r in kept if "loss" in r] != losses:
        kept = [{"step": i, "loss": v} for i, v in enumerate(losses)]
    tmp = path.with_name(".log.jsonl.tmp")
    tmp.write_text("".join(log_line(r) for r in kept))
    os.replace(tmp, path)


class TrainLog:
    """Rank 0's view: a progress bar on a terminal, a line every ``log_every`` steps otherwise."""

    def __init__(self, is_main: bool, cfg: Any, start: int, nodes_per_step: int) -> None:
        self.enabled, self.cfg, self.nodes = is_main and not cfg.quiet, cfg, nodes_per_step
        self.file = open_own(Path(cfg.out) / LOG, "a") if is_main else None  # never through a hard link
        self.bar = None
        self._plotted: float | None = None  # time.monotonic() of the last drawing of loss.png
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self.task = self.bar.add_task("train", total=cfg.steps, completed=start, info="")
            self.bar.start()

    def step(self, step: int, loss: float, seconds: float, memory: dict[str, list[float]] | None = None,
             lr: float | None = None) -> None:
        """Log one step (``lr``: the scheduled learning rate, recorded when there is a schedule)."""
        if self.file is None:
            return
        rate = self.nodes / seconds if seconds > 0 else 0.0
        record = {"step": step, "loss": loss, "seconds": round(seconds, 4), "nodes_per_s": round(rate),
                  "samples_per_s": round(self.cfg.data_parallel * self.cfg.batch / seconds, 3) if seconds > 0 else 0.0,
                  **(memory or {})}
        if lr is not None:
            record["lr"] = lr
        self.file.write(log_line(record))
        self.file.flush()
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, advance=1, info=f"loss {loss:.4g}  {rate:,.0f} nodes/s")
        elif step % self.cfg.log_every == 0 or step + 1 == self.cfg.steps:
            print(f"step {step:>5}  loss {loss:.5f}  {seconds * 1e3:7.1f} ms  {rate:>10,.0f} nodes/s", flush=True)

    def eval(self, step: int, loss: float, rollout_rmse: float | None = None, rollout_steps: int | None = None) -> None:
        """Log a validation: the one-step loss and, for a transient run, its rollout RMSE."""
        record: dict[str, Any] = {"step": step, "val_loss": loss}
        if rollout_rmse is not None:
            record |= {"val_rollout_rmse": rollout_rmse, "val_rollout_steps": rollout_steps}
        if self.file is not None:
            self.file.write(log_line(record))
            self.file.flush()
        if self.enabled and self.bar is None:
            extra = "" if rollout_rmse is None else f"  rollout RMSE ({rollout_steps} steps) {rollout_rmse:.5f}"
            print(f"step {step:>5}  validation loss {loss:.5f}{extra}", flush=True)

    def event(self, record: dict[str, Any] | None, message: str) -> None:
        """A line in log.jsonl (a learning-rate change) and, unless quiet, on the terminal."""
        if self.file is not None and record is not None:
            self.file.write(log_line(record))
            self.file.flush()
        if self.enabled:
            print(message, flush=True)

    def plot(self, final: bool = False) -> None:
        """Rewrite RUN/loss.png from log.jsonl (rank 0; a note once if matplotlib is missing): when
        ``final``, or the first time, or :data:`PLOT_EVERY_S` after the last drawing."""
        if self.file is None:
            return
        now = time.monotonic()
        if not final and self._plotted is not None and now - self._plotted < PLOT_EVERY_S:
            return
        self._plotted = now
        self.file.flush()
        out = Path(self.cfg.out)
        if not _report.write_loss_plot(_folder.read_log(out / LOG), out / LOSS_PLOT, f"meshshard train: {out}"):
            if self.enabled and not getattr(self, "_noted", False):
                print("note: matplotlib is not installed, so no loss.png (pip install matplotlib)", flush=True)
            self._noted = True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.file is not None:
            self.file.close()
