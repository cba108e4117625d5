"""Graph builders: nodal (higher-order cells included), dual, kNN, radius, edge lists."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from meshshard.partition import Graph
from meshshard.partition._graph import cell_edge_pairs, dual_graph, knn_graph, nodal_graph, radius_graph

from .conftest import grid_triangles


def _neighbours(graph: Graph, node: int) -> list[int]:
    return graph.indices[graph.indptr[node]:graph.indptr[node + 1]].tolist()


def test_from_edge_index_is_simple_symmetric_and_sorted() -> None:
    edges = np.array([[0, 1, 1, 2, 2, 3], [1, 0, 2, 2, 0, 1]])  # duplicate, self-loop
    graph = Graph.from_edge_index(edges, 5)
    assert graph.num_nodes == 5 and graph.num_edges == 8
    assert [_neighbours(graph, v) for v in range(5)] == [[1, 2], [0, 2, 3], [0, 1], [1], []]
    src, dst = graph.edge_index()
    assert (np.diff(dst * 5 + src) > 0).all()  # global edge ids in (dst, src) order


@pytest.mark.parametrize(("edges", "match"), [
    (np.zeros((3, 2), dtype=int), r"Expected 'edge_index' of shape \(2, E\) \(got \(3, 2\)\)"),
    (np.array([[0], [7]]), r"Expected node ids in \[0, 4\) in 'edge_index'"),
    (np.array([[0.5], [1.0]]), "Expected an integer 'edge_index'"),
])
def test_from_edge_index_rejects(edges: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Graph.from_edge_index(edges, 4)


def test_quadratic_triangle_keeps_mid_edge_nodes() -> None:
    graph = nodal_graph([("triangle6", np.arange(6)[None])], 6)
    assert [_neighbours(graph, v) for v in range(6)] == [
        [3, 5], [3, 4], [4, 5], [0, 1], [1, 2], [0, 2]]


def test_quadratic_tetra_and_quad9() -> None:
    tet = nodal_graph([("tetra10", np.arange(10)[None])], 10)
    assert tet.degree().tolist() == [3] * 4 + [2] * 6  # each corner: 3 mid nodes; each mid: 2
    quad = nodal_graph([("quad9", np.arange(9)[None])], 9)
    assert _neighbours(quad, 8) == [4, 5, 6, 7]
    assert quad.degree().min() >= 2


def test_unknown_cell_type_is_a_clique_and_isolated_nodes_stay() -> None:
    assert cell_edge_pairs("hexahedron27", 27).shape == (27 * 26 // 2, 2)
    graph = nodal_graph([("hexahedron27", np.arange(27)[None])], 30)
    assert graph.degree()[:27].tolist() == [26] * 27
    assert graph.degree()[27:].tolist() == [0, 0, 0]


def test_mixed_cells() -> None:
    cells = [("triangle", np.array([[0, 1, 2]])), ("quad", np.array([[1, 3, 4, 2]])),
             ("line", np.array([[4, 5]])), ("vertex", np.array([[6]]))]
    graph = nodal_graph(cells, 7)
    assert [_neighbours(graph, v) for v in range(7)] == [
        [1, 2], [0, 2, 3], [0, 1, 4], [1, 4], [2, 3, 5], [4], []]


def test_dual_graph_shares_faces_only() -> None:
    points = np.random.default_rng(0).random((6, 3))
    tets = np.array([[0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 4, 5]])  # 0-1 share a face, 0-2 an edge
    cells = [("tetra", tets), ("triangle", np.array([[0, 1, 2]]))]  # boundary face left out
    graph = dual_graph(cells, points)
    assert graph.num_nodes == 3
    assert [_neighbours(graph, c) for c in range(3)] == [[1], [0], []]
    np.testing.assert_allclose(graph.pos[0], points[:4].mean(axis=0))
    assert dual_graph(cells, points, ncommon=2).num_edges == 6


def test_knn_is_symmetric_with_at_least_k_neighbours() -> None:
    pos = np.random.default_rng(1).random((80, 3))
    graph = knn_graph(pos, 5)
    dense = np.zeros((80, 80), dtype=bool)
    dense[graph.edge_index()[1], graph.edge_index()[0]] = True
    assert (dense == dense.T).all() and not dense.diagonal().any()
    assert graph.degree().min() >= 5
    nearest = np.argsort(cdist(pos, pos), axis=1)[:, 1:6]
    assert dense[np.arange(80)[:, None], nearest].all()


def test_radius_graph_matches_brute_force() -> None:
    pos = np.random.default_rng(2).random((60, 2))
    graph = radius_graph(pos, 0.2)
    dense = np.zeros((60, 60), dtype=bool)
    dense[graph.edge_index()[1], graph.edge_index()[0]] = True
    expected = cdist(pos, pos) <= 0.2
    np.fill_diagonal(expected, False)
    assert (dense == expected).all()
    with pytest.raises(ValueError, match=r"Expected --radius > 0 \(got 0.0\)"):
        radius_graph(pos, 0.0)


def _reference_nodal(cells: list[tuple[str, np.ndarray]], num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodal graph's CSR the plain way: every cell-edge pair both ways, np.unique of the keys."""
    ends = [c[:, cell_edge_pairs(t, c.shape[1])].reshape(-1, 2) for t, c in cells if len(c)]
    pairs = np.concatenate(ends).astype(np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    keys = np.unique(np.concatenate([pairs[:, 0] * num_nodes + pairs[:, 1],
                                     pairs[:, 1] * num_nodes + pairs[:, 0]]))
    dst, src = keys // num_nodes, keys % num_nodes
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=num_nodes))])
    return indptr, src


def _random_mesh(seed: int, num_nodes: int) -> list[tuple[str, np.ndarray]]:
    """Mixed cell blocks over random nodes (repeated cells and nodes no cell uses included),
    shuffled so that every chunk of cells spans all rows."""
    rng = np.random.default_rng(seed)
    used = num_nodes - 7  # the last 7 nodes stay isolated
    tets = rng.integers(0, used, (900, 4))
    tets = np.concatenate([tets, tets[:50], tets[::-7, ::-1]])  # the same cells again, reversed
    blocks = [("tetra", tets), ("triangle", rng.integers(0, used, (300, 3))),
              ("hexahedron", rng.integers(0, used, (40, 8))), ("line", rng.integers(0, used, (25, 2))),
              ("tetra10", rng.integers(0, used, (30, 10))), ("vertex", rng.integers(0, used, (5, 1))),
              ("quad", np.zeros((0, 4), dtype=np.int64))]
    return [(t, c.astype(np.int32 if seed % 2 else np.int64)) for t, c in blocks]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("chunk", "workers"), [(None, 1), (64, 1), (64, 2), (1000, 2)])
def test_nodal_graph_matches_reference(monkeypatch: pytest.MonkeyPatch, seed: int,
                                       chunk: int | None, workers: int) -> None:
    from meshshard.partition import _graph

    num_nodes = 400
    cells = _random_mesh(seed, num_nodes)
    if chunk is not None:  # many chunks: pairs that several chunks share must merge
        monkeypatch.setattr(_graph, "PAIR_CHUNK", chunk)
        monkeypatch.setattr(_graph, "_SMALL", 0)
        monkeypatch.setattr(_graph, "_MIRROR_BLOCK", 50)  # the result filled in many blocks
    monkeypatch.setattr(_graph, "GRAPH_WORKERS", workers)
    graph = nodal_graph(cells, num_nodes)
    indptr, indices = _reference_nodal(cells, num_nodes)
    assert graph.indptr.dtype == np.int64 and graph.indices.dtype == np.int64
    np.testing.assert_array_equal(graph.indptr, indptr)
    np.testing.assert_array_equal(graph.indices, indices)
    assert graph.degree()[-7:].tolist() == [0] * 7


def test_nodal_graph_of_a_lattice_does_not_depend_on_the_chunks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells in mesh order (the two triangles of a square together): chunks over successive
    rows, spliced without merging them all together; the halves in turn, or chunks narrower
    than a row of the mesh: merged together."""
    from meshshard.partition import _graph

    points, triangles = grid_triangles(40, 30)
    half = len(triangles) // 2
    in_order = np.stack([triangles[:half], triangles[half:]], 1).reshape(-1, 3)
    merged = []
    merge_all = _graph._upper_csr
    monkeypatch.setattr(_graph, "_upper_csr", lambda *a: merged.append(len(a[0])) or merge_all(*a))
    for cells, settings in [(in_order, [(None, 2), (999, 1), (999, 2), (2000, 2)]),
                            (triangles, [(None, 2), (999, 2), (50, 2)])]:
        indptr, indices = _reference_nodal([("triangle", cells)], len(points))
        for chunk, workers in settings:
            monkeypatch.setattr(_graph, "PAIR_CHUNK", chunk or (1 << 25))
            monkeypatch.setattr(_graph, "_SMALL", 0 if chunk else 1 << 20)
            monkeypatch.setattr(_graph, "GRAPH_WORKERS", workers)
            graph = nodal_graph([("triangle", cells)], len(points))
            np.testing.assert_array_equal(graph.indptr, indptr)
            np.testing.assert_array_equal(graph.indices, indices)
        assert bool(merged) == (cells is triangles), merged
        merged.clear()


def test_nodal_graph_with_no_edges() -> None:
    graph = nodal_graph([("vertex", np.arange(3)[:, None]), ("line", np.array([[2, 2]]))], 4)
    assert graph.indptr.tolist() == [0] * 5 and graph.num_edges == 0
    assert graph.indices.dtype == np.int64


@pytest.mark.parametrize("seed", [0, 1])
def test_symmetric_csr_matches_reference(seed: int) -> None:
    from meshshard.partition._graph import symmetric_csr

    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 50, 700), rng.integers(0, 50, 700)  # self-loops, both directions
    indptr, indices = symmetric_csr(a, b, 60)
    keys = np.unique(np.concatenate([a * 60 + b, b * 60 + a])[np.tile(a != b, 2)])
    np.testing.assert_array_equal(indptr, np.r_[0, np.cumsum(np.bincount(keys // 60, minlength=60))])
    np.testing.assert_array_equal(indices, keys % 60)


def _as_chunk(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = np.unique(lo.astype(np.int64) * 1000 + hi)
    return (keys // 1000).astype(np.int32), (keys % 1000).astype(np.int32)


@pytest.mark.parametrize("layout", ["bands", "bands, reversed", "sparse", "nested", "wide", "one",
                                    "none"])
def test_merge_chunks_matches_the_union(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Chunks over successive row ranges that overlap their neighbours' (as cells in mesh order
    give) are spliced, only the shared bands made distinct again; any other layout is merged
    all together. Either way: the distinct union, sorted."""
    from meshshard.partition import _graph

    rng = np.random.default_rng(3)
    ranges = {"bands": [(0, 120), (100, 260), (250, 400), (400, 402), (401, 600)],
              "nested": [(0, 300), (100, 150), (280, 600)],  # a chunk inside another's rows
              "wide": [(0, 300), (100, 400), (250, 600)],  # the first and last overlap too
              "one": [(5, 600)], "none": [],
              "sparse": [(0, 100), (150, 300), (290, 600)]}  # gaps, and rows with no pair
    ranges["bands, reversed"] = ranges["bands"][::-1]
    los, his = [], []
    size = 40 if layout == "sparse" else 900
    for a, b in ranges[layout]:
        lo = rng.integers(a, b, size).astype(np.int32)
        los.append(lo)
        his.append(lo + rng.integers(1, 50, size).astype(np.int32))
    chunks = [_graph._distinct_rows(lo.copy(), hi, np.int32) for lo, hi in zip(los, his)]
    chunks.append(_graph._distinct_rows(np.zeros(0, np.int32), np.zeros(0, np.int32), np.int32))
    expected_lo, expected_hi = _as_chunk(np.concatenate(los or [np.zeros(0, np.int32)]),
                                         np.concatenate(his or [np.zeros(0, np.int32)]))
    if layout.startswith("bands") or layout in ("sparse", "one", "none"):
        def refuse(*args: object) -> None:
            raise AssertionError("merged all together")
        monkeypatch.setattr(_graph, "_upper_csr", refuse)
    upper = _graph._merge_chunks(chunks, 700)
    assert upper.shape == (700, 700)
    np.testing.assert_array_equal(np.repeat(np.arange(700), np.diff(upper.indptr)), expected_lo)
    np.testing.assert_array_equal(upper.indices, expected_hi)
