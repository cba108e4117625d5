"""The invariants one shard can check alone, cheaply (``load_partition`` runs them all).

Everything the format docstring promises about one rank's arrays that needs no other rank:
counts, index ranges, ghost order, hop distances against the edges, the order and numbering of
the edges, the send plan's shape, finite coordinates. Vectorised, ``O(N_local + E_local)``.
What needs every rank (each node owned once, the halo equal to a breadth-first search, the
plans symmetric between ranks) is left to :func:`meshshard.partition.check_partitions`.
"""

from __future__ import annotations

import numpy as np

from ._partition import Partition

__all__ = ["part_problems"]


def _nodes(p: Partition) -> str | None:
    n, r, n_own = p.num_nodes, p.rank, p.num_owned
    own, ghosts, owner = p.owned_ids, p.ghost_ids, p.ghost_owner
    if (own.size and (own[0] < 0 or own[-1] >= n)) or (np.diff(own) <= 0).any():
        return f"owned_ids not strictly ascending in [0, {n})"
    per_part = p.num_owned_per_part
    if per_part.shape != (p.num_parts,) or per_part[r] != n_own or per_part.sum() != n:
        return "owned counts of the metadata differ from owned_ids, or do not sum to num_nodes"
    if ghosts.size and (ghosts.min() < 0 or ghosts.max() >= n):
        return f"ghost ids outside [0, {n})"
    if owner.size and (owner.min() < 0 or owner.max() >= p.num_parts or (owner == r).any()):
        return f"ghost_owner outside [0, {p.num_parts}) or equal to the rank itself"
    if (np.diff(owner * n + ghosts) <= 0).any():
        return "ghosts not sorted by owner rank, then global id"
    at = np.searchsorted(own, ghosts)
    inside = at < n_own
    if (own[at[inside]] == ghosts[inside]).any():
        return "a ghost is also an owned node"
    if (p.recv_counts != np.bincount(owner, minlength=p.num_parts)).any():
        return "recv_counts differ from the number of ghosts per owner"
    hops = p.node_hops
    if (hops[:n_own] != 0).any() or (hops[n_own:] < 1).any() or (hops[n_own:] > p.halo_hops).any():
        return f"node_hops not 0 on owned rows and in 1..{p.halo_hops} on ghosts"
    return None


def _edges(p: Partition, num_owned_edges: int | None, num_edges: int | None) -> str | None:
    n, n_own, n_local, k = p.num_nodes, p.num_owned, p.num_local, p.halo_hops
    src, dst = p.edge_index
    gid = p.global_edge_ids
    if src.size and (p.edge_index.min() < 0 or p.edge_index.max() >= n_local):
        return f"edge_index outside [0, {n_local})"
    if (src == dst).any():
        return "an edge is a self-loop"
    ghost_dst = dst >= n_own
    if (np.diff(ghost_dst.astype(np.int8)) < 0).any():
        return "owned edges (dst < N_own) do not all come first"
    hops = p.node_hops
    if (hops[dst] > k - 1).any():
        return f"an edge ends at a node {k} hops out (halo_hops {k} stores edges ending within " \
               f"{k - 1} hops)"
    m = int(np.count_nonzero(~ghost_dst))
    if num_owned_edges is not None and m != num_owned_edges:
        return f"{m} owned edges stored, the metadata says {num_owned_edges}"
    if gid.size and (gid.min() < 0 or (num_edges is not None and gid.max() >= num_edges)):
        return f"global_edge_ids outside [0, {num_edges})"
    local_to_global = p.local_to_global
    key = local_to_global[dst] * n + local_to_global[src]
    for part in (slice(0, m), slice(m, None)):
        if (np.diff(key[part]) <= 0).any() or (np.diff(gid[part]) <= 0).any():
            return "edges not in global edge id order ((dst, src) ascending)"
    same_dst = dst[1:m] == dst[:m - 1]
    if (np.diff(gid[:m])[same_dst] != 1).any():
        return "global_edge_ids of one node's edges are not consecutive"
    # hop distances differ by at most 1 along an edge, and every ghost at hop h has an edge to
    # a node at hop h - 1 (whose edges are all stored)
    step = hops[src] - hops[dst]
    if (np.abs(step) > 1).any() or \
            (np.bincount(src[step == 1], minlength=n_local)[n_own:] == 0).any():
        return "node_hops disagree with the edges (a ghost has no edge towards the owned nodes)"
    if k > 1:
        into = np.bincount(dst, minlength=n_local)[n_own:]
        if (into[hops[n_own:] <= k - 1] == 0).any():
            return f"a ghost within {k - 1} hops has no stored edges (k-hop copies missing)"
    return None


def _plan(p: Partition) -> str | None:
    counts, index, r = p.send_counts, p.send_index, p.rank
    if (counts < 0).any() or counts.sum() != len(index):
        return f"send_counts not non-negative or not summing to len(send_index) = {len(index)}"
    if counts[r] or p.recv_counts[r]:
        return "sends to or receives from itself"
    if index.size and (index.min() < 0 or index.max() >= p.num_owned):
        return f"send_index outside the owned rows [0, {p.num_owned})"
    dest = np.repeat(np.arange(p.num_parts), counts)
    if (np.diff(index)[dest[1:] == dest[:-1]] <= 0).any():
        return "send_index not ascending within a destination rank"
    return None


def _coordinates(p: Partition) -> str | None:
    if p.pos is None:
        return None
    bad = ~np.isfinite(p.pos).all(axis=1)
    if bad.any():
        first = int(p.local_to_global[int(np.argmax(bad))])
        return (f"Expected finite coordinates ({int(bad.sum())} nodes with NaN or inf, the "
                f"first is node {first})")
    return None


def part_problems(p: Partition, *, num_owned_edges: int | None = None,
                  num_edges: int | None = None) -> list[str]:
    """The broken invariants of one shard (at most one per group: nodes, edges, plan,
    coordinates); empty when the shard is consistent. Arrays must already have the dtypes and
    shapes of the format (``load_partition`` checks those first).

    Args:
        p: The shard.
        num_owned_edges: Its owned edge count from the metadata, when known.
        num_edges: The global number of directed edges, when known.
    """
    nodes = _nodes(p)
    found = [nodes, None if nodes else _edges(p, num_owned_edges, num_edges), _plan(p),
             _coordinates(p)]
    return [problem for problem in found if problem]
