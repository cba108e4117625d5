"""Maps between meshes along a wall (``--map-along``, :mod:`meshshard.data._morph`): the wall's
outline in order, the identity where the walls are the same, a field of the distance to the wall
and of the place along it carried body to body (where a map by position alone is far off), and
``dataset`` / ``baseline`` with the option (for every target field, or for some:
``--map-along body:U``), and their one-line refusals.

The meshes are O-grids of quads around ellipses of one chord and several thicknesses (a family of
bodies), written as gmsh files whose ``body`` group is the ellipse.
"""

from __future__ import annotations

import json
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import along_walls, node_map, open_dataset
from meshshard.data._morph import outline
from tests._refusals import assert_refused_in_one_line

N_THETA, N_RING, FAR = 96, 14, 4.0


def _o_grid(thickness: float, n_theta: int = N_THETA, turn: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(points, quads, wall node ids): an ellipse of semi-axes 1 and ``thickness`` (its first wall node
    at angle ``turn``), rings out to a circle of radius FAR, closer together near the wall."""
    theta = turn + np.arange(n_theta) * 2 * np.pi / n_theta
    wall = np.stack([np.cos(theta), thickness * np.sin(theta)], 1)
    far = FAR * np.stack([np.cos(theta), np.sin(theta)], 1)
    t = np.linspace(0.0, 1.0, N_RING) ** 2
    pts = np.concatenate([(1 - s) * wall + s * far for s in t])
    i, j = np.meshgrid(np.arange(n_theta), np.arange(N_RING - 1), indexing="ij")
    a = j * n_theta + i
    b = j * n_theta + (i + 1) % n_theta
    quads = np.stack([a, b, b + n_theta, a + n_theta], -1).reshape(-1, 4)
    return pts, quads, np.arange(n_theta)


def _fields(pts: np.ndarray, thickness: float) -> dict[str, np.ndarray]:
    """A field of the place along the wall and the distance from it: what maps body to body."""
    x, y = pts[:, 0], pts[:, 1]
    wall_y = thickness * np.sqrt(np.clip(1 - x * x, 0, 1)) * np.sign(y)
    d = np.abs(y - wall_y)
    return {"p": np.exp(-4 * d) * (1 + x) + 0.1 * x, "U": np.c_[1 - np.exp(-8 * d), 0.2 * x * np.exp(-d), 0 * x]}


def _write(path: Path, thickness: float, turn: float = 0.0) -> None:
    pts, quads, wall = _o_grid(thickness, turn=turn)
    lines = np.stack([wall, np.roll(wall, -1)], 1)
    meshio.write(path, meshio.Mesh(np.c_[pts, np.zeros(len(pts))], [("line", lines), ("quad", quads)],
                                   point_data=_fields(pts, thickness),
                                   cell_data={"gmsh:physical": [np.full(len(lines), 1), np.full(len(quads), 2)],
                                              "gmsh:geometrical": [np.full(len(lines), 1), np.full(len(quads), 2)]},
                                   field_data={"body": np.array([1, 1]), "fluid": np.array([2, 2])}),
                 file_format="gmsh22", binary=True)


def test_the_outline_is_the_wall_in_order_from_its_landmarks() -> None:
    pts, quads, wall = _o_grid(0.12, turn=0.3)
    line = outline(pts, {"quad": quads}, wall[::-1], "m")  # the order of the ids given does not matter
    assert len(line.points) == N_THETA and line.scale == pytest.approx(1.0, rel=1e-3)  # half the chord
    # from the node of the greatest x (the chord's downstream end), counter-clockwise, to the other end at 0.5
    assert line.points[0, 0] == pts[wall, 0].max()
    assert np.all(np.diff(line.s) > 0) and line.s[0] == 0.0 and line.s[-1] < 1.0
    half = int(np.flatnonzero(line.s == 0.5)[0])
    np.testing.assert_allclose(line.points[half], -line.points[0], atol=1e-12)
    angle = np.unwrap(np.arctan2(line.points[:, 1] / 0.12, line.points[:, 0]))
    assert np.all(np.diff(angle) > 0)  # counter-clockwise
    np.testing.assert_allclose(line.at(line.s), line.points, atol=1e-15)
    with pytest.raises(ValueError, match=r"m: Expected the --map-along wall to be one closed curve \(got 1 piece"):
        outline(pts, {"quad": quads}, wall[:40], "m")
    with pytest.raises(ValueError, match=r"m: Expected a 2-D mesh for --map-along \(got points spanning 3 dim"):
        outline(np.c_[pts, pts[:, :1] ** 2], {"quad": quads}, wall, "m")
    flat = outline(np.c_[pts, np.full(len(pts), 0.5)], {"quad": quads}, wall[::-1], "m")  # a flat mesh in 3-D
    np.testing.assert_array_equal(flat.points, line.points)


def test_the_same_wall_maps_to_itself_and_another_body_maps_body_to_body() -> None:
    pts, quads, wall = _o_grid(0.12)
    same = outline(pts, {"quad": quads}, wall, "a")
    np.testing.assert_array_equal(along_walls(pts, same, same), pts)
    thin_pts, thin_quads, thin_wall = _o_grid(0.06, n_theta=80)  # another thickness, another resolution
    thin = outline(thin_pts, {"quad": thin_quads}, thin_wall, "b")
    moved = along_walls(pts, same, thin)
    # the wall of one lands on the wall of the other, and far from it nothing moves
    on_thin = np.abs(moved[wall, 1]) - 0.06 * np.sqrt(np.clip(1 - moved[wall, 0] ** 2, 0, 1))
    assert np.abs(on_thin).max() < 2e-3
    far = np.linalg.norm(pts, axis=1) > 3.5
    assert np.abs(moved[far] - pts[far]).max() < 1e-4
    # a field of the place along the wall and the distance from it, carried from the thin body onto the thick one
    truth = _fields(pts, 0.12)["p"]
    source = _fields(thin_pts, 0.06)["p"]
    by_position = node_map(thin_pts, pts).apply(source[:, None])[:, 0]
    along = node_map(thin_pts, moved).apply(source[:, None])[:, 0]
    near = np.linalg.norm(pts, axis=1) < 1.5
    error_position, error_along = (np.linalg.norm((got - truth)[near]) / np.linalg.norm(truth[near])
                                   for got in (by_position, along))
    assert error_along < 0.02 and error_position > 5 * error_along, (error_along, error_position)  # 1.4%, 10.7%


def _args(root: Path, out: str, *extra: str) -> list[str]:
    return ["dataset", str(root / "cases"), "--out", str(root / out), "--inputs", "pos", "--targets", "p,U",
            "--params", str(root / "params.csv"), "--val-samples", "v", "--dtype", "float64",
            "--quiet", *extra]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("family")
    (root / "cases").mkdir()
    rows = ["sample,thickness"]
    for name, thickness in {"a": 0.06, "b": 0.1, "c": 0.18, "v": 0.14}.items():
        _write(root / "cases" / f"{name}.msh", thickness, turn=0.01 * len(rows))  # each mesh its own
        rows.append(f"{name},{thickness}")
    (root / "params.csv").write_text("\n".join(rows) + "\n")
    return root


def test_a_prior_and_a_baseline_along_the_wall(family: Path, capsys: pytest.CaptureFixture) -> None:
    root = family
    assert main(_args(root, "position", "--mean-field", "linear:2")) == 0
    assert main(_args(root, "along", "--mean-field", "linear:2", "--map-along", "body")) == 0
    position, along = open_dataset(root / "position"), open_dataset(root / "along")
    assert along.meta["mean_field"]["along"] == ["body"] and "along" not in position.meta["mean_field"]
    assert along.meta["mean_field"]["sha256"] != position.meta["mean_field"]["sha256"]  # another prior of the cases
    v = [s["name"] for s in along.meta["samples"]].index("v")
    x, y = along.sample_arrays(v)
    xp, _ = position.sample_arrays(v)
    assert along.meta["input_channels"][-4:] == ["p_mean", "U_mean[0]", "U_mean[1]", "U_mean[2]"]
    near = np.linalg.norm(x[:, :2], axis=1) < 1.3  # pos[0], pos[1]: within 0.3 chords of the wall
    err_along, err_position = (np.linalg.norm(prior[near, :2] - y[near, :2]) / np.linalg.norm(y[near, :2])
                               for prior in (x[:, -4:], xp[:, -4:]))
    assert err_along < 0.5 * err_position, (err_along, err_position)
    # --map-along body:U: U's prior mapped along the wall, p's by position, each as the datasets above
    assert main(_args(root, "split", "--mean-field", "linear:2", "--map-along", "body:U")) == 0
    split = open_dataset(root / "split")
    assert (split.meta["mean_field"]["along"], split.meta["mean_field"]["along_fields"]) == (["body"], ["U"])
    assert len({d.meta["mean_field"]["sha256"] for d in (split, along, position)}) == 3
    for s in range(split.num_samples):
        got = split.sample_arrays(s)[0]
        np.testing.assert_array_equal(got[:, -4], position.sample_arrays(s)[0][:, -4])
        np.testing.assert_array_equal(got[:, -3:], along.sample_arrays(s)[0][:, -3:])
    # --position-prior-inputs: the prior along the wall as the offset, and the one by position as four more inputs
    assert main(_args(root, "both", "--mean-field", "linear:2", "--map-along", "body", "--position-prior-inputs")) == 0
    both = open_dataset(root / "both")
    assert both.meta["input_channels"][-8:] == ["p_mean", "U_mean[0]", "U_mean[1]", "U_mean[2]", "p_mean_by_position",
                                                "U_mean_by_position[0]", "U_mean_by_position[1]", "U_mean_by_position[2]"]
    assert both.meta["mean_field"]["position_inputs"] is True
    assert both.meta["normalisation"]["target_offset"] == along.meta["normalisation"]["target_offset"]
    assert both.meta["mean_field"]["sha256"] != along.meta["mean_field"]["sha256"]
    for s in range(both.num_samples):
        got = both.sample_arrays(s)[0]
        np.testing.assert_array_equal(got[:, -8:-4], along.sample_arrays(s)[0][:, -4:])
        np.testing.assert_array_equal(got[:, -4:], position.sample_arrays(s)[0][:, -4:])
    assert main(["info", str(root / "both")]) == 0
    assert "by position too, as the inputs <target>_mean_by_position" in capsys.readouterr().out
    # new designs take the prior as the training dataset made its own: along its wall
    assert main(["dataset", str(root / "cases" / "v.msh"), "--out", str(root / "new"), "--inputs", "pos", "--params",
                 str(root / "params.csv"), "--dtype", "float64", "--quiet", "--mean-field-from",
                 str(root / "along")]) == 0
    np.testing.assert_allclose(open_dataset(root / "new").sample_arrays(0)[0], x, rtol=1e-12, atol=1e-14)
    assert main(["dataset", str(root / "cases" / "v.msh"), "--out", str(root / "new-both"), "--inputs", "pos",
                 "--params", str(root / "params.csv"), "--dtype", "float64", "--quiet", "--mean-field-from",
                 str(root / "both")]) == 0
    np.testing.assert_allclose(open_dataset(root / "new-both").sample_arrays(0)[0], both.sample_arrays(v)[0], rtol=1e-12,
                               atol=1e-14)
    for name, extra in (("base-position", []), ("base-along", ["--map-along", "body"])):
        assert main(["baseline", str(root / "position"), "--out", str(root / name), "--method", "nearest",
                     "--near", "body:0.3", "--no-plots", "--quiet", *extra]) == 0
    a, b = (json.loads((root / n / "metrics.json").read_text()) for n in ("base-position", "base-along"))
    assert b["baseline"]["along"] == ["body"] and "along" not in a["baseline"]
    near_a, near_b = (m["samples"][0]["near"]["fields"] for m in (a, b))
    assert near_b["p"]["rel_l2"] < 0.5 * near_a["p"]["rel_l2"] and near_b["U"]["rel_l2"] < 0.5 * near_a["U"]["rel_l2"]


def test_map_along_refusals_are_one_line(family: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = family
    out = tmp_path / "x"
    cases = [
        (["--map-along", "body"], "Expected --mean-field with --map-along"),
        (["--mean-field", "knn:1", "--map-along", "wing"], "Expected the --map-along boundaries among the mesh's"),
        (["--mean-field", "knn:1", "--map-along", ","], "Expected --map-along as comma-separated boundary names"),
        (["--mean-field", "knn:1", "--map-along", "body:T"], "Expected --map-along's fields among the targets p, U "
                                                              "(got T)"),
        (["--mean-field", "knn:1", "--position-prior-inputs"], "Expected --map-along with --position-prior-inputs"),
    ]
    for extra, message in cases:
        args = _args(root, "unused", *extra)
        args[args.index("--out") + 1] = str(out)
        assert_refused_in_one_line(args, message, capsys, out)
    if not (root / "position").exists():
        assert main(_args(root, "position", "--mean-field", "linear:2")) == 0
    assert_refused_in_one_line(["dataset", str(root / "cases" / "v.msh"), "--out", str(out), "--inputs", "pos",
                                "--params", str(root / "params.csv"), "--dtype", "float64", "--quiet", "--mean-field-from",
                                str(root / "position"), "--map-along", "body"],
                               "Expected --map-along with --mean-field, not --mean-field-from", capsys, out)
    assert_refused_in_one_line(["baseline", str(root / "position"), "--out", str(out), "--method", "nearest",
                                "--map-along", "wing"], "Expected the --map-along boundaries among the mesh's",
                               capsys, out)
