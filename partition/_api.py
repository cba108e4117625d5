"""The pipeline ``read -> build_graph -> assign_parts -> refine -> build_partitions -> save``,
and its in-memory entry points :func:`partition_graph`, :func:`partition_mesh` and
:func:`partition_points`, which return every rank's :class:`Partition` without touching disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._assign import assign_parts, check_num_parts, edge_cut, load_imbalance, refine_balance, target_weights
from ._format import check_output_dir, write_partitions
from ._graph import Cells, Graph, dual_graph, knn_graph, nodal_graph, radius_graph
from ._io import InputData, check_finite, read_input
from ._partition import Partition
from ._plan import check_assignment, plan_partitions
from ._progress import Steps
from ._readers import max_expansion as _max_expansion
from ._readers import parse_max_expansion
from ._safe_io import folder_lock

__all__ = ["GRAPHS", "build_graph", "partition_file", "partition_graph", "partition_mesh",
           "partition_points"]

#: Values accepted by ``build_graph(kind=...)`` / ``--graph`` (``None``: the input's own kind).
GRAPHS = ("nodal", "dual", "knn", "radius")


def build_graph(
    data: InputData,
    kind: str | None = None,
    *,
    knn: int = 6,
    radius: float | None = None,
    ncommon: int | None = None,
) -> Graph:
    """The graph to partition: ``nodal`` (meshes' default), ``dual``, ``knn`` (point clouds'
    default) or ``radius``; a METIS graph file is its own graph (``kind=None``).
    """
    if kind is None:
        kind = {"graph": "file", "mesh": "nodal", "points": "knn"}[data.kind]
    if kind == "file":
        if data.graph is None:
            raise ValueError("Expected a METIS graph file for the file's own graph")
        return data.graph
    if kind not in GRAPHS:
        raise ValueError(f"Expected --graph in {', '.join(GRAPHS)} (got {kind!r})")
    if kind in ("nodal", "dual") and data.kind != "mesh":
        raise ValueError(f"--graph {kind} needs a mesh (the input is a {data.kind} file)")
    if kind == "nodal":
        return nodal_graph(data.cells, data.num_nodes, pos=data.pos)
    if kind == "dual":
        return dual_graph(data.cells, data.pos, ncommon=ncommon)
    if data.pos is None:
        raise ValueError(f"--graph {kind} needs coordinates (the input has none)")
    if kind == "knn":
        return knn_graph(data.pos, knn)
    if radius is None:
        raise ValueError("--graph radius needs --radius R")
    return radius_graph(data.pos, radius)


def run_pipeline(
    graph: Graph,
    num_parts: int,
    steps: Steps,
    *,
    method: str = "metis",
    parts: np.ndarray | Sequence[int] | None = None,
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    recursive: bool | None = None,
    tries: int | None = None,
    tpwgts: Sequence[float] | None = None,
    attrs: dict[str, Any],
) -> tuple[dict[str, Any], Iterator[Partition]]:
    """Assign (unless ``parts`` is given), refine when over ``imbalance``, plan the shards:
    the metadata, and the shards one at a time (see :func:`plan_partitions`)."""
    check_num_parts(num_parts, graph.num_nodes)
    refinement = None
    cut = None  # known when METIS's choice is kept as is
    extra: dict[str, Any] = {}
    if parts is not None:
        parts = check_assignment(np.asarray(parts), graph.num_nodes, num_parts)
        method, params = "given", {}
    else:
        choice: dict[str, Any] = {}
        with steps.step(method):
            parts = assign_parts(graph, num_parts, method, seed=seed, imbalance=imbalance,
                                 recursive=recursive, tries=tries, tpwgts=tpwgts, info=choice)
        params = {"seed": seed, "imbalance": imbalance, "tpwgts": tpwgts}
        if method == "metis":
            params.update(recursive=recursive, tries=tries)
            extra["metis"] = choice or None
            cut = choice.get("edge_cut")
        before = load_imbalance(graph, parts, num_parts, tpwgts)
        if before > 1.0 + imbalance + 1e-12:
            with steps.step("refine"):
                cut_before = edge_cut(graph, parts) if cut is None else cut
                cut = None
                parts, moved = refine_balance(graph, parts, num_parts, imbalance=imbalance,
                                              tpwgts=tpwgts)
            refinement = {"edge_cut_before": cut_before, "load_imbalance_before": before,
                          "moved": moved}
    attrs = {"method": method, **attrs, "parameters": {**attrs.get("parameters", {}), **params},
             "load_imbalance": load_imbalance(graph, parts, num_parts, tpwgts),
             "refinement": refinement, **extra}
    with steps.step("plans", total=num_parts) as advance:
        return plan_partitions(graph, parts, num_parts, halo_hops=halo_hops, attrs=attrs,
                               progress=advance, edge_cut=cut)


def _memory_input(graph: Graph) -> dict[str, Any]:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(graph.indptr, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(graph.indices, dtype=np.int64).tobytes())
    return {"kind": "memory", "name": None, "sha256": digest.hexdigest()}


def _numpy(x: Any) -> np.ndarray:
    """A numpy array from a numpy array, list or torch tensor (duck-typed: no torch import)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def partition_graph(
    graph: Any,
    num_parts: int,
    *,
    num_nodes: int | None = None,
    pos: Any = None,
    method: str = "metis",
    parts: np.ndarray | Sequence[int] | None = None,
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    recursive: bool | None = None,
    tries: int | None = None,
    tpwgts: Sequence[float] | None = None,
) -> list[Partition]:
    """Partition a graph in memory; returns every rank's :class:`Partition`.

    Args:
        graph: A :class:`Graph`, an ``edge_index`` (numpy or torch, either direction of each
            edge is enough), or a ``torch_geometric.data.Data`` (its ``edge_index``, ``pos``
            and ``num_nodes`` are read; no torch import here).
        num_parts: Number of ranks ``R``.
        num_nodes: ``N``, for an ``edge_index`` (default: largest id + 1).
        pos: Node coordinates (needed by ``rcb`` and ``morton``).
        method: ``"metis"``, ``"rcb"`` or ``"morton"``; ignored when ``parts`` is given.
        parts: A ready assignment of nodes to ranks, instead of ``method``.
        halo_hops: ``k``, see :mod:`meshshard.partition._format`.
        imbalance, seed, recursive, tries, tpwgts: See :func:`assign_parts`.

    Shapes:
        edge_index: ``(2, E)``. pos: ``(N, D)``. parts: ``(N,)``. Returns ``R`` partitions.
    """
    if not isinstance(graph, Graph):
        if hasattr(graph, "edge_index"):  # torch_geometric Data
            pos = graph.pos if pos is None else pos
            num_nodes = int(graph.num_nodes) if num_nodes is None else num_nodes
            graph = graph.edge_index
        edge_index = _numpy(graph)
        if num_nodes is None:
            num_nodes = int(edge_index.max()) + 1 if edge_index.size else 0
        pos_np = None if pos is None else _numpy(pos).astype(np.float64)
        if pos_np is not None:
            if pos_np.shape[0] != num_nodes or pos_np.ndim != 2:
                raise ValueError(f"Expected 'pos' of shape ({num_nodes}, D) (got {pos_np.shape})")
            check_finite(pos_np)
        graph = Graph.from_edge_index(edge_index, num_nodes, pos=pos_np)
    if graph.num_nodes == 0:
        raise ValueError("Expected at least one node (got an empty graph)")
    _, partitions = run_pipeline(graph, num_parts, Steps(), method=method, parts=parts,
                         halo_hops=halo_hops, imbalance=imbalance, seed=seed,
                         recursive=recursive, tries=tries, tpwgts=tpwgts,
                         attrs={"graph": graph.kind, "input": _memory_input(graph)})
    return list(partitions)


def partition_mesh(
    points: Any,
    cells: Cells | Any,
    num_parts: int,
    *,
    graph: str = "nodal",
    ncommon: int | None = None,
    **options: Any,
) -> list[Partition]:
    """Partition a mesh in memory (nodal graph by default, or the ``dual`` graph of its cells).

    Args:
        points: Node coordinates.
        cells: ``[(meshio cell type, connectivity), ...]``, a ``{type: connectivity}`` dict, or
            a ``meshio.Mesh`` (then ``points`` may be ``None``).
        num_parts: Number of ranks ``R``.
        graph: ``"nodal"`` or ``"dual"``.
        ncommon: Shared corner nodes that join two cells in the dual graph.
        **options: As for :func:`partition_graph` (``method``, ``parts``, ``halo_hops``, ...).

    Shapes:
        points: ``(N, D)``. connectivity: ``(C_b, k_b)``.
    """
    if hasattr(cells, "cells") and hasattr(cells, "points"):  # meshio.Mesh
        points = cells.points if points is None else points
        cells = [(b.type, b.data) for b in cells.cells]
    elif isinstance(cells, dict):
        cells = list(cells.items())
    pos = _numpy(points).astype(np.float64)
    check_finite(pos)
    blocks = [(str(t), _numpy(c).astype(np.int64)) for t, c in cells]
    for t, c in blocks:
        if c.ndim != 2 or (c.size and (c.min() < 0 or c.max() >= len(pos))):
            raise ValueError(f"Expected {t} cells of shape (C, k) with node ids in "
                             f"[0, {len(pos)}) (got shape {c.shape})")
    data = InputData(name="memory", sha256="", kind="mesh", num_nodes=len(pos), pos=pos,
                     cells=blocks)
    g = build_graph(data, graph, ncommon=ncommon)
    return partition_graph(g, num_parts, **options)


def partition_points(
    pos: Any,
    num_parts: int,
    *,
    graph: str = "knn",
    knn: int = 6,
    radius: float | None = None,
    **options: Any,
) -> list[Partition]:
    """Partition a point cloud in memory, through its kNN (default) or radius graph.

    Shapes:
        pos: ``(N, D)``, ``D`` 2 or 3.
    """
    pos = _numpy(pos).astype(np.float64)
    if pos.ndim != 2 or pos.shape[1] not in (2, 3) or len(pos) == 0:
        raise ValueError(f"Expected points of shape (N, 2) or (N, 3), N >= 1 (got {pos.shape})")
    check_finite(pos)
    data = InputData(name="memory", sha256="", kind="points", num_nodes=len(pos), pos=pos)
    return partition_graph(build_graph(data, graph, knn=knn, radius=radius), num_parts,
                           **options)


def partition_file(
    input: str | os.PathLike[str],
    out: str | os.PathLike[str],
    num_parts: int,
    *,
    format: str = "auto",
    graph: str | None = None,
    knn: int = 6,
    radius: float | None = None,
    ncommon: int | None = None,
    method: str = "metis",
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    recursive: bool | None = None,
    tries: int | None = None,
    tpwgts: Sequence[float] | None = None,
    force: bool = False,
    max_expansion: float | None = None,
    steps: Steps | None = None,
    parts: np.ndarray | Sequence[int] | None = None,
) -> Path:
    """``meshshard partition``: read ``input``, partition it, write the folder ``out``.

    ``parts``, the part of every node (``read_assignment`` of another folder, say), is used instead of
    ``method`` (recorded as ``"given"``): the same assignment gives the same part files.

    Cheap checks (arguments, the output folder) run before the input is read, and ``num_parts``
    is checked against the node count before anything is sized by it. Nothing is left at
    ``out`` when any step fails. ``max_expansion`` caps the decompression ratio of a ``.bz2``
    or ``.gz`` input (see :func:`meshshard.partition.read_input`).

    Returns:
        The partition folder.
    """
    with folder_lock(out):  # one writer per folder (held already under meshshard partition)
        steps = steps or Steps()
        out = Path(out)
        # the flag's value or, without one, the environment's: checked before anything is touched
        max_expansion = (_max_expansion() if max_expansion is None
                         else parse_max_expansion(max_expansion, "--max-expansion"))
        check_output_dir(out, force, inputs=[input])
        if num_parts < 1:
            raise ValueError(f"Expected --parts >= 1 (got {num_parts})")
        if tries is not None and tries < 1:
            raise ValueError(f"Expected --tries >= 1 (got {tries})")
        if tpwgts is not None:  # checked against num_parts, before num_parts sizes anything
            target_weights(num_parts, tpwgts)
        if method == "kaminpar" and parts is None:  # installed? before the input is read
            from ._kaminpar import check_kaminpar

            check_kaminpar()
        with steps.step("read"):
            data = read_input(input, format=format, max_expansion=max_expansion)
        with steps.step("graph"):
            g = build_graph(data, graph, knn=knn, radius=radius, ncommon=ncommon)
        source = {"kind": data.kind, "name": data.name, "sha256": data.sha256}
        del data  # the cells go before METIS runs: the graph is all that is needed from here on
        params: dict[str, Any] = {}
        if g.kind == "knn":
            params["knn"] = knn
        if g.kind == "radius":
            params["radius"] = radius
        if g.kind == "dual":
            params["ncommon"] = ncommon
        attrs = {"graph": g.kind, "input": source, "parameters": params}
        metadata, partitions = run_pipeline(g, num_parts, steps, method=method, parts=parts,
                                            halo_hops=halo_hops, imbalance=imbalance, seed=seed,
                                            recursive=recursive, tries=tries, tpwgts=tpwgts, attrs=attrs)
        with steps.step("write", total=num_parts) as advance:  # each part built, written, let go
            return write_partitions(metadata, partitions, out, force=force, progress=advance)
