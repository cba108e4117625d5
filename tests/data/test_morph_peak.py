"""A field's peak as a landmark of the maps along a wall (``--map-along body,peak=p``,
:mod:`meshshard.data._morph`): where a peak sits along the wall, found between its nodes; a map that
carries the source's peak onto the target's place for it; and a prior that blends cases whose peaks
sit at different places along the wall, which keeps the peak's height where a blend of the plain
maps flattens it; the baseline the same; the refusals in one line.

The meshes are test_morph's O-grids about an ellipse; the field is a bump along the wall (in the
angle about the ellipse's centre) at a place set by a parameter, as a stagnation point moves with
the angle of attack.
"""

from __future__ import annotations

import json
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import along_walls, node_map, open_dataset, peak_position
from meshshard.data._morph import outline, parse_along_peak, parse_map_along
from tests._refusals import assert_refused_in_one_line
from tests.data.test_morph import _o_grid

HEIGHT, WIDTH, THICKNESS = 1.0, 0.25, 0.12


def _bump(pts: np.ndarray, where: float) -> np.ndarray:
    """A bump of HEIGHT at the angle ``where`` about the ellipse (radians), fading away from the wall."""
    angle = np.arctan2(pts[:, 1] / THICKNESS, pts[:, 0]) % (2 * np.pi)
    gap = np.angle(np.exp(1j * (angle - where)))
    radius = np.hypot(pts[:, 0], pts[:, 1] / THICKNESS)
    return HEIGHT * np.exp(-(gap / WIDTH) ** 2) * np.exp(-2.0 * (radius - 1.0))


def _step(line: object, s: float) -> float:
    """The spacing of the outline's nodes in s about ``s``."""
    k = int(np.clip(np.searchsorted(line.s, s), 1, len(line.s) - 1))
    return float(line.s[k] - line.s[k - 1])


def test_a_peak_is_found_between_nodes_and_carried_to_the_targets_place() -> None:
    pts, quads, wall = _o_grid(THICKNESS)
    line = outline(pts, {"quad": quads}, wall, "m")
    np.testing.assert_array_equal(np.sort(line.nodes), wall)  # the mesh's ids of the wall, in the outline's order
    np.testing.assert_array_equal(pts[line.nodes], line.points)
    for where in (np.pi + 0.013, np.pi + 0.2, 2.1):  # between nodes (the nodes are 2 pi / 96 = 0.065 apart)
        field = _bump(pts, where)
        # the truth: the place along the wall of the wall point at that angle
        truth = np.interp(where, np.unwrap(np.arctan2(line.points[:, 1] / THICKNESS, line.points[:, 0]) % (2 * np.pi)),
                          line.s)
        step = _step(line, truth)  # the wall's nodes are closer together in s where it curves most
        got = peak_position(line, field)
        nearest_node = line.s[np.argmax(field[line.nodes])]
        assert abs(got - truth) < 0.15 * step, (got, truth, step)  # a node's place alone is up to half a step off
        assert abs(got - truth) < abs(nearest_node - truth) or abs(nearest_node - truth) < 0.15 * step
    # a map with the landmarks (target's place, source's place): the source's peak lands at the target's place
    other_pts, other_quads, other_wall = _o_grid(THICKNESS, n_theta=80, turn=0.02)  # another mesh of the same body
    other = outline(other_pts, {"quad": other_quads}, other_wall, "o")
    source_field = _bump(other_pts, np.pi + 0.2)
    at_source = peak_position(other, source_field)
    front = int(np.flatnonzero(line.s == 0.5)[0])  # the leading edge's node
    for node in (front - 3, front, front + 2):
        here = float(line.s[node])
        moved = along_walls(pts, line, other, (here, at_source))
        carried = node_map(other_pts, moved).apply(source_field[:, None])[:, 0]
        assert abs(peak_position(line, carried) - here) < 0.5 * _step(line, here), node
        assert carried[line.nodes[node]] > 0.9 * HEIGHT  # the peak's height kept (linear between the source's nodes)
    # the landmarks at one place on both walls: the plain map
    plain = along_walls(pts, line, other)
    np.testing.assert_allclose(along_walls(pts, line, other, (at_source, at_source)), plain, rtol=0, atol=1e-12)


def _write(path: Path, turn: float, where: float) -> None:
    pts, quads, wall = _o_grid(THICKNESS, turn=turn)
    lines = np.stack([wall, np.roll(wall, -1)], 1)
    p = _bump(pts, where) + 0.05 * pts[:, 0]
    meshio.write(path, meshio.Mesh(np.c_[pts, np.zeros(len(pts))], [("line", lines), ("quad", quads)],
                                   point_data={"p": p, "U": np.c_[np.ones(len(pts)), 0.1 * p, 0 * p]},
                                   cell_data={"gmsh:physical": [np.full(len(lines), 1), np.full(len(quads), 2)],
                                              "gmsh:geometrical": [np.full(len(lines), 1), np.full(len(quads), 2)]},
                                   field_data={"body": np.array([1, 1]), "fluid": np.array([2, 2])}),
                 file_format="gmsh22", binary=True)


@pytest.fixture(scope="module")
def moving(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three cases of one body, each its own mesh, the bump at an angle that moves with ``aoa``;
    ``v`` (aoa 1) is halfway between ``a`` (0) and ``b`` (2), and held out."""
    root = tmp_path_factory.mktemp("moving")
    (root / "cases").mkdir()
    rows = ["sample,aoa"]
    for k, (name, aoa) in enumerate({"a": 0.0, "b": 2.0, "v": 1.0}.items()):
        _write(root / "cases" / f"{name}.msh", turn=0.01 * (k + 1), where=np.pi + 0.2 * aoa)
        rows.append(f"{name},{aoa}")
    (root / "params.csv").write_text("\n".join(rows) + "\n")
    return root


def _args(root: Path, out: str, *extra: str) -> list[str]:
    return ["dataset", str(root / "cases"), "--out", str(root / out), "--inputs", "pos", "--targets", "p,U",
            "--params", str(root / "params.csv"), "--val-samples", "v", "--dtype", "float64", "--quiet", *extra]


def test_a_prior_of_moving_peaks_keeps_the_peak(moving: Path, capsys: pytest.CaptureFixture) -> None:
    root = moving
    assert main(_args(root, "plain", "--mean-field", "linear:2", "--map-along", "body")) == 0
    assert main(_args(root, "peak", "--mean-field", "linear:2", "--map-along", "body,peak=p")) == 0
    plain, peak = open_dataset(root / "plain"), open_dataset(root / "peak")
    assert peak.meta["mean_field"]["along_peak"] == "p" and "along_peak" not in plain.meta["mean_field"]
    assert peak.meta["mean_field"]["along"] == ["body"]
    assert peak.meta["mean_field"]["sha256"] != plain.meta["mean_field"]["sha256"]
    v = [s["name"] for s in peak.meta["samples"]].index("v")
    channel = peak.meta["input_channels"].index("p_mean")
    (x, y), (xp, _) = peak.sample_arrays(v), plain.sample_arrays(v)
    wall = np.asarray(peak.boundary(peak.sample_mesh(v), "body")[0])
    true_peak = y[wall, 0].max()
    # halfway between two bumps 0.4 radians apart: blended in place, the two halves of the prior are low humps
    assert xp[wall, channel].max() < 0.6 * true_peak
    assert abs(x[wall, channel].max() - true_peak) < 0.05 * true_peak
    near = np.hypot(x[:, 0], x[:, 1] / THICKNESS) < 2.0
    err_peak, err_plain = (np.linalg.norm(prior[near, channel] - y[near, 0]) / np.linalg.norm(y[near, 0])
                           for prior in (x, xp))
    # 23% against 44%: the bump is narrower along the wall where the wall curves most, so the two
    # sources' bumps differ in width as well as in place, which the landmark does not mend
    assert err_peak < 0.6 * err_plain, (err_peak, err_plain)
    assert main(["info", str(root / "peak")]) == 0
    assert "the peaks of p on it made to meet" in capsys.readouterr().out
    # new designs are mapped as the training dataset mapped its own, peaks and all
    assert main(["dataset", str(root / "cases" / "v.msh"), "--out", str(root / "new"), "--inputs", "pos", "--params",
                 str(root / "params.csv"), "--dtype", "float64", "--quiet", "--mean-field-from", str(root / "peak")]) == 0
    np.testing.assert_allclose(open_dataset(root / "new").sample_arrays(0)[0], x, rtol=1e-12, atol=1e-14)
    # the baseline: linear:2 with the peaks made to meet is the prior above; without, the plain prior
    for name, along in (("base-plain", "body"), ("base-peak", "body,peak=p")):
        assert main(["baseline", str(root / "plain"), "--out", str(root / name), "--method", "linear:2",
                     "--map-along", along, "--near", "body:0.2", "--no-plots", "--quiet"]) == 0
    a, b = (json.loads((root / n / "metrics.json").read_text()) for n in ("base-plain", "base-peak"))
    assert b["baseline"]["along_peak"] == "p" and "along_peak" not in a["baseline"]
    near_a, near_b = (m["samples"][0]["near"]["fields"]["p"]["rel_l2"] for m in (a, b))
    assert near_b < 0.6 * near_a, (near_a, near_b)  # 23% against 44%, as the priors


def test_peak_refusals_are_one_line(moving: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert parse_map_along("body:U,peak=p") == (("body",), ("U",)) and parse_along_peak("body:U,peak=p") == "p"
    assert parse_map_along("upper,lower,peak=p") == (("upper", "lower"), ()) and parse_along_peak("body") is None
    out = tmp_path / "x"
    for extra, message in [
        (["--map-along", "body,peak=T"], "Expected --map-along's peak=FIELD among the targets p, U (got T)"),
        (["--map-along", "body,peak=U"], "Expected --map-along's peak=FIELD to name a field of one component"),
        (["--map-along", "body,peak=p,peak=U"], "Expected --map-along's peak=FIELD once"),
        (["--map-along", "body,peak="], "Expected --map-along's peak=FIELD once"),
    ]:
        args = _args(moving, "unused", "--mean-field", "linear:2", *extra)
        args[args.index("--out") + 1] = str(out)
        assert_refused_in_one_line(args, message, capsys, out)
