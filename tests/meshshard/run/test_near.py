"""``--near PATCHES:DISTANCE``: each target's errors over the nodes near named boundaries, equal on
1, 2, 3 and 4 ranks to one process and to a brute-force count on the written files; printed in
the table and in the comparison; and the pictures along the boundaries and of the forces."""

from __future__ import annotations

import json

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.run import BaselineConfig, PredictConfig, baseline, comparison_table, predict
from meshshard.run._boundary_pictures import boundary_order
from meshshard.run._near import NearRegion, near_mask, near_record, parse_near
from tests._dist import run_ranks
from tests._ranks import predict_rank

PNG = b"\x89PNG\r\n\x1a\n"


def _by_hand(file, pts: np.ndarray, distance: float) -> dict:
    """The near errors of a written file, with the distances brute-forced in numpy."""
    mesh = meshio.read(file)
    wall = pts[(pts[:, 1] == 0.0) | (pts[:, 0] == 0.0)]
    d = np.sqrt(((pts[:, None, :] - wall[None]) ** 2).sum(-1)).min(1)
    near = d <= distance
    out = {"num_nodes": int(near.sum())}
    for field in ("p", "U"):
        t, p = mesh.point_data[field][near], mesh.point_data[f"{field}_pred"][near]
        out[field] = (np.sqrt(((p - t) ** 2).mean()), np.linalg.norm(p - t) / np.linalg.norm(t))
    return out


@pytest.mark.slow
def test_near_errors_on_one_to_four_ranks_equal_one_process_and_the_files(walls_case: dict) -> None:
    root = walls_case["root"]
    common = {"run": walls_case["run"], "data": walls_case["data"], "samples": "all", "near": "bottom,left:0.3",
              "boundary": "bottom", "quiet": True, "plots": False}
    one = predict(PredictConfig(out=str(root / "n1"), **common))
    for record in one["samples"]:
        want = _by_hand(root / "n1" / record["file"], walls_case["pts"], 0.3)
        got = record["near"]
        assert got["num_nodes"] == want["num_nodes"] and 0 < got["num_nodes"] < len(walls_case["pts"])
        assert got["boundaries"] == ["bottom", "left"] and got["distance"] == 0.3
        for field in ("p", "U"):
            assert got["fields"][field]["rmse"] == pytest.approx(want[field][0], rel=1e-10)
            assert got["fields"][field]["rel_l2"] == pytest.approx(want[field][1], rel=1e-10)
    for ranks in (2, 3, 4):
        many = run_ranks(predict_rank, ranks, {"out": str(root / f"n{ranks}"), "partition": str(root / f"parts{ranks}"),
                                               **common}, timeout=180)[0]
        for a, b in zip(one["samples"], many["samples"]):
            assert b["near"]["num_nodes"] == a["near"]["num_nodes"]
            for field in ("p", "U"):
                for key in ("rmse", "rel_l2"):
                    assert b["near"]["fields"][field][key] == pytest.approx(a["near"]["fields"][field][key], rel=1e-10)
        assert many["near"]["fields"]["p"]["rel_l2"] == pytest.approx(one["near"]["fields"]["p"]["rel_l2"], rel=1e-10)
    on_disk = json.loads((root / "n1" / "metrics.json").read_text())
    mean = np.mean([r["near"]["fields"]["U"]["rel_l2"] for r in one["samples"]])
    assert on_disk["near"]["fields"]["U"]["rel_l2"] == pytest.approx(mean, rel=1e-12)


def test_near_is_exact_on_any_split_of_the_rows(walls_case: dict) -> None:
    """The mask and sums of every split of the nodes (an empty part, uneven parts) add up to the whole."""
    from meshshard.data import open_dataset

    data = open_dataset(walls_case["data"])
    region = NearRegion(("bottom",), 0.25)
    n = len(walls_case["pts"])
    rng = np.random.default_rng(0)
    pred, truth = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
    fields = [("p", slice(0, 1)), ("U", slice(1, 3))]
    ctx = type("Ctx", (), {"device": "cpu"})()
    whole = near_mask(data, 0, np.arange(n), region)
    assert whole.sum() == (walls_case["pts"][:, 1] <= 0.25).sum()  # the floor: distance is y
    full = near_record(whole, pred, truth, fields, region, ctx)
    for cuts in ([], [0], [40, 41, 100], [10, 60, 61]):
        parts = np.split(np.arange(n), cuts)
        masks = [near_mask(data, 0, ids, region) for ids in parts]
        assert np.array_equal(np.concatenate(masks), whole)
        sse = sum(((pred[ids][m, 1:3] - truth[ids][m, 1:3]) ** 2).sum() for ids, m in zip(parts, masks))
        sst = sum((truth[ids][m, 1:3] ** 2).sum() for ids, m in zip(parts, masks))
        assert np.sqrt(sse / sst) == pytest.approx(full["fields"]["U"]["rel_l2"], rel=1e-12)


def test_parse_near_and_its_refusals(walls_case: dict, capsys, tmp_path) -> None:
    assert parse_near("walls,inlet:0.05") == NearRegion(("walls", "inlet"), 0.05)
    assert parse_near("a:b:1") == NearRegion(("a:b",), 1.0)
    for bad in ("walls", "walls:-1", "walls:nan", ":1", "walls:x"):
        with pytest.raises(ValueError, match=r"^Expected --near PATCHES:DISTANCE"):
            parse_near(bad)
    base = ["predict", walls_case["run"], "--data", walls_case["data"], "--out", str(tmp_path / "p"), "--no-plots"]
    for extra, message in ((["--near", "top:1"], "Expected --near to name boundaries of the meshes (got top"),
                           (["--near", "bottom"], "Expected --near PATCHES:DISTANCE")):
        capsys.readouterr()
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "p").exists()


def test_pictures_along_the_boundaries_and_of_the_forces_and_the_tables(walls_case: dict, tmp_path, capsys) -> None:
    out = tmp_path / "pred"
    capsys.readouterr()
    assert main(["predict", walls_case["run"], "--data", walls_case["data"], "--out", str(out), "--samples", "all",
                 "--boundary", "bottom,left", "--near", "left:0.2"]) == 0
    table = capsys.readouterr().out
    assert "p near L2" in table and "near: the nodes within 0.2 of left: mean p rel L2" in table
    metrics = json.loads((out / "metrics.json").read_text())
    for record in metrics["samples"]:
        picture = out / record["boundary_picture"]
        assert picture.name.endswith("_boundaries.png") and picture.read_bytes()[:8] == PNG
        assert picture.name in metrics["files"]
    assert metrics["forces_picture"] == "forces.png" and (out / "forces.png").read_bytes()[:8] == PNG
    assert "forces.png" in metrics["files"]
    # the mean baseline draws them too, and the comparison shows the near rows
    base = tmp_path / "base"
    baseline(BaselineConfig(data=walls_case["data"], out=str(base), samples="all", boundary="bottom", near="left:0.2",
                            quiet=True))
    assert all((base / r["boundary_picture"]).read_bytes()[:8] == PNG
               for r in json.loads((base / "metrics.json").read_text())["samples"])
    assert (base / "forces.png").is_file()
    assert "near left<=0.2: p rel L2" in comparison_table(out, base)
    # with one case there is no forces.png
    single = tmp_path / "single"
    predict(PredictConfig(run=walls_case["run"], data=walls_case["data"], out=str(single), samples="0", boundary="bottom",
                          quiet=True))
    assert not (single / "forces.png").exists() and len(list(single.glob("*_boundaries.png"))) == 1


def test_a_boundary_around_a_body_is_ordered_by_angle_and_an_open_one_along_its_extent() -> None:
    rng = np.random.default_rng(2)
    angles = rng.permutation(np.linspace(0, 2 * np.pi, 40, endpoint=False))
    circle = np.stack([3 + 2 * np.cos(angles), -1 + 2 * np.sin(angles)], 1)
    order, along, label = boundary_order(circle)
    assert np.array_equal(order, np.argsort(angles)) and label.startswith("arc length")
    assert along[0] == 0.0 and np.all(np.diff(along) > 0)
    assert along[-1] == pytest.approx(2 * np.pi * 2 * (39 / 40), rel=2e-3)  # the chords, one short of the ring
    wall = np.stack([rng.permutation(np.linspace(0, 1, 9)), np.zeros(9)], 1)  # a straight open wall: by x
    order, along, label = boundary_order(wall)
    assert label == "x" and np.array_equal(along, np.linspace(0, 1, 9))
    arc = np.stack([np.sin(np.linspace(0, np.pi, 20)), np.cos(np.linspace(0, np.pi, 20))], 1)  # a half circle: open
    order, along, label = boundary_order(arc[::-1])
    assert label == "y" and np.array_equal(order, np.arange(20))
    cube = rng.random((30, 3)) * np.array([1.0, 4.0, 2.0])  # 3-D: along its widest coordinate
    order, along, label = boundary_order(cube)
    assert label == "y" and np.all(np.diff(along) >= 0)
