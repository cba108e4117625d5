"""Training that must stop, and stop cleanly: non-finite data, loss or gradients.

Uses the dataset and 2-part partition of ``test_train.py`` (``setup``). Each spawn runs several
trainings in a row, so the ranks start once.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard._train import TrainConfig, load_checkpoint, sample_index, train
from meshshard.partition import load_partition, open_dataset
from tests._dist import run_ranks
from tests.meshshard.test_train import setup  # noqa: F401 - the shared module fixture


def _outcome(cfg: dict) -> tuple[str, str]:
    try:
        train(TrainConfig.from_dict(cfg))
    except Exception as err:  # noqa: BLE001 - reported to the test, which checks type and message
        return type(err).__name__, str(err)
    return "ok", ""


def _train_several(rank: int, world: int, cfgs: list[dict]) -> list[tuple[str, str]]:
    return [_outcome(cfg) for cfg in cfgs]


def _nan_dataset(setup: dict, name: str, sample: int, node: int, which: str) -> Path:  # noqa: F811
    data = setup["root"] / name
    shutil.copytree(setup["cfg"].data, data)
    file = data / "samples" / f"{sample:05d}" / f"{which}.npy"  # the dataset refuses NaN: damage it after
    values = np.load(file)
    values[node, 0] = np.nan if which == "inputs" else np.inf
    np.save(file, values)
    return data


def test_non_finite_data_loss_or_gradient_stops_every_rank_and_keeps_the_last_good_checkpoint(setup: dict) -> None:  # noqa: F811
    base = asdict(setup["cfg"]) | {"data_parallel": 1, "checkpoint_every": 2}
    train_ids = open_dataset(base["data"]).train

    def sample_at(step: int) -> int:
        return int(train_ids[sample_index(base["seed"], step, 0, 1, len(train_ids))])

    sample = sample_at(2)  # first read at step 2, after a checkpoint
    assert sample not in [sample_at(k) for k in (0, 1)]
    node = int(load_partition(base["partition"], 1).owned_ids[3])  # owned by rank 1 only
    nan_inputs = _nan_dataset(setup, "nan_inputs", sample, node, "inputs")
    inf_targets = _nan_dataset(setup, "inf_targets", sample, node, "targets")
    cfgs = [
        base | {"data": str(nan_inputs), "out": str(setup["root"] / "nan")},
        base | {"data": str(nan_inputs), "out": str(setup["root"] / "nan"), "resume": True},
        base | {"data": str(inf_targets), "out": str(setup["root"] / "inf")},
        base | {"lr": 1e300, "out": str(setup["root"] / "diverges")},
    ]
    outcomes = run_ranks(_train_several, 2, cfgs, timeout=240)
    assert outcomes[0] == outcomes[1], "every rank stops with the same error"
    nan_run, nan_resumed, inf_run, diverged = outcomes[0]
    expected = (rf"Expected finite training data \(got nan in the inputs of sample {sample} at node {node}, read by "
                rf"rank 1 at step 2\); fix the dataset {nan_inputs}")
    assert nan_run[0] == "ValueError" and nan_run[1] == expected.replace("\\", ""), nan_run
    assert nan_resumed == nan_run  # the resumed run stops at the same place
    assert inf_run[0] == "ValueError" and f"(got inf in the targets of sample {sample} at node {node}" in inf_run[1]
    for run in ("nan", "inf"):
        ckpt = load_checkpoint(setup["root"] / run / "checkpoint.pt")
        assert ckpt["step"] == 2, "the last good checkpoint is kept"
        assert all(bool(torch.isfinite(v).all()) for v in ckpt["model"].values())
    assert diverged[0] == "NonFiniteLoss", diverged
    assert diverged[1].startswith("step 1: the loss is not finite (nan) on sample(s) ["), diverged
    assert diverged[1].endswith("]; training stopped before the optimizer step, so no non-finite weights are saved "
                                "(last checkpoint: none yet). Lower --lr or check the data."), diverged
    assert not (setup["root"] / "diverges" / "checkpoint.pt").exists()


def test_a_non_finite_gradient_is_reported_with_the_step_and_samples() -> None:
    from meshshard._train import NonFiniteLoss, _check_finite, _local_flags

    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    loss = torch.tensor(0.5)
    flags = _local_flags(loss, None, model.parameters(), rank=1, world=2)
    assert _check_finite(flags, step=5, samples=[3], data="DATA", last="none yet") == 0.25  # all finite
    model.weight.grad[0, 1] = float("inf")
    flags = _local_flags(loss, None, model.parameters(), rank=1, world=2)
    with pytest.raises(NonFiniteLoss, match=r"^step 5: a gradient is not finite \(loss 0\.25\) on sample\(s\) \[3\]; "
                                            r"training stopped before the optimizer step, .*\(last checkpoint: none yet\)"):
        _check_finite(flags, step=5, samples=[3], data="DATA", last="none yet")
    flags = _local_flags(loss, (4, 17, "targets", float("-inf")), model.parameters(), rank=1, world=2)
    with pytest.raises(ValueError, match=r"^Expected finite training data \(got -inf in the targets of sample 4 at "
                                         r"node 17, read by rank 1 at step 5\); fix the dataset DATA$"):
        _check_finite(flags, step=5, samples=[3], data="DATA", last="none yet")
