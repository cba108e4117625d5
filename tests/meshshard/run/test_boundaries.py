"""``meshshard predict --boundary``: errors on named boundaries and the force on them, the same
on 1 and 3 ranks, and equal to what the written files give when integrated independently."""

from __future__ import annotations

import json

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import partition_dataset
from meshshard.run import PredictConfig, TrainConfig, predict, train
from meshshard.run._boundaries import BoundaryScoring, boundary_record, boundary_summary
from tests._dist import run_ranks
from tests._ranks import predict_rank


@pytest.mark.slow
def test_boundary_errors_and_forces_on_shards_equal_one_process_and_the_files(walls_case: dict) -> None:
    root = walls_case["root"]
    common = {"run": walls_case["run"], "data": walls_case["data"], "samples": "all", "boundary": "bottom,left",
              "quiet": True, "plots": True}
    one = predict(PredictConfig(out=str(root / "p1"), **common))
    three = run_ranks(predict_rank, 3, {"out": str(root / "p3"), "partition": str(root / "parts3"), **common},
                      timeout=120)[0]
    for a, b in zip(one["samples"], three["samples"]):
        for wall in ("bottom", "left"):
            fa, fb = a["boundaries"][wall], b["boundaries"][wall]
            for field in ("p", "U"):
                assert fb["fields"][field]["rel_l2"] == pytest.approx(fa["fields"][field]["rel_l2"], rel=1e-10)
            np.testing.assert_allclose(fb["force"]["pred"], fa["force"]["pred"], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(fb["force"]["true"], fa["force"]["true"], rtol=1e-10, atol=1e-12)
    assert json.loads((root / "p3" / "metrics.json").read_text())["boundaries"] == three["boundaries"]
    # independently: the trapezoid rule along each wall, on the values predict wrote
    for record in one["samples"]:
        mesh = meshio.read(root / "p1" / record["file"])
        pts = mesh.points[:, :2]
        bottom = np.flatnonzero(pts[:, 1] == 0.0)
        bottom = bottom[np.argsort(pts[bottom, 0])]
        left = np.flatnonzero(pts[:, 0] == 0.0)
        left = left[np.argsort(pts[left, 1])]
        for field, key in (("p_pred", "pred"), ("p", "true")):
            p = mesh.point_data[field]
            got_b = record["boundaries"]["bottom"]["force"][key]
            got_l = record["boundaries"]["left"]["force"][key]
            np.testing.assert_allclose(got_b, [0.0, -np.trapezoid(p[bottom], pts[bottom, 0])], atol=1e-12)
            np.testing.assert_allclose(got_l, [-np.trapezoid(p[left], pts[left, 1]), 0.0], atol=1e-12)
        u, u_pred = mesh.point_data["U"], mesh.point_data["U_pred"]
        rel = np.linalg.norm(u_pred[bottom] - u[bottom]) / np.linalg.norm(u[bottom])
        assert record["boundaries"]["bottom"]["fields"]["U"]["rel_l2"] == pytest.approx(rel, rel=1e-10)
    summary = one["boundaries"]["bottom"]
    assert summary["force"]["r2_of"] == "force" and summary["force"]["r2"][0] is None  # no x-force on a flat floor
    assert isinstance(summary["force"]["r2"][1], float)
    assert (root / "p1" / f"{one['samples'][0]['file'][:-4]}.png").is_file()


def test_bad_boundary_requests_are_refused_in_one_line(walls_case: dict, capsys, tmp_path) -> None:
    base = ["predict", walls_case["run"], "--data", walls_case["data"], "--out", str(tmp_path / "p"), "--no-plots"]
    for extra, message in (
        (["--boundary", "top"], "Expected --boundary to name boundaries of the meshes (got top; mesh 0 has bottom, "
                                "left)"),
        (["--pressure", "p"], "Expected --boundary NAMES with --force-field, --shear-field, --force-reference, "
                                "--reference-area or --direction"),
        (["--boundary", "left", "--pressure", "U"], "Expected --force-field (--pressure) to name a target field "
                                                            "of 1 component"),
        (["--boundary", "left", "--shear", "p"], "Expected --shear-field (--shear) to name a target field of 2 "
                                                          "components"),
        (["--boundary", "left", "--force-reference", "speed**2"], "Expected 'speed**2' to use the parameters"),
        (["--view", "1,0,0,1"], "Expected --view XMIN,XMAX,YMIN,YMAX"),
    ):
        capsys.readouterr()
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "p").exists()


def test_coefficients_and_r2_over_cases() -> None:
    scoring = BoundaryScoring(("wall",), (("p", slice(0, 1)),), slice(0, 1), None, "0.5*speed**2", 2)
    records = []
    for speed, (true, pred) in zip((1.0, 2.0, 3.0), (([1.0, 2.0], [1.0, 2.5]), ([2.0, 4.0], [2.0, 4.0]),
                                                       ([3.0, 5.0], [3.5, 5.0]))):
        sums = np.array([[1.0, 4.0, *true, *pred]])
        records.append({"boundaries": boundary_record(sums, scoring, {"speed": speed}, truth=True)})
    first = records[0]["boundaries"]["wall"]
    assert first["fields"]["p"]["rel_l2"] == pytest.approx(0.5)
    assert first["coefficient"] == {"reference": 0.5, "reference_area": 1.0, "true": [2.0, 4.0], "pred": [2.0, 5.0]}
    assert first["force"]["rel_error"] == pytest.approx(0.5 / np.sqrt(5.0))
    summary = boundary_summary(records, scoring)["wall"]
    cx_true, cx_pred = np.array([2.0, 1.0, 2 / 3]), np.array([2.0, 1.0, 3.5 / 4.5])
    r2_x = 1 - ((cx_pred - cx_true) ** 2).sum() / ((cx_true - cx_true.mean()) ** 2).sum()
    assert summary["force"]["r2_of"] == "coefficient"
    assert summary["force"]["r2"][0] == pytest.approx(r2_x)


def _box_surface(root) -> str:
    """The outer quads of a 4 x 4 x 4 box of hexahedra (1 x 2 x 3), wound outward, as a .ply with
    ``p = x`` at its points."""
    from meshshard.data._surface import _boundary_facets
    from tests.data.test_surface import _box_3d

    pts, cells = _box_3d(4, tets=False)
    [(quads, owner)] = _boundary_facets(pts, cells)
    p = pts[quads]
    raw = np.cross(p[:, 2] - p[:, 0], p[:, 3] - p[:, 1])
    inward = np.einsum("fd,fd->f", raw, p.mean(1) - owner) < 0
    quads[inward] = quads[inward][:, ::-1]
    used, quads = np.unique(quads, return_inverse=True)
    surface = pts[used]
    path = root / "box.ply"
    meshio.write(path, meshio.Mesh(surface, [("quad", quads.reshape(-1, 4))],
                                   point_data={"p": surface[:, 0], "q": np.sin(surface[:, 1])}))
    return str(path)


@pytest.mark.slow
def test_the_force_on_a_whole_surface_equals_the_divergence_theorem_on_shards_and_one_process(tmp_path) -> None:
    from meshshard.data import build_dataset

    data = str(build_dataset([_box_surface(tmp_path)], tmp_path / "data", inputs="pos,normal", targets="p,q",
                             val_fraction=0, dtype="float64"))
    assert open_dataset_names(data) == ["surface"]
    partition_dataset(data, tmp_path / "parts1", 1)
    partition_dataset(data, tmp_path / "parts3", 3)
    train(TrainConfig(partition=str(tmp_path / "parts1"), data=data, out=str(tmp_path / "run"), steps=1,
                      latent_size=8, hidden_layers=1, message_passing_steps=1, quiet=True, dtype="float64"))
    common = {"run": str(tmp_path / "run"), "data": data, "samples": "all", "boundary": "surface", "quiet": True}
    one = predict(PredictConfig(out=str(tmp_path / "p1"), **common))
    three = run_ranks(predict_rank, 3, {"out": str(tmp_path / "p3"), "partition": str(tmp_path / "parts3"),
                                         **common}, timeout=120)[0]
    a, b = one["samples"][0]["boundaries"]["surface"], three["samples"][0]["boundaries"]["surface"]
    # p = x on a closed surface: the force sum p a = -(integral of x n dA) = -volume e_x, exactly for faces
    # on which x is bilinear; the box is 1 x 2 x 3
    np.testing.assert_allclose(a["force"]["true"], [-6.0, 0.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(b["force"]["pred"], a["force"]["pred"], rtol=1e-10, atol=1e-12)
    assert b["fields"]["q"]["rel_l2"] == pytest.approx(a["fields"]["q"]["rel_l2"], rel=1e-10)


def open_dataset_names(data: str) -> list[str]:
    from meshshard.data import open_dataset

    return open_dataset(data).boundary_names(0)


def test_a_lift_direction_parallel_to_the_drag_direction_is_refused() -> None:
    """Issue 36 (minor): a lift direction parallel to the drag direction was accepted (the lift was the drag)."""
    import pytest

    from meshshard.run._boundaries import check_force_options

    for lift in ((2.0, 0.0, 0.0), (-1.0, 0.0, 0.0)):
        with pytest.raises(ValueError, match=r"^Expected --lift-direction across --direction, the drag direction "
                                             r"\(got -?1,0,0 parallel to 1,0,0, as unit vectors\)"):
            check_force_options(None, (1.0, 0.0, 0.0), lift, 3)
    assert check_force_options(None, (1.0, 0.0, 0.0), (1.0, 1.0, 0.0), 3)[2] == pytest.approx((0.5**0.5, 0.5**0.5, 0))
