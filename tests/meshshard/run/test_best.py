"""The best checkpoint by validation loss: kept beside the last one, read by predict and load_run
by default (``--checkpoint best|last``), deleted by ``--force`` only when it is a run's."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from meshshard.run import PredictConfig, TrainConfig, check_run_folder, load_checkpoint, load_run, predict, train
from tests.meshshard.run.test_train import setup  # noqa: F401 - the shared module fixture


def _cfg(setup: dict, name: str, **changes) -> TrainConfig:  # noqa: F811
    return TrainConfig.from_dict(asdict(setup["cfg"]) | {"partition": str(setup["root"] / "partition1"),
                                                         "data_parallel": 1, "out": str(setup["root"] / name)}
                                 | changes)


@pytest.fixture(scope="module")
def best_run(setup: dict) -> Path:  # noqa: F811
    # a learning rate this high makes the validation loss rise after a few steps: best and last differ
    train(_cfg(setup, "best", steps=8, val_every=2, lr=0.3, checkpoint_every=8))
    return Path(setup["root"]) / "best"


def test_best_pt_holds_the_step_of_the_lowest_validation_loss(best_run: Path) -> None:
    records = [json.loads(line) for line in (best_run / "log.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert sorted(val) == [0, 2, 4, 6, 8]
    best_step = min(val, key=val.get)
    best, last = load_checkpoint(best_run / "best.pt"), load_checkpoint(best_run / "checkpoint.pt")
    assert best["step"] == best_step and best["val_loss"] == val[best_step] and last["step"] == 8
    assert best["losses"] == last["losses"][:best_step]
    assert last["best_val_loss"] == val[best_step]
    assert best_step != 8, "the run was meant to get worse at the end; pick a higher lr"
    assert load_run(best_run).step == best_step
    assert load_run(best_run, checkpoint="last").step == 8
    for name, value in load_run(best_run).model.state_dict().items():
        assert torch.equal(value, best["model"][name].to(value.dtype)), name


def test_predict_reads_the_best_checkpoint_unless_told_last(setup: dict, best_run: Path) -> None:  # noqa: F811
    data = setup["cfg"].data
    for which, step in (("best", load_checkpoint(best_run / "best.pt")["step"]), ("last", 8)):
        out = Path(setup["root"]) / f"pred-{which}"
        metrics = predict(PredictConfig(run=str(best_run), data=data, out=str(out), samples="all", plots=False,
                                        quiet=True, checkpoint=which))
        assert metrics["step"] == step and metrics["checkpoint"] == which


def test_a_run_without_validation_reads_its_last_checkpoint_as_best(setup: dict) -> None:  # noqa: F811
    train(_cfg(setup, "no-val", steps=2))
    run = Path(setup["root"]) / "no-val"
    assert not (run / "best.pt").exists() and load_run(run).step == 2


def test_force_deletes_best_pt_only_when_it_is_a_runs(setup: dict, best_run: Path, tmp_path: Path) -> None:  # noqa: F811
    assert best_run / "best.pt" in check_run_folder(best_run, resume=False, force=True)
    (tmp_path / "log.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    (tmp_path / "best.pt").write_text("the user's own file")
    with pytest.raises(ValueError, match=r"holds best\.pt, which is not a readable meshshard checkpoint"):
        check_run_folder(tmp_path, resume=False, force=True)


def test_an_unknown_checkpoint_name_is_refused(best_run: Path) -> None:
    with pytest.raises(ValueError, match=r"^Expected --checkpoint best or last \(got 'first'\)$"):
        load_run(best_run, checkpoint="first")


def test_metrics_say_the_checkpoint_predict_read(setup: dict) -> None:  # noqa: F811
    """Issue 36 (minor): --checkpoint best of a run without best.pt read checkpoint.pt while
    metrics.json said "best"; it says "last", the checkpoint it read."""
    run = Path(setup["root"]) / "no-val-metrics"
    train(_cfg(setup, "no-val-metrics", steps=2))
    assert not (run / "best.pt").exists()
    metrics = predict(PredictConfig(run=str(run), data=setup["cfg"].data, out=str(Path(setup["root"]) / "pred-nv"),
                                    samples="all", plots=False, quiet=True, checkpoint="best"))
    assert metrics["step"] == 2 and metrics["checkpoint"] == "last"
