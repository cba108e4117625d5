"""The nodal graph of a mesh read in slices, built by the processes together.

Each process takes the cell edges of its own cells (:func:`meshshard.partition._graph.cell_edge_pairs`,
the pairs one process joins) and sends each directed edge ``src -> dst``, as its key ``dst * N + src``
and in batches of at most ``BATCH`` pairs, to the block owner of ``dst``. The owner keeps the distinct
edges sorted by ``(dst, src)``: the rows of the global CSR of
:class:`meshshard.partition.Graph` for its block of nodes, in global edge id order. With the
processes' edge counts (one all-gather) each edge's global edge id follows: the blocks hold
consecutive ranges of ids. Memory per process: a batch of its cells' edges and its block's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._exchange import BATCH, Exchange, route
from ._graph import Cells, cell_edge_pairs
from ._vtkhdf import block_owner

__all__ = ["BlockGraph", "block_graph"]


@dataclass(frozen=True, eq=False)
class BlockGraph:
    """The rows of the global graph for one process's block of nodes.

    Args:
        num_nodes: ``N``.
        num_edges: Directed edges of the whole graph.
        first: First global id of the block.
        src, dst: The block's directed edges ``src -> dst`` (``dst`` in the block), sorted by
            ``(dst, src)``.
        first_edge: Global edge id of the block's first edge (edge ``j`` has id ``first_edge + j``).

    Shapes:
        src, dst: ``(E_block,)`` int32 where the node ids fit (``N < 2**31``), int64 otherwise.
    """

    num_nodes: int
    num_edges: int
    first: int
    src: np.ndarray
    dst: np.ndarray
    first_edge: int


def _distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct non-negative values of ``keys``, ascending (``keys`` is sorted in place)."""
    keys.sort()
    keys = keys[np.searchsorted(keys, 0):]
    keep = np.ones(len(keys), dtype=bool)
    keep[1:] = keys[1:] != keys[:-1]
    return keys[keep]


def _local_pairs(cells: Cells, num_nodes: int) -> np.ndarray:
    """The distinct undirected pairs ``lo * N + hi`` (``lo < hi``) of the cell edges of ``cells``.

    Worked out by batches of at most ``BATCH`` cells, each batch's distinct pairs kept, then the
    distinct pairs of those: the memory is one batch's cell edges and about one int64 per distinct pair
    (cells sharing an edge are mostly in one batch).
    """
    found = []
    for cell_type, conn in cells:
        if not np.size(conn):
            continue
        pairs = cell_edge_pairs(cell_type, conn.shape[1])
        for first in range(0, len(conn), BATCH):
            rows = conn[first:first + BATCH]
            keys = np.empty(len(pairs) * len(rows), dtype=np.int64)
            for at, (i, j) in enumerate(pairs):
                a, b, out = rows[:, i], rows[:, j], keys[at * len(rows):(at + 1) * len(rows)]
                np.minimum(a, b, out=out)
                out *= num_nodes
                out += np.maximum(a, b)
                out[a == b] = -1  # a self-loop (a degenerate cell): sorted first, dropped
            found.append(_distinct(keys))
            del keys
    if not found:
        return np.zeros(0, dtype=np.int64)
    keys = found[0] if len(found) == 1 else np.concatenate(found)
    del found
    return _distinct(keys)


def block_graph(ex: Exchange, cells: Cells, num_nodes: int, first: int) -> BlockGraph:
    """This process's rows of the nodal graph of the mesh whose cells the processes hold between them
    (see the module docstring). Equal to the rows ``first ..`` of ``nodal_graph(all cells, N)``."""
    pairs = _local_pairs(cells, num_nodes)
    batches = int(ex.all_reduce(np.array([-(-len(pairs) // BATCH)], dtype=np.int64), "max")[0])
    got = []
    for b in range(batches):  # each edge as its key dst * N + src, to the owner of dst
        lo, hi = np.divmod(pairs[b * BATCH:(b + 1) * BATCH], num_nodes)
        dst, src = np.concatenate([hi, lo]), np.concatenate([lo, hi])  # lo -> hi, then hi -> lo
        del lo, hi
        (keys,) = route(ex, block_owner(dst, num_nodes, ex.size), dst * num_nodes + src)
        got.append(keys)
        del dst, src, keys
    del pairs
    keys = np.concatenate(got) if got else np.zeros(0, dtype=np.int64)
    del got
    keys.sort()  # in place, then the distinct keys
    keep = np.ones(len(keys), dtype=bool)
    keep[1:] = keys[1:] != keys[:-1]
    keys = keys[keep]
    del keep
    ids = np.int32 if num_nodes <= np.iinfo(np.int32).max else np.int64
    src = (keys % num_nodes).astype(ids)
    keys //= num_nodes
    dst = keys.astype(ids)
    del keys
    counts = ex.all_gather(len(src))
    return BlockGraph(num_nodes=num_nodes, num_edges=int(sum(counts)), first=first, src=src, dst=dst,
                      first_edge=int(sum(counts[:ex.rank])))
