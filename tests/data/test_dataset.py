"""Datasets: the documented example, both kinds from .vtu files, statistics, partitions, bad input."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import (
    _dataset,
    build_dataset,
    check_partition_matches,
    dataset_partition_folder,
    open_dataset,
    partition_dataset,
    write_dataset,
    write_dataset_from_pyg,
)
from meshshard.data._statistics import edge_moments
from meshshard.data._writer import Sample, write_samples
from meshshard.partition import load_partition, read_metadata, verify_partition

from .conftest import grid_triangles

SFEPY = Path(__file__).resolve().parents[3] / "shared" / "data" / "sfepy" / "big.mesh"


def _doc_example(folder: Path) -> Path:
    points = np.array([[i % 3, i // 3] for i in range(6)], dtype=np.float64)
    triangles = np.array([[0, 1, 4], [0, 4, 3], [1, 2, 5], [1, 5, 4]])
    inputs = [(s * points[:, 0])[:, None] for s in range(3)]
    targets = [np.stack([points[:, 1], np.full(6, s)], 1) for s in range(3)]
    return write_dataset(folder, inputs, targets, pos=points, cells=[("triangle", triangles)],
                         input_names=["T"], target_names=[("u", 2)], sample_names=["a", "b", "c"],
                         val_samples=[2])


def test_documented_example_is_what_is_written(tmp_path: Path) -> None:
    folder = _doc_example(tmp_path / "example")
    documented = json.loads(re.search(r"val_samples=\[2\]\)``::\n\n(    \{\n.*?\n    \})\n", _dataset.__doc__,
                                      flags=re.S).group(1))
    assert json.loads((folder / "dataset.json").read_text()) == documented
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == ["dataset.json", "meshes/00000/cells-triangle.npy", "meshes/00000/points.npy",
                     *[f"samples/0000{s}/{n}.npy" for s in range(3) for n in ("inputs", "targets")]]
    data = open_dataset(folder)
    assert data.kind == "one-mesh" and data.train.tolist() == [0, 1] and data.val.tolist() == [2]
    x, y = data.rows(1, np.array([2, 0]))
    np.testing.assert_array_equal(x, [[2.0], [0.0]])
    np.testing.assert_array_equal(y, [[0.0, 1.0], [0.0, 1.0]])
    mesh = data.mesh(0)
    assert mesh.sha256 == _dataset.mesh_checksum(mesh.points, mesh.cells) == documented["meshes"][0]["sha256"]
    assert _dataset.FORMAT_VERSION == 2


@pytest.fixture(scope="module")
def mesh() -> tuple[np.ndarray, np.ndarray]:
    """A real 2-D triangle mesh (SfePy's big.mesh) when present, a generated grid otherwise."""
    if SFEPY.exists():
        m = meshio.read(SFEPY)
        return m.points[:, :2].astype(np.float64), np.concatenate([b.data for b in m.cells if b.type == "triangle"])
    pts, tri = grid_triangles(30, 20)
    return pts, tri


def _write_vtu(path: Path, pts: np.ndarray, tri: np.ndarray, **fields: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, meshio.Mesh(pts, [("triangle", tri)], point_data=fields))


def _fields(pts: np.ndarray, s: int) -> dict[str, np.ndarray]:
    return {"T": np.sin(pts[:, 0] * (s + 1)) + s, "u": np.stack([pts[:, 1] * s, pts[:, 0] - s, pts[:, 0] * pts[:, 1]], 1)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory, mesh) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    pts, tri = mesh
    (root / "one").mkdir()
    (root / "many").mkdir()
    for s in range(5):
        _write_vtu(root / "one" / f"s{s}.vtu", pts, tri, **_fields(pts, s))
        scaled = pts * (1 + 0.1 * (s % 3))  # samples 0 and 3 share a mesh, so do 1 and 4
        _write_vtu(root / "many" / f"s{s}.vtu", scaled, tri, **_fields(scaled, s))
    return {"root": root, "one": root / "one", "many": root / "many"}


def _stacked_stats(values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    stacked = np.concatenate(values)
    return stacked.mean(0), stacked.std(0)


def _edge_values(pts: np.ndarray, tri: np.ndarray) -> np.ndarray:
    pairs = np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]])
    pairs = np.unique(np.sort(pairs, axis=1), axis=0)
    both = np.concatenate([pairs, pairs[:, ::-1]])
    rel = pts[both[:, 0]] - pts[both[:, 1]]
    return np.concatenate([rel, np.linalg.norm(rel, axis=1, keepdims=True)], 1)


@pytest.mark.parametrize("kind", ["one", "many"])
def test_both_kinds_from_vtu_files_with_statistics_equal_to_numpy(sources, mesh, tmp_path: Path, kind: str) -> None:
    out = tmp_path / "data"
    assert main(["dataset", str(sources[kind]), "--out", str(out), "--inputs", "T,pos", "--targets", "u",
                 "--val-samples", "s2", "--dtype", "float64", "--quiet"]) == 0
    data = open_dataset(out)
    assert data.kind == ("one-mesh" if kind == "one" else "many-meshes")
    assert data.num_meshes == (1 if kind == "one" else 3)
    assert [data.sample_mesh(s) for s in range(5)] == ([0] * 5 if kind == "one" else [0, 1, 2, 0, 1])
    assert data.input_channels == ["T", "pos[0]", "pos[1]", "pos[2]"]
    assert data.target_channels == ["u[0]", "u[1]", "u[2]"]
    assert data.meta["targets"] == [{"name": "u", "components": 3}]
    assert data.train.tolist() == [0, 1, 3, 4] and data.val.tolist() == [2]
    pts, tri = mesh
    xs, ys, es = [], [], []
    for s in data.train:
        p = np.column_stack([pts * (1 + 0.1 * (s % 3)) if kind == "many" else pts, np.zeros(len(pts))])
        f = _fields(p[:, :2], int(s))
        xs.append(np.column_stack([f["T"], p]))
        ys.append(f["u"])
        es.append(_edge_values(p, tri))
        x, y = data.rows(int(s), np.arange(len(pts)))
        np.testing.assert_allclose(x, xs[-1], rtol=1e-12, atol=1e-12)
    norm = data.normalisation
    for stats, values in ((norm.inputs, xs), (norm.targets, ys), (norm.edges, es)):
        mean, std = _stacked_stats(values)
        np.testing.assert_allclose(stats.mean, mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(stats.std, std, rtol=1e-10, atol=1e-12)
        assert stats.count == sum(len(v) for v in values)
    assert norm.inputs.std[3] == 0 and norm.inputs.scale[3] == 1.0  # z is flat: divided by 1, said so


def test_reader_touches_only_the_rows_asked_for(tmp_path: Path) -> None:
    """The sample arrays are memory maps: rows are read by fancy indexing, never the whole file."""
    pts, tri = grid_triangles(4, 3)
    write_dataset(tmp_path / "d", np.ones((2, len(pts), 2)), np.ones((2, len(pts), 1)), pos=pts,
                  cells=[("triangle", tri)], val_fraction=0.0)
    data = open_dataset(tmp_path / "d")
    inputs, targets = data.sample_arrays(1)
    assert isinstance(inputs, np.memmap) and isinstance(targets, np.memmap)
    # Damage every row but 0 and 5 on disk: reading those rows still works and sees no damage.
    file = tmp_path / "d" / "samples" / "00001" / "inputs.npy"
    raw = np.load(file, mmap_mode="r+")
    raw[[1, 2, 3, 4] + list(range(6, len(pts)))] = np.nan
    raw.flush()
    x, _ = data.rows(1, np.array([5, 0]))
    np.testing.assert_array_equal(x, np.ones((2, 2)))


def test_partition_a_dataset_of_each_kind(sources, tmp_path: Path) -> None:
    for kind, meshes in (("one", 1), ("many", 3)):
        data = build_dataset([sources[kind]], tmp_path / f"d-{kind}", inputs="T", targets="u[0]")
        parts = tmp_path / f"p-{kind}"
        assert main(["partition", str(data), "--parts", "3", "--out", str(parts), "--quiet"]) == 0
        check_partition_matches(data, parts)
        dataset = open_dataset(data)
        for m in range(meshes):
            folder = dataset_partition_folder(parts, m)
            assert folder == (parts if kind == "one" else parts / f"mesh-{m:05d}")
            meta = read_metadata(folder)
            assert meta["input"] == {"kind": "dataset", "name": f"d-{kind}/meshes/{m:05d}",
                                     "sha256": dataset.meta["meshes"][m]["sha256"]}
            assert meta["num_nodes"] == dataset.meta["meshes"][m]["num_nodes"] and meta["num_parts"] == 3
            assert verify_partition(folder) == []
            assert load_partition(folder, 2).num_nodes == meta["num_nodes"]
        # --force replaces our folder; a re-run gives the same partition.
        assert main(["partition", str(data), "--parts", "3", "--out", str(parts), "--quiet", "--force"]) == 0


def test_a_partition_of_another_dataset_is_refused(sources, mesh, tmp_path: Path) -> None:
    one = build_dataset([sources["one"]], tmp_path / "one", inputs="T", targets="u")
    many = build_dataset([sources["many"]], tmp_path / "many", inputs="T", targets="u")
    partition_dataset(one, tmp_path / "p-one", 2)
    partition_dataset(many, tmp_path / "p-many", 2)
    with pytest.raises(ValueError, match=r"p-one: partition made for another dataset \(1 mesh; .*many has 3\)"):
        check_partition_matches(many, tmp_path / "p-one")
    pts, tri = mesh
    other = write_dataset(tmp_path / "other", [np.ones((len(pts), 1))], [np.ones((len(pts), 1))],
                          pos=pts + 1.0, cells=[("triangle", tri)])
    with pytest.raises(ValueError, match=r"partition made for another dataset \(mesh 0: mesh checksum \w+ vs \w+ in"):
        check_partition_matches(other, tmp_path / "p-one")
    from meshshard.partition import partition_file
    _write_vtu(tmp_path / "m.vtu", pts, tri)
    partition_file(tmp_path / "m.vtu", tmp_path / "p-file", 2)
    with pytest.raises(ValueError, match=r"mesh 0: not made from a dataset"):
        check_partition_matches(one, tmp_path / "p-file")


def test_numpy_and_pyg_writers_agree(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch_geometric.data import Data

    pts, tri = grid_triangles(5, 4)
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(len(pts), 2)) for _ in range(3)]
    ys = [rng.normal(size=(len(pts), 1)) for _ in range(3)]
    a = write_dataset(tmp_path / "a", xs, ys, pos=pts, cells={"triangle": tri}, val_samples=[1], dtype="float64")
    data = [Data(x=torch.tensor(x), y=torch.tensor(y), pos=torch.tensor(pts), face=torch.tensor(tri.T)) for x, y in zip(xs, ys)]
    b = write_dataset_from_pyg(tmp_path / "b", data, val_samples=[1], dtype="float64")
    assert json.loads((a / "dataset.json").read_text()) == json.loads((b / "dataset.json").read_text())
    # edge_index only (a graph, no cells): stored as such, same edge statistics as the cells' graph.
    pairs = np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]]).T
    data = [Data(x=torch.tensor(x), y=torch.tensor(y), pos=torch.tensor(pts), edge_index=torch.tensor(pairs)) for x, y in zip(xs, ys)]
    c = write_dataset_from_pyg(tmp_path / "c", data, val_samples=[1], input_names=["p", "q"], target_names=["r"])
    dc = open_dataset(c)
    assert dc.input_channels == ["p", "q"] and dc.mesh(0).cells == [] and dc.mesh(0).edge_index.shape == pairs.shape
    np.testing.assert_allclose(dc.normalisation.edges.std, open_dataset(a).normalisation.edges.std, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Bad input: one line naming the file and the problem, exit 2, nothing left behind.


def _fails(args: list[str], capsys, out: Path, pattern: str) -> None:
    capsys.readouterr()
    assert main(["dataset", *args, "--out", str(out), "--quiet"]) == 2
    *notes, error = capsys.readouterr().err.splitlines()  # notes (a field both input and target) may come first
    assert all(line.startswith("meshshard dataset: note: ") for line in notes), notes
    assert error.startswith("meshshard dataset: error: ") and re.search(pattern, error), error
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp")]


def test_unknown_field_lists_the_available_ones(sources, tmp_path: Path, capsys) -> None:
    _fails([str(sources["one"]), "--inputs", "Tx", "--targets", "u"], capsys, tmp_path / "d",
           r"meshshard dataset: error: .*s0\.vtu: Expected field 'Tx' in point_data \(available: T, u \(3 components\); "
           r"and pos for the coordinates\)")


def test_a_field_that_is_cell_data_says_so(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(tmp_path / "a.vtu", meshio.Mesh(pts, [("triangle", tri)], cell_data={"k": [np.ones(len(tri))]}))
    _fails([str(tmp_path / "a.vtu"), "--inputs", "k", "--targets", "pos"], capsys, tmp_path / "d",
           r"a\.vtu: Expected field 'k' in point_data \(available: none; and pos for the coordinates\); 'k' is there as "
           r"cell data \(a value per cell\), and meshshard needs point fields: interpolate it to the nodes first "
           r"\(ParaView: Cell Data to Point Data\)$")
    _fails([str(tmp_path / "a.vtu"), "--inputs", "k[0]", "--targets", "pos"], capsys, tmp_path / "d",
           r"Expected field 'k\[0\]' in point_data .*; 'k' is there as cell data")


def test_what_a_source_folder_holds_besides_meshes_is_skipped_with_one_note(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(4, 3)
    cases = tmp_path / "cases"
    (cases / "old").mkdir(parents=True)
    (cases / "more").mkdir()
    for name in ("a.vtu", "b.vtu", "old/c.vtu"):
        _write_vtu(cases / name, pts, tri, T=np.ones(len(pts)))
    for name in ("notes.txt", "README", "run.py", "x.csv", ".hidden"):
        (cases / name).write_text("not a mesh")
    capsys.readouterr()
    assert main(["dataset", str(cases), "--out", str(tmp_path / "d"), "--inputs", "T", "--targets", "pos", "-q"]) == 0
    assert capsys.readouterr().err == (
        f"meshshard dataset: note: skipped 4 files meshio does not read ({cases / 'README'}, {cases / 'notes.txt'}, "
        f"{cases / 'run.py'} ... and 1 more) and 2 subfolders ({cases / 'more'}, {cases / 'old'}); subfolders are not "
        "searched (name one in SOURCES to read its mesh files)\n")
    assert [s["name"] for s in open_dataset(tmp_path / "d").meta["samples"]] == ["a", "b"]
    assert main(["dataset", str(cases / "old"), "--out", str(tmp_path / "e"), "--inputs", "T", "--targets", "pos", "-q"]) == 0
    assert capsys.readouterr().err == ""  # nothing skipped, nothing said


def test_field_of_the_wrong_length(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(4, 3)
    _write_vtu(tmp_path / "a.vtu", pts, tri, T=np.ones(len(pts)))
    # A legacy VTK file (written by hand: meshio refuses to write it) whose field is one value short.
    lines = ["# vtk DataFile Version 4.2", "bad", "ASCII", "DATASET UNSTRUCTURED_GRID",
             f"POINTS {len(pts)} double", *[f"{x} {y} 0" for x, y in pts],
             f"CELLS {len(tri)} {4 * len(tri)}", *[f"3 {a} {b} {c}" for a, b, c in tri],
             f"CELL_TYPES {len(tri)}", *["5"] * len(tri),
             f"POINT_DATA {len(pts)}", "SCALARS T double 1", "LOOKUP_TABLE default", *["1.0"] * (len(pts) - 1)]
    (tmp_path / "b.vtk").write_text("\n".join(lines) + "\n")
    _fails([str(tmp_path / "a.vtu"), str(tmp_path / "b.vtk"), "--inputs", "T", "--targets", "T"], capsys,
           tmp_path / "d", r"b\.vtk: (Expected point_data field 'T' to have one value per node, 12 \(got shape \(11,\)\)"
           r"|meshio cannot read it \(.*)")
    with pytest.raises(ValueError, match=r"sample 1 \('00001'\): Expected inputs of shape \(12, 1\), one row per node \(got \(11, 1\)\)"):
        write_dataset(tmp_path / "e", [np.ones((12, 1)), np.ones((11, 1))], [np.ones((12, 1))] * 2, pos=pts,
                      cells=[("triangle", tri)])
    assert not (tmp_path / "e").exists()


def test_nan_or_inf_names_the_sample_and_node(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(4, 3)
    t = np.ones(len(pts))
    _write_vtu(tmp_path / "a.vtu", pts, tri, T=t)
    t = t.copy()
    t[7] = np.inf
    _write_vtu(tmp_path / "b.vtu", pts, tri, T=t)
    _fails([str(tmp_path), "--inputs", "pos", "--targets", "T"], capsys, tmp_path / "d",
           r"b\.vtu: Expected finite values in field 'T' of sample 'b' \(got inf at node 7; 1 non-finite value in all\)")


def test_only_the_named_fields_must_be_in_every_sample(tmp_path: Path, capsys) -> None:
    """Other fields may differ from file to file (they are ignored); a named field
    must be in every file, from the same place and with the same components as in the first."""
    pts, tri = grid_triangles(4, 3)
    n = len(pts)
    _write_vtu(tmp_path / "a.vtu", pts, tri, T=np.ones(n), v=np.ones((n, 2)), w=np.ones((n, 3)))
    _write_vtu(tmp_path / "b.vtu", pts, tri, T=np.ones(n) * 2, v=np.ones((n, 3)), pos=np.zeros((n, 3)), extra=np.ones(n))
    capsys.readouterr()
    assert main(["dataset", str(tmp_path), "--out", str(tmp_path / "ok"), "--inputs", "T,v[1]", "--targets", "T", "-q"]) == 0
    assert capsys.readouterr().err.count("note: T is both input and target") == 1
    assert open_dataset(tmp_path / "ok").input_channels == ["T", "v[1]"]
    _fails([str(tmp_path), "--inputs", "T", "--targets", "w"], capsys, tmp_path / "d",
           r"b\.vtu: Expected field 'w' in point_data \(available: T, v \(3 components\), pos \(3 components\), extra; "
           r"and pos for the coordinates\)")
    _fails([str(tmp_path), "--inputs", "v", "--targets", "T"], capsys, tmp_path / "d",
           r"b\.vtu: Expected 'v' to be point_data field 'v' \(2 components\), as in .*a\.vtu "
           r"\(got point_data field 'v' \(3 components\)\)")
    _fails([str(tmp_path), "--inputs", "pos[1]", "--targets", "T"], capsys, tmp_path / "d",
           r"b\.vtu: Expected 'pos\[1\]' to be component 1 of the node coordinates, as in .*a\.vtu "
           r"\(got component 1 of point_data field 'pos'\)")


def test_empty_source_list(tmp_path: Path, capsys) -> None:
    _fails(["--inputs", "T", "--targets", "T"], capsys, tmp_path / "d",
           r"Expected at least one mesh file or folder in SOURCES \(got none\)")
    (tmp_path / "empty").mkdir()
    _fails([str(tmp_path / "empty"), "--inputs", "T", "--targets", "T"], capsys, tmp_path / "d",
           r"empty: Expected mesh files in the folder \(got none")


def _one_mesh_cases(folder: Path, count: int = 4) -> tuple[np.ndarray, np.ndarray]:
    pts, tri = grid_triangles(4, 3)
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(count):
        _write_vtu(folder / f"s{s}.vtu", pts, tri, T=np.full(len(pts), float(s)), u=pts * s)
    return pts, tri


def test_a_sample_on_another_mesh_is_shown_and_refused_with_same_mesh(tmp_path: Path, capsys) -> None:
    pts, tri = _one_mesh_cases(tmp_path / "c")
    args = [str(tmp_path / "c"), "--inputs", "T", "--targets", "u"]
    assert main(["dataset", *args, "--out", str(tmp_path / "one"), "--same-mesh"]) == 0
    out, err = capsys.readouterr()
    assert "kind one-mesh" in out and "meshes  " not in out and "note:" not in err
    scaled = pts * [1.1, 1.0]
    _write_vtu(tmp_path / "c" / "s2.vtu", scaled, tri, T=np.full(len(pts), 2.0), u=scaled * 2)
    capsys.readouterr()  # meshio's chatter
    # Without --same-mesh: a many-meshes dataset, and the summary and a note say which sample is on which mesh.
    assert main(["dataset", *args, "--out", str(tmp_path / "two")]) == 0
    out, err = capsys.readouterr()
    assert "kind many-meshes (2 distinct meshes, 12 to 12 nodes)" in out
    assert re.search(r"\n  meshes +mesh 0: 12 nodes, 3 samples: s0, s1, s3\n +mesh 1: 12 nodes, 1 sample: s2\n", out), out
    assert re.fullmatch(r"meshshard dataset: note: 2 distinct meshes: 3 of 4 samples are on mesh 0 \(12 nodes\), "
                        r"1 sample on another: s2 \(mesh 1, 12 nodes\); expected one mesh\? --same-mesh .*\n", err), err
    assert main(["dataset", *args, "--out", str(tmp_path / "three"), "-q"]) == 0
    assert capsys.readouterr() == ("", err)  # the note even with --quiet
    assert main(["info", str(tmp_path / "two")]) == 0 and "mesh 1: 12 nodes, 1 sample: s2" in capsys.readouterr().out
    # With --same-mesh: refused, in one line saying how the mesh differs; nothing written.
    _fails([*args, "--same-mesh"], capsys, tmp_path / "d",
           r"s2\.vtu: Expected the mesh of .*s0\.vtu in every sample, as --same-mesh asks \(got the same number of "
           r"nodes at other coordinates: up to 0\.1 apart, at node 3, 9 of 12 nodes moved\)")
    small, small_tri = grid_triangles(3, 3)
    _write_vtu(tmp_path / "c" / "s2.vtu", small, small_tri, T=np.ones(9), u=small)
    _fails([*args, "--same-mesh"], capsys, tmp_path / "d",
           r"s2\.vtu: Expected the mesh of .*s0\.vtu in every sample, as --same-mesh asks \(got 9 nodes; .*s0\.vtu has 12\)")
    flipped = tri.copy()
    flipped[4] = flipped[4, ::-1]
    _write_vtu(tmp_path / "c" / "s2.vtu", pts, flipped, T=np.ones(12), u=pts)
    _fails([*args, "--same-mesh"], capsys, tmp_path / "d",
           r"s2\.vtu: .*\(got the same nodes, different connectivity: triangle cell 4 is \[\d+, \d+, \d+\]; .*s0\.vtu "
           r"has \[\d+, \d+, \d+\]; 1 of 12 cells differ\)")
    _write_vtu(tmp_path / "c" / "s2.vtu", pts, tri[:-1], T=np.ones(12), u=pts)
    _fails([*args, "--same-mesh"], capsys, tmp_path / "d",
           r"s2\.vtu: .*\(got the same nodes, different connectivity: 11 triangle cells; .*s0\.vtu has 12\)")


def test_many_meshes_by_design_list_the_meshes_without_a_note(sources, tmp_path: Path, capsys) -> None:
    assert main(["dataset", str(sources["many"]), "--out", str(tmp_path / "d"), "--inputs", "T", "--targets", "u"]) == 0
    out, err = capsys.readouterr()
    assert "note:" not in err
    assert re.search(r"meshes +mesh 0: [\d,]+ nodes, 2 samples: s0, s3\n +mesh 1: [\d,]+ nodes, 2 samples: s1, s4\n"
                     r" +mesh 2: [\d,]+ nodes, 1 sample: s2\n", out), out


def test_files_of_one_name_in_two_folders_are_named_after_their_folders(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(4, 3)
    for folder, s in (("a", 0), ("a", 1), ("b", 0), ("x/b", 0)):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        _write_vtu(tmp_path / folder / f"case-{s}.vtu", pts, tri, T=np.ones(len(pts)))
    a, b, xb = (str(tmp_path / f) for f in ("a", "b", "x/b"))
    capsys.readouterr()
    assert main(["dataset", a, b, "--out", str(tmp_path / "d"), "--inputs", "pos", "--targets", "T",
                 "--val-samples", "b/case-0", "-q"]) == 0
    data = open_dataset(tmp_path / "d")
    assert [e["name"] for e in data.meta["samples"]] == ["a/case-0", "case-1", "b/case-0"] and data.val.tolist() == [2]
    assert capsys.readouterr().err == ("meshshard dataset: note: 2 files share a name with a file in another folder, so "
                                       "each sample is named after its folder too: a/case-0, b/case-0\n")
    # A --val-samples name that is the file name of several samples is refused, not one of them picked.
    for val in ("case-0", "case-1,case-0"):
        assert main(["dataset", a, b, "--out", str(tmp_path / "e"), "--inputs", "pos", "--targets", "T",
                     "--val-samples", val, "-q"]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            "meshshard dataset: error: Expected --val-samples to name one sample (got 'case-0', the file name of "
            "2 samples: a/case-0, b/case-0; name one of them)")
    assert not (tmp_path / "e").exists()
    # Folders of the same name: as many folders as it takes.
    from meshshard.data._sources import list_sources, sample_names

    files = list_sources([a, b, xb])
    assert sample_names(files) == ([f"{tmp_path.name}/a/case-0", "case-1", f"{tmp_path.name}/b/case-0", "x/b/case-0"],
                                   [0, 2, 3])
    # The same file twice, or one name twice in one folder: refused.
    with pytest.raises(ValueError, match=r"case-0\.vtu: Expected each file once in SOURCES \(got it twice, also as .*a/case-0\.vtu\)"):
        sample_names(list_sources([a, str(tmp_path / "a" / "case-0.vtu")]))
    meshio.write(tmp_path / "a" / "case-0.vtk", meshio.Mesh(np.column_stack([pts, np.zeros(len(pts))]), [("triangle", tri)],
                                                            point_data={"T": np.ones(len(pts))}))
    _fails([a, "--inputs", "pos", "--targets", "T"], capsys, tmp_path / "d2",
           r"case-0\.vtu: Expected one file per sample name \(got case-0\.vtk and case-0\.vtu in one folder, both sample 'case-0'\)")


def test_repeated_field_flags_add_up_and_a_field_named_twice_is_refused(sources, tmp_path: Path, capsys) -> None:
    one = str(sources["one"])
    assert main(["dataset", one, "--out", str(tmp_path / "d"), "--inputs", "T", "--inputs", "u[0]", "--targets", "u[1]",
                 "--targets", "u[2]", "--val-samples", "s1", "--val-samples", "s3", "-q"]) == 0
    data = open_dataset(tmp_path / "d")
    assert data.input_channels == ["T", "u[0]"] and data.target_channels == ["u[1]", "u[2]"]
    assert data.val.tolist() == [1, 3]
    assert capsys.readouterr().err == ""
    _fails([one, "--inputs", "T,T", "--targets", "u"], capsys, tmp_path / "e",
           r"^meshshard dataset: error: Expected each field once in --inputs \(got 'T' more than once\)$")
    _fails([one, "--inputs", "T", "--inputs", "u", "--targets", "u[0]", "--targets", "u[0]"], capsys, tmp_path / "e",
           r"Expected each field once in --targets \(got 'u\[0\]' more than once\)")
    _fails([one, "--inputs", "u,T,u[1]", "--targets", "T"], capsys, tmp_path / "e",
           r"Expected each channel once in --inputs \(got u\[1\] from both 'u' and 'u\[1\]'\)")
    # A field that is both an input and a target: allowed, with a note.
    assert main(["dataset", one, "--out", str(tmp_path / "f"), "--inputs", "T,u", "--targets", "u[2]", "-q"]) == 0
    assert capsys.readouterr().err == ("meshshard dataset: note: u[2] is both input and target (the model is given "
                                       "what it predicts: deliberate for an autoencoder, a mistake otherwise)\n")


def test_counts_in_messages_are_singular_or_plural(sources, tmp_path: Path, capsys) -> None:
    data = build_dataset([sources["one"]], tmp_path / "d", inputs="T", targets="u")
    many = build_dataset([sources["many"]], tmp_path / "m", inputs="T", targets="u")
    capsys.readouterr()
    assert main(["partition", str(data), "--parts", "1", "--out", str(tmp_path / "p")]) == 0
    assert re.match(r"wrote .*p: 1 mesh of .*d in 1 part \(", capsys.readouterr().out)
    assert main(["partition", str(many), "--parts", "1", "--out", str(tmp_path / "pm")]) == 0
    assert re.match(r"wrote .*pm: 3 meshes of .*m in 1 part \(", capsys.readouterr().out)
    assert main(["info", str(tmp_path / "pm")]) == 0 and "3 partitions into 1 part (" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"Expected at least one training sample \(got the only sample for validation\)"):
        write_dataset(tmp_path / "e", [np.ones((3, 1))], [np.ones((3, 1))], pos=np.eye(3), cells=[("triangle", np.array([[0, 1, 2]]))],
                      val_samples=[0])


def test_force_replaces_only_a_dataset_folder(sources, tmp_path: Path, capsys) -> None:
    out = tmp_path / "d"
    args = [str(sources["one"]), "--inputs", "T", "--targets", "u", "--out", str(out), "--quiet"]
    assert main(["dataset", *args]) == 0
    assert main(["dataset", *args]) == 2 and "pass --force" in capsys.readouterr().err
    assert main(["dataset", *args, "--force"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["dataset", *args, "--force"]) == 2
    assert "holds notes.txt, which meshshard did not write" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    assert main(["dataset", str(sources["one"]), "--inputs", "T", "--targets", "u", "--out", str(other), "--force", "-q"]) == 2
    assert "not a meshshard dataset folder (no readable dataset.json)" in capsys.readouterr().err
    assert main(["dataset", str(sources["one"]), "--inputs", "T", "--targets", "u", "--out", str(sources["root"]), "--force", "-q"]) == 2
    assert "holding the source" in capsys.readouterr().err
    out.joinpath("notes.txt").unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out / "samples")
        for where in (".", "..", str(out.parent)):
            assert main(["dataset", str(sources["one"]), "--inputs", "T", "--targets", "u", "--out", where, "--force", "-q"]) == 2
            assert "refusing to write a dataset over the current folder or a parent of it" in capsys.readouterr().err
    assert open_dataset(out).num_samples == 5


def test_info_shows_a_dataset(sources, tmp_path: Path, capsys) -> None:
    out = build_dataset([sources["many"]], tmp_path / "d", inputs="T", targets="u", val_fraction=0.4)
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kind many-meshes (3 distinct meshes" in text and "samples  5 (train 3, val 2" in text
    assert re.search(r"edges +channel", text) and "|dpos|" in text
    assert main(["info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((out / "dataset.json").read_text())


def test_samples_are_written_one_at_a_time(tmp_path: Path) -> None:
    """write_samples consumes its samples lazily: when sample i is made, samples 0..i-1 are on disk
    already (it never collects them all in memory first)."""
    pts, tri = grid_triangles(4, 3)
    seen = []

    def samples():
        for i in range(4):
            tmp = next(tmp_path.glob(".d.meshshard-new-*"))
            seen.append(sorted(p.name for p in (tmp / "samples").glob("*")) if (tmp / "samples").exists() else [])
            yield Sample(f"s{i}", pts, np.full((len(pts), 1), float(i)), np.ones((len(pts), 1)),
                         cells=[("triangle", tri)])

    write_samples(tmp_path / "d", samples(), [f"s{i}" for i in range(4)],
                  input_fields=[{"name": "T", "components": 1}],
                  target_fields=[{"name": "u", "components": 1}], val_samples=[3])
    assert seen == [[], ["00000"], ["00000", "00001"], ["00000", "00001", "00002"]]
    stats = open_dataset(tmp_path / "d").normalisation.inputs
    np.testing.assert_allclose(stats.mean, [1.0])
    np.testing.assert_allclose(stats.std, [np.sqrt(2 / 3)])


def test_info_of_a_datasets_partitions(sources, tmp_path: Path, capsys) -> None:
    data = build_dataset([sources["many"]], tmp_path / "d", inputs="T", targets="u")
    parts = tmp_path / "my parts"  # a name to quote in the command info prints
    partition_dataset(data, parts, 2)
    assert sorted(p.name for p in (parts).iterdir()) == [
        "mesh-00000", "mesh-00001", "mesh-00002", "partitions.json"]
    capsys.readouterr()
    assert main(["info", str(parts), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["format"] == "meshshard-dataset-partitions" and meta["num_parts"] == 2
    assert [m["sha256"] for m in meta["meshes"]] == [m["sha256"] for m in open_dataset(data).meta["meshes"]]
    assert main(["info", str(parts)]) == 0
    text = capsys.readouterr().out
    assert "3 partitions into 2 parts" in text and f"(meshshard info '{parts / 'mesh-00000'}')" in text
    assert main(["verify", str(parts)]) == 0
    assert capsys.readouterr().out.count(": OK (2 parts") == 3
    for name in ("partition.json", "part-00000.npz", "part-00001.npz"):  # mesh 1's partition where mesh 0's belongs
        (parts / "mesh-00000" / name).write_bytes((parts / "mesh-00001" / name).read_bytes())
    assert main(["verify", str(parts)]) == 1
    assert "FAIL " in capsys.readouterr().out
    pytest.importorskip("torch")
    from meshshard.tasks import DatasetReader  # training's reader checks each mesh's partition as it loads it

    with pytest.raises(ValueError, match=r"mesh-00000: partition made for another dataset \(its mesh checksum differs"):
        DatasetReader(data, parts, 0).sample(0)
    (parts / "stray.txt").write_text("x")
    assert main(["partition", str(data), "--parts", "2", "--out", str(parts), "--force", "-q"]) == 2
    assert "holds stray.txt, which meshshard did not write" in capsys.readouterr().err
    (parts / "stray.txt").unlink()
    (parts / "mesh-00001" / "my-notes.txt").write_text("mine")  # inside a mesh's partition: not ours either
    assert main(["partition", str(data), "--parts", "2", "--out", str(parts), "--force", "-q"]) == 2
    assert "holds 'my-notes.txt', which is not a file of a partition" in capsys.readouterr().err
    assert (parts / "mesh-00001" / "my-notes.txt").read_text() == "mine"


@pytest.mark.parametrize("chunk", [1, 5, 17, 10**6])
def test_edge_statistics_in_chunks_equal_numpy(chunk: int) -> None:
    from meshshard.partition._graph import nodal_graph

    pts, tri = grid_triangles(13, 7)
    graph = nodal_graph([("triangle", tri)], len(pts))
    run = edge_moments(graph, pts, chunk=chunk)
    values = _edge_values(pts, tri)
    assert run.n == len(values)
    np.testing.assert_allclose(run.mean, values.mean(0), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.sqrt(run.m2 / run.n), values.std(0), rtol=1e-13)


def test_the_dataset_command_never_imports_torch(sources, tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; from meshshard.cli import main; "
            f"rc = main(['dataset', {str(sources['one'])!r}, '--out', {str(tmp_path / 'd')!r}, '--inputs', 'T', "
            "'--targets', 'u', '-q']); "
            f"rc = rc or main(['partition', {str(tmp_path / 'd')!r}, '--parts', '2', '--out', {str(tmp_path / 'p')!r}, '-q']); "
            f"rc = rc or main(['info', {str(tmp_path / 'd')!r}]); "
            "print('torch' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("kind", ["one", "many"])
def test_a_dataset_without_targets_holds_the_inputs_only(sources, tmp_path: Path, capsys, kind: str) -> None:
    """New cases to predict on: zero target channels, no validation split unless asked, the same
    inputs and meshes as with targets, and a partition of the same meshes fits both."""
    out = tmp_path / "new"
    assert main(["dataset", str(sources[kind]), "--out", str(out), "--inputs", "T,u[1]"]) == 0
    text = capsys.readouterr().out
    assert "samples  5 (no validation split)" in text
    assert "targets  none: inputs only, cases for meshshard predict (train needs targets)" in text
    assert not re.search(r"targets +channel", text)
    new = open_dataset(out)
    with_targets = open_dataset(build_dataset([sources[kind]], tmp_path / "full", inputs="T,u[1]", targets="u[0]"))
    assert new.target_channels == [] and new.meta["targets"] == [] and list(new.val) == [] and len(new.train) == 5
    assert [m["sha256"] for m in new.meta["meshes"]] == [m["sha256"] for m in with_targets.meta["meshes"]]
    for s in range(5):
        x, y = new.rows(s, np.array([0, 3]))
        assert y.shape == (2, 0)
        np.testing.assert_array_equal(x, with_targets.rows(s, np.array([0, 3]))[0])
    partition_dataset(tmp_path / "full", tmp_path / "parts", 2)
    assert check_partition_matches(new, tmp_path / "parts")["num_parts"] == 2
    asked = build_dataset([sources[kind]], tmp_path / "asked", inputs="T", val_samples=["s1"])
    assert list(open_dataset(asked).val) == [1]


def test_write_dataset_without_targets(tmp_path: Path) -> None:
    pts, tri = grid_triangles(6, 5)
    inputs = np.random.default_rng(0).random((3, len(pts), 2))
    data = open_dataset(write_dataset(tmp_path / "d", inputs, pos=pts, cells=[("triangle", tri)], input_names=["a", "b"]))
    assert data.target_channels == [] and data.sample_arrays(2)[1].shape == (len(pts), 0) and list(data.val) == []
    with pytest.raises(ValueError, match="Expected targets with target_names"):
        write_dataset(tmp_path / "e", inputs, pos=pts, cells=[("triangle", tri)], target_names=["c"])

    class Data:  # PyG's Data by duck typing, as write_dataset_from_pyg reads it
        def __init__(self, **kw) -> None:
            self.__dict__.update(kw)

    graphs = [Data(x=inputs[s], pos=pts, face=tri.T) for s in range(3)]
    pyg = open_dataset(write_dataset_from_pyg(tmp_path / "p", graphs, input_names=["a", "b"]))
    assert pyg.target_channels == [] and pyg.meta["meshes"] == data.meta["meshes"]
    np.testing.assert_array_equal(pyg.sample_arrays(1)[0], data.sample_arrays(1)[0])
    graphs[0].y = inputs[0][:, :1]
    with pytest.raises(ValueError, match="Expected 'y' on every Data or on none"):
        write_dataset_from_pyg(tmp_path / "q", graphs)


def test_a_damaged_or_redirected_dataset_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    """Cell ids past the mesh (which crashed scipy, or wrote cells pointing nowhere), edited mesh
    files, and links or FIFOs in place of the folder's files are refused when read."""
    import os

    pts, tri = grid_triangles(6, 5)
    write_dataset(tmp_path / "d", np.ones((2, len(pts), 1)), np.ones((2, len(pts), 1)), pos=pts,
                  cells=[("triangle", tri)])
    mesh = tmp_path / "d" / "meshes" / "00000"
    good = np.load(mesh / "cells-triangle.npy")
    bad = good.copy()
    bad[0, 0] = len(pts)
    np.save(mesh / "cells-triangle.npy", bad)
    with pytest.raises(ValueError, match=rf"cells-triangle.npy: Expected integer node ids in \[0, {len(pts)}\) in a 2-D "
                                         rf"array \(got int64 \({len(tri)}, 3\), ids 0..{len(pts)}\)"):
        open_dataset(tmp_path / "d").mesh(0)
    assert main(["partition", str(tmp_path / "d"), "--parts", "2", "--out", str(tmp_path / "p"), "-q"]) == 2
    bad = good.copy()
    bad[[0, 1]] = bad[[1, 0]]  # ids in range, but not the mesh the checksum was taken of
    np.save(mesh / "cells-triangle.npy", bad)
    with pytest.raises(ValueError, match="the mesh's files differ from the checksum in dataset.json"):
        open_dataset(tmp_path / "d").mesh(0)
    np.save(mesh / "cells-triangle.npy", good)
    assert open_dataset(tmp_path / "d").mesh(0).num_nodes == len(pts)
    inputs = tmp_path / "d" / "samples" / "00001" / "inputs.npy"
    (tmp_path / "outside.npy").write_bytes(inputs.read_bytes())
    inputs.unlink()
    inputs.symlink_to(tmp_path / "outside.npy")
    with pytest.raises(ValueError, match="inputs.npy: not a regular file of the dataset folder"):
        open_dataset(tmp_path / "d").sample_arrays(1)
    inputs.unlink()
    os.mkfifo(inputs)  # would block a reader forever
    with pytest.raises(ValueError, match="inputs.npy: not a regular file of the dataset folder"):
        open_dataset(tmp_path / "d").rows(1, np.arange(3))


def test_a_dataset_replaced_with_force_is_never_left_half_deleted(tmp_path: Path, monkeypatch) -> None:
    """The old folder is set aside before the new one goes in: killed between the two renames,
    the old one is whole, aside, and the next run puts it back before it does anything else."""
    import subprocess

    from meshshard.data import write_dataset
    from meshshard.partition._safe_io import recover_interrupted

    pts, tri = grid_triangles(5, 4)
    write_dataset(tmp_path / "d", np.ones((3, len(pts), 1)), np.ones((3, len(pts), 1)), pos=pts, cells=[("triangle", tri)])
    real_rename = os.rename

    def killed_after_setting_aside(src, dst):
        real_rename(src, dst)
        if str(dst).endswith(f"meshshard-old-{os.getpid()}"):
            raise KeyboardInterrupt  # as if killed between the two renames

    monkeypatch.setattr(os, "rename", killed_after_setting_aside)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(tmp_path / "d", np.zeros((2, len(pts), 1)), np.zeros((2, len(pts), 1)), pos=pts,
                      cells=[("triangle", tri)], force=True)
    monkeypatch.setattr(os, "rename", real_rename)
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob(".d.meshshard-new-*"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    next(tmp_path.glob(".d.meshshard-old-*")).rename(tmp_path / f".d.meshshard-old-{dead.pid}")  # its process is gone
    assert recover_interrupted(tmp_path / "d") == [f"{tmp_path / 'd'}: restored from .d.meshshard-old-{dead.pid}, "
                                                   "left by an interrupted --force"]
    assert open_dataset(tmp_path / "d").num_samples == 3 and not list(tmp_path.glob(".d.*"))


# values that overflow, meshes without edges, a full disk (issue 27 §4) -----------------------

def test_values_beyond_float32_name_the_sample_and_field(tmp_path: Path, capsys) -> None:
    """1e300 is finite in float64 but inf once stored as float32: refused in one line naming the
    sample and the field, nothing written; float64 storage keeps it."""
    pts, tri = grid_triangles(4, 3)
    t = np.ones(len(pts))
    _write_vtu(tmp_path / "a.vtu", pts, tri, T=t, p=t)
    t = t.copy()
    t[5] = -1e300
    _write_vtu(tmp_path / "b.vtu", pts, tri, T=t, p=np.ones(len(pts)))
    _fails([str(tmp_path / "a.vtu"), str(tmp_path / "b.vtu"), "--inputs", "p", "--targets", "T"], capsys,
           tmp_path / "d", r"b\.vtu: Expected the values of field 'T' of sample 'b' to fit float32 \(got -1e\+300 at "
           r"node 5, beyond float32's largest magnitude 3\.4e\+38; 1 such value in all\)$")


def test_statistics_that_overflow_name_the_field(tmp_path: Path) -> None:
    """Values finite in float64 whose spread overflows it: the training statistics are not stored
    as Infinity (dataset.json stays strict JSON); the field is named."""
    pts, tri = grid_triangles(4, 3)
    inputs = np.ones((2, len(pts), 1))
    targets = np.ones((2, len(pts), 2))
    targets[0, :, 1] = 1.5e308
    targets[0, ::2, 1] = -1.5e308
    with pytest.raises(ValueError, match=r"^Expected finite training statistics of channel 'y\[1\]' \(got mean "
                                         r".*, std inf\): its values span more than float64 can hold; rescale the "
                                         r"field$"):
        write_dataset(tmp_path / "d", inputs, targets, pos=pts, cells=[("triangle", tri)], dtype="float64",
                      val_fraction=0.0)
    assert not (tmp_path / "d").exists()


def test_a_mesh_without_edges_is_refused_naming_the_sample(tmp_path: Path, capsys) -> None:
    one = np.zeros((1, 2))
    with pytest.raises(ValueError, match=r"^sample 0 \('00000'\): Expected a mesh with edges \(got 1 node and no "
                                         r"edge\); a graph network cannot learn on a mesh without edges$"):
        write_dataset(tmp_path / "d", np.ones((2, 1, 1)), np.ones((2, 1, 1)), pos=one, cells=[("vertex", [[0]])])
    assert not (tmp_path / "d").exists()
    for s in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meshio.write(tmp_path / f"s{s}.vtu", meshio.Mesh(np.zeros((1, 3)) + s, [("vertex", np.array([[0]]))],
                                                               point_data={"T": np.ones(1)}))
    _fails([str(tmp_path / f"s{s}.vtu") for s in range(3)] + ["--inputs", "pos", "--targets", "T"], capsys,
           tmp_path / "e", r"s0\.vtu: Expected at least \d+ points for --graph knn:\d+ \(got 1\)$")  # a point cloud


def test_a_full_disk_names_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    import errno

    pts, tri = grid_triangles(4, 3)
    real = np.lib.format.write_array
    calls = []

    def full(f, *args, **kwargs):
        calls.append(f.name)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", full)
    with pytest.raises(OSError, match=r"samples/00000/inputs\.npy: cannot write \(No space left on device\)$"):
        write_dataset(tmp_path / "d", np.ones((2, len(pts), 1)), np.ones((2, len(pts), 1)), pos=pts,
                      cells=[("triangle", tri)])
    assert not (tmp_path / "d").exists() and not list(tmp_path.iterdir())
