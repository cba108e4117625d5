"""KaMinPar (``--engine kaminpar`` / ``--method kaminpar``): a fast shared-memory graph partitioner for one
big node, in one process with every CPU it may use (threads).

The ``kaminpar`` package reads a graph only from a file, so the graph is written to a temporary file in
KaHIP's binary ParHIP layout (the fastest to write and to read: a header of three uint64, ``version``,
``N`` and the directed edge count ``E``; then ``N + 1`` row offsets, each the byte position of the row in
the file; then the ``E`` neighbours; then the node weights and the edge weights when there are any).
The ``version`` flags say what is absent (bit 0: edge weights, bit 1: node weights) and which ids are 32
bits wide (bit 2: row offsets, bit 3: node ids; weights are 64 bits). The file costs about ``4 E``
bytes on disk while KaMinPar reads it, and is removed at once.

KaMinPar balances the first weight of each node (``--imbalance`` as its ``eps``); the seed is its
random seed. Like METIS it is run as one process holding the whole graph; unlike METIS its result
depends on the thread count, so the assignment is what the part files store
(:func:`meshshard.partition.read_assignment`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from ._graph import Graph

__all__ = ["INSTALL_KAMINPAR", "check_kaminpar", "kaminpar_parts", "write_parhip"]

INSTALL_KAMINPAR = "install it with: pip install kaminpar"


def check_kaminpar() -> Any:
    """The ``kaminpar`` module, or a one-line ``ValueError`` saying how to install it (before any work)."""
    try:
        import kaminpar
    except ImportError as err:
        raise ValueError(f"--engine kaminpar needs the kaminpar package ({err}); {INSTALL_KAMINPAR}") from None
    return kaminpar


def write_parhip(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` to ``path`` in the binary ParHIP layout (see the module docstring)."""
    n, m = graph.num_nodes, graph.num_edges
    node_width = 4 if n <= np.iinfo(np.uint32).max else 8
    start = 24 + (n + 1) * 4  # the first row's byte position with 32-bit row offsets
    offset_width = 4 if start + m * node_width <= np.iinfo(np.uint32).max else 8
    start = 24 + (n + 1) * offset_width
    node_weights = None if graph.vertex_weights is None else np.ascontiguousarray(graph.vertex_weights[:, 0])
    version = ((graph.edge_weights is None) | (node_weights is None) << 1 | (offset_width == 4) << 2
               | (node_width == 4) << 3)
    ints = {4: np.uint32, 8: np.uint64}
    with open(path, "wb") as file:
        file.write(np.array([version, n, m], dtype=np.uint64).tobytes())
        offsets = np.asarray(graph.indptr, dtype=np.uint64) * np.uint64(node_width) + np.uint64(start)
        file.write(offsets.astype(ints[offset_width]).tobytes())
        del offsets
        file.write(np.asarray(graph.indices).astype(ints[node_width]).tobytes())
        if node_weights is not None:
            file.write(node_weights.astype(np.int64).tobytes())
        if graph.edge_weights is not None:
            file.write(np.asarray(graph.edge_weights).astype(np.int64).tobytes())


def kaminpar_parts(graph: Graph, num_parts: int, *, imbalance: float = 0.03, seed: int = 0,
                   threads: int | None = None) -> np.ndarray:
    """The owning part of every node by KaMinPar (see the module docstring).

    Args:
        graph: The graph (its first node weight is balanced, its edge weights are cut).
        num_parts: ``K``.
        imbalance: KaMinPar's ``eps``: each part at most ``(1 + eps)`` times the mean weight.
        seed: KaMinPar's random seed.
        threads: Threads (default: every CPU this process may use).

    Shapes:
        Returns ``(N,)`` int64 in ``[0, K)``.
    """
    kaminpar = check_kaminpar()
    if graph.vertex_weights is not None and graph.vertex_weights.shape[1] > 1:
        raise ValueError(f"--engine kaminpar balances one node weight (the graph has "
                         f"{graph.vertex_weights.shape[1]}); use --method metis for several")
    threads = threads or len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="meshshard-kaminpar-") as folder:
        path = os.path.join(folder, "graph.parhip")
        write_parhip(graph, path)
        loaded = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP)
    kaminpar.reseed(int(seed))
    solver = kaminpar.KaMinPar(threads, kaminpar.default_context())
    parts = np.asarray(solver.compute_partition(loaded, k=num_parts, eps=float(imbalance)), dtype=np.int64)
    if len(parts) != graph.num_nodes:
        raise ValueError(f"kaminpar returned {len(parts)} parts for {graph.num_nodes} nodes")
    return parts
