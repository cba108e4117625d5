"""``meshshard info RUN``: a run folder described from its checkpoint and log; partition and
dataset folders still go to meshshard.partition's description."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard._info import describe_run
from meshshard._train import TrainConfig, train
from meshshard._usermodel import build_user_model
from meshshard.cli import main
from meshshard.partition import open_dataset, partition_dataset, write_dataset
from tests.partition.conftest import grid_triangles

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model" / "model.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("info")
    pts, tri = grid_triangles(12, 10)
    rng = np.random.default_rng(0)
    inputs = rng.random((4, len(pts), 2))
    targets = np.concatenate([inputs[:, :, :1] * 2, inputs.sum(2, keepdims=True), inputs[:, :, 1:] ** 2], axis=2)
    write_dataset(root / "data", inputs, targets, pos=pts, cells=[("triangle", tri)], input_names=["a", "b"],
                  target_names=[("u", 2), "p"], val_samples=[3])
    partition_dataset(root / "data", root / "parts", 1)
    common = {"partition": str(root / "parts"), "data": str(root / "data"), "steps": 3, "quiet": True, "val_every": 2}
    torch.manual_seed(0)
    train(TrainConfig(out=str(root / "mgn"), latent_size=8, hidden_layers=1, message_passing_steps=2, **common))
    train(TrainConfig(out=str(root / "mine"), model=f"{EXAMPLE}:build", model_args={"hidden": 8, "layers": 1}, **common))
    return root


def test_info_describes_a_run_of_meshgraphnet_and_of_your_own_model(runs: Path, capsys) -> None:
    assert main(["info", str(runs / "mgn")]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{runs / 'mgn'}: meshshard run, 3 of 3 steps done, on 1 rank(s)\n")
    assert "  model      MeshGraphNet, latent 8, 1 hidden layers, 2 message-passing steps, relu, " in text
    assert f"  data       {runs / 'data'} (inputs a, b -> targets u (2), p)" in text
    assert "  val loss   last " in text and "at step 3" in text
    assert main(["info", str(runs / "mine"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == {"kind": "your own", "spec": f"{EXAMPLE}:build", "model_args": {"hidden": 8, "layers": 1}}
    assert summary["targets"] == [{"name": "u", "components": 2}, {"name": "p", "components": 1}]
    data = open_dataset(runs / "data")  # the weights trained, as the banner counts them (not buffers)
    built = build_user_model(f"{EXAMPLE}:build", {"hidden": 8, "layers": 1}, len(data.input_channels),
                             len(data.edge_channels), len(data.target_channels))
    assert summary["parameters"] == sum(p.numel() for p in built.parameters()) > 0
    assert summary["step"] == 3 and len([v for v in (summary["loss"]["first"], summary["loss"]["last"]) if v > 0]) == 2
    assert summary["val_loss"]["last_step"] == 3 and summary["settings"]["lr"] == 1e-3
    assert main(["info", str(runs / "mine")]) == 0
    assert f"(meshshard predict needs --model {shlex.quote(f'{EXAMPLE}:build')})" in capsys.readouterr().out
    # a command to paste is quoted for the shell: a path with a space, model args with a quote
    summary["model"] = {"kind": "your own", "spec": "/tmp/u/my models/sage.py:build", "model_args": {"name": "it's"}}
    text = describe_run(summary)
    assert shlex.split(text.split(" --model-args ")[1].split(", ")[0]) == ['{"name": "it\'s"}']
    assert "(meshshard predict needs --model '/tmp/u/my models/sage.py:build')" in text


def test_info_still_describes_partitions_and_datasets_and_refuses_a_damaged_run(runs: Path, capsys) -> None:
    assert main(["info", str(runs / "data")]) == 0
    assert "meshshard-dataset" in capsys.readouterr().out
    assert main(["info", str(runs / "parts")]) == 0
    assert "meshshard-partition" in capsys.readouterr().out
    (runs / "bad").mkdir()
    (runs / "bad" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["info", str(runs / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshshard info: error: ") and err.count("\n") == 1


def test_info_on_a_file_or_a_folder_of_none_of_its_kinds_says_what_it_takes(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("my notes")
    assert main(["info", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"meshshard info: error: {tmp_path}: not a partition, dataset or run folder "
                                       "(no partition.json, dataset.json or checkpoint.pt in it)\n")
    assert main(["info", str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err == (f"meshshard info: error: {tmp_path / 'notes.txt'}: is a file; meshshard info "
                                       "takes a folder (a partition, dataset or run folder)\n")
    assert main(["info", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"meshshard info: error: {tmp_path / 'none'}: no such folder\n"
