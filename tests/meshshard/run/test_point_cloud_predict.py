"""``meshshard predict`` on point clouds and surfaces: ``.vtp`` files (faces kept) or ``.pvtp``
pieces that hold every point once, the pictures, area-weighted errors and force coefficients,
the same on 1 and 3 ranks."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import meshio
import numpy as np
import pytest

from meshshard.data import build_dataset, partition_dataset
from meshshard.run import PredictConfig, TrainConfig, predict, train
from meshshard.run._vtk import read_vtp
from tests._dist import run_ranks
from tests._ranks import predict_rank
from tests.meshshard.run._cases import uv_ellipsoid


def _surface_files(root, count: int = 3) -> list[str]:
    """Spheres squashed differently, with p = x (+ a wave) and a shear tau, as .ply/.vtu surfaces."""
    pts, tris = uv_ellipsoid()
    files = []
    for k in range(count):
        q = pts * np.array([1.0 + 0.2 * k, 1.0, 0.8])
        p = q[:, 0] + 0.3 * k * np.sin(2 * q[:, 2])
        tau = np.stack([0.1 * q[:, 2], 0.05 * k * q[:, 0], 0 * q[:, 0]], 1)
        path = root / f"body-{k}.vtu"
        meshio.write(path, meshio.Mesh(q, [("triangle", tris)], point_data={"p": p, "tau": tau}))
        files.append(str(path))
    return files


@pytest.fixture(scope="module")
def surface(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("surface")
    data = str(build_dataset(_surface_files(root), root / "data", inputs="pos,normal", targets="p,tau",
                             val_fraction=0, dtype="float64"))
    partition_dataset(data, root / "parts1", 1)
    partition_dataset(data, root / "parts3", 3)
    train(TrainConfig(partition=str(root / "parts1"), data=data, out=str(root / "run"), steps=2, lr=1e-2,
                      latent_size=8, hidden_layers=1, message_passing_steps=1, quiet=True, dtype="float64"))
    return {"root": root, "data": data, "run": str(root / "run")}


def _pieces(index) -> list[dict]:
    root = ET.parse(index).getroot()
    assert root.attrib["type"] == "PPolyData"
    return [read_vtp(index.parent / p.attrib["Source"]) for p in root.iter("Piece")]


@pytest.mark.slow
def test_a_surface_is_written_as_vtp_with_its_faces_and_as_pvtp_pieces_holding_every_point_once(surface) -> None:
    root = surface["root"]
    common = {"run": surface["run"], "data": surface["data"], "samples": "all", "quiet": True, "plots": False}
    one = predict(PredictConfig(out=str(root / "p1"), **(common | {"plots": True, "samples": "body-1"})))
    assert one["samples"][0]["picture"] == "body-1.png" and (root / "p1" / "body-1.png").stat().st_size > 0
    three = run_ranks(predict_rank, 3, {"out": str(root / "p3"), "partition": str(root / "parts3"), "gather": False,
                                         **common}, timeout=120)[0]
    source = meshio.read(root / "body-1.vtu")
    whole = read_vtp(root / "p1" / "body-1.vtp")
    assert one["samples"][0]["file"] == "body-1.vtp" and three["samples"][1]["file"] == "body-1.pvtp"
    assert "body-1.vtp" in one["files"] and {"body-1.pvtp", "body-1"} <= set(three["files"])
    np.testing.assert_array_equal(whole["point_data"]["global_id"], np.arange(len(source.points)))
    np.testing.assert_allclose(whole["points"], source.points)
    # the faces as the source had them (same point numbering: the surface's points are the mesh's)
    np.testing.assert_array_equal(np.array(whole["polys"]), source.cells_dict["triangle"])
    pd = whole["point_data"]
    np.testing.assert_allclose(pd["p"], source.point_data["p"])
    np.testing.assert_allclose(pd["p_error"], pd["p_pred"] - pd["p"], atol=1e-12)
    np.testing.assert_allclose(pd["tau"], source.point_data["tau"])
    assert pd["tau_pred"].shape == (len(source.points), 3) and "normal" in pd
    # pieces: the points without the ghost mark are every point exactly once, with the one-process values
    pieces = _pieces(root / "p3" / "body-1.pvtp")
    assert len(pieces) == 3
    owned = [(m["point_data"]["global_id"][m["point_data"]["vtkGhostType"] == 0], m) for m in pieces]
    ids = np.concatenate([i for i, _ in owned])
    np.testing.assert_array_equal(np.sort(ids), np.arange(len(source.points)))
    for m in pieces:
        g = m["point_data"]["global_id"]
        np.testing.assert_allclose(m["point_data"]["p_pred"], pd["p_pred"][g], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(m["points"], source.points[g])
    # every face once over the pieces, in global numbering
    faces = np.concatenate([m["point_data"]["global_id"][np.array(m["polys"])] for m in pieces if len(m["polys"])])
    np.testing.assert_array_equal(np.sort(np.sort(faces, 1), 0),
                                  np.sort(np.sort(source.cells_dict["triangle"], 1), 0))
    assert json.loads((root / "p3" / "metrics.json").read_text())["complete"] is True


@pytest.mark.slow
def test_a_cloud_without_faces_is_written_with_vertex_cells(tmp_path) -> None:
    rng = np.random.default_rng(3)
    for k in range(3):
        pos = rng.random((60, 3))
        np.savez(tmp_path / f"c{k}.npz", pos=pos, a=np.sin(3 * pos[:, 0] + k), b=pos[:, 1] * k)
    data = str(build_dataset([str(tmp_path / f"c{k}.npz") for k in range(3)], tmp_path / "data", inputs="a",
                             targets="b", val_fraction=0, dtype="float64"))
    partition_dataset(data, tmp_path / "parts1", 1)
    partition_dataset(data, tmp_path / "parts2", 2)
    train(TrainConfig(partition=str(tmp_path / "parts1"), data=data, out=str(tmp_path / "run"), steps=1,
                      latent_size=8, hidden_layers=1, message_passing_steps=1, quiet=True, dtype="float64"))
    common = {"run": str(tmp_path / "run"), "data": data, "samples": "all", "quiet": True}
    predict(PredictConfig(out=str(tmp_path / "p1"), plots=False, **common))
    two = run_ranks(predict_rank, 2, {"out": str(tmp_path / "p2"), "partition": str(tmp_path / "parts2"),
                                       "gather": False, **common}, timeout=120)[0]
    whole = read_vtp(tmp_path / "p1" / "c2.vtp")
    assert [len(v) for v in whole["verts"]] == [1] * 60 and not whole["polys"]
    np.testing.assert_array_equal(np.concatenate(whole["verts"]), np.arange(60))
    pieces = _pieces(tmp_path / "p2" / "c2.pvtp")
    ids = np.concatenate([m["point_data"]["global_id"] for m in pieces])
    np.testing.assert_array_equal(np.sort(ids), np.arange(60))  # no faces: no point in two pieces
    for m in pieces:
        assert not m["point_data"]["vtkGhostType"].any()
        np.testing.assert_allclose(m["point_data"]["b_pred"], whole["point_data"]["b_pred"][m["point_data"]["global_id"]],
                                   rtol=1e-10, atol=1e-12)
    assert two["samples"][0]["picture"] == "c0.png"


def _point_areas(points: np.ndarray, tris: np.ndarray) -> np.ndarray:
    """Each point's third of the area of the triangles around it (computed here, independently)."""
    v = points[tris]
    area = 0.5 * np.linalg.norm(np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]), axis=1)
    return np.bincount(tris.ravel(), np.repeat(area / 3, 3), minlength=len(points))


@pytest.mark.slow
def test_area_weighted_errors_equal_the_files_and_are_the_same_on_three_ranks(surface) -> None:
    root = surface["root"]
    common = {"run": surface["run"], "data": surface["data"], "samples": "all", "quiet": True, "plots": False}
    one = predict(PredictConfig(out=str(root / "m1"), **common))
    three = run_ranks(predict_rank, 3, {"out": str(root / "m3"), "partition": str(root / "parts3"), **common},
                      timeout=120)[0]
    for k, (a, b) in enumerate(zip(one["samples"], three["samples"])):
        source = meshio.read(root / f"body-{k}.vtu")
        w = _point_areas(source.points, source.cells_dict["triangle"])
        pd = read_vtp(root / "m1" / f"body-{k}.vtp")["point_data"]
        for field in ("p", "tau"):
            e2 = (pd[f"{field}_error"].reshape(len(w), -1) ** 2).sum(1)
            y2 = (pd[field].reshape(len(w), -1) ** 2).sum(1)
            assert a["fields"][field]["rel_l2_area"] == pytest.approx(np.sqrt(w @ e2 / (w @ y2)), rel=1e-9)
            assert a["fields"][field]["rel_l2_area"] != pytest.approx(a["fields"][field]["rel_l2"], rel=1e-6)  # weighted
            assert b["fields"][field]["rel_l2_area"] == pytest.approx(a["fields"][field]["rel_l2_area"], rel=1e-10)
    assert one["mean"]["p"]["rel_l2_area"] == pytest.approx(
        np.mean([r["fields"]["p"]["rel_l2_area"] for r in one["samples"]]))
    from meshshard.run import prediction_summary

    assert prediction_summary(root / "m1")["mean"] == one["mean"]  # what meshshard info PRED prints


def _volume(points: np.ndarray, tris: np.ndarray) -> float:
    """The volume a closed outward-wound triangle surface encloses (independently of the code under test)."""
    v = points[tris]
    return float(np.einsum("fd,fd->f", v[:, 0], np.cross(v[:, 1], v[:, 2])).sum() / 6)


FORCE = {"pressure": "p", "reference_area": 2.0, "force_reference": "0.5*4", "direction": (2.0, 0.0, 0.0),
         "lift_direction": (0.0, 0.0, 1.0)}


@pytest.mark.slow
def test_force_coefficients_on_a_surface_match_the_divergence_theorem_and_three_ranks(surface) -> None:
    root = surface["root"]
    common = {"run": surface["run"], "data": surface["data"], "samples": "all", "quiet": True, "plots": False,
              **FORCE}  # no --boundary: a dataset of surfaces takes "surface"
    one = predict(PredictConfig(out=str(root / "f1"), **common))
    three = run_ranks(predict_rank, 3, {"out": str(root / "f3"), "partition": str(root / "parts3"), **common},
                      timeout=120)[0]
    pairs = []
    for k, (a, b) in enumerate(zip(one["samples"], three["samples"])):
        source = meshio.read(root / f"body-{k}.vtu")
        tris = source.cells_dict["triangle"]
        ca, cb = a["boundaries"]["surface"]["coefficients"], b["boundaries"]["surface"]["coefficients"]
        if k == 0:  # p = x: the force is -(volume) e_x, exact on flat faces; q A = 2 * 2
            volume = _volume(source.points, tris)
            assert ca["drag"]["true"] == pytest.approx(-volume / 4, rel=1e-10)
            assert volume == pytest.approx(4 / 3 * np.pi * 0.8, rel=0.1)  # the ellipsoid, within discretisation
            assert abs(ca["lift"]["true"]) < 1e-12
        for c in ("drag", "lift"):
            assert cb[c]["pred"] == pytest.approx(ca[c]["pred"], rel=1e-10, abs=1e-13)
            assert cb[c]["true"] == pytest.approx(ca[c]["true"], rel=1e-10, abs=1e-13)
            assert ca[c]["abs_error"] == pytest.approx(abs(ca[c]["pred"] - ca[c]["true"]))
        force = np.array(a["boundaries"]["surface"]["force"]["pred"])
        assert ca["drag"]["pred"] == pytest.approx(force[0] / 4) and ca["lift"]["pred"] == pytest.approx(force[2] / 4)
        pairs.append((ca["drag"]["true"], ca["drag"]["pred"]))
    t, p = np.array(pairs).T
    drag = one["boundaries"]["surface"]["coefficients"]["drag"]
    assert drag["mae"] == pytest.approx(np.abs(p - t).mean())
    assert drag["r2"] == pytest.approx(1 - ((p - t) ** 2).sum() / ((t - t.mean()) ** 2).sum())
    assert three["boundaries"]["surface"]["coefficients"]["drag"]["r2"] == pytest.approx(drag["r2"], rel=1e-9)
    one_sample = predict(PredictConfig(out=str(root / "f0"), **(common | {"samples": "body-0"})))
    assert one_sample["boundaries"]["surface"]["coefficients"]["drag"]["r2"] is None  # R² needs two samples


def test_a_uniform_pressure_on_a_closed_surface_gives_no_force(surface) -> None:
    from meshshard.data import open_dataset
    from meshshard.run._boundaries import boundary_record, boundary_sums, check_boundary_request

    data = open_dataset(surface["data"])
    fields = [("p", slice(0, 1)), ("tau", slice(1, 4))]
    scoring = check_boundary_request(data, fields, None, "p", None, None, [0, 1, 2], 1.5, (1, 0, 0), (0, 1, 0))
    assert scoring.names == ("surface",)
    for s in range(3):
        n = data.num_nodes(s)
        rows = [data.boundary_rows(data.sample_mesh(s), "surface", np.arange(n))]
        values = np.full((n, 4), 7.0)
        record = boundary_record(boundary_sums(rows, values, values, scoring), scoring, {}, True)["surface"]
        for c in ("drag", "lift"):
            assert abs(record["coefficients"][c]["true"]) < 1e-12 and abs(record["coefficients"][c]["pred"]) < 1e-12
        assert np.abs(record["force"]["true"]).max() < 1e-12


def test_bad_force_options_are_refused_in_one_line_before_any_rank_starts(surface, capsys, tmp_path) -> None:
    from meshshard.cli import main

    base = ["predict", surface["run"], "--data", surface["data"], "--out", str(tmp_path / "p"), "--no-plots",
            "--nproc", "3", "--partition", str(surface["root"] / "parts3")]
    for extra, message in (
        (["--force-field", "nope"], "Expected --force-field (--pressure) to name a target field of 1 component"),
        (["--pressure", "tau"], "Expected --force-field (--pressure) to name a target field of 1 component"),
        (["--shear-field", "p"], "Expected --shear-field (--shear) to name a target field of 3 components"),
        (["--direction", "0,0,0"], "Expected --direction X,Y,Z, a non-zero vector of finite numbers (got '0,0,0')"),
        (["--direction", "1,0,nan"], "Expected --direction X,Y,Z, a non-zero vector"),
        (["--direction", "1,0"], "Expected --direction to have 3 components"),
        (["--lift-direction", "0,0,1"], "Expected --direction (the drag direction) with --lift-direction"),
        (["--reference-area", "-1"], "Expected --reference-area to be a positive number (got -1.0)"),
        (["--reference-area", "0", "--direction", "1,0,0"], "Expected --reference-area to be a positive number"),
        (["--boundary", "wing"], "Expected --boundary to name boundaries of the meshes (got wing"),
    ):
        capsys.readouterr()
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (extra, err)
    assert not (tmp_path / "p").exists()


def test_which_meshes_are_point_clouds() -> None:
    from meshshard.run._writer import is_point_cloud

    assert is_point_cloud({"pos_dim": 3, "cells": {"triangle": 8, "quad": 2}})  # a surface
    assert is_point_cloud({"pos_dim": 3, "cells": {"triangle": 8}, "surface_area": 1.0})
    assert is_point_cloud({"pos_dim": 2, "cells": {"vertex": 5}})
    assert is_point_cloud({"pos_dim": 3, "cells": {}, "graph": {"rule": "knn", "k": 8}})  # a .npz cloud
    assert not is_point_cloud({"pos_dim": 2, "cells": {"triangle": 8}})  # a 2-D mesh
    assert not is_point_cloud({"pos_dim": 3, "cells": {"tetra": 8, "triangle": 2}})
    assert not is_point_cloud({"pos_dim": 3, "cells": {}})  # a graph given as edges
    # a 2-D mesh written with z = 0, as many solvers write one: an unstructured grid (.vtu)
    assert not is_point_cloud({"pos_dim": 3, "cells": {"triangle": 8}, "surface_area": 1.0, "planar": True})


def test_cloud_pictures_have_three_views_in_3d_and_one_in_2d(tmp_path) -> None:
    import matplotlib.image

    from meshshard.run._pictures import plot_cloud

    rng = np.random.default_rng(0)
    fields = [("p", slice(0, 1)), ("u", slice(1, 3))]
    heights = {}
    for dim in (2, 3):
        pos, truth = rng.random((300, dim)), rng.random((300, 3))
        assert plot_cloud(tmp_path / f"{dim}.png", "t", pos, truth, truth + 0.1, fields, "note")
        heights[dim] = matplotlib.image.imread(tmp_path / f"{dim}.png").shape[0]
    assert heights[3] > 2.5 * heights[2]  # two fields: six rows of views against two rows


def test_the_dataset_stores_each_points_area_and_predict_reads_only_its_rows(surface, monkeypatch) -> None:
    """Issue 37: ``surface-point-area.npy`` holds each point's share of the faces' areas; the
    weights of the area-weighted errors are its rows, no face is read, and a dataset written
    without it (before issue 37) computes the same weights from the faces."""
    from meshshard.data import open_dataset
    from meshshard.run._scores import surface_weights

    data = open_dataset(surface["data"])
    source = meshio.read(surface["root"] / "body-1.vtu")
    mesh = data.sample_mesh(1)
    assert data.meta["meshes"][mesh]["point_area"] is True
    expected = _point_areas(source.points, source.cells_dict["triangle"])
    np.testing.assert_allclose(np.load(data.mesh_folder(mesh) / "surface-point-area.npy"), expected, rtol=1e-12)
    rows = np.array([3, 7, 40, 41, len(expected) - 1])

    def no_faces(*args):
        raise AssertionError("a face was read")

    computed = surface_weights(data, mesh, rows)  # the faces, read in chunks, as before issue 37
    monkeypatch.setattr(data, "mesh_cells", no_faces)
    stored = surface_weights(data, mesh, rows)
    np.testing.assert_allclose(stored, expected[rows], rtol=1e-12)
    np.testing.assert_allclose(stored, computed, rtol=1e-12)
    monkeypatch.undo()
    del data.meta["meshes"][mesh]["point_area"]  # a dataset of before issue 37
    np.testing.assert_array_equal(surface_weights(data, mesh, rows), computed)


@pytest.mark.slow
def test_area_weighted_errors_on_two_and_four_ranks_equal_one_process(surface, tmp_path) -> None:
    """Issue 37: each rank reads its own points' areas; the metrics on 2 and 4 ranks equal one
    process, and a copy of the dataset without the stored areas gives the same metrics."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(surface["data"], old)
    meta = json.loads((old / "dataset.json").read_text())
    for entry in meta["meshes"]:
        entry.pop("point_area")
        (old / entry["folder"] / "surface-point-area.npy").unlink()
    (old / "dataset.json").write_text(json.dumps(meta))
    common = {"run": surface["run"], "samples": "all", "quiet": True, "plots": False}
    one = predict(PredictConfig(out=str(tmp_path / "m1"), data=surface["data"], **common))
    again = predict(PredictConfig(out=str(tmp_path / "m1-old"), data=str(old), **common))
    for ranks in (2, 4):
        parts = tmp_path / f"parts{ranks}"
        partition_dataset(surface["data"], parts, ranks)
        many = run_ranks(predict_rank, ranks, {"out": str(tmp_path / f"m{ranks}"), "partition": str(parts),
                                               "data": surface["data"], **common}, timeout=120)[0]
        for a, b in zip(one["samples"], many["samples"], strict=True):
            for field in ("p", "tau"):
                assert b["fields"][field]["rel_l2_area"] == pytest.approx(a["fields"][field]["rel_l2_area"], rel=1e-10)
    for a, b in zip(one["samples"], again["samples"], strict=True):
        for field in ("p", "tau"):
            assert b["fields"][field]["rel_l2_area"] == pytest.approx(a["fields"][field]["rel_l2_area"], rel=1e-12)
