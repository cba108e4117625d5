"""Reading inputs: METIS graphs and meshes, meshio meshes, point clouds, and bad files.

Real data from ../shared/data (see its README): KarypisLab/METIS graphs (Apache-2.0), the
Walshaw archive via NetworKit (MIT), SfePy meshes (BSD-3-Clause).
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path

import numpy as np
import pytest

from meshshard.partition import build_graph, check_partitions, partition_graph, read_input
from meshshard.partition._io import read_metis_graph


def _naive_metis_adjacency(path: Path) -> list[list[int]]:
    """Reference parse of an unweighted METIS graph, one line at a time (test only)."""
    lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("%")]
    n = int(lines[0].split()[0])
    return [sorted(int(t) - 1 for t in ln.split()) for ln in lines[1:n + 1]]


@pytest.mark.parametrize("name", ["metis/4elt.graph", "walshaw/fe_4elt2.graph",
                                  "walshaw/wing.graph"])
def test_metis_graph_matches_line_by_line_parse(shared_data: Path, name: str) -> None:
    data = read_input(shared_data / name)
    expected = _naive_metis_adjacency(shared_data / name)
    graph = data.graph
    assert data.kind == "graph" and data.pos is None
    assert graph.num_nodes == len(expected)
    assert graph.indices.tolist() == [v for row in expected for v in row]
    assert graph.degree().tolist() == [len(row) for row in expected]


def test_4elt_counts(shared_data: Path) -> None:
    graph = read_input(shared_data / "metis/4elt.graph").graph
    assert (graph.num_nodes, graph.num_edges) == (15606, 2 * 45878)


def test_wave_bz2_counts(shared_data: Path) -> None:
    """Its read time is measured by bench/partition.py (tests never assert on wall time)."""
    data = read_input(shared_data / "walshaw/wave.graph.bz2")
    assert (data.num_nodes, data.graph.num_edges) == (156317, 2 * 1059331)


def test_multi_constraint_vertex_weights(shared_data: Path) -> None:
    graph = read_input(shared_data / "metis/test.mgraph").graph
    assert graph.vertex_weights.shape == (766, 2)
    assert graph.vertex_weights[:3].tolist() == [[1, 1], [2, 2], [4, 4]]
    assert graph.indices[graph.indptr[0]:graph.indptr[1]].tolist() == sorted(
        [479 - 1, 389 - 1, 571 - 1, 2 - 1])
    partitions = partition_graph(graph, 4)
    assert check_partitions(partitions) == []


def test_edge_weights_comments_and_isolated_vertex(tmp_path: Path) -> None:
    text = b"% a comment\n4 2 011\n% another\n1 2 5\n2 1 5 3 7\n3 2 7\n\n"
    path = tmp_path / "w.graph.bz2"
    path.write_bytes(bz2.compress(text.replace(b"\n\n", b"\n0\n")))
    graph = read_input(path).graph
    assert graph.num_nodes == 4 and graph.degree().tolist() == [1, 2, 1, 0]
    assert graph.vertex_weights.ravel().tolist() == [1, 2, 3, 0]
    assert graph.edge_weights.tolist() == [5, 5, 7, 7]
    blank = read_metis_graph(b"3 1\n2\n1\n\n")  # an isolated vertex is a blank line
    assert blank.degree().tolist() == [1, 1, 0]


@pytest.mark.parametrize(("text", "match"), [
    (b"3 2\n2\n1 3\n", "Expected 2 edges as the header says"),
    (b"2 1\n3\n1\n", r"Expected neighbour ids in 1..2"),
    (b"3 1\n2\n\n\n", "Expected 1 edges as the header says"),
    (b"3 2\n2 3\n1\n2\n", "Expected a symmetric graph"),
    (b"2 1\n2\n1 x\n", "Expected only integers in the vertex lines"),
    (b"2 1\n1\n1\n", "Expected no self-loops"),
    (b"2 2\n2 2\n1 1\n", "Expected each edge listed once per end"),
    (b"2 1 011\n1 2\n1 1 5\n", "Expected 1 weights then neighbour weight pairs on vertex line 1"),
    (b"hello\n", "Expected only integers in the header line"),
    (b"2 1 2\n", "Expected fmt to be up to three 0/1 digits"),
    (b"2 0\n\n\n5\n", "Expected 2 vertex lines"),
])
def test_bad_metis_graphs(text: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_metis_graph(text)


def test_metis_mesh(shared_data: Path) -> None:
    data = read_input(shared_data / "metis/metis.mesh")
    assert data.kind == "mesh" and data.pos is None
    assert [(t, c.shape) for t, c in data.cells] == [("metis:3", (7434, 3))]
    dual = build_graph(data, "dual")
    assert dual.num_nodes == 7434
    nodal = build_graph(data)
    assert nodal.num_nodes == data.num_nodes and nodal.degree().min() >= 2


def test_metis_mesh_forced_format_and_weights(tmp_path: Path) -> None:
    path = tmp_path / "two.txt"
    path.write_bytes(b"2 1\n7 1 2 3\n9 2 3 4\n")
    data = read_input(path, format="metis-mesh")
    assert [c.tolist() for _, c in data.cells] == [[[0, 1, 2], [1, 2, 3]]]


# SfePy meshes (BSD-3-Clause): nodes and cells as listed in ../shared/data/README.md.
SFEPY = [
    ("cube_cylinder.mesh", 10490, "tetra", 54517),
    ("wheelset.vtk", 5457, "tetra", 21934),
    ("piezo_mesh_micro.vtk", 8918, "tetra", 42744),
    ("acoustics_mesh3d.mesh", 5272, "hexahedron", 4380),
    ("big.mesh", 2885, "triangle", 5568),
]


@pytest.mark.parametrize(("name", "nodes", "cell_type", "cells"), SFEPY)
def test_sfepy_meshes(shared_data: Path, tmp_path: Path, name: str, nodes: int, cell_type: str,
                      cells: int) -> None:
    import meshio

    data = read_input(shared_data / "sfepy" / name)
    assert data.num_nodes == nodes and data.pos.dtype == np.float64
    blocks = dict((t, c) for t, c in data.cells)
    assert blocks[cell_type].shape[0] == cells
    graph = build_graph(data)
    assert graph.kind == "nodal" and graph.num_nodes == nodes
    # meshio round trip: the same graph from a re-written file
    copy = tmp_path / "copy.vtu"
    meshio.write(copy, meshio.Mesh(data.pos, list(data.cells)))
    again = build_graph(read_input(copy))
    np.testing.assert_array_equal(again.indptr, graph.indptr)
    np.testing.assert_array_equal(again.indices, graph.indices)
    assert check_partitions(partition_graph(graph, 3, halo_hops=2)) == []


def test_point_clouds(tmp_path: Path) -> None:
    pos = np.random.default_rng(1).random((50, 2))
    np.save(tmp_path / "p.npy", pos)
    np.savez(tmp_path / "p.npz", pos=pos, other=np.zeros(3))
    for name in ("p.npy", "p.npz"):
        data = read_input(tmp_path / name)
        assert data.kind == "points"
        np.testing.assert_array_equal(data.pos, pos)
        assert build_graph(data).kind == "knn"


@pytest.mark.parametrize(("setup", "match"), [
    (lambda d: d / "missing.vtk", "no such file"),
    (lambda d: d, "is a directory"),
    (lambda d: _write(d / "x.xyz", b"1 2 3"), r"unknown input format '.xyz'"),
    (lambda d: _save(d / "e.npy", np.zeros((0, 3))), "Expected at least one node"),
    (lambda d: _save(d / "n.npy", np.array([[0, 0], [np.nan, 1.0]])),
     r"Expected finite coordinates \(got 1 nodes with NaN or inf, the first is node 1\)"),
    (lambda d: _save(d / "i.npy", np.array([[0, 0], [np.inf, 1.0]])), "Expected finite"),
    (lambda d: _save(d / "s.npy", np.zeros((4, 5))), r"Expected points of shape \(N, 2\)"),
    (lambda d: _write(d / "b.npy", b"not numpy"), "not a valid .npy array"),
    (lambda d: _write(d / "c.graph.bz2", b"not bz2"), "cannot decompress"),
    (lambda d: _write(d / "m.vtk", b"# vtk DataFile\ngarbage\n"), "meshio cannot read it"),
    (lambda d: _write(d / "z.mesh", b"2\n1 2 3\n"), "Expected 2 elements"),
])
def test_bad_inputs(tmp_path: Path, setup, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_input(setup(tmp_path))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _save(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


@pytest.mark.parametrize(("setup", "match"), [
    (lambda d: _save(d / "c.npy", np.ones((5, 3)) * (1 + 2j)),
     r"^Expected real coordinates \(got a complex128 array\)$"),
    (lambda d: _savez(d / "two.npz", x=np.ones((5, 3)), y=np.ones((5, 3))),
     r"^Expected the points as an array named 'pos' in the \.npz archive \(got x, y\)$"),
    (lambda d: _savez(d / "one.npz", points=np.ones((5, 3))),
     r"^Expected the points as an array named 'pos' in the \.npz archive \(got points\)$"),
    (lambda d: _savez(d / "c.npz", pos=np.ones((5, 2), dtype=np.complex64)),
     r"^Expected real coordinates \(got a complex64 array\)$"),
])
def test_point_clouds_that_are_not_coordinates_are_refused(tmp_path: Path, setup, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_input(setup(tmp_path))


def _savez(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_a_truncated_vtk_file_says_so(tmp_path: Path, capsys) -> None:
    """meshio stops on a truncated binary .vtk with a bare AssertionError, IndexError or KeyError:
    the reason given is that the file is truncated or malformed, not the exception's empty text."""
    import warnings

    import meshio

    from meshshard.cli import main

    from .conftest import grid_triangles

    pts, tri = grid_triangles(10, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(tmp_path / "whole.vtk", meshio.Mesh(np.c_[pts, np.zeros(len(pts))], [("triangle", tri)]),
                     binary=True)
    data = (tmp_path / "whole.vtk").read_bytes()
    reasons = {}
    for cut in range(40, len(data) // 2, 11):
        (tmp_path / "cut.vtk").write_bytes(data[:cut])
        with pytest.raises(ValueError) as info:
            read_input(tmp_path / "cut.vtk")
        reasons[str(info.value)] = cut
    bare = [r for r in reasons if "truncated" not in r and re.search(r"\((AssertionError|IndexError|KeyError|'\w+'|list index out of range)\)$", r)]
    assert not bare, bare
    truncated = [r for r in reasons if r.startswith("meshio cannot read it: the file is truncated or malformed (")]
    assert any("(AssertionError)" in r for r in truncated), reasons
    (tmp_path / "cut.vtk").write_bytes(data[:reasons[truncated[0]]])
    assert main(["partition", str(tmp_path / "cut.vtk"), "-k", "2", "-o", str(tmp_path / "p"), "-q"]) == 2
    assert capsys.readouterr().err == (f"meshshard partition: error: {tmp_path / 'cut.vtk'}: {truncated[0]}\n")
