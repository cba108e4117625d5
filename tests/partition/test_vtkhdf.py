"""VTKHDF files: written by ``write_vtkhdf`` / ``convert_mesh``, read whole or by slices, opened by VTK."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshshard.partition import build_graph, convert_mesh, read_input, read_slice, write_vtkhdf
from meshshard.partition._vtkhdf import block_owner, block_start, write_vtkhdf_slabs

from ._mixed_mesh import mixed_mesh, write_mixed_vtkhdf

pytest.importorskip("h5py")


def _cell_set(cells: list[tuple[str, np.ndarray]]) -> dict[str, set[tuple[int, ...]]]:
    out: dict[str, set[tuple[int, ...]]] = {}
    for name, conn in cells:
        out.setdefault(name, set()).update(map(tuple, np.asarray(conn).tolist()))
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_slices_cover_the_mesh_once(tmp_path: Path, size: int) -> None:
    pos, cells = mixed_mesh()
    path = write_mixed_vtkhdf(tmp_path)
    pieces = [read_slice(path, r, size) for r in range(size)]
    assert [p.first_node for p in pieces] == [block_start(len(pos), r, size) for r in range(size)]
    np.testing.assert_array_equal(np.concatenate([p.pos for p in pieces]), pos)
    found: dict[str, set] = {}
    total = 0
    for p in pieces:
        for name, conn in p.cells:
            total += len(conn)
            found.setdefault(name, set()).update(map(tuple, conn.tolist()))
    assert total == sum(len(c) for _, c in cells)
    assert found == _cell_set(cells)


def test_block_owner_inverts_block_start() -> None:
    for total in (1, 5, 17, 100):
        for size in (1, 2, 3, 4, 7):
            ids = np.arange(total)
            starts = [block_start(total, r, size) for r in range(size + 1)]
            expected = np.searchsorted(starts, ids, side="right") - 1
            np.testing.assert_array_equal(block_owner(ids, total, size), expected)


def test_read_input_reads_a_vtkhdf_as_the_original_graph(tmp_path: Path) -> None:
    import meshio

    pos, cells = mixed_mesh()
    source = tmp_path / "mixed.vtu"
    meshio.write(source, meshio.Mesh(pos, cells))
    out = convert_mesh(source, tmp_path / "mixed.vtkhdf")
    original, converted = read_input(source), read_input(out)
    assert converted.name == "mixed.vtkhdf" and converted.kind == "mesh"
    np.testing.assert_array_equal(converted.pos, original.pos)
    a, b = build_graph(original), build_graph(converted)
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)


def test_vtk_reads_the_file(tmp_path: Path) -> None:
    vtk = pytest.importorskip("vtk")
    from vtkmodules.vtkIOHDF import vtkHDFReader

    pos, cells = mixed_mesh()
    path = write_mixed_vtkhdf(tmp_path)
    reader = vtkHDFReader()
    reader.SetFileName(str(path))
    reader.Update()
    grid = reader.GetOutput()
    assert grid.GetNumberOfPoints() == len(pos)
    assert grid.GetNumberOfCells() == sum(len(c) for _, c in cells)
    assert grid.GetPointData().GetArray("temperature") is not None
    from vtkmodules.util.numpy_support import vtk_to_numpy

    np.testing.assert_allclose(vtk_to_numpy(grid.GetPoints().GetData()), pos)
    first_hex = cells[0][1][0]
    ids = grid.GetCell(0).GetPointIds()
    assert [ids.GetId(i) for i in range(ids.GetNumberOfIds())] == first_hex.tolist()
    assert grid.GetCellType(0) == vtk.VTK_HEXAHEDRON


def test_quadratic_wedge_keeps_meshio_order(tmp_path: Path) -> None:
    conn = np.arange(15).reshape(1, 15)
    pos = np.random.default_rng(0).uniform(size=(15, 3))
    path = write_vtkhdf(tmp_path / "w.vtkhdf", pos, [("wedge15", conn)])
    (name, back), = read_slice(path).cells
    assert name == "wedge15"
    np.testing.assert_array_equal(back, conn)


def test_convert_keeps_2d_points_as_3d(tmp_path: Path) -> None:
    import meshio

    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    source = tmp_path / "tri.vtu"
    meshio.write(source, meshio.Mesh(points, [("triangle", np.array([[0, 1, 2]]))]))
    out = convert_mesh(source, tmp_path / "tri.vtkhdf")
    piece = read_slice(out)
    np.testing.assert_array_equal(piece.pos[:, :2], points)
    np.testing.assert_array_equal(piece.pos[:, 2], 0.0)


@pytest.mark.parametrize("problem, edit, match", [
    ("node id", lambda f: f["VTKHDF/Connectivity"].__setitem__(0, 10**6), r"node ids in \[0, "),
    ("offsets", lambda f: f["VTKHDF/Offsets"].__setitem__(1, 10**6), "Expected Offsets rising"),
    ("type", lambda f: f["VTKHDF/Types"].__setitem__(0, 99), "Expected VTK cell types"),
    ("count", lambda f: f["VTKHDF/NumberOfCells"].__setitem__(0, 3), r"Expected Types of shape \(3,\)"),
    ("nan", lambda f: f["VTKHDF/Points"].__setitem__(0, [np.nan, 0, 0]), "Expected finite point coordinates"),
])
def test_bad_files_are_one_line_errors(tmp_path: Path, problem: str, edit, match: str) -> None:
    import h5py

    path = write_mixed_vtkhdf(tmp_path)
    with h5py.File(path, "r+") as file:
        edit(file)
    with pytest.raises(ValueError, match=match) as info:
        read_slice(path)
    assert "\n" not in str(info.value)


def test_external_link_is_refused(tmp_path: Path) -> None:
    import h5py

    other = write_mixed_vtkhdf(tmp_path, name="other.vtkhdf")
    path = write_mixed_vtkhdf(tmp_path)
    with h5py.File(path, "r+") as file:
        del file["VTKHDF/Points"]
        file["VTKHDF/Points"] = h5py.ExternalLink(str(other), "VTKHDF/Points")
    with pytest.raises(ValueError, match="Expected 'Points' stored in the file"):
        read_slice(path)


def test_convert_refuses_a_wrong_suffix_and_itself(tmp_path: Path) -> None:
    path = write_mixed_vtkhdf(tmp_path)
    with pytest.raises(ValueError, match=r"Expected an output file ending in \.vtkhdf"):
        convert_mesh(path, tmp_path / "out.vtu")
    with pytest.raises(ValueError, match="is the input itself"):
        convert_mesh(path, path)


def test_a_dataset_larger_than_the_file_allows_is_refused_before_reading(tmp_path: Path) -> None:
    import h5py

    path = write_mixed_vtkhdf(tmp_path)
    with h5py.File(path, "r+") as f:  # 24 TB declared, nothing stored: chunked, never written
        del f["VTKHDF/Points"]
        f["VTKHDF/NumberOfPoints"][0] = 10**12
        f.create_dataset("VTKHDF/Points", shape=(10**12, 3), dtype="f8", chunks=(1024, 3), compression="gzip")
    with pytest.raises(ValueError, match=r"Points declares 24,000,000,000,000 bytes, more than MESHSHARD_MAX_EXPANSION"):
        read_slice(path, 0, 4)


def test_slabs_write_the_file_write_vtkhdf_writes(tmp_path: Path) -> None:
    import h5py

    rng = np.random.default_rng(0)
    pos, tets = rng.uniform(size=(40, 3)), rng.integers(0, 40, size=(25, 4))
    whole = write_vtkhdf(tmp_path / "whole.vtkhdf", pos, [("tetra", tets)])
    # uneven slabs, an empty one among them, points and cells cut at different places
    slabs = list(zip(np.split(pos, [7, 7, 30]), np.split(tets, [10, 12, 12])))
    sliced = write_vtkhdf_slabs(tmp_path / "slabs.vtkhdf", 40, 25, "tetra", iter(slabs))
    with h5py.File(whole) as a, h5py.File(sliced) as b:
        assert dict(a["VTKHDF"].attrs.items()).keys() == dict(b["VTKHDF"].attrs.items()).keys()
        assert sorted(a["VTKHDF"]) == sorted(b["VTKHDF"])
        for name in a["VTKHDF"]:
            if isinstance(a["VTKHDF"][name], h5py.Dataset):
                np.testing.assert_array_equal(a["VTKHDF"][name][()], b["VTKHDF"][name][()], err_msg=name)
                assert a["VTKHDF"][name].dtype == b["VTKHDF"][name].dtype, name
    assert read_slice(sliced, 1, 3).first_node == read_slice(whole, 1, 3).first_node


@pytest.mark.parametrize(("counts", "slabs", "match"), [
    ((4, 2), [(np.zeros((3, 3)), np.zeros((2, 4), dtype=int))], r"4 points and 2 cells in all \(got 3 and 2\)"),
    ((3, 1), [(np.zeros((3, 3)), np.zeros((2, 4), dtype=int))], r"3 points and 1 cells in all \(got more\)"),
    ((3, 2), [(np.zeros((3, 3)), np.zeros((1, 4), dtype=int)), (np.zeros((0, 3)), np.zeros((1, 3), dtype=int))],
     r"tetra cells \(c, 4\) \(got \(0, 3\) and \(1, 3\)\)"),
    ((3, 1), [(np.zeros((3, 3)), np.full((1, 4), 3))], r"node ids in \[0, 3\) \(got \[3, 3\]\)"),
    ((3, 1), [], r"\(got 0 and 0\)"),
])
def test_slabs_that_do_not_add_up_leave_no_file(tmp_path: Path, counts, slabs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        write_vtkhdf_slabs(tmp_path / "m.vtkhdf", *counts, "tetra", iter(slabs))
    assert not (tmp_path / "m.vtkhdf").exists()
    with pytest.raises(ValueError, match=r"Expected a fixed-size cell type .* \(got 'polygon'\)"):
        write_vtkhdf_slabs(tmp_path / "m.vtkhdf", 3, 0, "polygon", iter([]))
