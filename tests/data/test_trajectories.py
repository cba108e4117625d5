"""Trajectory datasets (``meshshard dataset --state``): the three kinds of source, times, states,
statistics of the state and its change, node classes, partitions, ``info`` and every bad input."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import (
    Trajectory,
    _trajectories,
    check_partition_matches,
    dataset_partition_folder,
    open_dataset,
    open_trajectories,
    write_trajectories,
)
from meshshard.data._trajectory_build import _tag_classes
from meshshard.partition import load_partition, verify_partition

from ._solver_files import FOAM_CAVITY
from .conftest import grid_triangles


def test_documented_example_is_what_is_written(tmp_path: Path) -> None:
    points = np.array([[i % 3, i // 3] for i in range(6)], dtype=np.float64)
    triangles = np.array([[0, 1, 4], [0, 4, 3], [1, 2, 5], [1, 5, 4]])
    x = points[:, 0]
    folder = write_trajectories(
        tmp_path / "example", [Trajectory(name, points, [("triangle", triangles)], [0.0, 0.5, 1.0],
                                          [(c * t * x)[:, None] for t in range(3)], np.full((6, 1), c),
                                          (x == 0).astype(int)) for name, c in (("a", 1.0), ("b", 2.0))],
        ["a", "b"], state_fields=[{"name": "T", "components": 1}], input_fields=[{"name": "c", "components": 1}],
        node_type_source="field 'node_type'", val_samples=["b"])
    documented = json.loads(re.search(r'val_samples=\["b"\]\)``::\n\n(    \{\n.*?\n    \})\n', _trajectories.__doc__,
                                      flags=re.S).group(1))
    assert json.loads((folder / "dataset.json").read_text()) == documented
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == ["dataset.json", "meshes/00000/cells-triangle.npy", "meshes/00000/points.npy",
                     *[f"samples/0000{s}/{n}.npy" for s in range(2) for n in ("inputs", "node_type", "state")]]
    tr = open_trajectories(folder)
    np.testing.assert_array_equal(tr.state(1, 2, np.array([2, 0])), [[8.0], [0.0]])  # T = c t x: 2 * 2 * 2
    np.testing.assert_array_equal(tr.inputs(1, np.array([5])), [[2.0]])
    assert tr.node_type(0, np.arange(6)).tolist() == [1, 0, 0, 1, 0, 0]


def _mesh(nx: int, ny: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A triangle grid with 3-D points (z = 0), as .vtu stores them, so every source is on it exactly."""
    pts, tri = grid_triangles(nx, ny)
    return np.column_stack([pts * scale, np.zeros(len(pts))]), tri


def _state(pts: np.ndarray, k: int, t: int) -> dict[str, np.ndarray]:
    """The dynamic fields of trajectory k at step t: a 2-component u and a scalar p."""
    x, y = pts[:, 0], pts[:, 1]
    return {"u": np.stack([np.sin(x * (k + 1) + 0.3 * t), np.cos(y + t) * (k + 1)], 1), "p": x * y * t + k}


def _static(pts: np.ndarray, k: int) -> dict[str, np.ndarray]:
    x, y = pts[:, 0], pts[:, 1]
    return {"kappa": 1.0 + x + k, "nt": np.where(x == 0, 4, np.where(y == 0, 1, 0)).astype(np.float64)}


def _write(path: Path, pts: np.ndarray, tri: np.ndarray, fields: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, meshio.Mesh(pts, [("triangle", tri)], point_data=fields))


def _pvd(path: Path, entries: list[tuple[float, str]]) -> Path:
    lines = ['<?xml version="1.0"?>', '<VTKFile type="Collection" version="0.1" byte_order="LittleEndian">',
             "  <Collection>"]
    lines += [f'    <DataSet timestep="{t!r}" group="" part="0" file="{f}"/>' for t, f in entries]
    lines += ["  </Collection>", "</VTKFile>", ""]
    path.write_text("\n".join(lines))
    return path


def _xdmf(path: Path, pts: np.ndarray, tri: np.ndarray, times: list[float], fields: list[dict[str, np.ndarray]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with meshio.xdmf.TimeSeriesWriter(path, data_format="XML") as w:
            w.write_points_cells(pts, [("triangle", tri)])
            for t, f in zip(times, fields):
                w.write_data(t, point_data=f)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """Three trajectories: a .pvd (5 steps, listed out of time order), a folder of numbered files
    (4 steps, numbered 1, 2, 10, 11: ordered by number, not by name) on another mesh, and an .xdmf
    time series (3 steps) on the .pvd's mesh. ``ref[k]``: (times, states (T, N, 3), inputs, classes)."""
    root = tmp_path_factory.mktemp("trajectories")
    meshes = [_mesh(7, 5), _mesh(6, 6, 2.0)]
    ref = []
    pts, tri = meshes[0]
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    for t in range(5):
        _write(root / "flow" / f"flow_{t}.vtu", pts, tri, {**_state(pts, 0, t), **_static(pts, 0)})
    _pvd(root / "flow.pvd", [(times[t], f"flow/flow_{t}.vtu") for t in (3, 0, 4, 1, 2)])
    ref.append((times, pts))
    pts, tri = meshes[1]
    for t, n in enumerate((1, 2, 10, 11)):
        _write(root / "heat" / f"T_{n}.vtu", pts, tri, {**_state(pts, 1, t), **_static(pts, 1)})
    ref.append(([1.0, 2.0, 10.0, 11.0], pts))
    pts, tri = meshes[0]
    _xdmf(root / "series.xdmf", pts, tri, [0.0, 0.5, 1.0], [{**_state(pts, 2, t), **_static(pts, 2)} for t in range(3)])
    ref.append(([0.0, 0.5, 1.0], pts))
    whole = []
    for k, (times, pts) in enumerate(ref):
        states = np.stack([np.column_stack([_state(pts, k, t)["u"], _state(pts, k, t)["p"]]) for t in range(len(times))])
        static = _static(pts, k)
        whole.append({"times": times, "states": states, "inputs": static["kappa"][:, None],
                      "classes": static["nt"].astype(np.int64), "pos": pts})
    return {"root": root, "args": [str(root / "flow.pvd"), str(root / "heat"), str(root / "series.xdmf")],
            "whole": whole}


def _make(sources: dict, out: Path, *extra: str) -> int:
    return main(["dataset", *sources["args"], "--out", str(out), "--state", "u,p", "--inputs", "kappa",
                 "--node-type", "nt", "--val-samples", "series", "--dtype", "float64", "-q", *extra])


@pytest.fixture(scope="module")
def data(sources, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("made") / "data"
    assert _make(sources, out, "--time-stride", "2") == 0
    return out


def test_every_kind_of_source_is_one_trajectory_in_time_order(sources, data) -> None:
    tr = open_trajectories(data)
    assert tr.names == ["flow", "heat", "series"] and tr.time_stride == 2
    assert tr.state_channels == ["u[0]", "u[1]", "p"] and tr.input_channels == ["kappa"]
    assert [tr.dataset.sample_mesh(k) for k in range(3)] == [0, 1, 0]  # the .xdmf is on the .pvd's mesh
    assert tr.dataset.kind == "many-meshes" and tr.dataset.meta["task"] == "transient"
    assert tr.dataset.train.tolist() == [0, 1] and tr.dataset.val.tolist() == [2]
    for k, whole in enumerate(sources["whole"]):
        n = len(whole["pos"])
        assert tr.num_steps(k) == len(whole["times"]) and tr.num_pairs(k) == len(whole["times"]) - 2
        np.testing.assert_array_equal(tr.times(k), whole["times"])
        np.testing.assert_array_equal(tr.state_array(k), whole["states"])
        rows = np.array([n - 1, 0, 3])
        for t in range(tr.num_steps(k)):
            np.testing.assert_array_equal(tr.state(k, t, rows), whole["states"][t, rows])
        np.testing.assert_array_equal(tr.inputs(k, np.arange(n)), whole["inputs"])
        np.testing.assert_array_equal(tr.node_type(k, np.arange(n)), whole["classes"])
        np.testing.assert_array_equal(tr.dataset.mesh(tr.dataset.sample_mesh(k)).points, whole["pos"])
    with pytest.raises(ValueError, match=r"Expected a step in \[0, 5\) of trajectory 0 \(got 5\)"):
        tr.state(0, 5, np.arange(3))


def test_node_classes_with_counts_and_the_default_boundary(sources, data) -> None:
    tr = open_trajectories(data)
    every = np.concatenate([w["classes"] for w in sources["whole"]])
    ids, counts = np.unique(every, return_counts=True)
    assert tr.dataset.meta["node_types"]["source"] == "field 'nt'"
    assert tr.classes == [{"id": int(i), "name": "interior" if i == 0 else None, "boundary": bool(i != 0),
                           "count": int(c)} for i, c in zip(ids, counts)]
    assert tr.class_index(np.array([4, 0, 1])).tolist() == [2, 0, 1]  # the one-hot position, by id


def test_statistics_of_the_state_and_its_change_over_the_stride(sources, data) -> None:
    norm = open_dataset(data).meta["normalisation"]
    train = [sources["whole"][k] for k in (0, 1)]  # the split is by trajectory: series is validation
    state = np.concatenate([w["states"].reshape(-1, 3) for w in train])
    change = np.concatenate([(w["states"][2:] - w["states"][:-2]).reshape(-1, 3) for w in train])
    inputs = np.concatenate([w["inputs"] for w in train])
    for key, values in (("state", state), ("targets", change), ("inputs", inputs)):
        np.testing.assert_allclose(norm[key]["mean"], values.mean(0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(norm[key]["std"], values.std(0), rtol=1e-10, atol=1e-12)
        assert norm[key]["count"] == len(values)


def test_partition_data_works_unchanged(data, tmp_path: Path) -> None:
    assert main(["partition", str(data), "--parts", "3", "--out", str(tmp_path / "parts"), "-q"]) == 0
    dataset = open_dataset(data)
    check_partition_matches(dataset, tmp_path / "parts")
    for m in range(dataset.num_meshes):
        folder = dataset_partition_folder(tmp_path / "parts", m)
        assert verify_partition(folder) == []
        owned = np.concatenate([load_partition(folder, r).owned_ids for r in range(3)])
        assert sorted(owned.tolist()) == list(range(dataset.meta["meshes"][m]["num_nodes"]))


def test_info_shows_trajectories_steps_times_and_classes(data, capsys) -> None:
    capsys.readouterr()
    assert main(["info", str(data)]) == 0
    out = capsys.readouterr().out
    assert "trajectories 3 (train 2, val 1; split by trajectory)" in out
    assert "flow             5 steps, t 0 .. 0.4, dt 0.1, mesh 0 (35 nodes)" in out
    assert "heat             4 steps, t 1 .. 11, uneven dt, mesh 1 (36 nodes)" in out
    assert "series           3 steps, t 0 .. 1, dt 0.5, mesh 0 (35 nodes), val" in out
    assert "u (2), p: the input at step t, the target its change to step t+2" in out
    assert "classes  from field 'nt'" in out
    assert "0 interior" in out and "boundary" in out
    assert main(["info", str(data), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["task"] == "transient" and [s["num_steps"] for s in meta["samples"]] == [5, 4, 3]


def test_a_folder_is_replaced_with_force_and_interior_classes_chosen(sources, tmp_path: Path) -> None:
    out = tmp_path / "again"
    assert _make(sources, out) == 0
    assert _make(sources, out, "--force", "--interior-classes", "0,4") == 0
    tr = open_trajectories(out)
    assert tr.time_stride == 1 and tr.boundary.tolist() == [False, True, False]


def test_boundary_tags_of_a_real_foamtovtk_run(tmp_path: Path) -> None:
    """OpenFOAM's cavity, three iterations of foamToVTK: the patches are the classes (a corner on
    both takes the first, movingWall), and the .series file gives the times."""
    pytest.importorskip("vtk")
    assert main(["dataset", str(FOAM_CAVITY), "--out", str(tmp_path / "d"), "--state", "U,p", "--val-fraction", "0",
                 "-q"]) == 0
    tr = open_trajectories(tmp_path / "d")
    assert tr.names == ["cavity"] and tr.times(0).tolist() == [0.0, 0.005, 0.01]
    assert [(c["id"], c["name"], c["boundary"]) for c in tr.classes] == [
        (0, "interior", False), (1, "movingWall", True), (2, "fixedWalls", True)]
    pos = tr.dataset.mesh(0).points
    classes = tr.node_type(0, np.arange(len(pos)))
    top = np.isclose(pos[:, 1], pos[:, 1].max())
    side = ~top & (np.isclose(pos[:, 0], pos[:, 0].min()) | np.isclose(pos[:, 0], pos[:, 0].max())
                   | np.isclose(pos[:, 1], pos[:, 1].min()))
    assert (classes == np.where(top, 1, np.where(side, 2, 0))).all()
    assert [c["count"] for c in tr.classes] == [int((classes == i).sum()) for i in range(3)]


def test_cell_sets_of_a_lower_dimension_are_boundaries_and_regions_are_not() -> None:
    """As gmsh physical groups come through meshio: named cell sets per block; a set of the mesh's
    own dimension (a region) is no boundary, and gmsh's own entries are skipped."""
    pts, tri = grid_triangles(3, 3)
    lines = np.array([[0, 1], [1, 2], [2, 5]])
    mesh = meshio.Mesh(pts, [("triangle", tri), ("line", lines)],
                       cell_sets={"fluid": [np.arange(len(tri)), np.array([], dtype=int)],
                                  "inflow": [np.array([], dtype=int), np.array([2])],
                                  "wall": [np.array([], dtype=int), np.array([0, 1])],
                                  "gmsh:bounding_entities": [np.array([0]), np.array([0])]})
    registry = {"wall": 1}
    classes = _tag_classes(mesh, registry)
    assert registry == {"wall": 1, "inflow": 2}
    assert classes.tolist() == [1, 1, 2, 0, 0, 2, 0, 0, 0]  # node 2 is on both: the first set in the file wins


def _gmsh22(step: int) -> str:
    """A unit square of two triangles as gmsh 2.2 writes it: physical groups wall (the line 1-2),
    inflow (2-3) and the region fluid (both triangles), and a node field u at time ``step``."""
    return "\n".join([
        "$MeshFormat", "2.2 0 8", "$EndMeshFormat",
        "$PhysicalNames", "3", '1 1 "wall"', '1 2 "inflow"', '2 3 "fluid"', "$EndPhysicalNames",
        "$Nodes", "4", "1 0 0 0", "2 1 0 0", "3 1 1 0", "4 0 1 0", "$EndNodes",
        "$Elements", "4", "1 1 2 1 1 1 2", "2 1 2 2 2 2 3", "3 2 2 3 1 1 2 3", "4 2 2 3 1 1 3 4", "$EndElements",
        "$NodeData", "1", '"u"', "1", f"{step}.0", "3", str(step), "1", "4",
        *(f"{i + 1} {i * step}.0" for i in range(4)), "$EndNodeData", ""])


def test_gmsh_physical_groups_of_lines_are_the_classes(tmp_path: Path) -> None:
    for step in range(3):
        (tmp_path / "square").mkdir(exist_ok=True)
        (tmp_path / "square" / f"square_{step}.msh").write_text(_gmsh22(step))
    assert main(["dataset", str(tmp_path / "square"), "--out", str(tmp_path / "d"), "--state", "u",
                 "--val-fraction", "0", "-q"]) == 0
    tr = open_trajectories(tmp_path / "d")
    assert [(c["id"], c["name"], c["count"]) for c in tr.classes] == [(0, "interior", 1), (1, "wall", 2),
                                                                       (2, "inflow", 1)]
    assert tr.node_type(0, np.arange(4)).tolist() == [1, 1, 2, 0]  # node 1 is on wall and inflow: wall comes first
    np.testing.assert_array_equal(tr.state_array(0)[:, :, 0], [[0, 0, 0, 0], [0, 1, 2, 3], [0, 2, 4, 6]])


@pytest.fixture()
def small(tmp_path: Path) -> dict:
    pts, tri = _mesh(4, 3)
    return {"pts": pts, "tri": tri, "root": tmp_path, "out": tmp_path / "out"}


def _refused(capsys, args: list[str], match: str, out: Path) -> None:
    """One line on stderr matching ``match``, exit 2, and nothing left beside the sources."""
    parent = out.parent
    before = sorted(p.name for p in parent.iterdir())
    capsys.readouterr()
    assert main(["dataset", *args, "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("meshshard dataset: error: "), err
    assert re.search(match, err), err
    assert sorted(p.name for p in parent.iterdir()) == before


def _steps(small: dict, folder: str, count: int, **change) -> Path:
    """``count`` numbered steps of u and p in ``folder``; ``change[t]`` edits step t's (pts, fields)."""
    for t in range(count):
        pts, fields = small["pts"], {**_state(small["pts"], 0, t), **_static(small["pts"], 0)}
        if f"s{t}" in change:
            pts, fields = change[f"s{t}"](pts.copy(), fields)
        _write(small["root"] / folder / f"u_{t:03d}.vtu", pts, small["tri"], fields)
    return small["root"] / folder


def test_a_trajectory_of_one_step(small, capsys) -> None:
    folder = _steps(small, "one", 1)
    _refused(capsys, [str(folder), "--state", "u"], r"one: Expected a trajectory of at least two steps \(got 1 step\)",
             small["out"])


def test_a_single_mesh_file_is_no_trajectory(small, capsys) -> None:
    folder = _steps(small, "two", 2)
    _refused(capsys, [str(folder / "u_000.vtu"), "--state", "u"],
             r"u_000.vtu: Expected a trajectory: a .pvd collection, an .xdmf time series or a folder of numbered "
             r"files \(got a single .vtu file, one step\)", small["out"])


def test_steps_on_different_meshes(small, capsys) -> None:
    def moved(pts, fields):
        pts[3, 0] += 0.01
        return pts, fields

    folder = _steps(small, "moved", 4, s2=moved)
    _refused(capsys, [str(folder), "--state", "u"], r"u_002.vtu: Expected every step of a trajectory on one mesh, "
             r".*u_000.vtu's \(got the same number of nodes at other coordinates: up to 0.01 apart, at node 3",
             small["out"])


def test_times_that_do_not_increase(small, capsys) -> None:
    pts, tri = small["pts"], small["tri"]
    fields = [_state(pts, 0, t) for t in range(3)]
    series = _xdmf(small["root"] / "back.xdmf", pts, tri, [0.0, 0.2, 0.1], fields)
    _refused(capsys, [str(series), "--state", "u"], r"back.xdmf: Expected times that increase from step to step "
             r"\(got t=0.1 at step 2 after t=0.2 at step 1\)", small["out"])
    _steps(small, "twice", 2)
    pvd = _pvd(small["root"] / "twice.pvd", [(0.5, "twice/u_000.vtu"), (0.5, "twice/u_001.vtu")])
    _refused(capsys, [str(pvd), "--state", "u"], r"twice.pvd: Expected times that increase .*t=0.5 at u_001.vtu after "
             r"t=0.5 at u_000.vtu", small["out"])


def test_a_state_field_missing_at_some_step(small, capsys) -> None:
    folder = _steps(small, "gap", 3, s1=lambda pts, f: (pts, {k: v for k, v in f.items() if k != "p"}))
    _refused(capsys, [str(folder), "--state", "u,p"], r"u_001.vtu: Expected field 'p' in point_data \(available: u "
             r"\(2 components\), kappa, nt", small["out"])


def test_a_stride_longer_than_a_trajectory(small, capsys) -> None:
    folder = _steps(small, "short", 3)
    _refused(capsys, [str(folder), "--state", "u", "--time-stride", "3"],
             r"short: Expected more steps than --time-stride 3 \(got 3 steps: no step has a target 3 steps later\)",
             small["out"])
    _refused(capsys, [str(folder), "--state", "u", "--time-stride", "0"], r"Expected --time-stride >= 1 \(got 0\)",
             small["out"])


def test_bad_node_types_and_options(small, capsys) -> None:
    folder = _steps(small, "ok", 2)
    _refused(capsys, [str(folder), "--state", "u", "--node-type", "kappa"],
             r"u_000.vtu: Expected integers >= 0 in the node-type field 'kappa' \(got 1.333", small["out"])
    _refused(capsys, [str(folder), "--state", "u", "--node-type", "nt", "--interior-classes", "0,7"],
             r"Expected --interior-classes among the node classes found: 0 \(interior\), 1, 4 \(got '7'\)",
             small["out"])
    _refused(capsys, [str(folder), "--state", "u", "--targets", "p"], r"--targets does not apply to trajectories",
             small["out"])
    _refused(capsys, [str(folder), "--inputs", "u", "--targets", "p", "--time-stride", "2"],
             r"--time-stride applies to trajectories only \(with --state\)", small["out"])
    _refused(capsys, [str(folder), "--state", "u", "--inputs", "u"], r"Expected --inputs apart from --state",
             small["out"])
    _refused(capsys, [str(folder), "--targets", "p"], r"Expected --inputs NAMES \(or --state NAMES for trajectories\)",
             small["out"])
    shutil.rmtree(folder)


def test_states_beyond_float32_and_meshes_without_edges_are_named(tmp_path: Path) -> None:
    """As for a steady dataset (issue 27 §4): a state finite in float64 but inf in float32 is refused
    naming the trajectory, step and field, not written as inf with Infinity in dataset.json; a
    one-node mesh (no edges) is refused naming the trajectory."""
    pts, tri = grid_triangles(4, 3)

    def traj(name: str, big: float, points=pts, cells=(("triangle", tri),)) -> Trajectory:
        states = [np.ones((len(points), 1)) * t for t in range(3)]
        states[2][-1, 0] = big
        return Trajectory(name, points, list(cells), [0.0, 1.0, 2.0], states, np.ones((len(points), 1)),
                          np.zeros(len(points), dtype=int))

    fields = {"state_fields": [{"name": "T", "components": 1}], "input_fields": [{"name": "c", "components": 1}]}
    with pytest.raises(ValueError, match=r"^b \(step 2\): Expected the values of field 'T' of sample 'b' to fit "
                                         r"float32 \(got 1e\+300 at node 11, .*\)$"):
        write_trajectories(tmp_path / "d", [traj("a", 1.0), traj("b", 1e300)], ["a", "b"], **fields)
    assert not (tmp_path / "d").exists()
    one = [traj(name, 1.0, points=np.zeros((1, 2)), cells=[("vertex", np.array([[0]]))]) for name in ("a", "b")]
    with pytest.raises(ValueError, match=r"^a: Expected a mesh with edges \(got 1 node and no edge\); a graph "
                                         r"network cannot learn on a mesh without edges$"):
        write_trajectories(tmp_path / "e", one, ["a", "b"], **fields)
    assert not (tmp_path / "e").exists()


def test_trajectories_with_and_without_boundary_tags_are_refused(tmp_path: Path, capsys) -> None:
    """A tagged source (gmsh physical groups) beside an untagged one (plain .vtu, or a foamToVTK
    -legacy case) would leave the second's boundary nodes interior without a word."""
    for step in range(3):
        (tmp_path / "tagged").mkdir(exist_ok=True)
        (tmp_path / "tagged" / f"square_{step}.msh").write_text(_gmsh22(step))
        mesh = meshio.read(tmp_path / "tagged" / f"square_{step}.msh")
        (tmp_path / "plain").mkdir(exist_ok=True)
        meshio.write(tmp_path / "plain" / f"square_{step}.vtu",
                     meshio.Mesh(mesh.points, [("triangle", mesh.cells_dict["triangle"])],
                                 point_data={"u": mesh.point_data["u"]}))
    _refused(capsys, [str(tmp_path / "tagged"), str(tmp_path / "plain"), "--state", "u", "--val-fraction", "0"],
             r"plain: Expected boundary tags \(patch files, gmsh physical groups, cell sets\) in every trajectory or "
             r"in none, as node classes \(got .*tagged with tags, .*plain without", tmp_path / "out")
