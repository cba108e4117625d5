"""Refusals of train, predict and a loaded run that used to slip through, each one line (issue 27):
RUN as the current folder, a parent of it, or a folder holding DATA or PARTS; a model file whose
``build()`` or import calls ``sys.exit``; ``load_run`` and ``TrainedRun`` given wrong arguments;
a stopped rank during predict; ``--tries 0`` on a dataset."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.data import partition_dataset, write_dataset
from meshshard.run import load_run
from tests.partition.conftest import grid_triangles

_MODEL = """
import os
import signal
import sys

import torch
from torch_geometric.nn import GraphConv

from meshshard.nn import ShardConv

if os.environ.get("EXIT_ON_IMPORT"):
    sys.exit(3)


class Model(torch.nn.Module):
    def __init__(self, node_in, edge_in, node_out):
        super().__init__()
        self.conv = ShardConv(GraphConv(node_in, node_out))

    def forward(self, x, graph, edge_attr):
        if os.environ.get("STOP_RANK", "none") == os.environ.get("RANK"):
            os.kill(os.getpid(), signal.SIGSTOP)  # as a rank stopped from outside: no connection closes
        return self.conv(x, graph)


def build(node_in, edge_in, node_out):
    if os.environ.get("EXIT_IN_BUILD"):
        sys.exit(0)
    return Model(node_in, edge_in, node_out)
"""


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 3-D 5 x 5 x 2 grid of triangles (pos in 3-D), 4 samples, partitions into 1 and 2 parts, a model file."""
    root = tmp_path_factory.mktemp("refusals")
    points, tri = grid_triangles(6, 6)
    points = np.c_[points, 0.1 * points[:, 0] * points[:, 1]]
    inputs = np.random.default_rng(0).normal(size=(4, len(points), 2))
    write_dataset(root / "data", inputs, inputs[:, :, :1] * inputs[:, :, 1:], pos=points, cells=[("triangle", tri)],
                  input_names=["a", "b"], target_names=["c"], val_samples=[3], dtype="float64")
    partition_dataset(root / "data", root / "parts1", 1)
    partition_dataset(root / "data", root / "parts2", 2)
    (root / "model.py").write_text(_MODEL)
    return {"root": root, "data": str(root / "data"), "model": f"{root / 'model.py'}:build"}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MESHSHARD_DEBUG", "EXIT_IN_BUILD",
                 "EXIT_ON_IMPORT", "STOP_RANK"):
        monkeypatch.delenv(name, raising=False)


def _train(case: dict, out: str | Path, *extra: str) -> list[str]:
    return ["train", str(case["root"] / "parts1"), "--data", case["data"], "--out", str(out), "--steps", "1",
            "--quiet", *extra]


def test_train_refuses_the_current_folder_its_parents_and_a_folder_holding_data_or_parts(
        case: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        clean_env: None) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in (".", str(work), str(tmp_path)):
        assert main(_train(case, out, "--force")) == 2, out
        assert capsys.readouterr().err == (f"meshshard train: error: {out}: is the current folder or one of its "
                                           "parents; refusing to write a run there (give a new folder)\n")
    assert list(work.iterdir()) == []
    holder = tmp_path / "holder"
    holder.mkdir()
    data, parts = holder / "data", holder / "parts"
    write_dataset(data, np.ones((2, 3, 1)), np.ones((2, 3, 1)), pos=np.eye(3), cells=[("triangle", [[0, 1, 2]])])
    partition_dataset(data, parts, 1)
    for partition, dataset, what in ((case["root"] / "parts1", data, f"dataset folder {data}"),
                                     (parts, case["data"], f"partition folder {parts}")):
        argv = ["train", str(partition), "--data", str(dataset), "--out", str(holder), "--steps", "1", "--force"]
        assert main(argv) == 2
        assert capsys.readouterr().err == (f"meshshard train: error: {holder}: Expected an output folder apart from "
                                           f"the {what} (got a folder that holds it)\n")
    assert sorted(p.name for p in holder.iterdir()) == ["data", "parts"]


def test_a_model_whose_build_or_import_calls_sys_exit_is_refused_in_one_line(
        case: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        clean_env: None) -> None:
    run = tmp_path / "run"
    monkeypatch.setenv("EXIT_IN_BUILD", "1")
    assert main(_train(case, run, "--model", case["model"])) == 2
    assert capsys.readouterr().err == (f"meshshard train: error: --model {case['model']}: build(2, 4, 1) called "
                                       "sys.exit(0) instead of returning a model\n")
    monkeypatch.delenv("EXIT_IN_BUILD")
    monkeypatch.setenv("EXIT_ON_IMPORT", "1")
    (case["root"] / "model2.py").write_text(_MODEL)
    spec = f"{case['root'] / 'model2.py'}:build"
    assert main(_train(case, run, "--model", spec)) == 2
    assert capsys.readouterr().err == (f"meshshard train: error: --model {spec}: importing "
                                       f"{case['root'] / 'model2.py'} called sys.exit(3)\n")
    assert not run.exists()


def test_load_run_and_a_loaded_run_refuse_wrong_arguments_in_one_line(
        case: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None) -> None:
    run = tmp_path / "run"
    assert main(_train(case, run, "--dtype", "float64", "--latent", "4", "--mp-steps", "1")) == 0, \
        capsys.readouterr().err
    with pytest.raises(TypeError, match=r"^Expected model to be a 'FILE\.py:NAME' string or a torch\.nn\.Module "
                                        r"\(got int 123\)$"):
        load_run(run, model=123)
    with pytest.raises(ValueError, match=r"^Expected dtype float32 or float64 \(got 'float16'\)$"):
        load_run(run, dtype="float16")
    with pytest.raises(ValueError, match=r"^Expected dtype float32 or float64 \(got torch\.int64\)$"):
        load_run(run, dtype=torch.int64)
    loaded = load_run(run, dtype="float32")
    assert loaded.dtype == torch.float32
    points, tri = grid_triangles(3, 3)
    pos = np.c_[points, np.zeros(len(points))]
    edges = np.array([[0, 1, 2], [1, 2, 0]])
    x = np.zeros((len(points), 2))
    assert loaded(x, edges, pos).shape == (len(points), 1)
    with pytest.raises(ValueError, match=r"^Expected pos with 3 coordinates per node, as the run was trained on "
                                         r"\(got \(9, 2\)\)$"):
        loaded(x, edges, points)
    for bad, got in ((np.array([[0, 9], [1, 2]]), "9"), (np.array([[0, 1], [-1, 2]]), "-1")):
        with pytest.raises(ValueError, match=rf"^Expected edge_index in 0\.\.8, node ids of x's 9 rows \(got {got}\)$"):
            loaded(x, bad, pos)


def test_partition_of_a_dataset_honours_tries_and_refuses_below_1(
        case: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "parts"
    for argv in (["partition", case["data"], "--parts", "2", "--out", str(out), "--tries", "0", "-q"],
                 ["partition", "--grid", "4,4", "--parts", "2", "--out", str(out), "--tries", "0", "-q"]):
        assert main(argv) == 2
        assert capsys.readouterr().err == "meshshard partition: error: Expected --tries >= 1 (got 0)\n"
        assert not out.exists()
    assert main(["partition", case["data"], "--parts", "2", "--out", str(out), "--tries", "2", "-q"]) == 0
    assert json.loads((out / "partition.json").read_text())["parameters"]["tries"] == 2


@pytest.mark.slow
def test_a_stopped_rank_during_predict_is_reported_as_trains_is(case: dict, tmp_path: Path, clean_env: None) -> None:
    """The model's forward stops rank 1 (SIGSTOP): rank 0 waits in the first exchange until the
    groups' timeout, then says a peer stopped, as train says it, not gloo's raw words."""
    run = tmp_path / "run"
    assert main(_train(case, run, "--model", case["model"], "--dtype", "float64")) == 0
    cmd = [sys.executable, "-m", "meshshard", "predict", str(run), "--data", case["data"], "--out",
           str(tmp_path / "pred"), "--partition", str(case["root"] / "parts2"), "--nproc", "2", "--model",
           case["model"], "--no-plots", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=os.environ | {"STOP_RANK": "1", "MESHSHARD_TIMEOUT": "5"})
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(r"meshshard predict: error: rank 0: sample \S+ failed: a collective raised, so a peer rank "
                        r"probably died or stopped responding \(.+\)\n", done.stderr), done.stderr
