"""Assigning nodes to parts: METIS (pymetis), recursive coordinate bisection, Morton order, and
a balance refinement; plus the measures of a partition (edge cut, imbalance).

``assign_parts`` returns the owning part of every node; nothing here builds ghosts or plans.
Every function is deterministic for a given input and seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._graph import Graph

__all__ = [
    "METHODS",
    "assign_parts",
    "auto_tries",
    "metis_parts",
    "metis_search",
    "rcb_parts",
    "morton_parts",
    "refine_balance",
    "edge_cut",
    "imbalance",
    "load_imbalance",
    "check_num_parts",
    "target_weights",
]

#: Values accepted by ``assign_parts(method=...)`` / ``--method``.
METHODS = ("metis", "rcb", "morton", "kaminpar")


def check_num_parts(num_parts: int, num_nodes: int) -> None:
    """Raise unless ``1 <= num_parts <= num_nodes``."""
    if num_parts < 1:
        raise ValueError(f"Expected --parts >= 1 (got {num_parts})")
    if num_parts > num_nodes:
        raise ValueError(
            f"Expected at most one part per node: --parts <= {num_nodes} (got {num_parts})")


def target_weights(num_parts: int, tpwgts: Sequence[float] | None) -> np.ndarray:
    """Each part's target share of the total weight, ``(R,)`` float64 summing to 1."""
    if tpwgts is None:
        return np.full(num_parts, 1.0 / num_parts)
    tp = np.asarray(tpwgts, dtype=np.float64)
    if tp.shape != (num_parts,):
        raise ValueError(f"Expected {num_parts} target part weights (got {tp.size})")
    if not np.isfinite(tp).all() or (tp <= 0).any():
        raise ValueError(f"Expected positive target part weights (got {tp.tolist()})")
    if abs(tp.sum() - 1.0) > 1e-6:
        raise ValueError(f"Expected target part weights that sum to 1 (got {tp.sum():g})")
    return tp / tp.sum()


def _node_weights(graph: Graph) -> np.ndarray:
    """The weight balanced by refinement and the geometric methods: the first constraint."""
    if graph.vertex_weights is None:
        return np.ones(graph.num_nodes, dtype=np.int64)
    return graph.vertex_weights[:, 0].astype(np.int64)


#: METIS tries (``ncuts``) per variant when ``tries`` is not given: 5, fewer on big graphs so
#: that ``tries x directed edges`` stays under this budget (at least 1).
TRIES_BUDGET = 20_000_000
MAX_AUTO_TRIES = 5
#: Part counts up to which recursive bisection is tried besides k-way.
RECURSIVE_UP_TO = 16


def auto_tries(num_edges: int) -> int:
    """The default ``tries``: ``min(5, max(1, 20e6 // directed edges))`` (deterministic)."""
    return int(min(MAX_AUTO_TRIES, max(1, TRIES_BUDGET // max(num_edges, 1))))


def assign_parts(
    graph: Graph,
    num_parts: int,
    method: str = "metis",
    *,
    seed: int = 0,
    imbalance: float = 0.03,
    recursive: bool | None = None,
    tries: int | None = None,
    tpwgts: Sequence[float] | None = None,
    info: dict[str, Any] | None = None,
) -> np.ndarray:
    """The owning part of every node.

    Args:
        graph: The graph (``rcb`` and ``morton`` need ``graph.pos``).
        num_parts: Number of parts ``R``, ``1 <= R <= N``.
        method: ``"metis"`` (edge-cut minimising, see :func:`metis_search`), ``"rcb"``
            (recursive coordinate bisection), ``"morton"`` (Z-order curve cut in ``R`` runs) or
            ``"kaminpar"`` (KaMinPar, threads, when installed: :mod:`meshshard.partition._kaminpar`).
        seed: METIS's (or KaMinPar's) random seed.
        imbalance: Allowed load imbalance, ``max / target - 1`` (METIS ``ufactor / 1000``).
        recursive: METIS variant: ``None`` tries k-way and (for ``R <= 16``) recursive
            bisection and keeps the better; ``False`` k-way only; ``True`` recursive only.
        tries: METIS ``ncuts`` per variant (default :func:`auto_tries`).
        tpwgts: Target share of each part (sums to 1); ``None`` is uniform.
        info: When given, filled with the METIS choice (see :func:`metis_search`).

    Shapes:
        Returns ``(N,)`` int64 in ``[0, R)``.
    """
    check_num_parts(num_parts, graph.num_nodes)
    if not imbalance >= 0:
        raise ValueError(f"Expected --imbalance >= 0 (got {imbalance})")
    if tries is not None and tries < 1:
        raise ValueError(f"Expected --tries >= 1 (got {tries})")
    tp = target_weights(num_parts, tpwgts)
    if method == "metis":
        parts, choice = metis_search(graph, num_parts, seed=seed, imbalance=imbalance,
                                     recursive=recursive, tries=tries,
                                     tpwgts=None if tpwgts is None else tp)
        if info is not None:
            info.update(choice)
        return parts
    if method not in METHODS:
        raise ValueError(f"Expected --method in {', '.join(METHODS)} (got {method!r})")
    if method == "kaminpar":
        from ._kaminpar import kaminpar_parts

        if tpwgts is not None:
            raise ValueError("--tpwgts is taken by --method metis, rcb and morton, not by kaminpar")
        return kaminpar_parts(graph, num_parts, imbalance=imbalance, seed=seed)
    if graph.pos is None:
        raise ValueError(f"Method {method!r} needs coordinates (the input has none); "
                         "use --method metis")
    split = rcb_parts if method == "rcb" else morton_parts
    return split(graph.pos, num_parts, weights=_node_weights(graph), tpwgts=tp)


def metis_search(
    graph: Graph,
    num_parts: int,
    *,
    seed: int = 0,
    imbalance: float = 0.03,
    recursive: bool | None = None,
    tries: int | None = None,
    tpwgts: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The best of METIS k-way and recursive bisection, each with ``ncuts = tries``.

    METIS's own multi-try (``ncuts``) keeps the best of ``tries`` partitionings from one seed.
    Of the variants tried, the one with the smallest edge cut among those within the
    imbalance wins; when none is, the one with the smallest load imbalance (the pipeline's
    refinement then restores balance). Ties go to k-way. Deterministic for a given seed.

    Returns:
        The parts ``(N,)`` int64, and the choice: ``{"variant", "seed", "ncuts", "edge_cut",
        "load_imbalance", "candidates": [{"variant", "edge_cut", "load_imbalance"}, ...]}``.
    """
    ncuts = auto_tries(graph.num_edges) if tries is None else int(tries)
    if recursive is None:
        variants = [False, True] if num_parts <= RECURSIVE_UP_TO else [False]
    else:
        variants = [bool(recursive)]
    limit = 1.0 + imbalance + 1e-12
    found = []
    for rec in variants:
        parts, cut = _metis_call(graph, num_parts, seed=seed, imbalance=imbalance,
                                 recursive=rec, tpwgts=tpwgts, ncuts=ncuts)
        if graph.edge_weights is not None:  # METIS's cut is weighted; ours counts edges
            cut = edge_cut(graph, parts)
        found.append((parts, {"variant": "recursive" if rec else "kway", "edge_cut": cut,
                              "load_imbalance": load_imbalance(graph, parts, num_parts,
                                                               tpwgts)}))
    balanced = [f for f in found if f[1]["load_imbalance"] <= limit]
    if balanced:
        parts, best = min(balanced, key=lambda f: f[1]["edge_cut"])
    else:
        parts, best = min(found, key=lambda f: f[1]["load_imbalance"])
    choice = {"variant": best["variant"], "seed": int(seed), "ncuts": ncuts,
              "edge_cut": best["edge_cut"], "load_imbalance": best["load_imbalance"],
              "candidates": [f[1] for f in found]}
    return parts, choice


def metis_parts(
    graph: Graph,
    num_parts: int,
    *,
    seed: int = 0,
    imbalance: float = 0.03,
    recursive: bool = False,
    tpwgts: np.ndarray | None = None,
    ncuts: int = 1,
) -> np.ndarray:
    """One METIS ``PartGraphKway`` (or ``PartGraphRecursive``) call through pymetis.

    Vertex weights (all constraints) and edge weights of ``graph`` are passed on;
    ``ufactor = round(1000 * imbalance)``; METIS keeps the best of ``ncuts`` tries.

    Shapes:
        Returns ``(N,)`` int64.
    """
    return _metis_call(graph, num_parts, seed=seed, imbalance=imbalance, recursive=recursive,
                       tpwgts=tpwgts, ncuts=ncuts)[0]


#: What pymetis raises on any METIS error status (it throws a C++ pointer, which pybind11 cannot translate).
_METIS_FAILED = "Caught an unknown exception!"


def _metis_call(
    graph: Graph,
    num_parts: int,
    *,
    seed: int,
    imbalance: float,
    recursive: bool,
    tpwgts: np.ndarray | None,
    ncuts: int,
) -> tuple[np.ndarray, int]:
    """:func:`metis_parts`, and METIS's objective: the edge cut of the parts (weighted by
    ``graph.edge_weights`` when there are any), which METIS counts as it refines, so that
    it need not be counted again over every edge."""
    import pymetis

    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64), 0
    options = pymetis.Options(seed=int(seed), ufactor=max(1, round(1000 * imbalance)),
                              ncuts=int(ncuts))
    adjacency = pymetis.CSRAdjacency(adj_starts=graph.indptr, adjacent=graph.indices)
    vweights = None if graph.vertex_weights is None else graph.vertex_weights.ravel()
    try:
        result = pymetis.part_graph(
            num_parts, adjacency=adjacency, vweights=vweights, eweights=graph.edge_weights,
            tpwgts=None if tpwgts is None else tpwgts.tolist(), recursive=recursive, options=options)
    except RuntimeError as err:
        if str(err) != _METIS_FAILED:
            raise
        # pymetis throws a pointer for every METIS error status, which pybind11 cannot name; the input was
        # checked before, so the status left is METIS_ERROR_MEMORY (a malloc refused under a memory cap)
        raise MemoryError(f"METIS ran out of memory partitioning {graph.num_nodes:,} nodes into {num_parts} parts "
                          f"(pymetis: {err}); a mesh this large can be partitioned by several processes that "
                          "each hold a slice of it: torchrun --nproc-per-node P -m meshshard partition "
                          "MESH.vtkhdf (see docs/partition.md, 'Beyond one machine')") from None
    return np.asarray(result.vertex_part, dtype=np.int64), int(result.edge_cuts)


def _split_sizes(weights: np.ndarray, share: float) -> int:
    """How many leading items (in order) carry ``share`` of the total weight."""
    cw = np.cumsum(weights)
    return int(np.argmin(np.abs(cw - share * cw[-1]))) + 1 if len(cw) else 0


def rcb_parts(
    pos: np.ndarray,
    num_parts: int,
    *,
    weights: np.ndarray | None = None,
    tpwgts: np.ndarray | None = None,
) -> np.ndarray:
    """Recursive coordinate bisection: split along the longest extent at the weighted
    quantile that matches the target shares of the two halves (ties by global id).

    One vectorised split per part boundary (``R - 1`` in all).

    Shapes:
        pos: ``(N, D)``. weights: ``(N,)``. Returns ``(N,)`` int64.
    """
    n = len(pos)
    weights = np.ones(n, dtype=np.int64) if weights is None else weights
    tp = target_weights(num_parts, None) if tpwgts is None else tpwgts
    parts = np.empty(n, dtype=np.int64)
    stack = [(np.arange(n, dtype=np.int64), 0, num_parts)]
    while stack:
        idx, first, k = stack.pop()
        if k == 1:
            parts[idx] = first
            continue
        k_left = k // 2
        share = tp[first:first + k_left].sum() / tp[first:first + k].sum()
        sub = pos[idx]
        axis = int(np.argmax(sub.max(axis=0) - sub.min(axis=0))) if len(idx) else 0
        order = idx[np.lexsort((idx, sub[:, axis]))]
        n_left = _split_sizes(weights[order], share)
        if len(idx) >= k:  # keep every part non-empty
            n_left = min(max(n_left, k_left), len(idx) - (k - k_left))
        stack.append((order[n_left:], first + k_left, k - k_left))
        stack.append((order[:n_left], first, k_left))
    return parts


def morton_codes(pos: np.ndarray, bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Z-order (Morton) code of each point on a ``2^b`` grid over the bounding cube
    (``b`` = 32 bits per axis in 2-D, 21 in 3-D).

    Args:
        pos: The points.
        bounds: ``(lowest, highest)`` coordinates of the box, default ``pos``'s own (a distributed
            partition passes the whole mesh's, so that every process's codes are the ones of one).

    Shapes:
        pos: ``(N, D)``, ``D`` 2 or 3. bounds: two ``(D,)``. Returns ``(N,)`` uint64.
    """
    dim = pos.shape[1]
    bits = 64 // dim if dim > 1 else 63
    lo, hi = (pos.min(axis=0), pos.max(axis=0)) if bounds is None else bounds
    extent = float((hi - lo).max()) or 1.0
    scale = (2.0**bits - 1) / extent
    grid = np.clip(((pos - lo) * scale), 0, 2.0**bits - 1).astype(np.uint64)
    code = np.zeros(len(pos), dtype=np.uint64)
    for bit in range(bits):  # loop over bits, vectorised over points
        for axis in range(dim):
            b = (grid[:, axis] >> np.uint64(bit)) & np.uint64(1)
            code |= b << np.uint64(bit * dim + axis)
    return code


def morton_parts(
    pos: np.ndarray,
    num_parts: int,
    *,
    weights: np.ndarray | None = None,
    tpwgts: np.ndarray | None = None,
) -> np.ndarray:
    """Sort points along the Morton curve (ties by global id) and cut the curve into ``R``
    runs whose weights match the target shares.

    Shapes:
        pos: ``(N, D)``. weights: ``(N,)``. Returns ``(N,)`` int64.
    """
    n = len(pos)
    weights = np.ones(n, dtype=np.int64) if weights is None else weights
    tp = target_weights(num_parts, None) if tpwgts is None else tpwgts
    order = np.argsort(morton_codes(pos), kind="stable")
    w = weights[order].astype(np.float64)
    middle = np.cumsum(w) - 0.5 * w
    bounds = np.cumsum(tp)[:-1] * w.sum()
    parts = np.empty(n, dtype=np.int64)
    parts[order] = np.searchsorted(bounds, middle, side="right")
    return parts


#: Directed edges looked at together by :func:`edge_cut` (bounds its scratch memory).
EDGE_CHUNK = 1 << 24


def edge_cut(graph: Graph, parts: np.ndarray) -> int:
    """Undirected edges whose two ends are in different parts (rows taken about
    :data:`EDGE_CHUNK` edges at a time)."""
    n = graph.num_nodes
    starts = np.searchsorted(graph.indptr, np.arange(0, graph.num_edges, EDGE_CHUNK), side="right") - 1
    bounds = np.unique(np.r_[0, starts, n])  # rows, cut every ~EDGE_CHUNK edges
    cut = 0
    for start, stop in zip(bounds[:-1], bounds[1:]):
        lo, hi = graph.indptr[start], graph.indptr[stop]
        dst = np.repeat(parts[start:stop], np.diff(graph.indptr[start:stop + 1]))
        cut += int(np.count_nonzero(parts[graph.indices[lo:hi]] != dst))
    return cut // 2


def imbalance(parts: np.ndarray, num_parts: int) -> float:
    """Largest owned count over mean owned count (1.0 is perfect balance)."""
    counts = np.bincount(parts, minlength=num_parts)
    return float(counts.max() / counts.mean())


def load_imbalance(graph: Graph, parts: np.ndarray, num_parts: int,
                   tpwgts: Sequence[float] | None = None) -> float:
    """Largest ratio of a part's load to its target (the quantity METIS bounds), where the
    load is the first vertex weight (or the node count) and the target the part's share."""
    w = _node_weights(graph)
    load = np.bincount(parts, weights=w, minlength=num_parts)
    target = target_weights(num_parts, tpwgts) * w.sum()
    return float((load / target).max()) if w.sum() else 1.0


def _group_cumsum(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running sum of ``values`` restarted at each new value of the sorted ``groups``."""
    total = np.cumsum(values)
    start = np.ones(len(groups), dtype=bool)
    start[1:] = groups[1:] != groups[:-1]
    base = (total - values)[start]
    return total - np.repeat(base, np.diff(np.append(np.flatnonzero(start), len(groups))))


def _boundary_moves(
    parts: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    w: np.ndarray,
    load: np.ndarray,
    excess: np.ndarray,
    room: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One round of moves: nodes of parts with ``excess > 0`` to neighbouring parts with room.

    Every candidate node picks its lightest neighbouring part (relative to the room left),
    then most links to it, then lowest id. Each sending part takes its best cut gains first
    until its excess is covered; each receiving part accepts, best gains first, up to its room.

    Shapes:
        parts, w: ``(N,)``. src, dst: ``(E,)``. load, excess, room: ``(R,)``. Returns the moved
        nodes and their new parts.
    """
    num_parts = len(load)
    pu, pv = parts[dst], parts[src]
    ok = (excess[pu] > 1e-9) & (pv != pu) & (room[pv] >= w[dst])
    if not ok.any():
        return dst[:0], dst[:0]
    key = np.sort(dst[ok] * num_parts + pv[ok])
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    key, links = key[starts], np.diff(np.r_[starts, len(key)])
    u, q = np.divmod(key, num_parts)
    internal = np.bincount(dst[pu == pv], minlength=len(parts))[u]
    pick = np.lexsort((q, -links, -room[q], u))
    first = np.ones(len(pick), dtype=bool)
    first[1:] = u[pick][1:] != u[pick][:-1]
    cand = pick[first]
    u, q, gain = u[cand], q[cand], links[cand] - internal[cand]
    p = parts[u]
    order = np.lexsort((u, -gain, p))
    u, q, p, gain = u[order], q[order], p[order], gain[order]
    keep = _group_cumsum(p, w[u]) - w[u] < excess[p]
    u, q, gain = u[keep], q[keep], gain[keep]
    order = np.lexsort((u, -gain, q))
    u, q = u[order], q[order]
    keep = _group_cumsum(q, w[u]) <= room[q] + 1e-9
    return u[keep], q[keep]


def refine_balance(
    graph: Graph,
    parts: np.ndarray,
    num_parts: int,
    *,
    imbalance: float = 0.03,
    tpwgts: Sequence[float] | None = None,
    max_rounds: int = 500,
) -> tuple[np.ndarray, int]:
    """Move boundary nodes out of overloaded parts until every load is within
    ``(1 + imbalance) * target``.

    Each round is vectorised over all nodes (:func:`_boundary_moves`): overloaded parts send
    boundary nodes to neighbouring parts below their cap. When no such move exists (an
    overloaded part whose neighbours are all full), parts above their target send to
    neighbouring parts below it instead, which makes room along a chain of parts. Rounds stop
    when balanced, when nothing can move, or after ``max_rounds``.

    Shapes:
        parts: ``(N,)`` int64. Returns the new ``(N,)`` parts and the number of moves.
    """
    parts = parts.copy()
    w = _node_weights(graph).astype(np.float64)
    target = target_weights(num_parts, tpwgts) * w.sum()
    cap = (1.0 + imbalance) * target
    dst = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), graph.degree())
    src = graph.indices
    moved = 0
    for _ in range(max_rounds):
        load = np.bincount(parts, weights=w, minlength=num_parts)
        if (load - cap <= 1e-9).all():
            break
        u, q = _boundary_moves(parts, src, dst, w, load, load - cap,
                               np.maximum(cap - load, 0.0))
        if not len(u):  # diffuse: above-target parts make room along chains of parts
            u, q = _boundary_moves(parts, src, dst, w, load, load - target,
                                   np.maximum(target - load, 0.0))
        if not len(u):
            break
        parts[u] = q
        moved += len(u)
    return parts, moved
