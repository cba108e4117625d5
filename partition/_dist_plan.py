"""Every part's shard from the graph's rows and the assignment held in blocks, built by the processes
together, and its part file written by the process that built it, one part at a time.

Part ``k`` of ``K`` is built by process ``block_owner(k, K, P)`` (contiguous runs of parts).
:func:`gather_nodes` sends each node's id, part and coordinates to the builder of its part, which so
learns every part's size (the load balance is checked before anything is written). :func:`write_shards`
then goes through the rounds ``r = 0, 1, ..``: in round ``r`` each builder builds the ``r``-th part of its
run. Each process sends the rows of its block whose ``dst`` is in a part of the round (``dst``, ``src``
and the global edge id, in int32 where they fit, in batches of at most ``BATCH`` rows) to the builder;
the parts of the ends are not sent: every row a builder gets in a round has ``dst`` in the part it builds,
and it asks the block owners the parts of the sources it does not own (its ghosts) and their
coordinates. What arrives is put in global edge id order. A builder then has the part's owned nodes,
owned edges and ghosts, the send plan (in 1-hop mode the owned nodes that are ghosts on part ``q`` are
the ``dst`` of the edges whose ``src`` is on ``q``: the graph is symmetric), and writes the part's file
before the next round. Memory per process: its block's rows and one part's edges,
``O(N / P + N / K + halo)``.

The shards are the ones :func:`meshshard.partition._plan.plan_partitions` makes in one process for
the same assignment (``halo_hops = 1``), so the part files are the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._dist_graph import BlockGraph
from ._exchange import BATCH, Exchange, lookup, route
from ._format import _write_npz, part_file_name
from ._graph import sorted_unique
from ._partition import Partition
from ._vtkhdf import block_owner, block_start

__all__ = ["BuilderNodes", "gather_nodes", "write_shards"]


@dataclass(frozen=True, eq=False)
class BuilderNodes:
    """The nodes of the parts one process builds (parts ``first_part ..``), grouped by part, ascending
    global id within a part: part ``first_part + i`` has ``ids[bounds[i]:bounds[i + 1]]`` and their
    ``pos``; ``owned_counts`` are every part's node counts (``(K,)`` int64, the same on every process)."""

    first_part: int
    ids: np.ndarray
    pos: np.ndarray
    bounds: np.ndarray
    owned_counts: np.ndarray


def gather_nodes(ex: Exchange, first: int, parts_block: np.ndarray, pos_block: np.ndarray,
                 num_parts: int) -> BuilderNodes:
    """Send each node of this process's block (ids ``first ..``) to the builder of its part.

    Shapes:
        parts_block, pos_block: ``(n_block,)`` and ``(n_block, D)``.
    """
    ids = first + np.arange(len(parts_block), dtype=np.int64)
    ids, node_part, node_pos = route(ex, block_owner(parts_block, num_parts, ex.size), ids, parts_block, pos_block)
    k0, k1 = block_start(num_parts, ex.rank, ex.size), block_start(num_parts, ex.rank + 1, ex.size)
    counts = np.bincount(node_part - k0, minlength=k1 - k0)
    owned_counts = np.concatenate([np.asarray(c, dtype=np.int64) for c in ex.all_gather(counts.tolist())])
    order = np.argsort(node_part, kind="stable")  # ids arrive ascending: they stay so within a part
    bounds = np.searchsorted(node_part[order], np.arange(k0, k1 + 1))
    return BuilderNodes(first_part=k0, ids=ids[order], pos=node_pos[order], bounds=bounds, owned_counts=owned_counts)


def _edge_rounds(graph: BlockGraph, parts_block: np.ndarray, num_parts: int, size: int) -> np.ndarray:
    """The round in which each row of the block is sent: the place of its ``dst``'s part in its builder's
    run. ``(E_block,)``, the smallest unsigned dtype that holds the rounds; worked out by batches."""
    starts = np.array([block_start(num_parts, b, size) for b in range(size)], dtype=np.int64)
    most = max(block_start(num_parts, b + 1, size) - block_start(num_parts, b, size) for b in range(size))
    rounds = np.empty(len(graph.dst), dtype=np.min_scalar_type(max(most - 1, 0)))
    for at in range(0, len(graph.dst), BATCH):
        part = parts_block[graph.dst[at:at + BATCH] - graph.first]
        rounds[at:at + BATCH] = part - starts[block_owner(part, num_parts, size)]
    return rounds


def _receive_part(ex: Exchange, graph: BlockGraph, parts_block: np.ndarray, rows: np.ndarray,
                  num_parts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Send the block's rows ``rows`` (a round's) to their builders, in batches; return the rows this
    process got (``dst``, ``src``, global edge id, int64), in global edge id order."""
    n, size = graph.num_nodes, ex.size
    ids = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    eids = np.int32 if graph.num_edges <= np.iinfo(np.int32).max else np.int64
    batches = int(ex.all_reduce(np.array([-(-len(rows) // BATCH)], dtype=np.int64), "max")[0])
    got: list[list[np.ndarray]] = [[], [], []]
    for b in range(batches):
        at = rows[b * BATCH:(b + 1) * BATCH]
        dst = graph.dst[at]
        dest = block_owner(parts_block[dst - graph.first], num_parts, size)
        for column, value in zip(got, route(ex, dest, dst.astype(ids), graph.src[at].astype(ids),
                                            (graph.first_edge + at).astype(eids))):
            column.append(value)
        del at, dst, dest
    dst, src, eid = (np.concatenate(c).astype(np.int64) if c else np.zeros(0, dtype=np.int64) for c in got)
    del got
    if batches > 1:  # batch after batch, each by source: back to the global edge id order
        order = np.argsort(eid)
        dst, src, eid = dst[order], src[order], eid[order]
    return dst, src, eid


def _one_part(ex: Exchange, k: int, num_parts: int, owned: np.ndarray, edges: tuple[np.ndarray, ...],
              parts_block: np.ndarray, pos_block: np.ndarray, num_nodes: int) -> tuple[dict[str, np.ndarray], int]:
    """Part ``k``'s arrays but ``num_owned_per_part`` (with ``pos``: the ghosts' looked up), and its
    count of cut edges. Every process calls it in each round (the look-ups are collective), one with
    no part in the round with empty arrays.

    Shapes:
        owned: ``(n_own,)`` ascending. edges: ``dst``, ``src``, global edge id, each ``(E_k,)``, in
        global edge id order.
    """
    dst, src, eid = edges
    local_src = np.searchsorted(owned, src)
    away = owned[np.minimum(local_src, len(owned) - 1)] != src if len(owned) else np.ones(len(src), dtype=bool)
    away_src = src[away]
    by_id = sorted_unique(away_src)  # the ghosts, by id
    owner = lookup(ex, by_id, parts_block, num_nodes).astype(np.int64)
    keys = owner * num_nodes + by_id
    order = np.argsort(keys, kind="stable")  # by (owner, id): local order
    place = np.empty(len(order), dtype=np.int64)
    place[order] = np.arange(len(order), dtype=np.int64)
    ghost_owner, ghost_ids = np.divmod(keys[order], num_nodes)
    del keys, order
    at = np.searchsorted(by_id, away_src)
    local_src[away] = len(owned) + place[at]
    sent = sorted_unique(owner[at] * num_nodes + dst[away])  # owned dst seen from part q
    del at, away_src, place
    send_to, send_ids = np.divmod(sent, num_nodes)
    arrays = {
        "owned_ids": owned,
        "ghost_ids": ghost_ids,
        "ghost_owner": ghost_owner,
        "node_hops": np.concatenate([np.zeros(len(owned), dtype=np.int8), np.ones(len(ghost_ids), dtype=np.int8)]),
        "edge_index": np.stack([local_src, np.searchsorted(owned, dst)]),
        "global_edge_ids": eid,
        "send_index": np.searchsorted(owned, send_ids),
        "send_counts": np.bincount(send_to, minlength=num_parts).astype(np.int64),
        "recv_counts": np.bincount(ghost_owner, minlength=num_parts).astype(np.int64),
        "ghost_pos": lookup(ex, ghost_ids, pos_block, num_nodes),
    }
    return arrays, int(np.count_nonzero(away))


def write_shards(ex: Exchange, graph: BlockGraph, parts_block: np.ndarray, pos_block: np.ndarray,
                 nodes: BuilderNodes, num_parts: int,
                 folder: Path) -> tuple[list[dict[str, Any]], int, BaseException | None]:
    """Build the parts of this process's run one round at a time (see the module docstring) and write
    each one's file into ``folder``. Every process calls it, and goes through every round: a process
    whose write failed writes no more but keeps exchanging, so that none is left waiting.

    Returns:
        The metadata entries of the parts written (with ``file`` and ``sha256``, as
        :func:`meshshard.partition._plan.plan_partitions` and ``write_partitions`` make them), the
        count of their directed edges whose ends are in different parts, and the write's error if any.
    """
    size, n, k0 = ex.size, graph.num_nodes, nodes.first_part
    runs = [block_start(num_parts, b + 1, size) - block_start(num_parts, b, size) for b in range(size)]
    rounds = _edge_rounds(graph, parts_block, num_parts, size)
    entries: list[dict[str, Any]] = []
    cut, error = 0, None
    for r in range(max(runs)):
        edges = _receive_part(ex, graph, parts_block, np.flatnonzero(rounds == r), num_parts)
        mine = r < runs[ex.rank]
        owned = nodes.ids[nodes.bounds[r]:nodes.bounds[r + 1]] if mine else np.zeros(0, dtype=np.int64)
        arrays, away = _one_part(ex, k0 + r, num_parts, owned, edges, parts_block, pos_block, n)
        del edges
        cut += away
        if not mine or error is not None:
            continue
        ghost_pos = arrays.pop("ghost_pos")
        part = Partition(rank=k0 + r, num_parts=num_parts, num_nodes=n, halo_hops=1,
                         num_owned_per_part=nodes.owned_counts,
                         pos=np.concatenate([nodes.pos[nodes.bounds[r]:nodes.bounds[r + 1]], ghost_pos]), **arrays)
        del arrays, ghost_pos
        try:
            digest = _write_npz(folder / part_file_name(part.rank), part.arrays())
        except (ValueError, OSError) as err:
            error = err
            continue
        entries.append({"part": part.rank, "num_owned": part.num_owned, "num_ghost": part.num_ghost,
                        "num_edges": part.num_edges, "num_owned_edges": part.num_edges,
                        "num_send": int(part.send_counts.sum()), "file": part_file_name(part.rank),
                        "sha256": digest})
        del part
    return entries, cut, error
