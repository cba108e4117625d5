"""``meshshard predict RUN --ensemble RUN2``: the mean of the runs' predictions, on one process and
on shards, and the runs it refuses to average (one line, before any rank starts); the same mean in
your own code, ``load_run(RUN, ensemble=[RUN2])``.

Two runs trained alike on one generated dataset (a hexahedral lattice, float64) with seeds 0 and
1, and a third on a dataset of other statistics; each two steps on one process.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, replace

import meshio
import numpy as np
import pytest

from meshshard.data import partition_dataset, write_dataset
from meshshard.run import PredictConfig, TrainConfig, check_prediction_request, load_run, predict, train
from tests._dist import run_ranks
from tests._ranks import predict_rank
from tests._warm import warm_command
from tests.meshshard.run._cases import hex_lattice


def _dataset(folder, points, hexes, scale: float) -> None:
    rng = np.random.default_rng(0)
    inputs = np.stack([np.cos(points @ w) for w in rng.normal(size=(4, 3, 2))])  # (S, N, 2)
    targets = np.stack([np.stack([x[:, 0] * x[:, 1], np.sin(x[:, 1])], 1) for x in inputs]) * scale
    write_dataset(folder, inputs, targets, pos=points, cells=[("hexahedron", hexes)], input_names=["a", "b"],
                  target_names=["p", "q"], sample_names=[f"case {i}" for i in range(4)], val_samples=[3],
                  dtype="float64")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ensemble")
    points, hexes = hex_lattice(8)
    _dataset(root / "data", points, hexes, 5.0)
    _dataset(root / "other", points, hexes, 2.0)  # other target statistics
    partition_dataset(root / "data", root / "parts1", 1)
    partition_dataset(root / "data", root / "parts2", 2)
    partition_dataset(root / "other", root / "other-parts", 1)
    base = TrainConfig(partition=str(root / "parts1"), data=str(root / "data"), out="", steps=2, lr=1e-2,
                       latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64")
    for name, seed in (("a", 0), ("b", 1)):
        train(replace(base, out=str(root / name), seed=seed))
    train(replace(base, out=str(root / "c"), data=str(root / "other"), partition=str(root / "other-parts")))
    return {"root": root, "data": str(root / "data"), "a": str(root / "a"), "b": str(root / "b"), "c": str(root / "c")}


def _pred(folder, name: str = "case_3") -> np.ndarray:
    mesh = meshio.read(folder / f"{name}.vtu")
    order = np.argsort(mesh.point_data["global_id"])
    return np.stack([mesh.point_data["p_pred"], mesh.point_data["q_pred"]], 1)[order]


@pytest.mark.slow
def test_an_ensemble_prediction_is_the_mean_of_its_members_on_one_process_and_on_shards(runs: dict) -> None:
    root = runs["root"]
    base = asdict(PredictConfig(run=runs["a"], data=runs["data"], out="", quiet=True, plots=False, samples="all"))
    for name in ("a", "b"):
        predict(PredictConfig(**(base | {"run": runs[name], "out": str(root / f"pred-{name}")})))
    both = predict(PredictConfig(**(base | {"out": str(root / "pred-ab"), "ensemble": [runs["b"]]})))
    two = run_ranks(predict_rank, 2, base | {"out": str(root / "pred-ab2"), "ensemble": [runs["b"]],
                                              "partition": str(root / "parts2"), "gather": True}, timeout=180)[0]
    for name in ("case_0", "case_3"):
        a, b = _pred(root / "pred-a", name), _pred(root / "pred-b", name)
        assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()  # two seeds: two different models
        mean = _pred(root / "pred-ab", name)
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-12, atol=1e-12 * np.abs(mean).max())
        np.testing.assert_allclose(_pred(root / "pred-ab2", name), mean, rtol=1e-10, atol=1e-10 * np.abs(mean).max())
    truth = meshio.read(root / "pred-ab" / "case_3.vtu")
    order = np.argsort(truth.point_data["global_id"])
    error = _pred(root / "pred-ab")[:, 0] - truth.point_data["p"][order]
    assert both["samples"][3]["fields"]["p"]["rmse"] == pytest.approx(float(np.sqrt((error ** 2).mean())), rel=1e-10)
    assert two["samples"][3]["fields"]["p"]["rmse"] == pytest.approx(both["samples"][3]["fields"]["p"]["rmse"],
                                                                      rel=1e-10)
    metrics = json.loads((root / "pred-ab" / "metrics.json").read_text())
    assert metrics["ensemble"] == [runs["b"]] and metrics["run"] == runs["a"]
    assert "ensemble" not in json.loads((root / "pred-a" / "metrics.json").read_text())


def test_runs_that_cannot_be_averaged_are_refused_in_one_line(runs: dict, tmp_path) -> None:
    cfg = PredictConfig(run=runs["a"], data=runs["data"], out=str(tmp_path / "pred"))
    refusals = {
        "a run given twice": ([runs["a"]], r"Expected --ensemble runs other than .* and each given once"),
        "a missing folder": ([str(tmp_path / "nope")], r"nope: no such run folder of --ensemble"),
        "other statistics": ([runs["c"]], r"/c: Expected a run trained like .*/a to average with it; its statistics "
                                          r"\(the dataset and its options: train them on one dataset\) differ"),
    }
    for what, (members, message) in refusals.items():
        with pytest.raises(ValueError, match=message):
            check_prediction_request(replace(cfg, ensemble=members))
        assert not (tmp_path / "pred").exists(), what
    check_prediction_request(replace(cfg, ensemble=[runs["b"]]))  # the same training, another seed: accepted
    done = subprocess.run([*warm_command(), "predict", runs["a"], "--data", runs["data"], "--out", str(tmp_path / "p"),
                           "--ensemble", f"{runs['b']},,{runs['c']}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "Expected --ensemble RUN2[,RUN3...], run folders separated by commas" in done.stderr
    done = subprocess.run([*warm_command(), "predict", runs["a"], "--data", runs["data"], "--out", str(tmp_path / "p"),
                           "--ensemble", runs["c"]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "its statistics" in done.stderr and done.stderr.strip().count("\n") == 0
    assert not (tmp_path / "p").exists()


def test_load_run_averages_the_members_too(runs: dict, tmp_path) -> None:
    points, hexes = hex_lattice(8)
    edges = np.concatenate([hexes[:, [0, 1]], hexes[:, [1, 2]], hexes[:, [2, 3]], hexes[:, [3, 0]]])
    edges = np.unique(np.concatenate([edges, edges[:, ::-1]]), axis=0).T
    x = np.cos(points @ np.random.default_rng(1).normal(size=(3, 2)))
    a, b = (load_run(runs[n])(x, edges, points).detach().numpy() for n in ("a", "b"))
    mean = load_run(runs["a"], ensemble=[runs["b"]])(x, edges, points).detach().numpy()
    assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()
    np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-12, atol=1e-12 * np.abs(mean).max())
    with pytest.raises(ValueError, match=r"/c: Expected a run trained like .*/a to average with it; its statistics"):
        load_run(runs["a"], ensemble=[runs["c"]])
    with pytest.raises(ValueError, match=r"nope: no such run folder of --ensemble"):
        load_run(runs["a"], ensemble=[str(tmp_path / "nope")])
