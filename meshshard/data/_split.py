"""The split of a dataset's samples (or trajectories) into training and validation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["split_samples"]


def split_samples(names: Sequence[str], val_fraction: float | None = None,
                  val_samples: Sequence[int | str] | None = None) -> tuple[list[int], list[int]]:
    """(train, val) sample indices: the given ``val_samples`` (indices or names), or
    ``round(val_fraction * S)`` samples (at least one when the fraction is positive and S >= 2)
    drawn by a fixed permutation (seed 0); at least one sample is always left for training."""
    s = len(names)
    if val_samples is not None and val_fraction is not None:
        raise ValueError("Expected --val-fraction or --val-samples, not both")
    if val_samples is not None:
        by_name = {n: i for i, n in enumerate(names)}
        val = set()
        for item in val_samples:
            text = str(item).strip()
            if text in by_name:
                val.add(by_name[text])
            elif text.lstrip("-").isdigit() and 0 <= int(text) < s:
                val.add(int(text))
            else:
                raise ValueError(f"Expected --val-samples to name samples (indices 0..{s - 1} or names "
                                 f"such as {', '.join(list(names)[:3])}) (got {text!r})")
    else:
        f = 0.2 if val_fraction is None else float(val_fraction)
        if not 0.0 <= f < 1.0:
            raise ValueError(f"Expected --val-fraction in [0, 1) (got {f})")
        k = int(round(f * s))
        if f > 0 and s >= 2:
            k = max(k, 1)
        k = min(k, s - 1)
        val = set(np.random.default_rng(0).permutation(s)[:k].tolist()) if k > 0 else set()
    train = [i for i in range(s) if i not in val]
    if not train:
        raise ValueError("Expected at least one training sample (got "
                         f"{'the only sample' if s == 1 else f'all {s} samples'} for validation)")
    return train, sorted(val)
