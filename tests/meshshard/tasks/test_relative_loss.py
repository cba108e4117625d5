"""``train --relative-loss``: each sample's loss is divided by what predicting the training mean
loses on it, the same (weighted) mean of its normalised targets squared. On 1, 2, 3 and 4 ranks
(uneven shards) the loss and every gradient equal one process's on the whole mesh, written here
from the normalised targets (float64, 1e-10), with and without ``--loss-weight``; training with it
on three ranks equals one process; the setting is recorded, shown, kept on ``--resume`` and refused
by the transient task in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.data import open_dataset
from meshshard.run import load_checkpoint
from meshshard.tasks import get_task, whole_sample
from tests.meshshard.tasks import _trajectories, _walled

WEIGHTS = {"bottom": 10.0, "left": 0.5}
SEED = 7  # the model's initial weights


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("relative_loss")
    pts, walls = _walled.write_rectangle(root, 3)
    w = _walled.wall_weights(len(pts), walls)
    return {"root": root, "data": str(root / "data"), "w": w}


def _sharded(rank: int, world: int, data: str, parts: str, configs: list[dict]) -> list:
    return _walled.sharded(rank, world, data, parts, configs, SEED)


def _reference(case: dict, weighted: bool) -> list:
    """One process, from the normalised targets: mean(w e^2) / mean(w y^2) per sample."""
    weight = torch.as_tensor(case["w"] if weighted else np.ones(len(case["w"])))[:, None]
    return _walled.reference(case["data"], SEED, lambda e, y: ((e ** 2) * weight).sum() / ((y ** 2) * weight).sum())


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_loss_and_every_gradient_on_shards_equal_one_process(case: dict, world: int) -> None:
    configs = [{"relative_loss": True}, {"relative_loss": True, "loss_weight": WEIGHTS}]
    _walled.check_on_ranks(case["root"], case["data"], world, configs, [_reference(case, False), _reference(case, True)],
                           SEED)


def test_each_sample_is_divided_by_its_own_baseline(case: dict) -> None:
    """The ratio is the plain loss over the sample's mean square: the samples' weights differ."""
    parts = str(case["root"] / "parts1")
    plain, relative = (_sharded(0, 1, case["data"], parts, [config])[0] for config in ({}, {"relative_loss": True}))
    squares = [float((whole_sample(case["data"], s, dtype=torch.float64)[1] ** 2).mean()) for s in (0, 2)]
    for (p, _), (r, _), sq in zip(plain, relative, squares, strict=True):
        assert r == pytest.approx(p / sq, rel=1e-12)
    assert abs(squares[0] / squares[1] - 1) > 0.05  # the check can fail: one factor for both would not pass


def test_a_sample_with_nothing_to_learn_keeps_its_plain_loss() -> None:
    task = get_task("steady", {"relative_loss": True})
    batch = type("Batch", (), {"y": torch.zeros(5, 2, dtype=torch.float64), "sample": 0})()
    assert float(task._baseline_loss(batch)) == 1.0


def test_a_samples_baseline_is_computed_once_unless_its_points_change(case: dict) -> None:
    """The denominator is kept per sample (its all-reduce made once); with --max-points, whose
    subset changes each epoch, it is computed each time."""
    parts = str(case["root"] / "parts1")
    for max_points, kept in ((0, {0}), (50, set())):
        task = get_task("steady", {"relative_loss": True, "max_points": max_points})
        reader = task.reader(open_dataset(case["data"]), parts, 0, None, dtype=torch.float64)
        net, b = _walled.model(SEED), reader.sample(0)
        first, again = (float(task.loss(net(b.x, b.graph, b.edge_attr), b).detach()) for _ in range(2))
        assert first == again
        assert set(task.__dict__.get("_baselines", {})) == kept


@pytest.mark.slow
def test_training_with_it_on_three_ranks_equals_one_process(case: dict) -> None:
    _walled.check_training(case["root"], case["data"], "relative_loss", True, "relative_loss = true")


def test_the_command_records_shows_and_keeps_it(case: dict, capsys) -> None:
    root = case["root"]
    common = [str(root / "parts1"), "--data", case["data"], "--steps", "1", "--latent", "8", "--mp-steps", "1", "-q"]
    capsys.readouterr()
    assert main(["train", *common, "--out", str(root / "cli"), "--relative-loss", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "relative_loss = true\n" in printed
    (root / "recipe.toml").write_text(printed)
    assert main(["train", "--config", str(root / "recipe.toml"), "-q"]) == 0
    capsys.readouterr()
    assert main(["info", str(root / "cli")]) == 0
    assert ("  relative   each sample's loss is divided by what predicting the training mean loses on it "
            "(--relative-loss)") in capsys.readouterr().out
    assert main(["info", str(root / "cli"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["relative_loss"] is True
    # --resume without the flag keeps it; a run trained without it cannot resume with it
    assert main(["train", *common[:-1], "--out", str(root / "cli"), "--resume", "--steps", "2", "-q"]) == 0
    assert load_checkpoint(root / "cli" / "checkpoint.pt")["config"]["relative_loss"] is True
    assert main(["train", *common, "--out", str(root / "plain")]) == 0
    assert main(["train", *common[:-1], "--out", str(root / "plain"), "--resume", "--steps", "2", "--relative-loss",
                 "-q"]) == 2
    assert "cannot resume with changed settings: relative_loss" in capsys.readouterr().err


def test_the_transient_task_refuses_it(tmp_path: Path) -> None:
    trajectories = open_dataset(_trajectories.write(tmp_path, parts=(1,))["data"])
    with pytest.raises(ValueError, match=r"^Expected --relative-loss only with the steady task \(got --task "
                                         r"transient"):
        get_task("transient", {"relative_loss": True}).check_dataset(trajectories)
