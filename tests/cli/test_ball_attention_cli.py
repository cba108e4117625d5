"""``--model ball-attention`` from point-cloud files to predictions, through the commands.

``.npz`` clouds (3-D, of different sizes) -> ``meshshard dataset`` -> ``partition --method rcb
--radius R`` -> ``train --model ball-attention --nproc 2`` -> ``predict`` on one process (the
whole cloud, coordinates handed to the model) and on 2 ranks: the predictions are equal in
float64. A model radius larger than the partition's recorded halo radius is refused in one line,
by train and by predict, before any rank starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.run import load_checkpoint, load_run
from meshshard.run._vtk import read_vtp

RADIUS = 0.3
ARGS = {"width": 8, "layers": 2, "heads": 2, "radius": [0.2, RADIUS], "max_neighbors": 8}


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ballcli")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(4)
    for i, n in enumerate((120, 150, 90)):
        pos = rng.random((n, 3))
        np.savez(src / f"c{i}.npz", pos=pos, s=np.cos(3 * pos[:, 1]), p=np.sin(4 * pos[:, 0]) * pos[:, 2])
    assert main(["dataset", str(src), "--out", str(root / "data"), "--inputs", "pos,s", "--targets", "p",
                 "--val-samples", "2", "--dtype", "float64", "-q"]) == 0
    assert main(["partition", str(root / "data"), "--parts", "2", "--method", "rcb", "--radius", str(RADIUS),
                 "--out", str(root / "parts"), "-q"]) == 0
    return root


def _pred(folder: Path) -> dict[str, np.ndarray]:
    files = sorted(folder.glob("*.vtp"))  # a cloud's predictions are PolyData
    assert files, sorted(p.name for p in folder.iterdir())
    return {f.name: np.asarray(read_vtp(f)["point_data"]["p_pred"]) for f in files}


@pytest.mark.slow
def test_ball_attention_trains_on_ranks_and_predicts_alike_whole_and_sharded(clouds: Path, capsys) -> None:
    root = clouds
    run = root / "run"
    assert main(["train", str(root / "parts"), "--data", str(root / "data"), "--out", str(run), "--steps", "2",
                 "--model", "ball-attention", "--model-args", json.dumps(ARGS), "--dtype", "float64",
                 "--nproc", "2", "-q"]) == 0
    cfg = load_checkpoint(run / "checkpoint.pt")["config"]
    assert cfg["architecture"] == "ball-attention" and cfg["model_args"] == ARGS
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    assert "BallAttentionNet, width 8, layers 2, heads 2, radius [0.2, 0.3], max_neighbors 8" in capsys.readouterr().out
    common = ["--data", str(root / "data"), "--no-plots", "-q", "--gather"]
    assert main(["predict", str(run), *common, "--out", str(root / "pred1")]) == 0
    assert main(["predict", str(run), *common, "--out", str(root / "pred2"), "--partition", str(root / "parts"),
                 "--nproc", "2"]) == 0
    one, two = _pred(root / "pred1"), _pred(root / "pred2")
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-10, atol=1e-12, err_msg=name)
        assert np.ptp(one[name]) > 0, name  # a model that sees the points, not a constant
    # load_run: the whole cloud in a script of your own, coordinates given as pos
    trained = load_run(run)
    for name in one:
        cloud = read_vtp(root / "pred1" / name)
        x = np.concatenate([cloud["points"], np.asarray(cloud["point_data"]["s"]).reshape(-1, 1)], 1)
        with torch.no_grad():
            out = trained(x, np.zeros((2, 0), np.int64), cloud["points"])
        np.testing.assert_allclose(out.numpy()[:, 0], one[name].reshape(-1), rtol=1e-10, atol=1e-12, err_msg=name)


MINE = """
from torch import nn

from meshshard.nn import BallAttentionNet


class Mine(nn.Module):
    needs_pos = True  # predict on one process hands the coordinates as pos=

    def __init__(self, node_in, edge_in, node_out, radius=0.25):
        super().__init__()
        self.net = BallAttentionNet(node_in, node_out, width=8, layers=1, heads=2, radius=radius, max_neighbors=8)

    def forward(self, x, graph, edge_attr, pos=None):
        if pos is None:  # on shards: the ShardGraph's owned rows
            pos = graph.pos[: graph.num_owned]
        return self.net(x, pos)
"""


@pytest.mark.slow
def test_your_own_point_model_gets_pos(clouds: Path) -> None:
    root = clouds
    (root / "mine.py").write_text(MINE)
    model = ["--model", f"{root / 'mine.py'}:Mine"]
    run = root / "mine-run"
    assert main(["train", str(root / "parts"), "--data", str(root / "data"), "--out", str(run), "--steps", "2",
                 *model, "--dtype", "float64", "--nproc", "2", "-q"]) == 0
    common = ["--data", str(root / "data"), "--no-plots", "-q", "--gather", *model]
    assert main(["predict", str(run), *common, "--out", str(root / "mine1")]) == 0
    assert main(["predict", str(run), *common, "--out", str(root / "mine2"), "--partition", str(root / "parts"),
                 "--nproc", "2"]) == 0
    one, two = _pred(root / "mine1"), _pred(root / "mine2")
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_a_radius_beyond_the_partitions_halo_is_refused(clouds: Path, capsys) -> None:
    root = clouds
    big = json.dumps({**ARGS, "radius": [0.2, 0.5]})
    assert main(["train", str(root / "parts"), "--data", str(root / "data"), "--out", str(root / "refused"),
                 "--steps", "1", "--model", "ball-attention", "--model-args", big, "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (f"{root / 'parts'}: Expected a model radius of at most 0.3, the halo radius the partition was made for "
            "(got 0.5); partition again with meshshard partition DATA --radius 0.5") in err, err
    assert not (root / "refused").exists()
    # a partition that records no radius takes any: the geometric halo is built at run time for the model's
    assert main(["partition", str(root / "data"), "--parts", "1", "--method", "rcb", "--out", str(root / "free"),
                 "-q"]) == 0
    run = root / "wide"
    assert main(["train", str(root / "free"), "--data", str(root / "data"), "--out", str(run), "--steps", "1",
                 "--model", "ball-attention", "--model-args", big, "--dtype", "float64", "-q"]) == 0
    capsys.readouterr()
    assert main(["predict", str(run), "--data", str(root / "data"), "--out", str(root / "wide-pred"), "--partition",
                 str(root / "parts"), "--nproc", "2", "--no-plots", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{root / 'parts'}: Expected a model radius of at most 0.3" in err, err
    assert not (root / "wide-pred").exists()
    # nor as a member of an ensemble whose first run fits the partition
    narrow = root / "narrow"
    assert main(["train", str(root / "free"), "--data", str(root / "data"), "--out", str(narrow), "--steps", "1",
                 "--model", "ball-attention", "--model-args", json.dumps({**ARGS, "radius": [0.2, 0.3]}),
                 "--dtype", "float64", "-q"]) == 0
    capsys.readouterr()
    assert main(["predict", str(narrow), "--ensemble", str(run), "--data", str(root / "data"), "--out",
                 str(root / "wide-pred"), "--partition", str(root / "parts"), "--nproc", "2", "--no-plots", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run}: {root / 'parts'}: Expected a model radius of at most 0.3" in err, err
    assert not (root / "wide-pred").exists()


def test_bad_model_args_are_refused_in_one_line(clouds: Path, capsys) -> None:
    root = clouds
    for args, message in (({"radius": -1}, "Expected --model-args radius of --model ball-attention to be a positive "
                                           "number or a list of them (got -1)"),
                          ({"depth": 2}, "Expected --model-args of --model ball-attention among width, layers"),
                          ({"checkpoint": 1}, "checkpoint of --model ball-attention to be true or false")):
        assert main(["train", str(root / "parts"), "--data", str(root / "data"), "--out", str(root / "bad"),
                     "--steps", "1", "--model", "ball-attention", "--model-args", json.dumps(args)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (root / "bad").exists()
