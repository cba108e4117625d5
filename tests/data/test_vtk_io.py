"""Reading .vtp, .vtm, .pvtu and .vtkhdf with vtk: the same mesh meshio gives for a .vtu, pieces
joined, multiblock boundaries as node sets, one line for a missing vtk or a broken file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import meshio
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from meshshard.cli import main
from meshshard.data import build_dataset, list_sources, open_dataset
from meshshard.data._vtk_io import VTK_SUFFIXES, read_vtk
from meshshard.partition._graph import nodal_graph

from ._solver_files import extruded, polydata, vtk_grid, write_vtk, write_vtm, write_vtu
from .conftest import grid_triangles

pytest.importorskip("vtkmodules.vtkIOXML", reason="the vtk package is not installed (pip install vtk)")


def _mixed_vtu(path: Path) -> Path:
    """A 3-D mesh of hexahedra and wedges (one cell thick) with point and cell fields."""
    m = extruded(4, 3, wedges=True)
    n = len(m["points3"])
    return write_vtu(path, m["points3"], [("hexahedron", m["hexahedron"]), ("wedge", m["wedge"])],
                     point_data={"T": np.arange(n, dtype=np.float64), "U": m["points3"] * 2.0},
                     cell_data={"k": [np.arange(len(m["hexahedron"])) + 0.5, np.arange(len(m["wedge"])) - 7.0]})


def _same_mesh(got: meshio.Mesh, want: meshio.Mesh) -> None:
    np.testing.assert_array_equal(got.points, want.points)
    assert [(b.type, b.data.tolist()) for b in got.cells] == [(b.type, b.data.tolist()) for b in want.cells]
    assert set(got.point_data) == set(want.point_data)
    for k in want.point_data:
        np.testing.assert_array_equal(np.asarray(got.point_data[k]).reshape(len(got.points), -1),
                                      np.asarray(want.point_data[k]).reshape(len(want.points), -1))
    for k in want.cell_data:
        for g, w in zip(got.cell_data[k], want.cell_data[k]):
            np.testing.assert_array_equal(np.ravel(g), np.ravel(w))


@pytest.mark.parametrize("suffix", [".vtkhdf", ".pvtu", ".vtm"])
def test_a_grid_reads_as_meshio_reads_its_vtu(tmp_path: Path, suffix: str) -> None:
    vtu = _mixed_vtu(tmp_path / "a.vtu")
    want = meshio.read(vtu)  # wedges in meshio's node order: the vtk reader gives the same
    if suffix == ".vtm":
        path = write_vtm(tmp_path / "a.vtm", {"mesh": "a.vtu"})
    elif suffix == ".pvtu":
        path = write_vtk(tmp_path / "a.pvtu", [vtk_grid(vtu)])
    else:
        path = write_vtk(tmp_path / "a.vtkhdf", vtk_grid(vtu))
    _same_mesh(read_vtk(path), want)


def test_polydata_keeps_its_cells_and_splits_larger_polygons(tmp_path: Path) -> None:
    pts = np.array([[0, 0], [1, 0], [2, 0], [2, 1], [1, 1], [0, 1], [1.5, 2], [0.5, 2], [3, 0]], dtype=float)
    polys = [[0, 1, 4, 5], [1, 2, 3], [5, 4, 3, 6, 7]]  # a quad, a triangle, a pentagon
    path = write_vtk(tmp_path / "s.vtp", polydata(pts, polys=polys, lines=[[2, 8]], verts=[8],
                                                  point_data={"T": np.arange(9.0)},
                                                  cell_data={"k": np.array([10.0, 11.0, 12.0, 13.0, 14.0])}))
    mesh = read_vtk(path)
    np.testing.assert_array_equal(mesh.points[:, :2], pts)
    cells = {b.type: b.data.tolist() for b in mesh.cells}
    assert cells["vertex"] == [[8]] and cells["line"] == [[2, 8]] and cells["quad"] == [[0, 1, 4, 5]]
    assert [1, 2, 3] in cells["triangle"] and len(cells["triangle"]) == 1 + 3  # the pentagon in 3 triangles
    assert sorted(set(np.ravel(cells["triangle"][1:]).tolist())) == [3, 4, 5, 6, 7]
    k = dict(zip([b.type for b in mesh.cells], mesh.cell_data["k"]))
    assert k["vertex"].tolist() == [10.0] and k["line"].tolist() == [11.0] and k["quad"].tolist() == [12.0]
    assert sorted(k["triangle"].tolist()) == [13.0, 14.0, 14.0, 14.0]
    np.testing.assert_array_equal(mesh.point_data["T"], np.arange(9.0))


@pytest.mark.parametrize("suffix", [".pvtu", ".vtkhdf"])
def test_pieces_are_joined_at_their_shared_nodes(tmp_path: Path, suffix: str) -> None:
    pts, tri = grid_triangles(6, 5)
    T = pts[:, 0] * 10 + pts[:, 1]
    pieces = []
    for k, half in enumerate((np.arange(len(tri)) < len(tri) // 2, np.arange(len(tri)) >= len(tri) // 2)):
        used, local = np.unique(tri[half], return_inverse=True)  # each piece numbers its own nodes
        piece = write_vtu(tmp_path / f"piece{k}.vtu", pts[used], [("triangle", local.reshape(-1, 3))],
                          point_data={"T": T[used]})
        pieces.append(vtk_grid(piece))
    assert sum(p.GetNumberOfPoints() for p in pieces) > len(pts)  # the pieces repeat the nodes they share
    mesh = read_vtk(write_vtk(tmp_path / f"p{suffix}", pieces))
    assert len(mesh.points) == len(pts)
    key = {tuple(p): t for p, t in zip(np.round(pts, 12).tolist(), T)}
    np.testing.assert_allclose(mesh.point_data["T"], [key[tuple(p)] for p in np.round(mesh.points[:, :2], 12).tolist()])
    graph = nodal_graph([(b.type, b.data) for b in mesh.cells], len(mesh.points))
    adjacency = sp.csr_matrix((np.ones(len(graph.indices)), graph.indices, graph.indptr))
    count, _ = connected_components(adjacency)
    assert count == 1


def test_a_multiblock_holds_the_mesh_and_its_boundaries_as_node_sets(tmp_path: Path) -> None:
    m = extruded(4, 3)
    write_vtu(tmp_path / "case" / "volume.vtu", m["points3"], [("hexahedron", m["hexahedron"])],
                       point_data={"T": np.arange(len(m["points3"]), dtype=float)})
    bottom = m["lower"][[0, 3, 6, 9]]  # the 2-D nodes i * ny at y = 0, lower plane
    write_vtk(tmp_path / "case" / "wall.vtp", polydata(m["points3"][bottom], lines=[[0, 1], [1, 2], [2, 3]]))
    write_vtk(tmp_path / "case" / "cloud.vtp", polydata(np.array([[0.3, 0.3, 0.05]]), verts=[0]))
    write_vtk(tmp_path / "case" / "off.vtp", polydata(np.array([[5.0, 5, 5], [6, 5, 5]]), lines=[[0, 1]]))
    path = write_vtm(tmp_path / "case.vtm", {"fluid/volume": "case/volume.vtu", "walls/wall": "case/wall.vtp",
                                              "walls/cloud": "case/cloud.vtp", "walls/off": "case/off.vtp"})
    said: list[str] = []
    mesh = read_vtk(path, said.append)
    assert len(mesh.points) == len(m["points3"]) and [b.type for b in mesh.cells] == ["hexahedron"]
    assert list(mesh.point_sets) == ["wall"]
    assert mesh.point_sets["wall"].tolist() == sorted(bottom.tolist())
    assert said == [f"{path}: 2 blocks left out, not a boundary of the mesh (not of a lower dimension, or not on its "
                    "nodes): cloud, off"]


def test_list_sources_takes_the_vtk_files_of_a_folder(tmp_path: Path) -> None:
    for name in ("a.vtp", "b.vtm", "c.pvtu", "d.vtkhdf", "e.vtu", "notes.txt"):
        (tmp_path / name).write_text("x")
    said: list[str] = []
    files = list_sources([tmp_path], said.append)
    assert [p.name for p in files] == ["a.vtp", "b.vtm", "c.pvtu", "d.vtkhdf", "e.vtu"]
    assert set(VTK_SUFFIXES) == {".vtp", ".vtm", ".pvtu", ".vtkhdf"}
    assert len(said) == 1 and "notes.txt" in said[0]


def test_a_dataset_from_vtp_files(tmp_path: Path) -> None:
    pts, tri = grid_triangles(5, 4)
    for s in range(3):
        write_vtk(tmp_path / "src" / f"s{s}.vtp", polydata(pts, polys=tri.tolist(), point_data={"p": pts[:, 0] * s}))
    out = build_dataset([tmp_path / "src"], tmp_path / "data", inputs="pos", targets="p", val_samples=["s2"])
    data = open_dataset(out)
    assert data.kind == "one-mesh" and [s["name"] for s in data.meta["samples"]] == ["s0", "s1", "s2"]
    np.testing.assert_allclose(data.rows(2, np.arange(len(pts)))[1][:, 0], pts[:, 0] * 2, rtol=1e-6)


def _fails(args: list[str], capsys, out: Path, pattern: str) -> str:
    capsys.readouterr()
    assert main(["dataset", *args, "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshshard dataset: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return lines[0]


def test_a_broken_file_is_one_line_naming_it(tmp_path: Path, capfd) -> None:
    capsys = capfd  # vtk writes its errors to file descriptor 2 unless told not to: none may get there
    (tmp_path / "bad.vtp").write_text("<?xml version='1.0'?>\n<VTKFile type='PolyData'><PolyData><Piece")
    _fails([str(tmp_path / "bad.vtp"), "--inputs", "pos"], capsys, tmp_path / "d",
           r"bad\.vtp: vtk cannot read it \(Error parsing XML in stream at line 2.*\)$")
    (tmp_path / "bad.vtkhdf").write_bytes(b"not hdf5 at all")
    _fails([str(tmp_path / "bad.vtkhdf"), "--inputs", "pos"], capsys, tmp_path / "d",
           r"bad\.vtkhdf: not an HDF5 file h5py can open \(.*\)$")  # h5py checks it before vtk reads it
    write_vtm(tmp_path / "gone.vtm", {"internal": "nowhere/internal.vtu"})
    _fails([str(tmp_path / "gone.vtm"), "--inputs", "pos"], capsys, tmp_path / "d", r"gone\.vtm: .*nowhere/internal\.vtu: missing$")


def test_polyhedra_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    from vtkmodules.vtkCommonCore import vtkIdList, vtkPoints
    from vtkmodules.vtkCommonDataModel import vtkUnstructuredGrid

    grid = vtkUnstructuredGrid()
    points = vtkPoints()
    for p in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]:
        points.InsertNextPoint(*p)
    grid.SetPoints(points)
    faces = [4, 3, 0, 1, 2, 3, 0, 1, 3, 3, 0, 2, 3, 3, 1, 2, 3]
    ids = vtkIdList()
    for f in faces:
        ids.InsertNextId(f)
    grid.InsertNextCell(42, ids)
    path = write_vtk(tmp_path / "poly.vtkhdf", grid)
    _fails([str(path), "--inputs", "pos"], capsys, tmp_path / "d",
           r"poly\.vtkhdf: Expected cells of a fixed node count \(got polyhedron cells, which meshshard does not read\)")


def test_without_vtk_the_error_says_pip_install_vtk(tmp_path: Path, monkeypatch, capsys) -> None:
    pts, tri = grid_triangles(3, 3)
    path = write_vtk(tmp_path / "s.vtp", polydata(pts, polys=tri.tolist()))
    for name in [m for m in sys.modules if m == "vtkmodules" or m.startswith("vtkmodules.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "vtkmodules", None)
    with pytest.raises(ValueError, match=r"s\.vtp: reading \.vtp files needs the vtk package, which is not installed "
                                         r"\(pip install vtk\)$"):
        read_vtk(path)
    _fails([str(path), "--inputs", "pos"], capsys, tmp_path / "d", r"needs the vtk package.*\(pip install vtk\)$")
