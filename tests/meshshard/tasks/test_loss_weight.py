"""``train --loss-weight NAME=W``: the steady task's loss weighs the rows of named boundaries, and
with ``NAME:DISTANCE=W`` the nodes near one. On 1, 2, 3 and 4 ranks (uneven shards) the loss and
every gradient equal the weighted mean of one process on the whole mesh, written here from the raw
arrays (float64, 1e-10); training with it equals that reference step for step; the weights are
recorded, shown and refused in one line."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.data import dataset_partition_folder, open_dataset, partition_dataset, write_dataset
from meshshard.nn import MeshGraphNet
from meshshard.partition import read_metadata
from meshshard.run import TrainConfig, load_checkpoint
from meshshard.tasks import get_task, parse_loss_weight, whole_sample
from tests._dist import run_ranks
from tests._ranks import all_sum, train_rank
from tests.meshshard.tasks import _trajectories

WEIGHTS = {"bottom": 10.0, "left": 0.5}  # the corner (0, 0) is on both: it takes 10
# the nodes within 0.25 of the top (its three upper rows, y >= 7/9) weigh 3, those of them on the left too
# (the largest weight); the top's own nodes 4; the bottom's nodes near the left's bottom corner 0.25
REGIONS = {"bottom": 10.0, "left": 0.5, "top:0.25": 3.0, "top": 4.0, "left:0.15": 0.25}


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("loss_weight")
    nx, ny = 19, 9  # 200 nodes: 3 ranks cannot own as many each
    x, y = np.meshgrid(np.linspace(0.0, 2.0, nx + 1), np.linspace(0.0, 1.0, ny + 1), indexing="xy")
    pts = np.stack([x.ravel(), y.ravel()], 1)
    i, j = np.meshgrid(np.arange(nx), np.arange(ny), indexing="xy")
    a = (j * (nx + 1) + i).ravel()
    quads = np.stack([a, a + 1, a + nx + 2, a + nx + 1], 1)
    rng = np.random.default_rng(3)
    waves = rng.normal(size=(4, 2, 2))
    inputs = np.stack([np.cos(pts @ w) for w in waves])
    targets = np.stack([np.stack([v[:, 0] + pts[:, 0], v[:, 1], v[:, 0] * v[:, 1]], 1) for v in inputs])
    walls = {"bottom": np.flatnonzero(pts[:, 1] == 0.0), "left": np.flatnonzero(pts[:, 0] == 0.0),
             "top": np.flatnonzero(pts[:, 1] == 1.0)}
    write_dataset(root / "data", inputs, targets, pos=pts, cells=[("quad", quads)], input_names=[("a", 2)],
                  target_names=["p", ("U", 2)], val_samples=[3], dtype="float64", boundaries=walls)
    for k in (1, 2, 3, 4):
        partition_dataset(root / "data", root / f"parts{k}", k)
    w = np.where(np.isin(np.arange(len(pts)), walls["bottom"]), 10.0,
                 np.where(np.isin(np.arange(len(pts)), walls["left"]), 0.5, 1.0))
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


def _model() -> MeshGraphNet:
    torch.manual_seed(7)
    return MeshGraphNet(2, 3, 3, latent_size=8, hidden_layers=1, message_passing_steps=2).to(torch.float64)


def _sharded(rank: int, world: int, data: str, parts: str, weights: dict) -> list[tuple[float, list[np.ndarray]]]:
    """Per sample: the loss and every parameter's gradient (summed over the ranks)."""
    if isinstance(weights, list):  # several sets of weights in one start of the ranks
        return [_sharded(rank, world, data, parts, w) for w in weights]
    model, task = _model(), get_task("steady", {"loss_weight": weights})
    reader = task.reader(open_dataset(data), parts, rank, None, dtype=torch.float64)
    out = []
    for s in (0, 2):
        model.zero_grad()
        b = reader.sample(s)
        loss = task.loss(model(b.x, b.graph, b.edge_attr), b)
        loss.backward()
        out.append((float(loss.detach()), [all_sum(p.grad).numpy() for p in model.parameters()]))
    return out


def _reference(data: str, w: np.ndarray) -> list[tuple[float, list[np.ndarray]]]:
    model, out = _model(), []
    weight = torch.as_tensor(w)[:, None]
    for s in (0, 2):
        model.zero_grad()
        x, y, ei, ea = whole_sample(data, s, dtype=torch.float64)
        loss = (((model(x, ei, ea) - y) ** 2) * weight).sum() / (weight.sum() * y.shape[1])
        loss.backward()
        out.append((float(loss.detach()), [p.grad.numpy().copy() for p in model.parameters()]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_weighted_loss_and_every_gradient_on_shards_equal_one_process(case: dict, world: int) -> None:
    """Boundaries alone (the sum of the weights counted from their node lists) and with regions (the
    ranks add their weights): both equal the reference."""
    wants = [_reference(case["data"], case["w"]), _reference(case["data"], case["w_regions"])]
    parts = str(case["root"] / f"parts{world}")
    sets = [WEIGHTS, REGIONS]
    got = run_ranks(_sharded, world, case["data"], parts, sets, timeout=90) if world > 1 else \
        [_sharded(0, 1, case["data"], parts, sets)]
    counts = [p["num_owned"] for p in read_metadata(dataset_partition_folder(parts, 0))["parts"]]
    for rank in got:
        for per_set, want in zip(rank, wants):
            for (loss, grads), (ref, ref_grads) in zip(per_set, want):
                assert abs(loss - ref) <= 1e-10 * abs(ref)
                for g, r in zip(grads, ref_grads):
                    np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-13)
    assert len(counts) == world and (world != 3 or len(set(counts)) > 1)  # uneven shards


def test_every_weight_1_is_the_plain_mean(case: dict) -> None:
    plain = _sharded(0, 1, case["data"], str(case["root"] / "parts1"), {})
    ones = _sharded(0, 1, case["data"], str(case["root"] / "parts1"), {"bottom": 1.0})
    for (a, ga), (b, gb) in zip(plain, ones):
        assert abs(a - b) <= 1e-13 * abs(a)
        for x, y in zip(ga, gb):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15)
    assert plain[0][0] != _sharded(0, 1, case["data"], str(case["root"] / "parts1"), WEIGHTS)[0][0]


@pytest.mark.slow
def test_training_with_weights_on_three_ranks_equals_one_process(case: dict) -> None:
    root = case["root"]
    cfg = TrainConfig(partition=str(root / "parts3"), data=case["data"], out=str(root / "run3"), steps=3, lr=1e-2,
                      latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64",
                      loss_weight=dict(REGIONS))
    three = run_ranks(train_rank, 3, asdict(cfg), timeout=120)[0]
    one = train_rank(0, 1, asdict(TrainConfig(**{**asdict(cfg), "partition": str(root / "parts1"),
                                                 "out": str(root / "run1")})))
    np.testing.assert_allclose(three, one, rtol=1e-10)
    assert load_checkpoint(root / "run3" / "checkpoint.pt")["config"]["loss_weight"] == REGIONS
    assert ('loss_weight = {bottom = 10.0, left = 0.5, "top:0.25" = 3.0, top = 4.0, "left:0.15" = 0.25}'
            in (root / "run3" / "config.toml").read_text())


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
    # on --resume the run's weights, and another is refused: the run would not repeat
    assert main(["train", *common[:-1], "--out", str(root / "cli"), "--resume", "--steps", "2", "-q"]) == 0
    assert load_checkpoint(root / "cli" / "checkpoint.pt")["config"]["loss_weight"] == weighted
    assert main(["train", *common[:-1], "--out", str(root / "cli"), "--resume", "--steps", "3",
                 "--loss-weight", "top=3", "-q"]) == 2
    assert "cannot resume with changed settings: loss_weight" in capsys.readouterr().err


def test_transient_and_point_subsets_are_refused(case: dict, tmp_path: Path) -> None:
    data = open_dataset(case["data"])
    with pytest.raises(ValueError, match=r"^Expected --loss-weight without --max-points \(got --max-points 50\)"):
        get_task("steady", {"loss_weight": {"bottom": 2.0}, "max_points": 50}).check_dataset(data)
    trajectories = open_dataset(_trajectories.write(tmp_path, parts=(1,))["data"])
    with pytest.raises(ValueError, match=r"^Expected --loss-weight only with the steady task \(got --task transient"):
        get_task("transient", {"loss_weight": {"bottom": 2.0}}).check_dataset(trajectories)
