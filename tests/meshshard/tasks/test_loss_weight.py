"""``train --loss-weight NAME=W``: the steady task's loss weighs the rows of named boundaries, and
with ``NAME:DISTANCE=W`` the nodes near one. On 1, 2, 3 and 4 ranks (uneven shards) the loss and
every gradient equal the weighted mean of one process on the whole mesh, written here from the raw
arrays (float64, 1e-10); training with it equals that reference step for step; the weights are
recorded, shown and refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.tasks import parse_loss_weight
from tests.meshshard.tasks import _walled

WEIGHTS = {"bottom": 10.0, "left": 0.5}  # the corner (0, 0) is on both: it takes 10
# the nodes within 0.25 of the top (its three upper rows, y >= 7/9) weigh 3, those of them on the left too
# (the largest weight); the top's own nodes 4; the bottom's nodes near the left's bottom corner 0.25
SEED = 7  # the model's initial weights
REGIONS = {"bottom": 10.0, "left": 0.5, "top:0.25": 3.0, "top": 4.0, "left:0.15": 0.25}


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("loss_weight")
    pts, walls = _walled.write_rectangle(root, 3)
    w = _walled.wall_weights(len(pts), walls)
    # the same with REGIONS, from the raw points: every weight that applies, the largest wins, 1 if none
    def near(name: str, d: float) -> np.ndarray:
        gap = np.linalg.norm(pts[:, None, :] - pts[walls[name]][None, :, :], axis=2).min(1)
        return gap <= d
    on = {n: np.isin(np.arange(len(pts)), walls[n]) for n in walls}
    applies = [(on["bottom"], 10.0), (on["left"], 0.5), (near("top", 0.25), 3.0), (on["top"], 4.0),
               (near("left", 0.15), 0.25)]
    stack = np.stack([np.where(m, v, -np.inf) for m, v in applies])
    wr = np.where(np.isfinite(stack.max(0)), stack.max(0), 1.0)
    assert {3.0, 4.0, 10.0, 0.5, 0.25, 1.0} <= set(wr.tolist())  # every kind of node is there
    return {"root": root, "data": str(root / "data"), "w": w, "w_regions": wr}


def _sharded(rank: int, world: int, data: str, parts: str, weights: list[dict]) -> list:
    return _walled.sharded(rank, world, data, parts, [{"loss_weight": w} for w in weights], SEED)


def _reference(data: str, w: np.ndarray) -> list[tuple[float, list[np.ndarray]]]:
    weight = torch.as_tensor(w)[:, None]
    return _walled.reference(data, SEED, lambda e, y: ((e ** 2) * weight).sum() / (weight.sum() * y.shape[1]))


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_weighted_loss_and_every_gradient_on_shards_equal_one_process(case: dict, world: int) -> None:
    """Boundaries alone (the sum of the weights counted from their node lists) and with regions (the
    ranks add their weights): both equal the reference."""
    wants = [_reference(case["data"], case["w"]), _reference(case["data"], case["w_regions"])]
    _walled.check_on_ranks(case["root"], case["data"], world, [{"loss_weight": w} for w in (WEIGHTS, REGIONS)],
                           wants, SEED)


def test_every_weight_1_is_the_plain_mean(case: dict) -> None:
    plain = _sharded(0, 1, case["data"], str(case["root"] / "parts1"), [{}])[0]
    ones = _sharded(0, 1, case["data"], str(case["root"] / "parts1"), [{"bottom": 1.0}])[0]
    for (a, ga), (b, gb) in zip(plain, ones):
        assert abs(a - b) <= 1e-13 * abs(a)
        for x, y in zip(ga, gb):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15)
    assert plain[0][0] != _sharded(0, 1, case["data"], str(case["root"] / "parts1"), [WEIGHTS])[0][0][0]


@pytest.mark.slow
def test_training_with_weights_on_three_ranks_equals_one_process(case: dict) -> None:
    _walled.check_training(case["root"], case["data"], "loss_weight", REGIONS,
                           'loss_weight = {bottom = 10.0, left = 0.5, "top:0.25" = 3.0, top = 4.0, "left:0.15" = 0.25}')


def test_parse_loss_weight() -> None:
    assert parse_loss_weight(["walls=10,inlet=2", "outlet=0.5"]) == {"walls": 10.0, "inlet": 2.0, "outlet": 0.5}
    assert parse_loss_weight({"walls": 3}) == {"walls": 3.0} and parse_loss_weight(None) == {}
    assert parse_loss_weight("walls=10,walls:0.10=3,walls:1e-3=2") == {"walls": 10.0, "walls:0.1": 3.0,
                                                                      "walls:0.001": 2.0}
    assert parse_loss_weight({"walls:0.123456789": 2}) == {"walls:0.123456789": 2.0}
    for bad, message in (("walls", r"^Expected --loss-weight as NAME=W\[,NAME=W\] \(got 'walls'\)$"),
                         ("walls=-1", r"^Expected --loss-weight walls=W with W a positive number \(got '-1'\)$"),
                         ("walls=x", r"^Expected --loss-weight walls=W with W a positive number \(got 'x'\)$"),
                         ("walls=1,walls=2", r"^Expected --loss-weight to weigh walls once \(got 1 and 2\)$"),
                         ("walls:x=2", r"^Expected --loss-weight NAME:DISTANCE=W with a boundary name and a distance "
                                       r">= 0 \(got 'walls:x'\)$"),
                         ("walls:-1=2", r"distance >= 0 \(got 'walls:-1'\)$"),
                         (":0.1=2", r"distance >= 0 \(got ':0.1'\)$"),
                         ("walls:0.1=2,walls:0.10=3", r"^Expected --loss-weight to weigh walls:0.1 once")):
        with pytest.raises(ValueError, match=message):
            parse_loss_weight(bad)


def test_the_command_records_shows_and_refuses(case: dict, capsys) -> None:
    root = case["root"]
    common = [str(root / "parts1"), "--data", case["data"], "--steps", "1", "--latent", "8", "--mp-steps", "1", "-q"]
    capsys.readouterr()
    assert main(["train", *common, "--out", str(root / "x"), "--loss-weight", "bottom=10,wing=2",
                 "--loss-weight", "fin:0.1=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"meshshard train: error: {case['data']}: Expected --loss-weight to name boundaries of the dataset "
                   "(got wing, fin; its boundaries are bottom, left, top)"], err
    assert not (root / "x").exists()
    assert main(["train", *common, "--out", str(root / "x"), "--loss-weight", "bottom"]) == 2
    assert "Expected --loss-weight as NAME=W[,NAME=W] (got 'bottom')" in capsys.readouterr().err
    assert main(["train", *common, "--out", str(root / "cli"), "--loss-weight", "bottom=4", "--loss-weight",
                 "top=2,top:0.3=1.5", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert 'loss_weight = {bottom = 4.0, top = 2.0, "top:0.3" = 1.5}\n' in printed
    (root / "recipe.toml").write_text(printed)
    assert main(["train", "--config", str(root / "recipe.toml"), "-q"]) == 0
    assert 'loss_weight = {bottom = 4.0, top = 2.0, "top:0.3" = 1.5}' in (root / "cli" / "config.toml").read_text()
    capsys.readouterr()
    assert main(["info", str(root / "cli")]) == 0
    assert ("  weights    the loss weighs the nodes of bottom x4, top x2, within 0.3 of top x1.5, every other node x1 "
            "(--loss-weight)" in capsys.readouterr().out)
    weighted = {"bottom": 4.0, "top": 2.0, "top:0.3": 1.5}
    assert main(["info", str(root / "cli"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["loss_weight"] == weighted
    _walled.check_resumed(main, common, root / "cli", "loss_weight", weighted, "--loss-weight", "top=3", capsys)


def test_transient_and_point_subsets_are_refused(case: dict, tmp_path: Path) -> None:
    _walled.check_refused_beside_subsets_and_trajectories(case["data"], tmp_path, "loss_weight", "--loss-weight")
