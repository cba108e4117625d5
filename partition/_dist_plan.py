"""Every part's shard from the graph's rows and the assignment held in blocks, built by the processes
together, and its part file written by the process that built it.

Part ``k`` of ``K`` is built by process ``block_owner(k, K, P)`` (contiguous runs of parts). Each
process sends the rows of its block (``dst``, ``src``, global edge id, the parts of both ends) to the
builder of ``dst``'s part, with its nodes' ids and coordinates; what arrives is in global edge id and
global id order, because the blocks are. A builder then has, for each of its parts, the owned nodes,
the owned edges and so the ghosts (the sources owned elsewhere), the send plan (in 1-hop mode the
owned nodes that are ghosts on part ``q`` are the ``dst`` of the edges whose ``src`` is on ``q``: the
graph is symmetric), and asks the block owners for the ghosts' coordinates. Memory per process: its
parts' edges and nodes, ``O(N / P + halo)``.

The shards are the ones :func:`meshshard.partition._plan.plan_partitions` makes in one process for
the same assignment (``halo_hops = 1``), so the part files are the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._dist_graph import BlockGraph
from ._exchange import Exchange, lookup, route
from ._format import _write_npz, part_file_name
from ._graph import sorted_unique
from ._partition import Partition
from ._vtkhdf import block_owner, block_start

__all__ = ["PartShards", "build_shards", "write_shards"]


@dataclass(frozen=True, eq=False)
class PartShards:
    """The parts one process built: ``parts[i]`` is part ``first_part + i``; ``cut_edges`` counts
    their directed edges whose ends are in different parts; ``owned_counts`` are every part's node
    counts (``(K,)`` int64, the same on every process)."""

    first_part: int
    parts: list[Partition]
    cut_edges: int
    owned_counts: np.ndarray


def _one_part(k: int, num_parts: int, owned: np.ndarray, owned_pos: np.ndarray, edges: Sequence[np.ndarray],
              num_nodes: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Part ``k``'s arrays but ``pos`` and ``num_owned_per_part``, and its ghost ids in local order.

    Shapes:
        owned: ``(n_own,)`` ascending. edges: ``dst``, ``src``, global edge id, part of ``src``, each
        ``(E_k,)``, in global edge id order.
    """
    dst, src, eid, src_part = edges
    away = src_part != k
    ghost_keys = sorted_unique(src_part[away] * num_nodes + src[away])  # by (owner, id): local order
    ghost_owner, ghost_ids = np.divmod(ghost_keys, num_nodes)
    local_src = np.searchsorted(owned, src)
    local_src[away] = len(owned) + np.searchsorted(ghost_keys, src_part[away] * num_nodes + src[away])
    sent = sorted_unique(src_part[away] * num_nodes + dst[away])  # owned dst seen from part q
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
    }
    return arrays, ghost_ids


def build_shards(ex: Exchange, graph: BlockGraph, parts_block: np.ndarray, pos_block: np.ndarray,
                 num_parts: int) -> PartShards:
    """Build, on each process, the shards of its run of parts (see the module docstring).

    Shapes:
        parts_block, pos_block: ``(n_block,)`` and ``(n_block, D)``, for the ids ``graph.first ..``.
    """
    n, size = graph.num_nodes, ex.size
    uniq, inverse = np.unique(graph.src, return_inverse=True)
    src_part = lookup(ex, uniq, parts_block, n)[inverse]
    del uniq, inverse
    dst_part = parts_block[graph.dst - graph.first]
    eid = graph.first_edge + np.arange(len(graph.dst), dtype=np.int64)
    dst, src, eid, dst_part, src_part = route(ex, block_owner(dst_part, num_parts, size),
                                              graph.dst, graph.src, eid, dst_part, src_part)
    ids = graph.first + np.arange(len(parts_block), dtype=np.int64)
    ids, node_part, node_pos = route(ex, block_owner(parts_block, num_parts, size), ids, parts_block, pos_block)
    k0, k1 = block_start(num_parts, ex.rank, size), block_start(num_parts, ex.rank + 1, size)
    counts = np.bincount(node_part - k0, minlength=k1 - k0)
    owned_counts = np.concatenate([np.asarray(c, dtype=np.int64) for c in ex.all_gather(counts.tolist())])
    built, ghosts = [], []
    node_order = np.argsort(node_part, kind="stable")
    edge_order = np.argsort(dst_part, kind="stable")
    node_bounds = np.searchsorted(node_part[node_order], np.arange(k0, k1 + 1))
    edge_bounds = np.searchsorted(dst_part[edge_order], np.arange(k0, k1 + 1))
    for i, k in enumerate(range(k0, k1)):
        at = node_order[node_bounds[i]:node_bounds[i + 1]]
        on = edge_order[edge_bounds[i]:edge_bounds[i + 1]]
        arrays, ghost_ids = _one_part(k, num_parts, ids[at], node_pos[at],
                                      (dst[on], src[on], eid[on], src_part[on]), n)
        built.append((arrays, node_pos[at]))
        ghosts.append(ghost_ids)
    cut = int(np.count_nonzero(src_part != dst_part))
    del dst, src, eid, dst_part, src_part
    wanted = np.concatenate(ghosts) if ghosts else np.zeros(0, dtype=np.int64)
    ghost_pos = lookup(ex, wanted, pos_block, n)
    shards, start = [], 0
    for i, (arrays, owned_pos) in enumerate(built):
        stop = start + len(arrays["ghost_ids"])
        shards.append(Partition(rank=k0 + i, num_parts=num_parts, num_nodes=n, halo_hops=1,
                                num_owned_per_part=owned_counts, pos=np.concatenate([owned_pos, ghost_pos[start:stop]]),
                                **arrays))
        start = stop
    return PartShards(first_part=k0, parts=shards, cut_edges=cut, owned_counts=owned_counts)


def write_shards(shards: PartShards, folder: Path) -> list[dict[str, Any]]:
    """Write each built part's file into ``folder``; return their metadata entries (with ``file`` and
    ``sha256``), as :func:`meshshard.partition._plan.plan_partitions` and ``write_partitions`` make them."""
    entries = []
    for part in shards.parts:
        digest = _write_npz(folder / part_file_name(part.rank), part.arrays())
        entries.append({"part": part.rank, "num_owned": part.num_owned, "num_ghost": part.num_ghost,
                        "num_edges": part.num_edges, "num_owned_edges": part.num_edges,
                        "num_send": int(part.send_counts.sum()), "file": part_file_name(part.rank),
                        "sha256": digest})
    return entries
