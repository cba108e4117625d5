"""``meshshard predict``: sharded prediction equals one process on the whole mesh, and the files
hold the predicted values at the right nodes.

Mesh: ../shared/data/sfepy/acoustics_mesh3d.mesh (5,272 nodes, hexahedra: cells whose corners are
not all neighbours in the nodal graph, so writing pieces needs the node-value directory), or a
generated hexahedral lattice when it is missing. A run is trained for two steps on one process in
float64, then predicted on 1, 2 and 3 ranks (partitions into 2 and 3 METIS parts).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import asdict

import meshio
import numpy as np
import pytest
import torch

from meshshard.data import open_dataset, partition_dataset, write_dataset
from meshshard.run import PredictConfig, TrainConfig, predict, read_run, train
from meshshard.run._vtk import read_pvtu
from tests._dist import run_ranks
from tests._meshes import DATA
from tests._ranks import predict_rank
from tests._warm import warm_command
from tests.meshshard.run._cases import hex_lattice


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("predict")
    source = DATA / "sfepy" / "acoustics_mesh3d.mesh"
    if source.exists():
        mesh = meshio.read(source)
        points = np.asarray(mesh.points, dtype=np.float64)
        hexes = np.concatenate([b.data for b in mesh.cells if b.type == "hexahedron"]).astype(np.int64)
    else:
        points, hexes = hex_lattice(14)
    rng = np.random.default_rng(0)
    s = 5
    waves = rng.normal(size=(s, 3, 3))
    inputs = np.stack([np.cos(points @ w) for w in waves])  # (S, N, 3)
    targets = np.stack([np.stack([x[:, 0] * x[:, 1], np.sin(x[:, 2])], 1) for x in inputs]) * 7.0 + 3.0
    write_dataset(root / "data", inputs, targets, pos=points, cells=[("hexahedron", hexes)],
                  input_names=[("a", 3)], target_names=["p", "q"], sample_names=[f"case {i}" for i in range(s)],
                  val_samples=[3, 4], dtype="float64")
    for k in (1, 2, 3):
        partition_dataset(root / "data", root / f"parts{k}", k)
    cfg = TrainConfig(partition=str(root / "parts1"), data=str(root / "data"), out=str(root / "run"), steps=2, lr=1e-2,
                      latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64")
    train(cfg)
    return {"root": root, "data": str(root / "data"), "run": str(root / "run"), "points": points, "cells": len(hexes)}


def _reference(case: dict, sample: int) -> np.ndarray:
    """The run's model on the whole mesh, computed here from the checkpoint (not by predict)."""
    from meshshard.nn import MeshGraphNet
    from meshshard.tasks import Normaliser, whole_sample

    ckpt = read_run(case["run"])
    cfg = ckpt["config"]
    x, _, edge_index, _ = whole_sample(case["data"], sample, dtype=torch.float64)
    normaliser = Normaliser.from_dict(cfg["normalisation"], dtype=torch.float64)
    from meshshard import edge_features

    data = open_dataset(case["data"])
    pos = torch.as_tensor(data.mesh(data.sample_mesh(sample)).points)
    ea = normaliser.normalise_edges(edge_features(pos, edge_index))
    model = MeshGraphNet(3, 4, 2, latent_size=8, hidden_layers=1, message_passing_steps=2).double()
    model.load_state_dict(ckpt["model"])
    with torch.no_grad():
        return normaliser.denormalise_targets(model(x, edge_index, ea)).numpy()


def _by_id(meshes: list, fields: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    ids = np.concatenate([m.point_data["global_id"] for m in meshes]).astype(np.int64)
    pts = np.concatenate([m.points for m in meshes])
    return ids, {f: np.concatenate([m.point_data[f] for m in meshes]) for f in fields}, pts


@pytest.mark.slow
def test_sharded_prediction_equals_one_process_and_files_hold_the_values_at_their_nodes(case: dict) -> None:
    root = case["root"]
    base = asdict(PredictConfig(run=case["run"], data=case["data"], out="", dtype="float64", quiet=True))
    one = predict(PredictConfig(**(base | {"out": str(root / "pred1"), "samples": "all"})))
    assert [r["name"] for r in one["samples"]] == [f"case {i}" for i in range(5)]
    assert sorted(p.name for p in (root / "pred1").iterdir()) == sorted(
        [f"case_{i}.vtu" for i in range(5)] + [f"case_{i}.png" for i in range(5)] + ["metrics.json"])

    # one process: the file holds the model's prediction at every node, and truth and error beside it
    data = open_dataset(case["data"])
    for s in (0, 3):
        ref = _reference(case, s)
        mesh = meshio.read(root / "pred1" / f"case_{s}.vtu")
        np.testing.assert_array_equal(mesh.point_data["global_id"], np.arange(len(case["points"])))
        np.testing.assert_allclose(mesh.points, case["points"])
        pred = np.stack([mesh.point_data["p_pred"], mesh.point_data["q_pred"]], 1)
        np.testing.assert_allclose(pred, ref, rtol=1e-12, atol=1e-12)
        truth = data.sample_arrays(s)[1]
        np.testing.assert_array_equal(mesh.point_data["p"], truth[:, 0])
        np.testing.assert_allclose(mesh.point_data["q_error"], pred[:, 1] - truth[:, 1], rtol=0, atol=1e-12)
        np.testing.assert_allclose(mesh.point_data["a"], data.sample_arrays(s)[0])
        rmse = float(np.sqrt(((pred[:, 0] - truth[:, 0]) ** 2).mean()))
        rel = float(np.linalg.norm(pred[:, 1] - truth[:, 1]) / np.linalg.norm(truth[:, 1]))
        assert one["samples"][s]["fields"]["p"]["rmse"] == pytest.approx(rmse, rel=1e-10)
        assert one["samples"][s]["fields"]["q"]["rel_l2"] == pytest.approx(rel, rel=1e-10)
    metrics = json.loads((root / "pred1" / "metrics.json").read_text())
    assert metrics["samples"][4]["split"] == "val" and metrics["samples"][0]["split"] == "train"

    # 2 ranks, one piece per rank plus a .pvtu; 3 ranks gathered into one .vtu; default samples: val
    two = run_ranks(predict_rank, 2, base | {"out": str(root / "pred2"), "partition": str(root / "parts2"),
                                              "gather": False}, timeout=180)[0]
    three = run_ranks(predict_rank, 3, base | {"out": str(root / "pred3"), "partition": str(root / "parts3"),
                                                "gather": True, "plots": False}, timeout=180)[0]
    assert [r["sample"] for r in two["samples"]] == [3, 4] == [r["sample"] for r in three["samples"]]
    assert len(two["peak_rss_mb"]) == 2 and len(three["peak_rss_mb"]) == 3 and min(three["peak_rss_mb"]) > 50
    for s in (3, 4):
        full = meshio.read(root / "pred1" / f"case_{s}.vtu")
        ref = np.stack([full.point_data["p_pred"], full.point_data["q_pred"]], 1)
        for r in (two, three):
            for f in ("p", "q"):
                assert r["samples"][s - 3]["fields"][f]["rmse"] == pytest.approx(one["samples"][s]["fields"][f]["rmse"], rel=1e-10)
        pieces = read_pvtu(root / "pred2" / f"case_{s}.pvtu")
        assert len(pieces) == 2 and all(0 < len(m.points) < len(case["points"]) for m in pieces)
        assert sum(len(c.data) for m in pieces for c in m.cells) == case["cells"]  # every cell written once
        ids, values, pts = _by_id(pieces, ["p_pred", "q_pred", "p"])
        assert set(ids.tolist()) == set(range(len(case["points"])))  # every node in some piece
        np.testing.assert_allclose(pts, case["points"][ids])  # each value sits at its node
        np.testing.assert_allclose(np.stack([values["p_pred"], values["q_pred"]], 1), ref[ids], rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(values["p"], full.point_data["p"][ids])
        gathered = meshio.read(root / "pred3" / f"case_{s}.vtu")
        np.testing.assert_array_equal(gathered.point_data["global_id"], np.arange(len(case["points"])))
        np.testing.assert_allclose(np.stack([gathered.point_data["p_pred"], gathered.point_data["q_pred"]], 1), ref,
                                   rtol=1e-10, atol=1e-10)
    assert (root / "pred2" / "case_3.png").is_file() and not (root / "pred3" / "case_3.png").exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*warm_command(), "predict", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_predict_refuses_bad_requests_in_one_line(case: dict) -> None:
    root = case["root"]
    (root / "taken").mkdir(exist_ok=True)
    (root / "taken" / "mine.txt").write_text("x")
    for args, message in (
        (["--out", str(root / "taken")], "exists and is not empty (pass --force to replace earlier predictions)"),
        (["--out", str(root / "taken"), "--force"], "holds mine.txt, which meshshard predict did not write"),
        (["--out", str(root / "p"), "--samples", "nine"], "Expected --samples to list sample names or indices 0..4"),
        (["--out", os.path.join(case["data"], "pred")], "Expected an output folder apart from the dataset folder"),
        (["--out", str(case["run"])], "Expected an output folder apart from the run folder (got the run folder; "),
    ):
        proc = _cli(case["run"], "--data", case["data"], *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    proc = _cli(str(root), "--data", case["data"], "--out", str(root / "p"))
    assert proc.returncode == 2 and "no checkpoint.pt" in proc.stderr
    assert (root / "taken" / "mine.txt").exists() and not (root / "p").exists()


@pytest.mark.slow
def test_force_replaces_only_what_metrics_json_lists_and_a_stopped_prediction_keeps_its_finished_samples(
        case: dict, monkeypatch) -> None:
    """``--force`` deletes the files PRED's metrics.json lists and nothing else: a folder of the
    user's own .vtu files is refused, and so is a file predict did not list; a prediction that
    stops part-way leaves a metrics.json with the samples it finished, which a rerun names."""
    import meshshard.run._prediction as pr

    root = case["root"]
    cases = root / "my-cases"
    cases.mkdir()
    (cases / "case_3.vtu").write_text("the user's own simulation result")
    proc = _cli(case["run"], "--data", case["data"], "--out", str(cases), "--force", "--samples", "3")
    assert proc.returncode == 2 and "holds no metrics.json of meshshard predict's" in proc.stderr, proc.stderr
    assert (cases / "case_3.vtu").read_text() == "the user's own simulation result"

    out = root / "stopped"
    base = PredictConfig(run=case["run"], data=case["data"], out=str(out), samples="2,3,4", quiet=True, plots=False)
    real, calls = pr._write_gathered, []

    def fails_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(pr, "_write_gathered", fails_at_the_second)
    with pytest.raises(RuntimeError, match="disk full"):
        predict(base)
    monkeypatch.setattr(pr, "_write_gathered", real)
    meta = json.loads((out / "metrics.json").read_text())
    assert meta["complete"] is False and [r["name"] for r in meta["samples"]] == ["case 2"]
    assert meta["files"] == ["case_2.vtu", "case_3.vtu"] and sorted(p.name for p in out.iterdir()) == ["case_2.vtu", "metrics.json"]
    with pytest.raises(ValueError, match="holds a prediction that stopped part-way"):
        predict(base)
    (out / "case_4.vtu").write_text("mine")  # a name predict would write, but it did not list it
    with pytest.raises(ValueError, match="holds case_4.vtu, which meshshard predict did not write .its metrics.json does not"):
        predict(PredictConfig(**(asdict(base) | {"force": True})))
    assert (out / "case_4.vtu").read_text() == "mine"
    (out / "case_4.vtu").unlink()
    for bad in ("../case_4.vtu", "/tmp/x.png", ".."):  # a record naming a path is not ours
        (out / "metrics.json").write_text(json.dumps(meta | {"files": [bad]}))
        with pytest.raises(ValueError, match="holds no metrics.json"):
            predict(PredictConfig(**(asdict(base) | {"force": True})))
    (out / "metrics.json").write_text(json.dumps(meta))
    done = predict(PredictConfig(**(asdict(base) | {"force": True})))
    assert done["complete"] is True and [r["name"] for r in done["samples"]] == ["case 2", "case 3", "case 4"]
    assert json.loads((out / "metrics.json").read_text())["files"] == ["case_2.vtu", "case_3.vtu", "case_4.vtu"]
    older = {k: v for k, v in done.items() if k not in ("format", "format_version", "complete", "files")}
    (out / "metrics.json").write_text(json.dumps(older))  # written by a version before `files`: its samples' files
    assert predict(PredictConfig(**(asdict(base) | {"force": True, "samples": "4"})))["files"] == ["case_4.vtu"]
    assert sorted(p.name for p in out.iterdir()) == ["case_4.vtu", "metrics.json"]


@pytest.mark.slow
def test_new_cases_without_targets_are_predicted_with_no_truth_and_the_same_values(case: dict) -> None:
    """A dataset of inputs only (the inputs of the case's samples, no targets): predict writes
    ``<t>_pred`` equal to the predictions with targets, no ``<t>`` or ``<t>_error``, no errors;
    on one process and on 2 ranks with the run's own kind of partition; train refuses it."""
    root = case["root"]
    data = open_dataset(case["data"])
    points = np.asarray(data.mesh(0).points)
    cells = [(t, np.asarray(c)) for t, c in data.mesh(0).cells]
    inputs = np.stack([data.sample_arrays(s)[0] for s in range(5)])
    write_dataset(root / "new", inputs, pos=points, cells=cells, input_names=[("a", 3)], dtype="float64")
    new = open_dataset(root / "new")
    assert new.target_channels == [] and list(new.val) == [] and len(new.train) == 5
    base = asdict(PredictConfig(run=case["run"], data=str(root / "new"), out="", dtype="float64", quiet=True))
    predict(PredictConfig(**(base | {"data": case["data"], "out": str(root / "new-ref"), "samples": "all", "plots": False})))
    one = predict(PredictConfig(**(base | {"out": str(root / "new-pred1")})))
    two = run_ranks(predict_rank, 2, base | {"out": str(root / "new-pred2"), "partition": str(root / "parts2"),
                                              "gather": False}, timeout=180)[0]
    assert one["targets_known"] is False and [r["sample"] for r in one["samples"]] == list(range(5))  # default: all
    assert two["targets_known"] is False and len(two["samples"]) == 5 and len(two["peak_rss_mb"]) == 2
    for s in range(5):
        assert one["samples"][s]["fields"] == {"p": {"rmse": None, "rel_l2": None}, "q": {"rmse": None, "rel_l2": None}}
        assert one["samples"][s]["split"] is None and one["samples"][s]["picture"] == f"{s:05d}.png"
        with_truth = meshio.read(root / "new-ref" / f"case_{s}.vtu").point_data
        mesh = meshio.read(root / "new-pred1" / f"{s:05d}.vtu")
        assert set(mesh.point_data) == {"p_pred", "q_pred", "a", "global_id"}
        for f in ("p_pred", "q_pred"):
            np.testing.assert_allclose(mesh.point_data[f], with_truth[f], rtol=1e-12, atol=1e-12)
        ids, values, _ = _by_id(read_pvtu(root / "new-pred2" / f"{s:05d}.pvtu"), ["p_pred", "q_pred"])
        for f in ("p_pred", "q_pred"):
            np.testing.assert_allclose(values[f], with_truth[f][ids], rtol=1e-10, atol=1e-10)
    proc = subprocess.run([*warm_command(), "train", str(root / "parts1"), "--data", str(root / "new"),
                           "--out", str(root / "new-run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (root / "new-run").exists()
    assert proc.stderr.strip() == (f"meshshard train: error: {root / 'new'}: has no targets (made without --targets), so "
                                   "there is nothing to train on; it holds cases for meshshard predict. Train on a "
                                   "dataset made with --targets")


def _layered_box(nx: int = 12, ny: int = 12, nz: int = 8) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """A structured box of ``nz`` node layers in z, whose middle plane falls between two layers:
    hexahedra, and on the half x < 1/2 each hexahedron split into two wedges."""
    axes = [np.arange(n) for n in (nx, ny, nz)]
    i, j, k = (a.ravel() for a in np.meshgrid(*axes, indexing="ij"))
    points = np.stack([i / (nx - 1), j / (ny - 1), k / (nz - 1)], 1)
    ci, cj, ck = (a.ravel() for a in np.meshgrid(*(a[:-1] for a in axes), indexing="ij"))
    b = (ci * ny + cj) * nz + ck
    hexes = np.stack([b, b + ny * nz, b + ny * nz + nz, b + nz, b + 1, b + ny * nz + 1, b + ny * nz + nz + 1, b + nz + 1], 1)
    split = ci < (nx - 1) // 2
    wedges = np.concatenate([hexes[split][:, [0, 1, 2, 4, 5, 6]], hexes[split][:, [0, 2, 3, 4, 6, 7]]])
    return points, [("hexahedron", hexes[~split]), ("wedge", wedges)]


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> dict:
    """A dataset on the layered box, its partitions into 1 and 2 parts, and a run of two steps."""
    root = tmp_path_factory.mktemp("layers")
    points, cells = _layered_box()
    rng = np.random.default_rng(1)
    inputs = np.stack([np.cos(points @ rng.normal(size=(3, 2))) for _ in range(3)])
    write_dataset(root / "data", inputs, inputs[:, :, :1] * inputs[:, :, 1:], pos=points, cells=cells,
                  input_names=["a", "b"], target_names=["c"], val_samples=[2], dtype="float64")
    for k in (1, 2):
        partition_dataset(root / "data", root / f"parts{k}", k)
    train(TrainConfig(partition=str(root / "parts1"), data=str(root / "data"), out=str(root / "run"), steps=2,
                      latent_size=8, hidden_layers=1, message_passing_steps=1, quiet=True, dtype="float64"))
    return {"root": root, "data": str(root / "data"), "run": str(root / "run"), "points": points}


def _middle_layer(points: np.ndarray) -> np.ndarray:
    """The nodes nearest the middle plane (of those as near, the lowest), as rows of ``points``."""
    z = points[:, 2]
    gap = np.abs(z - (z.min() + z.max()) / 2)
    return points[z == z[gap == gap.min()].min()]


def _layers_rank(rank: int, world: int, cfg: dict) -> tuple[np.ndarray | None, dict | None]:
    """The slab of a picture when rank 0 owns the nodes below the middle plane and rank 1 those
    above (so one rank has no node in it), gathered on rank 0; then predict on the 2-part partition."""
    from meshshard.comm import gather_rows as _gather_rows
    from meshshard.run._pictures import plot_rows as _plot_rows

    points = _layered_box()[0]
    mine = points[(points[:, 2] < 0.5) == (rank == 0)]
    take = _plot_rows(mine, len(points), None, torch.device("cpu"))
    return _gather_rows(mine[take], None, torch.device("cpu")), predict(PredictConfig(**cfg))


@pytest.mark.slow
def test_a_mesh_of_few_node_layers_is_pictured_at_the_layer_nearest_its_middle_plane(layers: dict) -> None:
    """8 node layers in z: no node lies within the default slab around the middle plane, which
    used to fail predict on 1 process and on 2 ranks; the slab now goes through the nearest layer."""
    root, points = layers["root"], layers["points"]
    expected = _middle_layer(points)
    assert len(expected) == 12 * 12
    from meshshard.run._pictures import plot_rows as _plot_rows

    take = _plot_rows(points, len(points), None, torch.device("cpu"))
    np.testing.assert_array_equal(points[take], expected)
    base = asdict(PredictConfig(run=layers["run"], data=layers["data"], out="", dtype="float64", quiet=True))
    one = predict(PredictConfig(**(base | {"out": str(root / "pred1")})))
    assert one["samples"][0]["picture"] == "00002.png" and (root / "pred1" / "00002.png").is_file()
    rows, two = run_ranks(_layers_rank, 2, base | {"out": str(root / "pred2"), "partition": str(root / "parts2")},
                          timeout=180)[0]
    np.testing.assert_array_equal(rows[np.lexsort(rows.T[::-1])], expected[np.lexsort(expected.T[::-1])])
    assert two["samples"][0]["picture"] == "00002.png" and (root / "pred2" / "00002.png").is_file()
    assert two["samples"][0]["fields"]["c"]["rmse"] == pytest.approx(one["samples"][0]["fields"]["c"]["rmse"], rel=1e-10)


def test_a_picture_that_cannot_be_drawn_is_skipped_with_a_note(layers: dict, monkeypatch, capsys) -> None:
    import meshshard.run._pictures as module

    def fail(*args, **kwargs):
        raise RuntimeError("cannot draw this")

    monkeypatch.setattr(module, "plot_sample", fail)
    out = layers["root"] / "pred-no-picture"
    summary = predict(PredictConfig(run=layers["run"], data=layers["data"], out=str(out), quiet=True))
    assert summary["samples"][0]["picture"] is None
    assert sorted(p.name for p in out.iterdir()) == ["00002.vtu", "metrics.json"]
    assert capsys.readouterr().err == ("meshshard predict: note: no picture of 00002 (RuntimeError: cannot draw this); "
                                       "the files and metrics are written\n")


@pytest.mark.slow
def test_the_runs_partition_of_other_meshes_is_refused_without_suggesting_to_replace_it(layers: dict) -> None:
    root = layers["root"]
    points, cells = _layered_box(5, 4, 3)
    write_dataset(root / "other", np.ones((1, len(points), 2)), pos=points, cells=cells, input_names=["a", "b"])
    proc = _cli(layers["run"], "--data", str(root / "other"), "--out", str(root / "pred-other"), "--nproc", "2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "partition made for another dataset" in proc.stderr and "--force" not in proc.stderr
    assert proc.stderr.rstrip().endswith(
        f"it is the run's own partition, which the run needs: make one of {root / 'other'} in a new folder and pass "
        f"it: meshshard partition {root / 'other'} --parts 2 --out NEW_PARTS, then --partition NEW_PARTS")


def test_a_prediction_that_is_not_finite_gets_null_errors_and_a_note(case: dict, monkeypatch, capsys) -> None:
    import meshshard.run._prediction as pr

    real = pr._whole_layout

    def nan_layout(*args, **kwargs):
        layout = real(*args, **kwargs)
        forward = layout.forward
        layout.forward = lambda x: forward(x) * float("nan")
        return layout

    monkeypatch.setattr(pr, "_whole_layout", nan_layout)
    out = case["root"] / "pred-nan"
    done = predict(PredictConfig(run=case["run"], data=case["data"], out=str(out), samples="3", plots=False))
    assert done["samples"][0]["fields"]["p"] == {"rmse": None, "rel_l2": None}
    assert json.loads((out / "metrics.json").read_text())["mean"]["p"] == {"rmse": None, "rel_l2": None}  # valid JSON
    assert "note: case 3: the prediction of p holds NaN or inf; its errors are null in metrics.json" in capsys.readouterr().err


def test_new_cases_read_unlike_the_runs_dataset_are_refused_with_the_option_to_use(tmp_path) -> None:
    pytest.importorskip("vtkmodules.vtkIOXML", reason="the vtk package is not installed")
    from meshshard.data import build_dataset
    from meshshard.run._request import normalisation_of
    from tests.data._solver_files import FOAM_CAVITY

    last = FOAM_CAVITY / "VTK" / "cavity_2.vtm"
    flat = open_dataset(build_dataset([last], tmp_path / "flat", inputs=["pos[0]"], targets=["p"], collapse_2d=True))
    thick = open_dataset(build_dataset([last], tmp_path / "thick", inputs=["pos[0]"], targets=["p"]))
    trained_flat = {"config": {"normalisation": flat.normalisation.to_dict()}}
    with pytest.raises(ValueError, match=r"to have 2-D meshes like the run's \(got 3-D\) \(the run's dataset was made "
                                         r"with --collapse-2d: make this one with it too\)"):
        normalisation_of(trained_flat, thick)
    trained_thick = {"config": {"normalisation": thick.normalisation.to_dict()}}
    with pytest.raises(ValueError, match="to have 3-D meshes like the run's .got 2-D. .the run's dataset was "
                                         "one-cell-thick 3-D: make this one without --collapse-2d"):
        normalisation_of(trained_thick, flat)
    assert list(normalisation_of(trained_flat, flat).edges.channels) == flat.edge_channels


def test_predictions_that_overflow_their_dtype_times_the_target_scale_are_refused_not_written_infinite() -> None:
    """Issue 36, defect 12: a run of non-dimensional targets multiplied its float32 predictions back by
    the dataset's scale with no finiteness check (1e39 times a prediction: inf, written as such)."""
    from meshshard.run._trained_run import TrainedRun

    def run(dtype: torch.dtype) -> TrainedRun:
        return TrainedRun(model=None, step=0, config={"target_scales": {"p": "speed*1e30"},  # type: ignore[arg-type]
                                                      "target_fields": [{"name": "p", "components": 1}]},
                          input_channels=["speed"], target_channels=["p"], device=torch.device("cpu"), dtype=dtype,
                          _normaliser=None)

    x, out = torch.tensor([[1e3], [2.0]]), torch.tensor([[1e6], [1.0]])
    with pytest.raises(ValueError, match=r"^Expected the predictions of p to be finite in physical units \(times its "
                                         r"target scale speed\*1e30, they overflow float32\); predict in float64"):
        run(torch.float32)._dimensional(out, x)
    got = run(torch.float64)._dimensional(out.double(), x.double())
    assert torch.allclose(got, torch.tensor([[1e39], [2e30]], dtype=torch.float64), rtol=1e-12, atol=0)
    assert torch.isinf(run(torch.float32)._dimensional(torch.tensor([[math.inf]]), torch.tensor([[1.0]]))).all()
