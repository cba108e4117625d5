"""``train --force-loss NAME=W``: the steady task's loss adds the squared error of each target's
integral over named boundaries. On 1, 2, 3 and 4 ranks (uneven shards) the loss and every gradient
equal one process's on the whole mesh, written here from the raw points (the area vectors of a
straight wall: its spacing along the outward normal, half at its ends; float64, 1e-10); with
``--loss-weight`` too; training with it equals that reference step for step; the setting is
recorded, shown and refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.data import open_dataset
from meshshard.tasks import parse_force_loss
from tests.meshshard.tasks import _walled

FORCES = {"bottom": 10.0, "top": 3.0}
WEIGHTS = {"bottom": 10.0, "left": 0.5}
SEED = 11  # the model's initial weights


def _wall(ids: np.ndarray, step: float, normal: tuple[float, float]) -> np.ndarray:
    """The area vectors of a straight wall of evenly spaced nodes: ``step`` along the outward
    normal, half at both ends."""
    length = np.full(len(ids), step)
    length[[0, -1]] = step / 2
    return length[:, None] * np.asarray(normal)[None, :]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("force_loss")
    pts, walls = _walled.write_rectangle(root, 5, {"pins": np.array([0, 5, 47])})  # pins: no face between them
    spacing = 2.0 / _walled.NX
    areas = {"bottom": (walls["bottom"], _wall(walls["bottom"], spacing, (0.0, -1.0))),
             "top": (walls["top"], _wall(walls["top"], spacing, (0.0, 1.0)))}
    w = _walled.wall_weights(len(pts), walls)
    return {"root": root, "data": str(root / "data"), "areas": areas, "w": w}


def _sharded(rank: int, world: int, data: str, parts: str, configs: list[dict]) -> list:
    return _walled.sharded(rank, world, data, parts, configs, SEED)


def _reference(case: dict, weighted: bool) -> list:
    weight = torch.as_tensor(case["w"] if weighted else np.ones(len(case["w"])))[:, None]

    def loss_of(e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = ((e ** 2) * weight).sum() / (weight.sum() * y.shape[1])
        for name, w in FORCES.items():
            ids, area = case["areas"][name]
            integral = e[torch.as_tensor(ids)].T @ torch.as_tensor(area)  # (targets, 2)
            loss = loss + w * (integral ** 2).sum() / (y.shape[1] * np.abs(area).sum() ** 2)
        return loss

    return _walled.reference(case["data"], SEED, loss_of)


def test_the_stored_area_vectors_are_the_walls(case: dict) -> None:
    """What the reference integrates against is what the dataset stores; the pins have no area."""
    data = open_dataset(case["data"])
    for name, (ids, area) in case["areas"].items():
        stored_ids, stored_area = data.boundary(0, name)
        np.testing.assert_array_equal(stored_ids, ids)
        np.testing.assert_allclose(stored_area, area, rtol=1e-12, atol=1e-15)
    assert not data.boundary(0, "pins")[1].any()


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_loss_and_every_gradient_on_shards_equal_one_process(case: dict, world: int) -> None:
    """The force terms alone, and beside weighted nodes (--loss-weight): both equal the reference."""
    configs = [{"force_loss": FORCES}, {"force_loss": FORCES, "loss_weight": WEIGHTS}]
    _walled.check_on_ranks(case["root"], case["data"], world, configs, [_reference(case, False), _reference(case, True)],
                           SEED)


def test_the_term_is_there_and_grows_with_its_weight(case: dict) -> None:
    parts = str(case["root"] / "parts1")
    plain, one, ten = (_sharded(0, 1, case["data"], parts, [config])[0][0][0]
                       for config in ({}, {"force_loss": {"bottom": 1.0}}, {"force_loss": {"bottom": 10.0}}))
    assert plain < one < ten
    assert ten - plain == pytest.approx(10 * (one - plain), rel=1e-12)


@pytest.mark.slow
def test_training_with_it_on_three_ranks_equals_one_process(case: dict) -> None:
    _walled.check_training(case["root"], case["data"], "force_loss", FORCES,
                           "force_loss = {bottom = 10.0, top = 3.0}")


def test_parse_force_loss() -> None:
    assert parse_force_loss(["body=10,flap=2", "slat=0.5"]) == {"body": 10.0, "flap": 2.0, "slat": 0.5}
    assert parse_force_loss({"body": 3}) == {"body": 3.0} and parse_force_loss(None) == {}
    for bad, message in (("body", r"^Expected --force-loss as NAME=W\[,NAME=W\] \(got 'body'\)$"),
                         ("body=0", r"^Expected --force-loss body=W with W a positive number \(got '0'\)$"),
                         ("body=1,body=2", r"^Expected --force-loss to weigh body once \(got 1 and 2\)$"),
                         ("body:0.1=2", r"^Expected --force-loss as NAME=W with boundary names \(got body:0.1: a "
                                        r"force is integrated over a boundary, not a region\)$")):
        with pytest.raises(ValueError, match=message):
            parse_force_loss(bad)


def test_the_command_records_shows_and_refuses(case: dict, capsys) -> None:
    root = case["root"]
    common = [str(root / "parts1"), "--data", case["data"], "--steps", "1", "--latent", "8", "--mp-steps", "1", "-q"]
    capsys.readouterr()
    assert main(["train", *common, "--out", str(root / "x"), "--force-loss", "bottom=10,wing=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"meshshard train: error: {case['data']}: Expected --force-loss to name boundaries of the dataset "
                   "(got wing; its boundaries are bottom, left, pins, top)"], err
    assert main(["train", *common, "--out", str(root / "x"), "--force-loss", "pins=1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"meshshard train: error: {case['data']}: Expected --force-loss on boundaries with faces (got pins, which has "
        "no area on mesh 0: its nodes came without the faces between them)"]
    assert main(["train", *common, "--out", str(root / "x"), "--force-loss", "top:0.1=1"]) == 2
    assert "Expected --force-loss as NAME=W with boundary names (got top:0.1" in capsys.readouterr().err
    assert not (root / "x").exists()
    assert main(["train", *common, "--out", str(root / "cli"), "--force-loss", "bottom=4", "--force-loss", "top=2",
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "force_loss = {bottom = 4.0, top = 2.0}\n" in printed
    (root / "recipe.toml").write_text(printed)
    assert main(["train", "--config", str(root / "recipe.toml"), "-q"]) == 0
    capsys.readouterr()
    assert main(["info", str(root / "cli")]) == 0
    assert ("  forces     the loss adds the squared error of the integral over bottom x4, top x2 (--force-loss)"
            in capsys.readouterr().out)
    assert main(["info", str(root / "cli"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["force_loss"] == {"bottom": 4.0, "top": 2.0}
    _walled.check_resumed(main, common, root / "cli", "force_loss", {"bottom": 4.0, "top": 2.0}, "--force-loss", "top=3", capsys)


def test_transient_and_point_subsets_are_refused(case: dict, tmp_path: Path) -> None:
    _walled.check_refused_beside_subsets_and_trajectories(case["data"], tmp_path, "force_loss", "--force-loss")
