"""From a graph and an assignment of nodes to parts, every rank's local graph and halo plan.

For rank ``r`` with owned set ``O`` and ``k = halo_hops``:

- ghosts: the nodes within ``k`` hops of ``O`` (undirected graph) that ``r`` does not own, with
  their hop distance;
- local edges: every global directed edge whose ``dst`` is within ``k - 1`` hops of ``O``
  (for ``k = 1``: whose ``dst`` is owned), owned ``dst`` first;
- halo plan: ``r`` receives each ghost from its owner, and sends to rank ``q`` its owned nodes
  that are ghosts on ``q``, in ``q``'s ghost order.

Work is vectorised per part (a loop over parts, none over nodes or edges; two threads find the
halos of two parts at once), and touches only the part's own rows, so the total cost is
``O(N + sum of local edges)``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ._assign import edge_cut as count_cut
from ._assign import imbalance
from ._format import MAX_HOPS, make_metadata
from ._graph import Graph, sorted_unique
from ._partition import Partition

__all__ = ["build_partitions", "check_assignment", "plan_partitions"]

#: Threads that find the parts' halos in :func:`plan_partitions` (the result does not depend
#: on it).
PLAN_WORKERS = max(1, min(2, os.cpu_count() or 1))


def check_assignment(parts: np.ndarray, num_nodes: int, num_parts: int) -> np.ndarray:
    """Return ``parts`` as int64 after checking its shape and range.

    Shapes:
        parts: ``(N,)`` integer in ``[0, R)``.
    """
    parts = np.asarray(parts)
    if parts.shape != (num_nodes,):
        raise ValueError(f"Expected 'parts' of shape ({num_nodes},) (got {parts.shape})")
    if parts.size and not np.issubdtype(parts.dtype, np.integer):
        raise ValueError(f"Expected integer 'parts' (got dtype {parts.dtype})")
    if parts.size and (parts.min() < 0 or parts.max() >= num_parts):
        raise ValueError(f"Expected 'parts' in [0, {num_parts}) "
                         f"(got range [{parts.min()}, {parts.max()}])")
    return parts.astype(np.int64, copy=False)


def _row_entries(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``indices`` of every entry of ``rows``, row after row, and the row lengths.

    One running sum: steps of 1 within a row, and at the first entry of each row the jump from
    the previous row's last entry to this row's first.

    Shapes:
        rows: ``(M,)``. Returns ``(sum of lengths,)`` int64 and ``(M,)`` int64.
    """
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    entries = np.ones(int(lengths.sum()), dtype=np.int64)
    if len(entries):
        filled = lengths > 0
        starts, sizes = starts[filled], lengths[filled]
        jump = starts.copy()
        jump[1:] -= starts[:-1] + sizes[:-1] - 1
        entries[np.cumsum(sizes) - sizes] = jump
        np.cumsum(entries, out=entries)
    return entries, lengths


def _ghost_layers(
    graph: Graph, owned: np.ndarray, halo_hops: int, hop: np.ndarray
) -> list[np.ndarray]:
    """``[owned, ring 1, ..., ring k]``: the nodes first reached at each hop from ``owned``.

    ``hop`` is an ``(N,)`` int8 scratch array filled with -1; it is restored before returning.
    """
    hop[owned] = 0
    layers, frontier = [owned], owned
    for h in range(1, halo_hops + 1):
        entries, _ = _row_entries(graph.indptr, frontier)
        reached = graph.indices[entries]
        del entries
        frontier = sorted_unique(reached[hop[reached] < 0])
        hop[frontier] = h
        layers.append(frontier)
    for layer in layers:
        hop[layer] = -1
    return layers


def _halo(graph: Graph, parts: np.ndarray, owned: np.ndarray, halo_hops: int,
          hop: np.ndarray) -> dict[str, np.ndarray]:
    """One part's ghosts in local order, their owners and hop distances, and the ghost rows
    whose edges are stored too (``k > 1``)."""
    layers = _ghost_layers(graph, owned, halo_hops, hop)
    ghosts = np.concatenate(layers[1:])
    hops = np.repeat(np.arange(1, halo_hops + 1, dtype=np.int8), [len(x) for x in layers[1:]])
    owner = parts[ghosts]
    order = np.lexsort((ghosts, owner))
    inner = np.sort(np.concatenate(layers[1:halo_hops])) if halo_hops > 1 else owned[:0]
    return {"ghost_ids": ghosts[order], "ghost_owner": owner[order],
            "ghost_hops": hops[order], "inner": inner}


def _local_graph(
    graph: Graph,
    owned: np.ndarray,
    halo: Mapping[str, np.ndarray],
    global_to_local: np.ndarray,
) -> dict[str, np.ndarray]:
    """One part's local edges, hop distances and positions, from its ghosts.

    ``global_to_local`` is an ``(N,)`` scratch array filled with -1; it is restored before
    returning.
    """
    ghost_ids = halo["ghost_ids"]
    local = np.concatenate([owned, ghost_ids])
    global_to_local[local] = np.arange(len(local), dtype=np.int64)
    dst_rows = np.concatenate([owned, halo["inner"]])
    entries, lengths = _row_entries(graph.indptr, dst_rows)
    edge_index = np.empty((2, len(entries)), dtype=np.int64)
    # in place, unbuffered (mode "clip": every id is in range by construction)
    np.take(graph.indices, entries, out=edge_index[0], mode="clip")
    np.take(global_to_local, edge_index[0], out=edge_index[0], mode="clip")
    edge_index[1] = np.repeat(global_to_local[dst_rows], lengths)
    out = {
        "owned_ids": owned,
        "ghost_ids": ghost_ids,
        "ghost_owner": halo["ghost_owner"],
        "node_hops": np.concatenate([np.zeros(len(owned), dtype=np.int8), halo["ghost_hops"]]),
        "edge_index": edge_index,
        "global_edge_ids": entries,
    }
    if graph.pos is not None:
        out["pos"] = np.take(np.asarray(graph.pos, dtype=np.float64), local, axis=0)
    global_to_local[local] = -1
    return out


def _send_plans(
    halos: list[dict[str, np.ndarray]], local_of: np.ndarray, num_parts: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every rank's ``(send_index, send_counts)``: what each rank's ghosts ask of it.

    Rank ``q``'s ghosts are sorted by (owner, global id); concatenated over ``q`` and stably
    sorted by owner they become, for each owner ``r``, the rows ``r`` sends, grouped by
    destination ``q`` and in ``q``'s ghost order.
    """
    sizes = [len(h["ghost_ids"]) for h in halos]
    dest = np.repeat(np.arange(num_parts, dtype=np.int64), sizes)
    gids = np.concatenate([h["ghost_ids"] for h in halos])
    owner = np.concatenate([h["ghost_owner"] for h in halos])
    order = np.argsort(owner, kind="stable")
    gids, dest, owner = gids[order], dest[order], owner[order]
    counts = np.bincount(owner * num_parts + dest, minlength=num_parts * num_parts)
    counts = counts.reshape(num_parts, num_parts)
    bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
    return [(local_of[gids[bounds[r]:bounds[r + 1]]], counts[r]) for r in range(num_parts)]


def plan_partitions(
    graph: Graph,
    parts: np.ndarray,
    num_parts: int,
    *,
    halo_hops: int = 1,
    attrs: Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    edge_cut: int | None = None,
) -> tuple[dict[str, Any], Iterator[Partition]]:
    """The partition's metadata, and every rank's :class:`Partition` built one at a time.

    The ghosts and halo plans of every rank are found first (their size is the halo's, not the
    graph's); each rank's local edges and positions are only built when the iterator reaches
    it, so a caller that writes each part and lets it go holds one part at a time.

    Args:
        graph: The whole graph.
        parts: Owning rank of each node.
        num_parts: Number of ranks ``R`` (ranks with no node are allowed).
        halo_hops: ``k >= 1``, see the module docstring.
        attrs: Extra metadata entries (``method``, ``graph``, ``input``, ``parameters``, ...).
        progress: Called with 1 after each rank's halo is found.
        edge_cut: The edge cut of ``parts``, when the caller knows it already.

    Shapes:
        parts: ``(N,)`` integer in ``[0, R)``. The iterator yields ``R`` partitions.
    """
    n = graph.num_nodes
    parts = check_assignment(parts, n, num_parts)
    if not 1 <= halo_hops <= MAX_HOPS:
        raise ValueError(f"Expected 1 <= --halo-hops <= {MAX_HOPS} (got {halo_hops})")
    # a stable sort of 16-bit keys is a radix sort: 3x faster than of the int64 parts
    keys = parts.astype(np.int16) if num_parts <= np.iinfo(np.int16).max else parts
    owned_order = np.argsort(keys, kind="stable")
    del keys
    counts = np.bincount(parts, minlength=num_parts)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    scratch = threading.local()  # each thread's hop array (-1 between parts)

    def halo_of(r: int) -> dict[str, np.ndarray]:
        if not hasattr(scratch, "hop"):  # noqa: F821 - scratch is deleted after the pool is done
            scratch.hop = np.full(n, -1, dtype=np.int8)  # noqa: F821
        owned = owned_order[offsets[r]:offsets[r + 1]]
        return _halo(graph, parts, owned, halo_hops, scratch.hop)  # noqa: F821

    halos = []
    # numpy's gathers let go of the GIL: on two cores two parts' halos are found at once
    with ThreadPoolExecutor(PLAN_WORKERS) as pool:
        for halo in pool.map(halo_of, range(num_parts)):
            halos.append(halo)
            if progress is not None:
                progress(1)
    del scratch
    local_of = np.empty(n, dtype=np.int64)
    local_of[owned_order] = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], counts)
    plans = _send_plans(halos, local_of, num_parts)
    del local_of
    degree = graph.degree()
    summary = []
    for r, (halo, (_, send_counts)) in enumerate(zip(halos, plans)):
        owned_edges = int(degree[owned_order[offsets[r]:offsets[r + 1]]].sum())
        summary.append({
            "part": r, "num_owned": int(counts[r]), "num_ghost": len(halo["ghost_ids"]),
            "num_edges": owned_edges + int(degree[halo["inner"]].sum()),
            "num_owned_edges": owned_edges, "num_send": int(send_counts.sum())})
    del degree
    metadata = make_metadata(
        num_nodes=n, num_edges=graph.num_edges,
        edge_cut=count_cut(graph, parts) if edge_cut is None else edge_cut,
        imbalance=imbalance(parts, num_parts), halo_hops=halo_hops,
        pos_dim=None if graph.pos is None else int(graph.pos.shape[1]),
        attrs=attrs or {}, parts=summary)

    def build() -> Iterator[Partition]:
        global_to_local = np.full(n, -1, dtype=np.int64)
        for r in range(num_parts):
            owned = owned_order[offsets[r]:offsets[r + 1]]
            halo, (send_index, send_counts) = halos[r], plans[r]
            halos[r] = plans[r] = None  # type: ignore[call-overload]  # each goes once built
            yield Partition(
                rank=r, num_parts=num_parts, num_nodes=n, halo_hops=halo_hops,
                num_owned_per_part=counts, send_index=send_index, send_counts=send_counts,
                recv_counts=np.bincount(halo["ghost_owner"], minlength=num_parts),
                metadata=metadata, **_local_graph(graph, owned, halo, global_to_local))

    return metadata, build()


def build_partitions(graph: Graph, parts: np.ndarray, num_parts: int, **options: Any) -> list[Partition]:
    """Every rank's :class:`Partition` for the assignment ``parts``, all in memory
    (:func:`plan_partitions`'s arguments and parts, gathered in a list).

    Shapes:
        parts: ``(N,)`` integer in ``[0, R)``. Returns ``R`` partitions.
    """
    return list(plan_partitions(graph, parts, num_parts, **options)[1])
