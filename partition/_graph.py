"""The graph every partitioner works on, and the builders that make it from meshes and points.

A :class:`Graph` is undirected and stored as a symmetric CSR matrix with sorted columns: row
``i`` lists the neighbours of node ``i``. Read as directed edges, row ``dst`` lists the sources
``src`` of the edges ``src -> dst``, so the position of an entry in ``indices`` is the **global
edge id**: directed edges are numbered in ``(dst, src)`` lexicographic order. Self-loops and
duplicate edges are never stored.

Builders (all vectorised, no Python loop per node, edge or cell):

- :func:`nodal_graph`: mesh nodes joined along cell edges. Higher-order cells keep every node:
  an edge of a quadratic cell is the chain ``corner - mid - corner`` (so a mid-edge node is joined
  to the two corners of its edge), and the centre node of a ``quad9`` is joined to the four
  mid-edge nodes. Cell types with no edge table (``hexahedron27``, cubic and higher Lagrange
  cells, ...) join every pair of their nodes, which is connected and keeps every node.
- :func:`dual_graph`: one node per cell of the mesh's highest dimension (lower-dimensional
  boundary cells are left out), joined when two cells share at least ``ncommon`` corner nodes.
- :func:`knn_graph` and :func:`radius_graph`: point clouds, through ``scipy.spatial.cKDTree``;
  the kNN graph is symmetrised (``i - j`` when either is among the other's ``k`` nearest).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = [
    "Graph",
    "nodal_graph",
    "dual_graph",
    "knn_graph",
    "radius_graph",
    "cell_edge_pairs",
    "sorted_unique",
]

#: A mesh's cells: ``(meshio cell type, connectivity (C, nodes per cell))`` per block.
Cells = Sequence[tuple[str, np.ndarray]]

_LINEAR_EDGES: dict[str, tuple[tuple[int, int], ...]] = {
    "line": ((0, 1),),
    "triangle": ((0, 1), (1, 2), (2, 0)),
    "quad": ((0, 1), (1, 2), (2, 3), (3, 0)),
    "tetra": ((0, 1), (1, 2), (2, 0), (0, 3), (1, 3), (2, 3)),
    "hexahedron": (
        (0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6),
        (6, 7), (7, 4), (0, 4), (1, 5), (2, 6), (3, 7),
    ),
    "wedge": ((0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3), (0, 3), (1, 4), (2, 5)),
    "pyramid": ((0, 1), (1, 2), (2, 3), (3, 0), (0, 4), (1, 4), (2, 4), (3, 4)),
}
_CORNERS = {"vertex": 1, "line": 2, "triangle": 3, "quad": 4, "tetra": 4, "hexahedron": 8,
            "wedge": 6, "pyramid": 5}
# Quadratic cells (VTK / meshio node order): the corners of the linear cell, then one mid-edge
# node per edge of the linear cell, in the order of _LINEAR_EDGES.
_QUADRATIC = {"line3": "line", "triangle6": "triangle", "quad8": "quad", "tetra10": "tetra",
              "hexahedron20": "hexahedron", "wedge15": "wedge", "pyramid13": "pyramid"}


@dataclass(frozen=True, eq=False)
class Graph:
    """An undirected graph as a symmetric CSR matrix with sorted columns.

    Args:
        indptr: Row pointers; row ``i`` is ``indices[indptr[i]:indptr[i + 1]]``.
        indices: Neighbour of each stored entry; entry ``e`` of row ``dst`` is the directed edge
            ``indices[e] -> dst`` with global edge id ``e``.
        pos: Node coordinates, when known.
        vertex_weights: Integer weights per node and constraint (METIS ``vwgt``).
        edge_weights: Positive integer weight of each stored entry (METIS ``adjwgt``), the same
            for both directions of an edge.
        kind: How the graph was made (``"nodal"``, ``"dual"``, ``"knn"``, ``"radius"``,
            ``"file"``, ``"edge_index"``).

    Shapes:
        indptr: ``(N + 1,)`` int64. indices: ``(E,)`` int64, ``E`` directed edges (twice the
        undirected ones). pos: ``(N, D)`` float64. vertex_weights: ``(N, ncon)`` int64.
        edge_weights: ``(E,)`` int64.
    """

    indptr: np.ndarray
    indices: np.ndarray
    pos: np.ndarray | None = None
    vertex_weights: np.ndarray | None = None
    edge_weights: np.ndarray | None = None
    kind: str = "edge_index"

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        """Directed edges (each undirected edge counts twice)."""
        return len(self.indices)

    def degree(self) -> np.ndarray:
        """Number of neighbours of each node, ``(N,)`` int64."""
        return np.diff(self.indptr)

    def edge_index(self) -> np.ndarray:
        """All directed edges in global edge id order, ``(2, E)`` int64, row 0 src, row 1 dst."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.degree())
        return np.stack([self.indices, dst])

    def __repr__(self) -> str:
        dim = "none" if self.pos is None else self.pos.shape[1]
        return (f"Graph(kind={self.kind!r}, num_nodes={self.num_nodes}, "
                f"num_edges={self.num_edges}, pos_dim={dim})")

    @classmethod
    def from_edge_index(
        cls,
        edge_index: np.ndarray,
        num_nodes: int,
        *,
        pos: np.ndarray | None = None,
        vertex_weights: np.ndarray | None = None,
        kind: str = "edge_index",
    ) -> Graph:
        """Build the undirected graph of a list of edges (either direction; duplicates and
        self-loops are dropped).

        Shapes:
            edge_index: ``(2, E_in)`` integer, node ids in ``[0, num_nodes)``.
        """
        edge_index = np.asarray(edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"Expected 'edge_index' of shape (2, E) (got {edge_index.shape})")
        if edge_index.size and not np.issubdtype(edge_index.dtype, np.integer):
            raise ValueError(f"Expected an integer 'edge_index' (got dtype {edge_index.dtype})")
        edge_index = edge_index.astype(np.int64, copy=False)
        if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
            raise ValueError(
                f"Expected node ids in [0, {num_nodes}) in 'edge_index' "
                f"(got range [{edge_index.min()}, {edge_index.max()}])")
        indptr, indices = symmetric_csr(edge_index[0], edge_index[1], num_nodes)
        return cls(indptr, indices, pos=pos, vertex_weights=vertex_weights, kind=kind)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (a sort; numpy's hash-based ``np.unique`` is several
    times slower on millions of integers)."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def symmetric_csr(a: np.ndarray, b: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the undirected graph with edges ``a[i] - b[i]``, without self-loops or duplicates.

    The pairs are oriented ``lo < hi`` and made distinct (:func:`_upper_csr`), then mirrored
    (:func:`_mirror`).

    Shapes:
        a, b: ``(M,)`` integer. Returns indptr ``(N + 1,)`` and sorted-per-row indices ``(E,)``,
        both int64.
    """
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return _mirror(_upper_csr(lo, hi, num_nodes))


def _upper_csr(lo: np.ndarray, hi: np.ndarray, num_nodes: int) -> sp.csr_array:
    """The distinct pairs ``(lo[i], hi[i])``, self-loops dropped, as a CSR matrix in canonical
    form (row ``lo``, sorted distinct columns ``hi``).

    scipy's C++ COO-to-CSR conversion (a counting sort by row, then small per-row sorts) is
    several times faster than a global sort of edge keys on large meshes.

    Shapes:
        lo, hi: ``(M,)`` integer, ``lo <= hi``. Returns an ``(N, N)`` matrix.
    """
    keep = lo != hi
    if not keep.all():
        lo, hi = lo[keep], hi[keep]
    del keep
    ones = np.ones(len(lo), dtype=bool)  # bool: duplicates merge, never overflow
    upper = sp.csr_array((ones, (lo, hi)), shape=(num_nodes, num_nodes))
    upper.sum_duplicates()
    return upper


def _mirror(upper: sp.csr_array) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric CSR ``upper + upper.T`` of a canonical strictly upper triangular matrix,
    as int64 ``(indptr, indices)`` with sorted rows.

    No sort: row ``r`` is the column ``r`` of ``upper`` (its rows ``< r``, ascending after the
    stable counting sort of ``upper.T.tocsr()``) followed by the row ``r`` of ``upper``
    (columns ``> r``, ascending). The two are written into the int64 result through a mask of
    the slots of each part, :data:`_MIRROR_BLOCK` entries at a time (small buffers that the
    allocator reuses), so no int32 copy of the whole graph is made.
    """
    n = upper.shape[0]
    lower = upper.T.tocsr()
    indptr = np.add(upper.indptr, lower.indptr, dtype=np.int64)
    indices = np.empty(int(indptr[-1]), dtype=np.int64)
    rows = max(1, n * _MIRROR_BLOCK // max(len(indices), 1))
    sides = np.tile(np.array([False, True]), min(rows, n))  # row r: lower part, then upper
    runs = np.empty(2 * min(rows, n), dtype=np.int64)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        up, low = upper.indptr[start:stop + 1], lower.indptr[start:stop + 1]
        np.subtract(low[1:], low[:-1], out=runs[0:2 * (stop - start):2])
        np.subtract(up[1:], up[:-1], out=runs[1:2 * (stop - start):2])
        is_upper = np.repeat(sides[:2 * (stop - start)], runs[:2 * (stop - start)])
        block = indices[indptr[start]:indptr[stop]]
        block[is_upper] = upper.indices[up[0]:up[-1]]
        np.logical_not(is_upper, out=is_upper)
        block[is_upper] = lower.indices[low[0]:low[-1]]
    return indptr, indices


#: Entries of the symmetric CSR that :func:`_mirror` fills at a time.
_MIRROR_BLOCK = 1 << 21


def _index_dtype(num_nodes: int) -> type:
    """int32 when node ids fit: half the memory traffic for the big edge lists."""
    return np.int32 if num_nodes < 2**31 - 1 else np.int64


def cell_edge_pairs(cell_type: str, nodes_per_cell: int) -> np.ndarray:
    """Local node pairs joined in the nodal graph of one cell of ``cell_type``.

    Shapes:
        Returns ``(P, 2)`` int64 local node indices.
    """
    if cell_type == "vertex" or nodes_per_cell < 2:
        return np.zeros((0, 2), dtype=np.int64)
    if cell_type in _LINEAR_EDGES:
        return np.array(_LINEAR_EDGES[cell_type], dtype=np.int64)
    base = _QUADRATIC.get("quad8" if cell_type == "quad9" else cell_type)
    if base is not None:
        edges = np.array(_LINEAR_EDGES[base], dtype=np.int64)
        mid = _CORNERS[base] + np.arange(len(edges), dtype=np.int64)
        chain = np.concatenate([np.stack([edges[:, 0], mid], 1), np.stack([mid, edges[:, 1]], 1)])
        if cell_type == "quad9":
            chain = np.concatenate([chain, np.stack([np.full(4, 8), mid], 1)])
        return chain
    if cell_type == "polygon":
        ring = np.arange(nodes_per_cell, dtype=np.int64)
        return np.stack([ring, np.roll(ring, -1)], 1)
    return np.array(list(itertools.combinations(range(nodes_per_cell), 2)), dtype=np.int64)


#: Cell-edge pairs in flight at once in :func:`nodal_graph`, over all its workers (bounds its
#: working memory).
PAIR_CHUNK = 1 << 25
#: Threads of :func:`nodal_graph` (scipy's sparse kernels and numpy's ``take`` and ufuncs let go
#: of the GIL, so on two cores two chunks are made distinct at once).
GRAPH_WORKERS = max(1, min(2, os.cpu_count() or 1))
#: Below this many cell-edge pairs :func:`nodal_graph` takes the cells in one piece.
_SMALL = 1 << 20


def release_freed_memory() -> None:
    """Give the memory that threads freed back to the system (glibc's ``malloc_trim``; a no-op
    where there is none).

    Each worker thread allocates from its own malloc arena, which keeps what it frees; the main
    thread (METIS) cannot reuse it, so without this it adds to the next step's peak.
    """
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # no glibc (TypeError: Windows' CDLL(None))
        return
    trim(0)


#: A chunk's distinct pairs by rows: ``(first, indptr, hi)``, row ``first + i`` (a ``lo``) holding
#: the sorted ``hi[indptr[i]:indptr[i + 1]]``; its first and last rows are not empty.
Rows = tuple[int, np.ndarray, np.ndarray]


def _chunk_pairs(conn: np.ndarray, pairs: np.ndarray, dtype: type,
                 scratch: threading.local) -> Rows | None:
    """The distinct undirected pairs ``(lo, hi)``, ``lo < hi``, of ``conn``'s cell edges, self-
    loops dropped, by rows (:func:`_distinct_rows`); ``None`` when there are none.

    The pairs are oriented in place, in buffers that each thread keeps (``scratch``) from
    one chunk to the next: page faults on fresh memory cost as much as the sort.

    Shapes:
        conn: ``(C, k)`` node ids. pairs: ``(P, 2)`` local node pairs.
    """
    conn = conn.astype(dtype, copy=False)
    size = len(conn) * len(pairs)
    if getattr(scratch, "size", -1) < size:
        scratch.size = size
        scratch.lo, scratch.hi = np.empty(size, dtype=dtype), np.empty(size, dtype=dtype)
        scratch.keep = np.empty(size, dtype=bool)
    lo, hi, keep = scratch.lo[:size], scratch.hi[:size], scratch.keep[:size]
    # one pair of the cell at a time, straight from the two columns (3x faster than a take)
    for (i, j), lo_p, hi_p in zip(pairs, lo.reshape(len(pairs), -1), hi.reshape(len(pairs), -1)):
        np.minimum(conn[:, i], conn[:, j], out=lo_p)
        np.maximum(conn[:, i], conn[:, j], out=hi_p)
    np.not_equal(lo, hi, out=keep)
    if not keep.all():
        lo, hi = lo[keep], hi[keep]
    return _distinct_rows(lo, hi, dtype)


def _distinct_rows(lo: np.ndarray, hi: np.ndarray, dtype: type) -> Rows | None:
    """The distinct pairs ``(lo[i], hi[i])`` by rows (``lo`` is overwritten); ``None`` for no
    pairs.

    A counting sort by ``lo`` (scipy's COO-to-CSR) over the rows the pairs use, then small
    per-row sorts: linear in the pairs, and only ``O(rows spanned)`` besides.
    """
    if not len(lo):
        return None
    first = int(lo.min())
    lo -= first
    rows = int(lo.max()) + 1
    half = sp.csr_array((np.ones(len(lo), dtype=bool), (lo, hi)),
                        shape=(rows, int(hi.max()) + 1))
    del lo, hi
    half.sum_duplicates()
    return first, half.indptr, half.indices.astype(dtype, copy=False)


def _expand(rows: Rows, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(lo, hi)`` of the local rows ``start:stop`` of a chunk."""
    first, indptr, hi = rows
    stop = len(indptr) - 1 if stop is None else stop
    lo = np.repeat(np.arange(first + start, first + stop, dtype=hi.dtype),
                   np.diff(indptr[start:stop + 1]))
    return lo, hi[indptr[start]:indptr[stop]]


def _merge_chunks(found: list[Rows | None], num_nodes: int) -> sp.csr_array:
    """The union of the chunks' pairs as a canonical upper triangular CSR matrix.

    Cells in mesh order make chunks over successive row (``lo``) ranges, neighbours sharing a
    thin band of rows. Then only the pairs in those bands are made distinct again, and the
    other rows are laid out as they are. Chunks in any other order are merged all together.
    """
    chunks = sorted((f for f in found if f is not None),
                    key=lambda f: (f[0], f[0] + len(f[1]) - 1))
    found.clear()
    first = [f[0] for f in chunks]
    last = [f[0] + len(f[1]) - 2 for f in chunks]
    banded = all(last[k] <= last[k + 1] for k in range(len(chunks) - 1)) and all(
        last[k - 1] < first[k + 1] for k in range(1, len(chunks) - 1))
    if not banded:
        pairs = [_expand(f) for f in chunks]
        chunks.clear()
        lo = np.concatenate([p[0] for p in pairs])
        hi = np.concatenate([p[1] for p in pairs])
        pairs.clear()
        return _upper_csr(lo, hi, num_nodes)
    counts = np.zeros(num_nodes + 1, dtype=np.int64)  # counts[r + 1]: pairs of row r
    his = []
    tail: tuple[np.ndarray, np.ndarray] | None = None
    for k, rows in enumerate(chunks):
        start = 0 if k == 0 else max(0, last[k - 1] + 1 - first[k])  # before: shared with k - 1
        stop = last[k] + 1 - first[k]  # from here on: shared with k + 1
        if k + 1 < len(chunks):
            stop = min(stop, max(first[k + 1] - first[k], start))
        if tail is not None:  # the band of rows shared with chunk k - 1
            head = _expand(rows, 0, start)
            band = _distinct_rows(np.concatenate([tail[0], head[0]]),
                                  np.concatenate([tail[1], head[1]]), rows[2].dtype)
            if band is not None:
                counts[band[0] + 1:band[0] + len(band[1])] = np.diff(band[1])
                his.append(band[2])
        indptr = rows[1]
        counts[first[k] + start + 1:first[k] + stop + 1] = np.diff(indptr[start:stop + 1])
        his.append(rows[2][indptr[start]:indptr[stop]])
        tail = _expand(rows, stop)
    chunks.clear()
    np.cumsum(counts, out=counts)
    hi = np.concatenate(his) if his else np.zeros(0, dtype=_index_dtype(num_nodes))
    del his, tail
    return sp.csr_array((np.ones(len(hi), dtype=bool), hi, counts), shape=(num_nodes, num_nodes))


def nodal_graph(cells: Cells, num_nodes: int, *, pos: np.ndarray | None = None) -> Graph:
    """Mesh nodes joined along the edges of every cell (see the module docstring).

    Nodes that no cell uses stay in the graph, isolated. The cells are taken in chunks of at
    most ``PAIR_CHUNK / GRAPH_WORKERS`` cell-edge pairs, :data:`GRAPH_WORKERS` chunks at a
    time, and each chunk's pairs made distinct, so the memory is that of the graph's edges,
    not of every cell's (a tet mesh lists each edge about 5 times). The pairs that two chunks
    share merge last (:func:`_merge_chunks`); the result does not depend on the chunking.

    Shapes:
        cells: blocks of ``(C_b, k_b)`` node ids. pos: ``(N, D)``.
    """
    dtype = _index_dtype(num_nodes)
    jobs = []
    for cell_type, conn in cells:
        pairs = cell_edge_pairs(cell_type, conn.shape[1])
        if not len(pairs) or not len(conn):
            continue
        total = len(conn) * len(pairs)
        pieces = 1 if total <= _SMALL else GRAPH_WORKERS * -(-total // PAIR_CHUNK)
        step = -(-len(conn) // pieces)
        jobs += [(conn[start:start + step], pairs) for start in range(0, len(conn), step)]
    scratch = threading.local()
    if len(jobs) > 1 and GRAPH_WORKERS > 1:
        with ThreadPoolExecutor(GRAPH_WORKERS) as pool:  # map: at most GRAPH_WORKERS running
            found = list(pool.map(lambda job: _chunk_pairs(*job, dtype, scratch), jobs))  # noqa: F821 - del'd below, after use
    else:
        found = [_chunk_pairs(*job, dtype, scratch) for job in jobs]
    del jobs, scratch
    upper = _merge_chunks(found, num_nodes)
    indptr, indices = _mirror(upper)
    del upper
    release_freed_memory()  # the chunks' arrays, freed to the workers' arenas
    return Graph(indptr, indices, pos=pos, kind="nodal")


def _corners(cell_type: str, nodes_per_cell: int) -> int:
    if cell_type in _CORNERS:
        return _CORNERS[cell_type]
    base = _QUADRATIC.get(cell_type, "quad" if cell_type == "quad9" else None)
    return _CORNERS[base] if base else nodes_per_cell


def _dimension(cell_type: str, nodes_per_cell: int) -> int:
    from meshio._mesh import topological_dimension  # meshio's own table

    if cell_type in topological_dimension:
        return topological_dimension[cell_type]
    if cell_type.startswith("metis:"):  # METIS mesh elements: guess from the node count
        return {1: 0, 2: 1, 3: 2}.get(nodes_per_cell, 3)
    raise ValueError(f"Unknown cell type {cell_type!r} for a dual graph")


def default_ncommon(cell_type: str, nodes_per_cell: int) -> int:
    """Shared corner nodes that make two cells neighbours: a shared face (2-D: an edge)."""
    dim = _dimension(cell_type, nodes_per_cell)
    if cell_type.startswith("metis:"):
        return {2: 1, 3: 2, 4: 3, 8: 4}.get(nodes_per_cell, max(dim, 1))
    return max(dim, 1)


def dual_graph(
    cells: Cells, points: np.ndarray | None, *, ncommon: int | None = None
) -> Graph:
    """Cells of the highest dimension, joined when they share ``ncommon`` corner nodes.

    Node ``i`` of the result is the ``i``-th such cell, counting blocks in order. Its position
    is the centroid of its corner nodes.

    Shapes:
        cells: blocks of ``(C_b, k_b)`` node ids. points: ``(N_points, D)``. Result: ``N = sum C_b``
        over the kept blocks.
    """
    cells = [(t, c) for t, c in cells if len(c)]
    if not cells:
        raise ValueError("Expected cells for a dual graph (got a mesh with no cells)")
    dims = [_dimension(t, c.shape[1]) for t, c in cells]
    top = max(dims)
    blocks = [(t, c) for (t, c), d in zip(cells, dims) if d == top]
    if ncommon is None:
        ncommon = min(default_ncommon(t, c.shape[1]) for t, c in blocks)
    if ncommon < 1:
        raise ValueError(f"Expected --ncommon >= 1 (got {ncommon})")
    corner_rows, corner_cols, centroids = [], [], []
    start = 0
    for t, c in blocks:
        k = _corners(t, c.shape[1])
        corner_cols.append(c[:, :k].ravel())
        corner_rows.append(np.repeat(np.arange(start, start + len(c), dtype=np.int64), k))
        if points is not None:
            centroids.append(points[c[:, :k]].mean(axis=1))
        start += len(c)
    num_cells = start
    num_points = int(max(col.max() for col in corner_cols)) + 1
    rows, cols = np.concatenate(corner_rows), np.concatenate(corner_cols)
    incidence = sp.csr_array(
        (np.ones(len(rows), dtype=np.int32), (rows, cols)), shape=(num_cells, num_points))
    shared = sp.triu(incidence @ incidence.T, k=1).tocoo()
    keep = shared.data >= ncommon
    indptr, indices = symmetric_csr(
        shared.row[keep].astype(np.int64), shared.col[keep].astype(np.int64), num_cells)
    pos = np.concatenate(centroids) if points is not None else None
    return Graph(indptr, indices, pos=pos, kind="dual")


def knn_graph(pos: np.ndarray, k: int) -> Graph:
    """Each point joined to its ``k`` nearest neighbours, symmetrised.

    Shapes:
        pos: ``(N, D)``. Every node ends with at least ``min(k, N - 1)`` neighbours.
    """
    from scipy.spatial import cKDTree

    if k < 1:
        raise ValueError(f"Expected --knn >= 1 (got {k})")
    n = len(pos)
    kk = min(k + 1, n)
    _, nbr = cKDTree(pos).query(pos, k=kk)
    nbr = np.asarray(nbr, dtype=np.int64).reshape(n, kk)
    src = np.repeat(np.arange(n, dtype=np.int64), kk)
    indptr, indices = symmetric_csr(src, nbr.ravel(), n)
    return Graph(indptr, indices, pos=pos, kind="knn")


def radius_graph(pos: np.ndarray, radius: float) -> Graph:
    """Points joined when their distance is at most ``radius``.

    Shapes:
        pos: ``(N, D)``.
    """
    from scipy.spatial import cKDTree

    if not radius > 0:
        raise ValueError(f"Expected --radius > 0 (got {radius})")
    pairs = cKDTree(pos).query_pairs(radius, output_type="ndarray").astype(np.int64)
    indptr, indices = symmetric_csr(pairs[:, 0], pairs[:, 1], len(pos))
    return Graph(indptr, indices, pos=pos, kind="radius")
