"""How many steps a run takes and at which learning rate: the schedules of ``--lr-schedule``
with their warm-up (:func:`lr_at`, a pure function of the step, so a resumed run repeats the
uninterrupted one's rates), ``--steps auto`` (:func:`fit_steps`: as many steps as fit
``--max-time``, timed on passes that train nothing), and what a stop at the time budget leaves of
a schedule (:func:`unfinished_schedule`)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

__all__ = ["AUTO_STEPS", "AUTO_WARMUP", "FIT_MARGIN", "LR_SCHEDULES", "PROBE_STEPS", "check_steps", "fit_steps",
           "lr_at", "resumed_steps", "unfinished_schedule", "warmup_steps"]


#: The learning-rate schedules of ``--lr-schedule``.
LR_SCHEDULES = ("constant", "cosine", "exponential")
#: ``TrainConfig.warmup`` of ``--warmup auto`` (the default): :func:`warmup_steps`.
AUTO_WARMUP = -1
#: ``TrainConfig.steps`` of ``--steps auto`` (with ``--max-time``): :func:`fit_steps`.
AUTO_STEPS = -1
#: Forward and backward passes ``--steps auto`` times before the first step (none of them trains).
PROBE_STEPS = 8
#: A training step's time over its forward and backward pass's, for ``--steps auto``: the shape
#: sweep's steps (one rank) took 72 ms against 57 ms for the passes alone.
FIT_MARGIN = 1.25


def warmup_steps(cfg: Any) -> int:
    """The warm-up steps of ``cfg``: ``cfg.warmup``, or with ``auto`` (-1) 2% of ``cfg.steps``, at
    most 100 (none for a run of fewer than 50 steps)."""
    return cfg.warmup if cfg.warmup != AUTO_WARMUP else min(100, cfg.steps // 50)


def lr_at(cfg: Any, step: int) -> float:
    """The learning rate of ``step`` (0-based): ``cfg.lr``, times a linear warm-up over the first
    :func:`warmup_steps` steps, times for ``cosine`` a half cosine from 1 at step 0 to ``cfg.lr_floor``
    at the last step (``cfg.steps - 1``), or for ``exponential`` a geometric decay
    ``cfg.lr_floor ** t`` with ``t`` going linearly from 0 at the end of the warm-up (step
    ``cfg.warmup - 1``, or step 0 without one) to 1 at the last step (MeshGraphNets' exponential
    decay to a floor). A pure function of the step, so a resumed run repeats the uninterrupted
    one's rates."""
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"Expected --lr-schedule {', '.join(LR_SCHEDULES[:-1])} or {LR_SCHEDULES[-1]} "
                         f"(got {cfg.lr_schedule!r})")
    if cfg.warmup < AUTO_WARMUP or not 0.0 <= cfg.lr_floor <= 1.0:
        raise ValueError(f"Expected --warmup auto or >= 0 and 0 <= --lr-floor <= 1 (got {cfg.warmup}, {cfg.lr_floor})")
    if cfg.lr_schedule == "exponential" and cfg.lr_floor <= 0.0:
        raise ValueError(f"Expected --lr-floor > 0 for --lr-schedule exponential (got {cfg.lr_floor})")
    warmup = warmup_steps(cfg)
    rate = cfg.lr * (min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0)
    if cfg.lr_schedule == "cosine":
        done = min(1.0, step / max(cfg.steps - 1, 1))
        rate *= cfg.lr_floor + (1.0 - cfg.lr_floor) * 0.5 * (1.0 + math.cos(math.pi * done))
    elif cfg.lr_schedule == "exponential":
        start = max(warmup - 1, 0)
        done = min(1.0, max(0.0, (step - start) / max(cfg.steps - 1 - start, 1)))
        rate *= cfg.lr_floor**done
    return rate


def check_steps(cfg: Any) -> None:
    """Refuse, in one line, ``--steps`` that is neither a positive number nor ``auto`` with a time
    budget to fit the steps to (or on ``--resume``: the steps fitted when the run began)."""
    if cfg.steps == AUTO_STEPS:
        if not (cfg.max_time > 0 or cfg.resume):
            raise ValueError("Expected --steps auto with --max-time (it fits the number of steps to that budget)")
    elif cfg.steps < 1:
        raise ValueError(f"Expected --steps to be a positive integer or auto (got {cfg.steps})")


def resumed_steps(cfg: Any, saved: Any) -> Any:
    """``cfg`` of a run resumed from checkpoint ``saved``: with ``--steps auto``, the steps fitted when
    the run began (the run's recorded ``steps``)."""
    if saved is None or cfg.steps != AUTO_STEPS:
        return cfg
    return replace(cfg, steps=int(saved.get("config", {}).get("steps") or AUTO_STEPS))


def fit_steps(run: Any, began: float) -> tuple[Any, dict[str, float]]:
    """``--steps auto``: the steps that fit what is left of ``--max-time``, from the median time of
    :data:`PROBE_STEPS` forward and backward passes on the first steps' samples, the first two left
    out (and of one validation pass, with ``--val-every``), the slowest rank's, times
    :data:`FIT_MARGIN`. The passes train nothing: their
    gradients are dropped, and the model's buffers and the random state are restored, so the run
    is the run of ``--steps N`` with the number found, which is recorded."""
    cfg, model = run.cfg, run.model
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rng = torch.get_rng_state()
    try:
        times = []
        for step in range(PROBE_STEPS):
            t0 = time.perf_counter()
            run.backward(step, 0, {}, began)
            times.append(time.perf_counter() - t0)
        step_s = float(np.median(times[2:]))  # the first passes warm up (allocations, caches)
        validating = cfg.val_every > 0 and len(run.reader.val) > 0
        t0 = time.perf_counter()
        if validating:
            with torch.no_grad():
                run.validate(0)
                if cfg.val_rollout > 0 and getattr(run.task, "rolls_out", False):
                    run.validate_rollout(0)
        validation_s = time.perf_counter() - t0 if validating else 0.0
    finally:
        run.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        torch.set_rng_state(rng)
    slowest = torch.tensor([step_s, validation_s], dtype=torch.float64, device=run.ctx.device)
    from meshshard.comm import all_reduce_max

    slowest = all_reduce_max(slowest).tolist()  # every rank alike
    left = cfg.max_time - (time.monotonic() - began)
    # a quarter more for what the passes leave out: the optimizer step, logs, checkpoints, meshes read the first time
    per_step = FIT_MARGIN * slowest[0] + (slowest[1] / cfg.val_every if validating else 0.0)
    steps = max(1, int(left / per_step))
    return replace(cfg, steps=steps), {"step_s": slowest[0], "validation_s": slowest[1]}


def unfinished_schedule(cfg: Any, done: int) -> str:
    """What a stop at the time budget leaves of a decaying learning-rate schedule, and the
    ``--steps`` whose schedule would have ended within it (the steps done), or nothing."""
    if cfg.lr_schedule == "constant":
        return ""
    left = lr_at(cfg, done) / cfg.lr
    return (f". Its --lr-schedule {cfg.lr_schedule} was set for --steps {cfg.steps} and stops at {left:.0%} of --lr: "
            f"for a schedule that ends within the budget, train with --steps {done} (what fitted)")
