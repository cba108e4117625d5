"""Checking a partition against every invariant of the format (``meshshard verify``).

The checks recompute what they can from the shards alone and never trust the code that built
them: the whole graph is rebuilt from the owned edges, the halo from a breadth-first search on
it (scipy row slicing), the plans from the ghost lists. Vectorised; one loop over ranks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from ._format import load_partition, read_metadata
from ._invariants import part_problems
from ._partition import Partition

__all__ = ["check_partitions", "verify_partition"]

_MAX_PROBLEMS = 50


class _Problems(list[str]):
    def add(self, message: str) -> None:
        if len(self) < _MAX_PROBLEMS:
            self.append(message)


def _check_ownership(parts: Sequence[Partition], problems: _Problems) -> np.ndarray | None:
    """Every node owned exactly once, ``owned_ids`` ascending; returns the owner of each node."""
    n, num_parts = parts[0].num_nodes, len(parts)
    owned = np.concatenate([p.owned_ids for p in parts])
    if owned.size and (owned.min() < 0 or owned.max() >= n):
        problems.add(f"owned ids outside [0, {n})")
        return None
    times = np.bincount(owned, minlength=n)
    for label, bad in (("no rank", times == 0), ("several ranks", times > 1)):
        if bad.any():
            problems.add(f"{int(bad.sum())} nodes owned by {label} "
                         f"(first: node {int(np.flatnonzero(bad)[0])})")
    sizes = [p.num_owned for p in parts]
    for p in parts:
        if (np.diff(p.owned_ids) <= 0).any():
            problems.add(f"rank {p.rank}: owned_ids not strictly ascending")
        if list(p.num_owned_per_part) != sizes:
            problems.add(f"rank {p.rank}: num_owned_per_part {list(p.num_owned_per_part)} "
                         f"differs from the owned counts {sizes}")
    if problems:
        return None
    owner = np.empty(n, dtype=np.int64)
    owner[owned] = np.repeat(np.arange(num_parts), sizes)
    return owner


def _check_local(p: Partition, owner: np.ndarray, problems: _Problems) -> bool:
    """Ghost order and owners, hop distances, edge ranges and order on one rank."""
    r, k, n_own = p.rank, p.halo_hops, p.num_owned
    if p.num_ghost and (p.ghost_ids.min() < 0 or p.ghost_ids.max() >= len(owner)):
        problems.add(f"rank {r}: ghost ids out of range")
        return False
    if len(p.ghost_owner) != p.num_ghost or (p.ghost_owner != owner[p.ghost_ids]).any():
        problems.add(f"rank {r}: ghost_owner differs from the ranks that own the ghosts")
    if (p.ghost_owner == r).any():
        problems.add(f"rank {r}: a ghost is owned by the rank itself")
    key = owner[p.ghost_ids] * len(owner) + p.ghost_ids
    if (np.diff(key) <= 0).any():
        problems.add(f"rank {r}: ghosts not grouped by owner rank, ascending global id within")
    if (p.recv_counts != np.bincount(owner[p.ghost_ids], minlength=p.num_parts)).any():
        problems.add(f"rank {r}: recv_counts differ from the number of ghosts per owner")
    hops = p.node_hops
    if hops.shape != (p.num_local,) or (hops[:n_own] != 0).any() or \
            (hops[n_own:] < 1).any() or (hops[n_own:] > k).any():
        problems.add(f"rank {r}: node_hops not 0 on owned rows and in 1..{k} on ghosts")
        return False
    ei = p.edge_index
    if ei.ndim != 2 or ei.shape[0] != 2 or len(p.global_edge_ids) != ei.shape[1]:
        problems.add(f"rank {r}: edge_index not (2, E) or global_edge_ids not (E,)")
        return False
    if ei.size and (ei.min() < 0 or ei.max() >= p.num_local):
        problems.add(f"rank {r}: edge_index outside [0, {p.num_local})")
        return False
    is_owned = ei[1] < n_own
    if (np.diff(is_owned.astype(np.int8)) > 0).any():
        problems.add(f"rank {r}: owned edges (dst < N_own) do not all come first")
    if (hops[ei[1]] > k - 1).any():
        problems.add(f"rank {r}: an edge ends at a node {k} hops out (a stored dst must be "
                     f"within {k - 1} hops)")
    return True


def _check_edges(parts: Sequence[Partition], problems: _Problems) -> sp.csr_array | None:
    """Owned edges: every global id once, in (dst, src) order, a symmetric simple graph;
    redundant copies agree with them. Returns the whole graph (row dst, columns src)."""
    n = parts[0].num_nodes
    src, dst, gid, copies = [], [], [], []
    for p in parts:
        l2g = p.local_to_global
        mask = p.edge_index[1] < p.num_owned
        g = l2g[p.edge_index]
        src.append(g[0, mask]), dst.append(g[1, mask]), gid.append(p.global_edge_ids[mask])
        copies.append((g[:, ~mask], p.global_edge_ids[~mask]))
    src, dst, gid = np.concatenate(src), np.concatenate(dst), np.concatenate(gid)
    order = np.argsort(gid, kind="stable")
    if (gid[order] != np.arange(len(gid))).any():
        problems.add("global edge ids of the owned edges are not 0..E-1, each once")
        return None
    src, dst = src[order], dst[order]
    key = dst * n + src
    if (np.diff(key) <= 0).any():
        problems.add("global edge ids not in (dst, src) order, or an edge stored twice")
    if (src == dst).any():
        problems.add("a self-loop is stored")
    if (np.sort(key) != np.sort(src * n + dst)).any():
        problems.add("the graph is not symmetric (an edge lacks its reverse)")
    meta_edges = parts[0].metadata.get("num_edges")
    if meta_edges is not None and meta_edges != len(gid):
        problems.add(f"metadata num_edges {meta_edges} but {len(gid)} edges are stored")
    for p, (g, ids) in zip(parts, copies):
        if ids.size and ((ids < 0).any() or (ids >= len(gid)).any()
                         or (src[ids] != g[0]).any() or (dst[ids] != g[1]).any()):
            problems.add(f"rank {p.rank}: a redundant edge copy differs from its owned edge")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    return sp.csr_array((np.ones(len(src), dtype=np.int8), src, indptr), shape=(n, n))


def _check_halo(p: Partition, graph: sp.csr_array, problems: _Problems) -> None:
    """Ghosts and hops equal a breadth-first search; local edges are those of the inner rows."""
    n, k = graph.shape[0], p.halo_hops
    hop = np.full(n, -1, dtype=np.int64)
    hop[p.owned_ids] = 0
    frontier = p.owned_ids
    for h in range(1, k + 1):
        reached = graph[frontier].indices if len(frontier) else frontier
        frontier = np.unique(reached[hop[reached] < 0])
        hop[frontier] = h
    ghosts = np.flatnonzero(hop > 0)
    if not np.array_equal(np.sort(p.ghost_ids), ghosts):
        problems.add(f"rank {p.rank}: ghosts differ from the nodes within {k} hops "
                     f"({p.num_ghost} stored, {len(ghosts)} expected)")
        return
    if (p.node_hops[p.num_owned:] != hop[p.ghost_ids]).any():
        problems.add(f"rank {p.rank}: node_hops differ from the hop distances")
    inner = np.flatnonzero((hop >= 0) & (hop <= k - 1))
    expected = _ranges(graph.indptr[inner], graph.indptr[inner + 1])
    if not np.array_equal(np.sort(p.global_edge_ids), expected):
        problems.add(f"rank {p.rank}: local edges differ from all edges ending within "
                     f"{k - 1} hops ({p.num_edges} stored, {len(expected)} expected)")


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    lengths = ends - starts
    return np.arange(lengths.sum()) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)


def _check_plans(parts: Sequence[Partition], owner: np.ndarray, problems: _Problems) -> None:
    """What each rank sends to each rank is exactly that rank's ghost group, in order."""
    num_parts = len(parts)
    sent = []
    for p in parts:
        sc = p.send_counts
        if sc.shape != (num_parts,) or (sc < 0).any() or sc.sum() != len(p.send_index):
            problems.add(f"rank {p.rank}: send_counts do not have {num_parts} non-negative "
                         f"entries summing to len(send_index) = {len(p.send_index)}")
            return
        if sc[p.rank] or p.recv_counts[p.rank]:
            problems.add(f"rank {p.rank}: sends to or receives from itself")
        if p.send_index.size and (p.send_index.min() < 0 or p.send_index.max() >= p.num_owned):
            problems.add(f"rank {p.rank}: send_index outside the owned rows [0, {p.num_owned})")
            return
        dest = np.repeat(np.arange(num_parts), sc)
        sent.append(np.stack([np.full(len(dest), p.rank), dest, p.owned_ids[p.send_index]]))
    wanted = np.concatenate(
        [np.stack([owner[p.ghost_ids], np.full(p.num_ghost, p.rank), p.ghost_ids])
         for p in parts], axis=1)
    wanted = wanted[:, np.argsort(wanted[0], kind="stable")]
    sent_all = np.concatenate(sent, axis=1)
    if sent_all.shape != wanted.shape or (sent_all != wanted).any():
        problems.add("halo plans are not symmetric: the rows a rank sends to another differ "
                     "from that rank's ghosts of it, in ghost order")


def _check_pos(parts: Sequence[Partition], problems: _Problems) -> None:
    if any((p.pos is None) != (parts[0].pos is None) for p in parts) or parts[0].pos is None:
        return
    pos = np.empty((parts[0].num_nodes, parts[0].pos.shape[1]))
    for p in parts:
        pos[p.owned_ids] = p.pos[:p.num_owned]
    for p in parts:
        if p.pos.shape[0] != p.num_local or (p.pos[p.num_owned:] != pos[p.ghost_ids]).any():
            problems.add(f"rank {p.rank}: ghost coordinates differ from their owner's")


def _check_metadata(parts: Sequence[Partition], graph: sp.csr_array, owner: np.ndarray,
                    problems: _Problems) -> None:
    meta = parts[0].metadata
    if not meta:
        return
    dst = np.repeat(np.arange(graph.shape[0]), np.diff(graph.indptr))
    cut = int(np.count_nonzero(owner[graph.indices] != owner[dst])) // 2
    if meta.get("edge_cut") != cut:
        problems.add(f"metadata edge_cut {meta.get('edge_cut')} but the shards cut {cut}")
    for p, entry in zip(parts, meta.get("parts", [])):
        stored = (entry.get("num_owned"), entry.get("num_ghost"), entry.get("num_edges"))
        if stored != (p.num_owned, p.num_ghost, p.num_edges):
            problems.add(f"rank {p.rank}: metadata counts {stored} differ from the file's "
                         f"{(p.num_owned, p.num_ghost, p.num_edges)}")


def check_partitions(partitions: Sequence[Partition]) -> list[str]:
    """Every invariant of a complete set of shards; returns the problems found (none: valid).

    Checks: each shard's own invariants (:func:`~meshshard.partition._invariants.part_problems`,
    finite coordinates included); each node owned once; ghost order and owners; hop distances and the halo against
    a breadth-first search; every global directed edge stored once as an owned edge (in
    ``(dst, src)`` id order, symmetric graph), redundant k-hop copies equal to it; halo plans
    symmetric between ranks; ghost coordinates; the metadata's counts and edge cut.
    """
    problems = _Problems()
    if not partitions:
        return ["no partitions"]
    first = partitions[0]
    for r, p in enumerate(partitions):
        same = (p.num_parts, p.num_nodes, p.halo_hops) == (len(partitions), first.num_nodes,
                                                          first.halo_hops)
        if p.rank != r or not same:
            problems.add(f"partition {r}: rank {p.rank}, num_parts {p.num_parts}, num_nodes "
                         f"{p.num_nodes}, halo_hops {p.halo_hops} do not match the set")
    for p in partitions:
        for problem in part_problems(p):
            problems.add(f"rank {p.rank}: {problem}")
    owner = None if problems else _check_ownership(partitions, problems)
    if owner is None:
        return list(problems)
    if not all([_check_local(p, owner, problems) for p in partitions]):
        return list(problems)
    graph = _check_edges(partitions, problems)
    if graph is not None:
        for p in partitions:
            _check_halo(p, graph, problems)
        _check_metadata(partitions, graph, owner, problems)
    _check_plans(partitions, owner, problems)
    _check_pos(partitions, problems)
    return list(problems)


def verify_partition(path: str | os.PathLike[str]) -> list[str]:
    """Load every rank of a partition folder (checksums included) and check it.

    Raises:
        ValueError: ``path`` is not a readable partition folder (no or bad metadata).

    Returns:
        The problems found; empty when the partition is valid.
    """
    meta = read_metadata(path)
    partitions, problems = [], []
    for rank in range(meta["num_parts"]):
        try:
            partitions.append(load_partition(path, rank))
        except ValueError as err:
            problems.append(str(err))
    return problems or check_partitions(partitions)
