"""``meshshard dataset --mirror``: each training sample's mirror equals the sample of its mirrored
file, written by hand, in every array (coordinates, cells, derived wall inputs, targets, parameters);
the split is left as it is; a sample that is its own mirror is not added; each refusal is one line."""

from __future__ import annotations

import json
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import mirrored_channels, open_dataset
from meshshard.data._mirror import MirrorRequest, mirror_mesh
from tests._refusals import assert_refused_in_one_line
from tests.data.test_wall_geometry import _disc

#: (camber, speed) per case: c0 is symmetric (its own mirror at camber 0), v is validation.
CASES = {"a": (0.03, 1.0), "b": (-0.01, 2.0), "c0": (0.0, 1.5), "v": (0.02, 1.2)}


def _fields(pts: np.ndarray, camber: float, speed: float) -> dict[str, np.ndarray]:
    """Fields with no symmetry in y, from the parameters."""
    x, y = pts[:, 0], pts[:, 1]
    return {"p": speed * (x + 2 * y * y) + camber * y, "U": np.c_[speed + x * y, camber + y - x * x, 0 * x],
            "T": np.c_[x, y, x * y]}


def _case(path: Path, pts: np.ndarray, tri: np.ndarray, edges: np.ndarray, camber: float, speed: float,
          mirrored: bool = False) -> None:
    """A case on the disc mesh as a gmsh 2.2 file, the body's edges its physical group ``body``;
    ``mirrored``: the mirrored case as a solver would give it, written by hand (node i at (x, -y)
    with what node i carried at (x, y), U's y negated; each cell's nodes reordered)."""
    fields = _fields(pts, camber, speed)
    if mirrored:
        pts, tri, edges = pts * [1, -1], tri[:, [0, 2, 1]], edges[:, ::-1]
        fields["U"][:, 1] *= -1
    meshio.write(path, meshio.Mesh(np.c_[pts, np.zeros(len(pts))], [("line", edges), ("triangle", tri)],
                                   point_data=fields,
                                   cell_data={"gmsh:physical": [np.full(len(edges), 1), np.full(len(tri), 2)],
                                              "gmsh:geometrical": [np.full(len(edges), 1), np.full(len(tri), 2)]},
                                   field_data={"body": np.array([1, 1]), "fluid": np.array([2, 2])}),
                 file_format="gmsh22", binary=True)


def _write(root: Path) -> None:
    disc, body = _disc(hole=True)
    pts, tri = disc.points, disc.cells_dict["triangle"]
    on = np.zeros(len(pts), bool)
    on[body] = True
    edges = np.sort(np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]]), axis=1)
    edges = np.unique(edges[on[edges].all(1)], axis=0)
    (root / "cases").mkdir(parents=True)
    (root / "by-hand").mkdir()
    rows = ["sample,camber,speed"]
    for name, (camber, speed) in CASES.items():
        _case(root / "cases" / f"{name}.msh", pts, tri, edges, camber, speed)
        rows.append(f"{name},{camber},{speed}")
    _case(root / "by-hand" / "a.msh", pts, tri, edges, *CASES["a"], mirrored=True)
    (root / "params.csv").write_text("\n".join(rows) + "\n")
    (root / "by-hand.csv").write_text(f"sample,camber,speed\na,{-CASES['a'][0]},{CASES['a'][1]}\n")


def _args(root: Path, sources: str, out: str, params: str, *extra: str) -> list[str]:
    return ["dataset", str(root / sources), "--out", str(root / out), "--inputs", "pos", "--targets", "p,U",
            "--params", str(root / params), "--target-scale", "U=speed,p=speed**2+camber", "--wall-distance", "body",
            "--wall-normal", "body", "--signed-distance", "body", "--dtype", "float64", "--quiet", *extra]


def test_a_mirrored_sample_is_the_sample_of_its_mirrored_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _write(tmp_path)
    assert main(_args(tmp_path, "cases", "data", "params.csv", "--val-samples", "v", "--mirror", "y:U",
                      "--mirror-params", "camber")) == 0
    err = capsys.readouterr().err
    assert "1 training sample is its own mirror (--mirror-params camber all 0), not mirrored: c0" in err
    assert "distinct meshes" not in err  # the mirrors are on the mirror of the mesh: not a mesh changed by mistake
    assert main(_args(tmp_path, "by-hand", "hand", "by-hand.csv", "--val-fraction", "0")) == 0
    assert main(["info", str(tmp_path / "data")]) == 0
    assert ("mirror   2 training samples are mirrors in y of others (--mirror: U's y, camber negated), named "
            "<name>~mirror-y") in capsys.readouterr().out
    data, hand = open_dataset(tmp_path / "data"), open_dataset(tmp_path / "hand")
    meta = json.loads((tmp_path / "data" / "dataset.json").read_text())
    names = [*CASES, "a~mirror-y", "b~mirror-y"]
    assert meta["split"] == {"train": [0, 1, 2, 4, 5], "val": [3]}  # the validation case is never mirrored
    assert meta["mirror"] == {"axis": "y", "vectors": ["U"], "parameters": ["camber"], "in_prior": False,
                              "samples": {"a~mirror-y": "a", "b~mirror-y": "b"}}
    assert meta["parameters"]["values"][4:] == [[-0.03, 1.0], [0.01, 2.0]]
    assert [s["name"] for s in meta["samples"]] == names
    s = names.index("a~mirror-y")
    x, y = data.sample_arrays(s)
    hx, hy = hand.sample_arrays(0)
    np.testing.assert_array_equal(x, hx)  # pos, wall distance, offset, normal, signed distance, parameters
    np.testing.assert_array_equal(y, hy)  # p and U over their scales at the mirrored parameters
    m, hm = data.sample_mesh(s), hand.sample_mesh(0)
    np.testing.assert_array_equal(data.mesh_points(m), hand.mesh_points(hm))
    np.testing.assert_array_equal(data.mesh_cells(m, "triangle"), hand.mesh_cells(hm, "triangle"))
    np.testing.assert_array_equal(data.boundary(m, "body")[0], hand.boundary(hm, "body")[0])
    # and it is the original's mirror: y-components negated, the rest the same
    x0, y0 = data.sample_arrays(0)
    channels = meta["input_channels"]
    flip = np.array([c in ("pos[1]", "wall_offset[1]", "wall_normal[1]", "camber") for c in channels])
    assert flip.sum() == 4
    np.testing.assert_array_equal(mirrored_channels(meta, meta["inputs"]), flip)  # the rule predict mirrors with
    assert mirrored_channels(meta, meta["targets"]).tolist() == [False, False, True, False]
    np.testing.assert_allclose(x, np.where(flip, -x0, x0), rtol=0, atol=1e-15)
    assert meta["target_channels"] == ["p", "U[0]", "U[1]", "U[2]"]
    np.testing.assert_allclose(y[:, 2], -y0[:, 2], rtol=1e-15)
    np.testing.assert_allclose(y[:, [1, 3]], y0[:, [1, 3]], rtol=1e-15)
    np.testing.assert_allclose(y[:, 0] * (1 - 0.03), y0[:, 0] * (1 + 0.03), rtol=1e-14)  # p over speed**2 +- camber


def test_mirrored_cells_keep_their_orientation() -> None:
    """Each cell type's reordered mirror has the orientation of the original: the signed area of a
    face, the signed volume spanned at node 0 by its three edges of a solid."""
    cells = {"triangle": ([[0, 0, 0], [1, 0, 0], [0, 1, 0]], None),
             "quad": ([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], None),
             "polygon": ([[0, 0, 0], [1, 0, 0], [1.5, 1, 0], [0.5, 1.5, 0], [-0.5, 1, 0]], None),
             "tetra": ([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], (1, 2, 3)),
             "pyramid": ([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0.5, 0.5, 1]], (1, 3, 4)),
             "wedge": ([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [0, 1, 1]], (1, 2, 3)),
             "hexahedron": ([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1]],
                            (1, 3, 4))}

    def orientation(pts: np.ndarray, conn: np.ndarray, edges: tuple[int, ...] | None) -> float:
        p = pts[conn]
        if edges is None:  # a face in z = 0: its signed area (shoelace)
            return float(np.sum(p[:, 0] * np.roll(p[:, 1], -1) - np.roll(p[:, 0], -1) * p[:, 1]))
        return float(np.linalg.det(p[list(edges)] - p[0]))

    for axis in ("x", "y", "z"):
        for cell_type, (points, edges) in cells.items():
            if edges is None and axis == "z":
                continue  # a face in z = 0 is its own mirror in z
            pts = np.asarray(points, dtype=float)
            conn = np.arange(len(pts))[None]
            mesh = meshio.Mesh(pts, [(cell_type, conn)])
            mirrored = mirror_mesh(mesh, MirrorRequest(axis), ["pos"], Path("m.vtu"))
            before = orientation(pts, conn[0], edges)
            after = orientation(mirrored.points, mirrored.cells[0].data[0], edges)
            assert before > 0 and after == pytest.approx(before), (axis, cell_type)
            assert sorted(mirrored.cells[0].data[0]) == list(range(len(pts)))
    np.testing.assert_array_equal(mesh.points, np.asarray(cells["hexahedron"][0], dtype=float))  # not changed
    flat = meshio.Mesh(np.zeros((3, 2)), [("triangle", np.array([[0, 1, 2]]))])
    with pytest.raises(ValueError, match=r"^m.vtu: Expected z coordinates to mirror \(got 2-D points\)$"):
        mirror_mesh(flat, MirrorRequest("z"), ["pos"], Path("m.vtu"))
    with pytest.raises(ValueError, match="Expected cells --mirror can reorder .* \\(got 'triangle6'"):
        mirror_mesh(meshio.Mesh(np.zeros((6, 2)), [("triangle6", np.arange(6)[None])]), MirrorRequest("y"), ["pos"],
                    Path("m.vtu"))


@pytest.mark.parametrize(("extra", "message"), [
    (["--mirror", "w:U"], "Expected --mirror as AXIS[:VECTOR,...], AXIS one of x, y, z (got 'w:U')"),
    (["--mirror", "y:U[1]"], "Expected --mirror to name whole vector fields (U, not U[1])"),
    (["--mirror", "y"], "Expected --mirror to name 'U', a field of 3 components, if it is a vector"),
    (["--mirror", "y:U,T"], "Expected --mirror's vectors among the fields read (got T, not among U, p)"),
    (["--mirror", "y:U", "--mirror-params", "angle"], "Expected --mirror-params among the --params columns camber, "
                                                      "speed (got angle)"),
    (["--mirror-params", "camber"], "Expected --mirror with --mirror-params"),
    (["--mirror-in-prior"], "Expected --mirror with --mirror-in-prior"),
    (["--mirror", "y:U", "--mirror-params", "camber", "--target-scale", "p=camber+0.03", "--val-samples", "c0"],
     "sample a~mirror-y: Expected --target-scale p=camber+0.03 to be non-zero (got 0)"),
])
def test_a_mirror_that_cannot_be_made_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             extra: list[str], message: str) -> None:
    _write(tmp_path)
    args = ["dataset", str(tmp_path / "cases"), "--out", str(tmp_path / "out"), "--inputs", "pos", "--targets",
            "p,U", "--params", str(tmp_path / "params.csv"), "--val-samples", "v", *extra]
    assert_refused_in_one_line(args, message, capsys, tmp_path / "out")


def test_a_sample_named_as_a_mirror_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _write(tmp_path)
    (tmp_path / "cases" / "a.msh").rename(tmp_path / "cases" / "b~mirror-y.msh")
    text = (tmp_path / "params.csv").read_text().replace("\na,", "\nb~mirror-y,")
    (tmp_path / "params.csv").write_text(text)
    assert_refused_in_one_line(["dataset", str(tmp_path / "cases"), "--out", str(tmp_path / "out"), "--inputs", "pos",
                                "--targets", "p,U", "--params", str(tmp_path / "params.csv"), "--val-samples", "v",
                                "--mirror", "y:U"],
                               "Expected no sample named as a mirror is (b~mirror-y: a file of that name", capsys,
                               tmp_path / "out")


@pytest.mark.parametrize("method", ["knn:2", "linear"])
def test_priors_and_baselines_are_made_of_the_solved_cases_and_a_mirror_takes_its_originals(
        tmp_path: Path, capsys: pytest.CaptureFixture, method: str) -> None:
    """With --mirror, every solved sample's prior is what it is without (the mirrors are in no
    prior; the solved cases share one mesh, so a training sample leaves out itself, as on one mesh),
    a mirror's prior is its original's with U's y negated, and a baseline is the same."""
    _write(tmp_path)
    common = ["--mean-field", method, "--val-samples", "v"]
    assert main(_args(tmp_path, "cases", "plain", "params.csv", *common)) == 0
    assert main(_args(tmp_path, "cases", "data", "params.csv", *common, "--mirror", "y:U", "--mirror-params",
                      "camber")) == 0
    plain, data = open_dataset(tmp_path / "plain"), open_dataset(tmp_path / "data")
    meta = data.meta
    assert (meta["mean_field"]["left_out"], meta["mean_field"]["samples"]) == ("sample", 3)
    assert "its original's, mirrored" in meta["mean_field"]["mirrors"]
    assert meta["mean_field"]["sha256"] == plain.meta["mean_field"]["sha256"]  # made of the same cases
    prior = [i for i, c in enumerate(meta["input_channels"]) if c.endswith("_mean") or "_mean[" in c]
    assert [meta["input_channels"][i] for i in prior] == ["p_mean", "U_mean[0]", "U_mean[1]", "U_mean[2]"]
    for s in range(len(CASES)):
        np.testing.assert_array_equal(data.sample_arrays(s)[0], plain.sample_arrays(s)[0])
    for mirror, original in meta["mirror"]["samples"].items():
        got = data.sample_arrays([e["name"] for e in meta["samples"]].index(mirror))[0][:, prior]
        want = plain.sample_arrays(list(CASES).index(original))[0][:, prior] * [1, 1, -1, 1]
        np.testing.assert_array_equal(got, want)
    for name in ("plain", "data"):  # new designs take their prior from the solved cases alone too
        assert main(["dataset", str(tmp_path / "cases" / "v.msh"), "--out", str(tmp_path / f"new-{name}"), "--inputs",
                     "pos", "--params", str(tmp_path / "params.csv"), "--wall-distance", "body", "--wall-normal",
                     "body", "--signed-distance", "body", "--dtype", "float64", "--quiet", "--mean-field-from",
                     str(tmp_path / name)]) == 0
    np.testing.assert_array_equal(*(open_dataset(tmp_path / f"new-{n}").sample_arrays(0)[0] for n in ("plain", "data")))
    for name in ("plain", "data"):
        assert main(["baseline", str(tmp_path / name), "--out", str(tmp_path / f"base-{name}"), "--method", "knn:2",
                     "--no-plots", "--quiet"]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / f"base-{n}" / "metrics.json").read_text())["samples"] for n in ("plain", "data"))
    assert len(a) == 1 and a[0]["fields"] and [r["fields"] for r in a] == [r["fields"] for r in b]


def test_with_mirror_in_prior_the_mirrors_are_cases_of_every_prior(tmp_path: Path) -> None:
    _write(tmp_path)
    common = ["--mean-field", "knn:2", "--val-samples", "v", "--mirror", "y:U", "--mirror-params", "camber"]
    assert main(_args(tmp_path, "cases", "solved", "params.csv", *common)) == 0
    assert main(_args(tmp_path, "cases", "data", "params.csv", *common, "--mirror-in-prior")) == 0
    solved, data = open_dataset(tmp_path / "solved"), open_dataset(tmp_path / "data")
    record = data.meta["mean_field"]
    assert (record["samples"], record["mirrors"], data.meta["mirror"]["in_prior"]) == (
        5, "cases of every prior, as any training sample (--mirror-in-prior)", True)
    assert record["sha256"] != solved.meta["mean_field"]["sha256"]
    v = list(CASES).index("v")  # its nearest cases now among the mirrors too
    assert np.abs(data.sample_arrays(v)[0][:, -4:] - solved.sample_arrays(v)[0][:, -4:]).max() > 1e-3


def test_a_mirrors_priors_along_the_wall_and_by_position_are_its_originals_mirrored(tmp_path: Path) -> None:
    """With ``--map-along body --position-prior-inputs`` a sample carries two priors; a mirror's are
    both its original's, mirrored (U's y negated in each)."""
    _write(tmp_path)
    assert main(_args(tmp_path, "cases", "data", "params.csv", "--mean-field", "knn:2", "--val-samples", "v",
                      "--map-along", "body", "--position-prior-inputs", "--mirror", "y:U", "--mirror-params",
                      "camber")) == 0
    data = open_dataset(tmp_path / "data")
    meta = data.meta
    assert meta["input_channels"][-4:] == [f"{c}_by_position" if "[" not in c else c.replace("[", "_by_position[")
                                           for c in ("p_mean", "U_mean[0]", "U_mean[1]", "U_mean[2]")]
    flip = mirrored_channels(meta, meta["inputs"])[-8:]
    assert flip.tolist() == [False, False, True, False] * 2
    names = [e["name"] for e in meta["samples"]]
    for mirror, original in meta["mirror"]["samples"].items():
        got = data.sample_arrays(names.index(mirror))[0][:, -8:]
        want = data.sample_arrays(names.index(original))[0][:, -8:]
        np.testing.assert_array_equal(got, np.where(flip, -want, want))
