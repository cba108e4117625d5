"""What meshshard dataset does to a mesh on request: cell data averaged onto the nodes
(--cell-data-to-points), a one-cell-thick mesh collapsed to 2-D (--collapse-2d), the distance to
named boundaries (--wall-distance); each checked against a plain reference, and each refusal one
line that leaves nothing behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import build_dataset, open_dataset
from meshshard.data._mesh_ops import cell_data_to_points, collapse_2d, one_cell_thick_note
from meshshard.data._wall_geometry import wall_distance

from ._solver_files import FOAM_CAVITY, extruded, foam_case, write_vtu
from .conftest import grid_triangles


def _fails(args: list[str], capsys, out: Path, pattern: str) -> None:
    capsys.readouterr()
    assert main(["dataset", *args, "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.splitlines()
    notes, error = err[:-1], err[-1]
    assert all(line.startswith("meshshard dataset: note: ") for line in notes), notes
    assert error.startswith("meshshard dataset: error: ") and re.search(pattern, error), error
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


# ---------------------------------------------------------------------------------------------
# --cell-data-to-points


def _mixed_mesh() -> meshio.Mesh:
    """Triangles and quads sharing nodes, a line block too, with a 2-component cell field."""
    pts = np.array([[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1], [3, 0.5]], dtype=float)
    cells = [("quad", np.array([[0, 1, 4, 3]])), ("triangle", np.array([[1, 2, 5], [1, 5, 4], [2, 6, 5]])),
             ("line", np.array([[3, 4]]))]
    k = [np.array([[1.0, 10]]), np.array([[2.0, 20], [4, 40], [8, 80]]), np.array([[16.0, 160]])]
    return meshio.Mesh(pts, cells, cell_data={"k": k})


def test_cell_data_is_the_mean_over_the_cells_of_each_node() -> None:
    mesh = _mixed_mesh()
    got = cell_data_to_points(mesh, "k", Path("m.vtu"))
    want = np.zeros((7, 2))
    count = np.zeros(7)
    for block, values in zip(mesh.cells, mesh.cell_data["k"]):  # the plain loop, for reference
        for cell, value in zip(block.data, values):
            for node in cell:
                want[node] += value
                count[node] += 1
    np.testing.assert_allclose(got, want / count[:, None])
    assert got[4].tolist() == [(1 + 4 + 16) / 3, (10 + 40 + 160) / 3]


def test_a_node_in_no_cell_is_refused() -> None:
    mesh = _mixed_mesh()
    mesh = meshio.Mesh(np.vstack([mesh.points, [[9, 9]]]), mesh.cells, cell_data=mesh.cell_data)
    with pytest.raises(ValueError, match=r"^m\.vtu: Expected every node in a cell to average cell field 'k' onto the "
                                         r"nodes \(got 1 node in no cell, the first node 7\)$"):
        cell_data_to_points(mesh, "k", Path("m.vtu"))


def test_cell_data_to_points_in_a_dataset(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(5, 4)
    for s in range(2):
        write_vtu(tmp_path / "src" / f"s{s}.vtu", pts, [("triangle", tri)], point_data={"T": pts[:, 0] + s},
                  cell_data={"k": [np.arange(len(tri), dtype=float) * (s + 1)], "w": [np.ones((len(tri), 2))]})
    _fails([str(tmp_path / "src"), "--inputs", "T", "--targets", "k"], capsys, tmp_path / "d",
           r"s0\.vtu: Expected field 'k' in point_data \(available: T; and pos for the coordinates\); 'k' is there as "
           r"cell data .*interpolate it to the nodes first \(ParaView: Cell Data to Point Data\)$")
    _fails([str(tmp_path / "src"), "--inputs", "T", "--targets", "q", "--cell-data-to-points"], capsys,
           tmp_path / "d", r"s0\.vtu: Expected field 'q' in point_data or cell_data \(available: T; cell_data: k, w "
           r"\(2 components\); and pos for the coordinates\)$")
    out = build_dataset([tmp_path / "src"], tmp_path / "d", inputs="T,w[1]", targets="k", cell_data_to_points=True,
                        val_samples=["s1"])
    data = open_dataset(out)
    assert data.input_channels == ["T", "w[1]"] and data.target_channels == ["k"]
    mesh = meshio.read(tmp_path / "src" / "s1.vtu")
    x, y = data.rows(1, np.arange(len(pts)))
    np.testing.assert_allclose(y[:, 0], cell_data_to_points(mesh, "k", Path("s1.vtu"))[:, 0], rtol=1e-6)
    np.testing.assert_allclose(x[:, 1], 1.0)


def test_a_field_from_cells_in_one_file_and_from_nodes_in_another_is_refused(tmp_path: Path, capsys) -> None:
    pts, tri = grid_triangles(4, 3)
    write_vtu(tmp_path / "a.vtu", pts, [("triangle", tri)], point_data={"k": pts[:, 0]})
    write_vtu(tmp_path / "b.vtu", pts, [("triangle", tri)], cell_data={"k": [np.ones(len(tri))]})
    _fails([str(tmp_path / "a.vtu"), str(tmp_path / "b.vtu"), "--inputs", "pos", "--targets", "k",
            "--cell-data-to-points"], capsys, tmp_path / "d",
           r"b\.vtu: Expected 'k' to be point_data field 'k', as in .*a\.vtu \(got cell_data field 'k' averaged onto "
           r"the nodes\)$")


# ---------------------------------------------------------------------------------------------
# --collapse-2d


def _cells_as_sets(points: np.ndarray, cells: np.ndarray) -> list[tuple]:
    return sorted(tuple(sorted(map(tuple, np.round(points[c], 9).tolist()))) for c in cells)


@pytest.mark.parametrize("wedges", [False, True])
def test_a_one_cell_thick_mesh_collapses_to_its_lower_plane(wedges: bool) -> None:
    m = extruded(6, 5, wedges=wedges)
    n3 = len(m["points3"])
    cells = [("hexahedron", m["hexahedron"])] + ([("wedge", m["wedge"])] if wedges else [])
    T = np.arange(n3, dtype=float)
    mesh = meshio.Mesh(m["points3"], cells, point_data={"T": T},
                       cell_data={"k": [np.arange(len(c), dtype=float) for _, c in cells]},
                       point_sets={"top": m["upper"][:5], "bottom": m["lower"][:3]})
    flat = collapse_2d(mesh, Path("m.vtu"))
    keep = np.sort(m["lower"])
    np.testing.assert_array_equal(flat.points, m["points3"][keep, :2])  # the lower plane's nodes, in their order
    np.testing.assert_array_equal(flat.point_data["T"], T[keep])
    types = [b.type for b in flat.cells]
    assert types == (["quad", "triangle"] if wedges else ["quad"])
    assert _cells_as_sets(flat.points, flat.cells[0].data) == _cells_as_sets(m["points2"], m["quad"])
    if wedges:
        assert _cells_as_sets(flat.points, flat.cells[1].data) == _cells_as_sets(m["points2"], m["triangle"])
    for block in flat.cells:  # counter-clockwise, whatever the 3-D cell's orientation
        xy = flat.points[block.data]
        area = (xy[:, :, 0] * np.roll(xy[:, :, 1], -1, 1) - np.roll(xy[:, :, 0], -1, 1) * xy[:, :, 1]).sum(1)
        assert (area > 0).all()
    np.testing.assert_array_equal(flat.cell_data["k"][0], np.arange(len(m["hexahedron"])))
    new_id = {int(v): i for i, v in enumerate(keep.tolist())}
    order = np.argsort(m["lower"])  # 2-D node of each kept node
    to_flat = np.empty(len(order), dtype=int)
    to_flat[order] = np.arange(len(order))
    assert flat.point_sets["top"].tolist() == sorted(to_flat[:5].tolist())  # the upper plane's patch moved down
    assert flat.point_sets["bottom"].tolist() == sorted(new_id[int(v)] for v in m["lower"][:3])


def test_a_mesh_of_another_shape_is_refused_in_one_line() -> None:
    m = extruded(4, 3)
    two = m["points3"].copy()
    two[m["upper"][0], 2] = 0.05
    sheared = m["points3"].copy()
    sheared[m["upper"], 0] += 0.01
    for points, cells, why in [
        (m["points3"][:, :2], [("hexahedron", m["hexahedron"])], r"2-D points, not 3-D"),
        (np.column_stack([m["points3"][:, :2], np.zeros(len(m["points3"]))]), [("hexahedron", m["hexahedron"])],
         r"every node at z = 0: a 2-D mesh already"),
        (two, [("hexahedron", m["hexahedron"])], r"1 node between z = 0 and z = 0\.1 .*more than one cell thick"),
        (m["points3"], [("tetra", m["hexahedron"][:, :4])], r"tetra cells \(a one-cell-thick mesh has hexahedra and "
                                                            r"wedges\)"),
        (sheared, [("hexahedron", m["hexahedron"])], r"cells not extruded along z: node \d+ is at another \(x, y\)"),
        (m["points3"], [("hexahedron", m["hexahedron"][:, [0, 1, 2, 3, 5, 6, 7, 4]])],
         r"hexahedron cell 1 does not span the two planes with one face on each \(nodes \["),
    ]:
        mesh = meshio.Mesh(points, cells)
        with pytest.raises(ValueError, match=r"^m\.vtu: Expected a mesh one cell thick in z for --collapse-2d \(got "
                                             + why):
            collapse_2d(mesh, Path("m.vtu"))
        assert one_cell_thick_note(mesh, Path("m.vtu")) is None


def test_collapse_2d_in_a_dataset_and_the_note_without_it(tmp_path: Path, capsys) -> None:
    m = extruded(5, 4, wedges=True)
    cells = [("hexahedron", m["hexahedron"]), ("wedge", m["wedge"])]
    for s in range(2):
        write_vtu(tmp_path / "src" / f"s{s}.vtu", m["points3"], cells,
                  point_data={"p": m["points3"][:, 0] * (s + 1), "U": m["points3"] * s})
    capsys.readouterr()
    assert main(["dataset", str(tmp_path / "src"), "--out", str(tmp_path / "d3"), "--inputs", "pos", "--targets",
                 "p", "-q"]) == 0
    notes = capsys.readouterr().err.splitlines()
    assert notes == [f"meshshard dataset: note: {tmp_path / 'src' / 's0.vtu'}: the mesh is one cell thick in z (every "
                     "cell spans z = 0 to 0.1: a 2-D case?); --collapse-2d makes it the 2-D mesh of its lower plane "
                     f"(20 of 40 nodes, no z-edges in the graph)"]
    assert main(["dataset", str(tmp_path / "src"), "--out", str(tmp_path / "d"), "--inputs", "pos", "--targets",
                 "p,U", "--collapse-2d", "-q"]) == 0
    assert capsys.readouterr().err == ""
    data = open_dataset(tmp_path / "d")
    assert data.meta["meshes"][0]["pos_dim"] == 2 and data.meta["meshes"][0]["cells"] == {"quad": 6, "triangle": 12}
    assert data.meta["collapsed_2d"] is True and "collapsed_2d" not in json.loads((tmp_path / "d3" / "dataset.json")
                                                                                  .read_text())
    x, y = data.rows(1, np.arange(20))
    np.testing.assert_allclose(y[:, 0], x[:, 0] * 2, rtol=1e-6)
    assert main(["info", str(tmp_path / "d")]) == 0
    assert "2-D      each mesh the lower z-plane of a one-cell-thick 3-D mesh (--collapse-2d)" in capsys.readouterr().out
    pts, tri = grid_triangles(4, 3)
    write_vtu(tmp_path / "src" / "s2.vtu", np.column_stack([pts, pts[:, 0]]), [("triangle", tri)],
              point_data={"p": pts[:, 0], "U": np.zeros((len(pts), 3))})
    _fails([str(tmp_path / "src"), "--inputs", "pos", "--targets", "p", "--collapse-2d"], capsys, tmp_path / "e",
           r"s2\.vtu: Expected a mesh one cell thick in z for --collapse-2d \(got 6 nodes between z = 0 and z = 1 ")


# ---------------------------------------------------------------------------------------------
# --wall-distance


def test_wall_distance_is_the_distance_to_the_nearest_patch_node() -> None:
    rng = np.random.default_rng(0)
    pts = rng.random((200, 3))
    mesh = meshio.Mesh(pts, [("vertex", np.arange(200)[:, None])],
                       point_sets={"a": np.arange(5), "b": np.arange(50, 60), "c": np.array([], dtype=int)})
    got = wall_distance(mesh, ["a", "b"], Path("m.vtm"))
    wall = pts[np.r_[0:5, 50:60]]
    want = np.sqrt(((pts[:, None, :] - wall[None]) ** 2).sum(-1)).min(1)
    np.testing.assert_allclose(got[:, 0], want)
    assert got.shape == (200, 1) and got[np.r_[0:5, 50:60], 0].max() == 0
    with pytest.raises(ValueError, match=r"^m\.vtm: Expected --wall-distance to name boundaries of the file \(got "
                                         r"wall, d; the boundaries are a, b, c\)$"):
        wall_distance(mesh, ["wall", "a", "d"], Path("m.vtm"))
    with pytest.raises(ValueError, match=r"^m\.vtm: Expected nodes on c for --wall-distance \(got none\)$"):
        wall_distance(mesh, ["c"], Path("m.vtm"))
    with pytest.raises(ValueError, match=r"^m\.vtu: Expected named boundaries for --wall-distance \(got none in this "
                                         r"file; a \.vtm with boundary blocks, as foamToVTK writes, node sets or gmsh "
                                         r"physical groups have them\)$"):
        wall_distance(meshio.Mesh(pts, []), ["a"], Path("m.vtu"))


def test_wall_distance_in_a_dataset(tmp_path: Path, capsys) -> None:
    pytest.importorskip("vtkmodules.vtkIOXML", reason="the vtk package is not installed (pip install vtk)")
    m = extruded(6, 4, wedges=True)
    ny = 4
    patches = {"lowerWall": np.arange(0, 24, ny), "inlet": np.arange(0, ny)}  # y = 0, and x = 0
    for k in range(2):
        foam_case(tmp_path / "runs" / f"c{k}", 50, m, {"p": m["points3"][:, 0] * (k + 1)}, patches)
    sources = [str(tmp_path / "runs" / f"c{k}") for k in range(2)]
    _fails([*sources, "--inputs", "pos", "--targets", "p", "--wall-distance", "lowerWall,outlet"], capsys,
           tmp_path / "d", r"c0_50\.vtm: Expected --wall-distance to name boundaries of the file \(got outlet; the "
           r"boundaries are lowerWall, inlet\)$")
    (tmp_path / "p.csv").write_text("sample,wall_distance\nc0,1\nc1,2\n")
    _fails([*sources, "--inputs", "pos", "--targets", "p", "--wall-distance", "lowerWall", "--params",
            str(tmp_path / "p.csv")], capsys, tmp_path / "d",
           r"p\.csv: Expected parameter names apart from the input fields \(got wall_distance in both\)$")
    out = build_dataset(sources, tmp_path / "d", inputs="pos", targets="p", wall_distance=["lowerWall", "inlet"],
                        collapse_2d=True, val_fraction=0)
    data = open_dataset(out)
    assert data.input_channels == ["pos[0]", "pos[1]", "wall_distance"]
    assert data.meta["inputs"][1] == {"name": "wall_distance", "components": 1, "patches": ["lowerWall", "inlet"]}
    x, _ = data.rows(0, np.arange(data.num_nodes(0)))
    np.testing.assert_allclose(x[:, 2], np.minimum(x[:, 0], x[:, 1]), atol=1e-6)  # walls at y = 0 and x = 0
    flat = build_dataset(sources[:1], tmp_path / "d3", inputs="pos", targets="p", wall_distance="lowerWall")
    x3, _ = open_dataset(flat).rows(0, np.arange(48))
    np.testing.assert_allclose(np.sort(x3[:, 3]), np.sort(np.repeat(np.sort(x[:, 1]), 2)), atol=1e-6)
    own = foam_case(tmp_path / "own", 7, m, {"p": m["points3"][:, 0], "wall_distance": m["points3"][:, 1]}, patches)
    _fails([str(own), "--inputs", "pos,wall_distance", "--targets", "p", "--wall-distance", "inlet"], capsys,
           tmp_path / "e", r"error: Expected --inputs apart from wall_distance, the channel --wall-distance adds \(got "
           r"it in both\)$")
    _fails([str(FOAM_CAVITY / "VTK" / "cavity_2" / "internal.vtu"), "--inputs", "pos", "--targets", "p",
            "--wall-distance", "movingWall"], capsys, tmp_path / "e",
           r"internal\.vtu: Expected named boundaries for --wall-distance \(got none in this file")
