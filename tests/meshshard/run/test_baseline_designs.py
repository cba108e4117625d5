"""``meshshard baseline`` beyond one dataset of volume meshes: on surfaces (each body its own cloud,
fields mapped between clouds, errors area-weighted as predict weights them) and on new designs
without targets, predicted from the training samples of another dataset (``--from``)."""

from __future__ import annotations

import json
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import build_dataset, node_map, open_dataset
from meshshard.run import BaselineConfig, baseline
from meshshard.run._vtk import read_vtp
from tests.meshshard.run._cases import uv_ellipsoid
from tests.meshshard.run._sweeps import PARAMS, TRAIN, fields, write_sweep


def _point_areas(points: np.ndarray, tris: np.ndarray) -> np.ndarray:
    v = points[tris]
    area = 0.5 * np.linalg.norm(np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]), axis=1)
    out = np.zeros(len(points))
    np.add.at(out, tris.ravel(), np.repeat(area / 3, 3))
    return out


@pytest.fixture(scope="module")
def bodies(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bodies")
    files, shapes = [], []
    for k in range(4):  # each body its own cloud: different shapes and point counts
        pts, tris = uv_ellipsoid(np.array([1.0 + 0.2 * k, 1.0, 0.8]), 7 + k, 12 + 2 * k)
        p = pts[:, 0] + 0.5 * k * pts[:, 2] ** 2
        path = root / f"body-{k}.vtu"
        meshio.write(path, meshio.Mesh(pts, [("triangle", tris)], point_data={"p": p}))
        files.append(str(path))
        shapes.append((pts, tris, p))
    data = str(build_dataset(files, root / "data", inputs="pos,normal", targets="p", val_samples=[3],
                             dtype="float64"))
    return {"root": root, "data": data, "shapes": shapes}


def test_the_mean_of_surfaces_maps_between_clouds_and_weighs_errors_by_area(bodies: dict, tmp_path: Path) -> None:
    out = tmp_path / "pred"
    metrics = baseline(BaselineConfig(data=bodies["data"], out=str(out), quiet=True, near="surface:0"))
    [record] = metrics["samples"]
    pts, tris, p = bodies["shapes"][3]
    data = open_dataset(bodies["data"])
    assert not np.array_equal(np.asarray(data.mesh_points(data.sample_mesh(3))), np.asarray(data.mesh_points(0)))
    want = sum(node_map(bodies["shapes"][i][0], pts, cloud=True).apply(bodies["shapes"][i][2][:, None])[:, 0]
               for i in range(3)) / 3
    written = read_vtp(out / record["file"])
    assert record["file"].endswith(".vtp")
    np.testing.assert_allclose(written["point_data"]["p_pred"], want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(written["point_data"]["p"], p, rtol=1e-12)
    area = _point_areas(pts, tris)
    rel_area = np.sqrt((area * (want - p) ** 2).sum() / (area * p ** 2).sum())
    assert record["fields"]["p"]["rel_l2_area"] == pytest.approx(rel_area, rel=1e-10)
    assert record["fields"]["p"]["rel_l2"] == pytest.approx(np.linalg.norm(want - p) / np.linalg.norm(p), rel=1e-10)
    # --near surface:0 is every point of the surface: its errors are the whole sample's
    assert record["near"]["num_nodes"] == len(pts)
    assert record["near"]["fields"]["p"]["rel_l2"] == pytest.approx(record["fields"]["p"]["rel_l2"], rel=1e-12)
    assert (out / record["picture"]).is_file()


def test_new_designs_without_targets_are_predicted_from_another_dataset(tmp_path: Path, capsys) -> None:
    source = write_sweep(tmp_path / "train", meshes="many")
    new = write_sweep(tmp_path / "new", meshes="many", targets=False)
    out = tmp_path / "pred"
    capsys.readouterr()
    assert main(["baseline", new["data"], "--from", source["data"], "--method", "nearest", "-o", str(out),
                 "--samples", "all", "--no-plots"]) == 0
    assert "has no targets: predictions only, no errors" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["complete"] and metrics["targets_known"] is False and metrics["baseline"]["from"] == source["data"]
    train = PARAMS[:len(TRAIN)]
    z = train / train.std(0)
    assert len(metrics["samples"]) == len(PARAMS)
    for record in metrics["samples"]:
        case = record["sample"]
        nearest = int(np.argmin(np.linalg.norm(z - PARAMS[case] / train.std(0), axis=1)))
        written = meshio.read(out / record["file"])
        assert "p" not in written.point_data and "p_error" not in written.point_data
        # the fields are linear, so mapped onto the new mesh they are the nearest case's there; p was
        # stored divided by b**2 (--target-scale), and is multiplied by the new design's own b**2
        want = fields(new["points"][case], *PARAMS[nearest])
        p = want[:, 0] / PARAMS[nearest, 1] ** 2 * PARAMS[case, 1] ** 2
        np.testing.assert_allclose(written.point_data["p_pred"], p, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(written.point_data["U_pred"], want[:, 1:], rtol=1e-10, atol=1e-10)
        assert record["fields"]["p"] == {"rmse": None, "rel_l2": None} and record["split"] is None
        assert record["baseline"]["sources"] == [{"sample": f"t{nearest}", "weight": 1.0}]


def test_from_a_dataset_unlike_data_and_without_from_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    source = write_sweep(tmp_path / "train", meshes="many")
    new = write_sweep(tmp_path / "new", meshes="many", targets=False)
    bare = write_sweep(tmp_path / "bare", meshes="many", targets=False, parameters=False)
    for args, message in (
        ([new["data"]], "Expected a dataset with targets (it holds inputs only): a baseline is made of its training "
                        "samples' targets (new designs without targets: --from TRAINING_DATA)"),
        ([bare["data"], "--from", source["data"]], "Expected the inputs, targets and mesh dimension of --from"),
        ([new["data"], "--from", new["data"]], "Expected a dataset with targets"),
    ):
        capsys.readouterr()
        assert main(["baseline", *args, "-o", str(tmp_path / "p"), "--no-plots"]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "p").exists()
