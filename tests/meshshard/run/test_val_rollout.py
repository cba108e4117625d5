"""Validation of a transient run by a short rollout (``--val-rollout V``): its RMSE on 2 ranks equals
one process (float64, 1e-10), changes with training, is what ``predict --rollout`` of the same
checkpoint gives (normalised by the state's scale, over the interior nodes, V steps), and best.pt
is chosen by it; ``--val-rollout 0`` turns it off."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from meshshard.data import open_dataset
from meshshard.run import PredictConfig, TrainConfig, load_checkpoint, predict, read_log, train
from tests._dist import run_ranks
from tests._ranks import train_rank
from tests.meshshard.run.test_rollout import _steps
from tests.meshshard.tasks import _trajectories

V = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    return _trajectories.write(tmp_path_factory.mktemp("valroll"), parts=(1, 2), steps=8)


def _cfg(setup: dict, name: str, parts: int = 1, **changes) -> TrainConfig:
    base = TrainConfig(partition=setup[parts], data=setup["data"], out=str(setup["root"] / name), steps=4, lr=1e-2,
                       latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64",
                       val_every=2, val_rollout=V, noise_std=0.05)
    return TrainConfig(**(asdict(base) | changes))


def _records(run: str | Path) -> list[dict]:
    return [r for r in read_log(Path(run) / "log.jsonl") if "val_loss" in r]


def test_the_rollout_error_on_two_ranks_equals_one_process_and_predict(setup: dict) -> None:
    one = _cfg(setup, "one")
    train(one)
    two = _cfg(setup, "two", parts=2)
    run_ranks(train_rank, 2, asdict(two), timeout=120)
    a, b = _records(one.out), _records(two.out)
    assert [r["step"] for r in a] == [0, 2, 4] and all(r["val_rollout_steps"] == V for r in a)
    rmse = [r["val_rollout_rmse"] for r in a]
    np.testing.assert_allclose([r["val_rollout_rmse"] for r in b], rmse, rtol=1e-10)
    assert all(np.isfinite(rmse)) and len(set(rmse)) == 3  # it moves with training
    # best.pt: the step of the lowest rollout error, not of the lowest one-step loss
    best = load_checkpoint(Path(one.out) / "best.pt")
    assert best["step"] == a[int(np.argmin(rmse))]["step"] and best["val_rollout_rmse"] == min(rmse)
    assert best["best_by"] == "val_rollout_rmse"
    # the same number from predict --rollout's files of the last checkpoint (step 4)
    out = setup["root"] / "pred"
    predict(PredictConfig(run=one.out, data=setup["data"], out=str(out), rollout=True, steps=V, quiet=True,
                          plots=False, checkpoint="last"))
    data = open_dataset(setup["data"])
    scale = np.asarray(data.meta["normalisation"]["state"]["scale"])
    interior = setup["whole"][-1]["classes"] == 0
    err = [((pred - truth) / scale)[interior] for _, pred, truth in _steps(out, "run2")[1:]]
    assert len(err) == V
    assert rmse[-1] == pytest.approx(float(np.sqrt(np.mean(np.square(err)))), rel=1e-10)


def test_data_parallel_groups_share_the_trajectories_and_agree(setup: dict) -> None:
    """2 data-parallel groups of 1 rank: one group has the validation trajectory, the other none; at
    step 0 (the same initial weights) the figure is the one-process one."""
    one = _cfg(setup, "dp-one", steps=1)
    train(one)
    dp = _cfg(setup, "dp-two", steps=1, data_parallel=2)
    run_ranks(train_rank, 2, asdict(dp), timeout=120)
    a, b = _records(one.out), _records(dp.out)
    assert a[0]["step"] == b[0]["step"] == 0
    assert b[0]["val_rollout_rmse"] == pytest.approx(a[0]["val_rollout_rmse"], rel=1e-10)


def test_val_rollout_0_is_off_and_best_is_by_the_loss(setup: dict) -> None:
    cfg = _cfg(setup, "off", val_rollout=0, steps=2)
    train(cfg)
    records = _records(cfg.out)
    assert records and all("val_rollout_rmse" not in r for r in records)
    assert load_checkpoint(Path(cfg.out) / "best.pt")["best_by"] == "val_loss"


def test_info_shows_the_validation_rollout(setup: dict, capsys) -> None:
    from meshshard.cli import main

    cfg = _cfg(setup, "info", steps=2)
    train(cfg)
    rmse = [r["val_rollout_rmse"] for r in _records(cfg.out)]
    assert main(["info", cfg.out]) == 0
    out = capsys.readouterr().out
    best = int(np.argmin(rmse)) * 2
    assert f"val rollout RMSE ({V} steps, normalised) last {rmse[-1]:.5g} at step 2, best {min(rmse):.5g} " \
           f"at step {best} (best.pt)" in out


def test_a_resumed_run_logs_the_uninterrupted_rollout_errors(setup: dict) -> None:
    whole = _cfg(setup, "resume-whole")
    train(whole)
    stopped = _cfg(setup, "resume-part", max_time=1e-9)
    train(stopped)  # stops after its first step, with a checkpoint
    assert [r["step"] for r in _records(stopped.out)] == [0]
    train(_cfg(setup, "resume-part", resume=True))
    a, b = _records(whole.out), _records(stopped.out)
    assert [(r["step"], r["val_rollout_rmse"]) for r in b] == [(r["step"], r["val_rollout_rmse"]) for r in a]
    assert load_checkpoint(Path(stopped.out) / "best.pt")["step"] == load_checkpoint(Path(whole.out) / "best.pt")["step"]


def test_the_command_line_sets_it(setup: dict, capsys) -> None:
    from meshshard.cli import main

    out = str(setup["root"] / "cli")
    assert main(["train", setup[1], "--data", setup["data"], "--out", out, "--steps", "1", "--latent", "8",
                 "--mp-steps", "1", "--val-every", "1", "--val-rollout", "3", "--log-every", "1"]) == 0
    records = _records(out)
    assert [r["val_rollout_steps"] for r in records] == [3, 3]
    printed = capsys.readouterr().out
    assert f"rollout RMSE (3 steps) {records[-1]['val_rollout_rmse']:.5f}" in printed
