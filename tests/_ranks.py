"""What the ranks of a multi-rank test run, shared by the tests (module level, so ranks can import it).

    from tests._dist import run_ranks
    from tests._ranks import train_rank

    losses = run_ranks(train_rank, 3, asdict(cfg), timeout=180)[0]

:func:`train_rank` and :func:`predict_rank` take the config as a dict (``asdict(config)``) and build
it as the commands hand it to their ranks (``TrainConfig.from_dict``, ``PredictConfig.from_dict``).
:func:`all_sum` is for code running inside a rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from meshshard.run import PredictConfig, TrainConfig, predict, train

__all__ = ["all_sum", "predict_rank", "train_rank"]


def train_rank(rank: int, world: int, cfg: dict[str, Any]) -> list[float]:
    """``meshshard.train`` on this rank; returns its losses."""
    return train(TrainConfig.from_dict(cfg))


def predict_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict | None:
    """``meshshard.predict`` on this rank; returns what it returns (the summary on rank 0)."""
    return predict(PredictConfig.from_dict(cfg))


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the ranks, as a new tensor (a copy of ``t`` without a process group)."""
    t = t.clone()
    if dist.is_initialized():
        dist.all_reduce(t)
    return t
