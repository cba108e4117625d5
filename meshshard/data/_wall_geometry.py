"""Geometric inputs from named walls (``meshshard dataset --wall-normal``, ``--signed-distance``):
at every node, the offset to the nearest wall node and the wall's normal there, or the signed
distance to a closed body.

The wall. The *wall facets* are the faces of the mesh's cells (edges of 2-D cells, faces of 3-D
cells) whose nodes all lie in the named boundaries (:func:`~meshshard.data._surface.named_boundaries`):
boundary facets of the mesh (a body cut out of it, as a solver meshes it) or facets inside it (a
body drawn into a background mesh, its inside meshed too). Cutting the mesh's cells at the wall
facets splits them into connected regions; a region none of whose cells touches the mesh's own
boundary is *inside a body*, any other is fluid.

Normals. Each wall facet's area vector (:func:`~meshshard.data._surface.facet_vectors`) is turned
to point into the fluid: towards its one cell for a boundary facet, from the inside region to the
fluid for a facet inside the mesh (one with fluid or body on both sides, a baffle, is refused: its
normal has no side). A wall node's normal is the sum of its facets' vectors split among their
nodes (area-weighted), made unit length.

Offset. At every node, ``x - x_wall`` with ``x_wall`` the nearest *wall node* (one k-d tree query,
as ``--wall-distance``: the nearest node, not the nearest point of the facets between them, so the
offset is exact on the wall and off by up to half a wall facet's width along the wall elsewhere),
and the normal of that wall node: ``wall_offset`` and ``wall_normal``, ``D`` channels each.

Signed distance. The distance to the nearest wall node, negative at the nodes inside a body, 0
on the wall. The sign is the node's region (exact, whatever the wall's shape), not the sign of
``normal . offset`` (which a concave corner can flip). Only for *closed* walls, checked: in 2-D
every wall node has exactly two wall edges, in 3-D every edge of a wall face is shared by exactly
two wall faces; else one line naming the first open node or edge.

All vectorised: facets are rows of one array, matched with ``np.unique``; regions are the
connected components of a sparse cell graph (``scipy.sparse.csgraph``); no loop over nodes or
cells, only over cell blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural

from ._surface import _FACETS, _dimension, facet_vectors, named_boundaries

__all__ = ["SIGNED_DISTANCE", "WALL_NORMAL", "WALL_OFFSET", "signed_distance", "wall_distance", "wall_normal"]

#: The input fields ``--wall-normal`` adds: the offset to the nearest wall node, and its normal.
WALL_OFFSET = "wall_offset"
WALL_NORMAL = "wall_normal"
#: The input channel ``--signed-distance`` adds.
SIGNED_DISTANCE = "signed_distance"


@dataclass(frozen=True, eq=False)
class _Wall:
    """The wall of named boundaries on a mesh: its facets (grouped by node count), their area
    vectors into the fluid, each node's unit normal, and which nodes lie inside a body."""
    facets: list[np.ndarray]       # [(F_k, k) int64], one array per facet size
    nodes: np.ndarray              # (n_w,) the wall nodes on a wall facet, ascending
    normal: np.ndarray             # (n_w, D) unit normals into the fluid
    inside: np.ndarray             # (N,) bool: the node lies inside a body (never a wall node)


def _wall_ids(mesh: Any, patches: Sequence[str], path: Path, flag: str) -> list[np.ndarray]:
    """The node ids of each named boundary (checked: the file names them, and they hold nodes)."""
    sets = named_boundaries(mesh)
    if not sets:
        raise ValueError(f"{path}: Expected named boundaries for {flag} (got none in this file; a .vtm with "
                         "boundary blocks, as foamToVTK writes, node sets or gmsh physical groups have them)")
    unknown = [p for p in patches if p not in sets]
    if unknown:
        raise ValueError(f"{path}: Expected {flag} to name boundaries of the file (got {listed(unknown)}; "
                         f"the boundaries are {listed(list(sets), limit=20)})")
    if not sum(len(sets[p]) for p in patches):
        raise ValueError(f"{path}: Expected nodes on {listed(list(patches))} for {flag} (got none)")
    return [sets[p] for p in patches]


def _cell_facets(points: np.ndarray, mesh: Any) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Every facet of every top-dimensional cell, grouped by node count: ``[(facets (M, k), cell (M,))]``
    (a facet once per cell that has it), and the cells' centroids ``(C, D)``."""
    blocks = [(b.type, np.asarray(b.data, dtype=np.int64)) for b in mesh.cells]
    top = max((_dimension(t) for t, _ in blocks), default=-1)
    blocks = [(t, c) for t, c in blocks if _dimension(t) == top and t in _FACETS]
    if top not in (2, 3) or not blocks:
        return [], np.zeros((0, points.shape[1]))
    groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    centroids, start = [], 0
    for cell_type, conn in blocks:  # cell blocks, not cells
        centroids.append(points[conn].mean(axis=1))
        ids = np.arange(start, start + len(conn))
        start += len(conn)
        for facet in _FACETS[cell_type][1]:
            groups.setdefault(len(facet), []).append((conn[:, facet], ids))
    return ([(np.concatenate([f for f, _ in g]), np.concatenate([c for _, c in g])) for g in groups.values()],
            np.concatenate(centroids))


def _wall(mesh: Any, patches: Sequence[str], path: Path, flag: str, closed: bool = False) -> _Wall:
    """The wall of ``patches`` on ``mesh`` (see the module docstring); with ``closed``, refused in
    one line unless it closes (:func:`_check_closed`)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    points = np.asarray(mesh.points, dtype=np.float64)
    n = len(points)
    masks = []
    for ids in _wall_ids(mesh, patches, path, flag):
        masks.append(np.zeros(n, dtype=bool))
        masks[-1][ids] = True
    on_wall = np.logical_or.reduce(masks)
    groups, centroid = _cell_facets(points, mesh)
    num_cells = len(centroid)
    touches = np.zeros(num_cells, dtype=bool)  # the cell has a facet on the mesh's boundary
    unique = []  # per facet size: each facet once, its first cell, its second (or -1), how many cells have it
    for facets, cell in groups:
        _, first, inverse, counts = np.unique(np.sort(facets, axis=1), axis=0, return_index=True,
                                              return_inverse=True, return_counts=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")
        starts = np.searchsorted(inverse.reshape(-1)[order], np.arange(len(first)))
        a = cell[order[starts]]
        b = np.where(counts >= 2, cell[order[np.minimum(starts + 1, len(order) - 1)]], -1)
        touches[a[counts == 1]] = True
        unique.append((facets[first], a, b, counts))
    # a boundary on the mesh's boundary is its boundary facets (not a chord across a corner cell);
    # one drawn inside the mesh is the facets inside it whose nodes all lie on it
    on_boundary = [any((m[f].all(axis=1) & (c == 1)).any() for f, _, _, c in unique) for m in masks]
    rows, cols, walls = [], [], []
    for facets, a, b, counts in unique:
        wall = np.logical_or.reduce([m[facets].all(axis=1) & ((counts == 1) if edge else (counts == 2))
                                     for m, edge in zip(masks, on_boundary)])
        inner = ~wall & (counts == 2)
        rows.append(a[inner])
        cols.append(b[inner])
        walls.append((facets[wall], a[wall], b[wall]))
    if not any(len(f) for f, _, _ in walls):
        raise ValueError(f"{path}: Expected faces of the mesh's cells on {listed(list(patches))} for {flag} (got "
                         "none: the named nodes make no cell edge or face)")
    if closed:
        _check_closed([f for f, _, _ in walls], patches, path)
    r, c = np.concatenate(rows), np.concatenate(cols)
    graph = coo_matrix((np.ones(len(r)), (r, c)), shape=(num_cells, num_cells))
    _, region = connected_components(graph, directed=False)
    fluid_region = np.bincount(region, weights=touches, minlength=region.max() + 1) > 0
    fluid = fluid_region[region]  # per cell
    normal = np.zeros((n, points.shape[1]))
    kept = []
    for facets, a, b in walls:
        two = b >= 0
        sided = np.flatnonzero(two & (fluid[a] == fluid[np.maximum(b, 0)]))
        if len(sided):
            i = sided[0]
            raise ValueError(f"{path}: Expected {listed(list(patches))} to part fluid from a body for {flag} (got a"
                             f"{'face' if facets.shape[1] > 2 else 'n edge'} inside the mesh, nodes "
                             f"{facets[i].tolist()}, with {'fluid' if fluid[a[i]] else 'body'} on both sides)")
        owner = np.where(two & ~fluid[a], np.maximum(b, 0), a)  # the fluid cell beside each facet
        vectors = -facet_vectors(points, facets, centroid[owner])  # turned away from the fluid, then back
        k = facets.shape[1]
        for d in range(points.shape[1]):
            normal[:, d] += np.bincount(facets.reshape(-1), weights=np.repeat(vectors[:, d] / k, k), minlength=n)
        kept.append(facets)
    length = np.linalg.norm(normal, axis=1)
    nodes = np.flatnonzero(length > 0)
    inside = np.zeros(n, dtype=bool)
    for facets, cell in groups:  # a node off the wall lies in one region: that of any cell around it
        inside[facets.reshape(-1)] = np.repeat(~fluid[cell], facets.shape[1])
    inside &= ~on_wall
    return _Wall(kept, nodes, normal[nodes] / length[nodes, None], inside)


def _nearest(points: np.ndarray, wall_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's nearest wall node (index into ``wall_ids``) and its distance: one k-d tree query."""
    from scipy.spatial import cKDTree

    dist, at = cKDTree(points[wall_ids]).query(points, k=1)
    return np.asarray(at, dtype=np.int64), np.asarray(dist, dtype=np.float64)


def wall_distance(mesh: Any, patches: Sequence[str], path: Path) -> np.ndarray:
    """``--wall-distance``: the distance from every node to the nearest node of the named boundaries
    (:func:`~meshshard.data._surface.named_boundaries`), their facets not needed.

    Shapes:
        Returns ``(N, 1)`` float64.
    """
    ids = np.unique(np.concatenate(_wall_ids(mesh, patches, path, "--wall-distance")))
    _, dist = _nearest(np.asarray(mesh.points, dtype=np.float64), ids)
    return dist.reshape(-1, 1)


def wall_normal(mesh: Any, patches: Sequence[str], path: Path) -> np.ndarray:
    """``--wall-normal``: at every node, the offset ``x - x_wall`` to the nearest wall node and
    that node's unit normal into the fluid (see the module docstring).

    Shapes:
        Returns ``(N, 2 D)`` float64: the offset's ``D`` channels, then the normal's.
    """
    points = np.asarray(mesh.points, dtype=np.float64)
    wall = _wall(mesh, patches, path, "--wall-normal")
    at, _ = _nearest(points, wall.nodes)
    return np.concatenate([points - points[wall.nodes[at]], wall.normal[at]], axis=1)


def _check_closed(facets: list[np.ndarray], patches: Sequence[str], path: Path) -> None:
    """Refuse, in one line, a wall that does not close: a 2-D wall node without exactly two wall
    edges, a 3-D wall face edge not shared by exactly two wall faces."""
    what = listed(list(patches))
    if facets[0].shape[1] == 2:
        ends = np.concatenate([f.reshape(-1) for f in facets])
        ids, counts = np.unique(ends, return_counts=True)
        open_ = np.flatnonzero(counts != 2)
        if len(open_):
            i = open_[0]
            raise ValueError(f"{path}: Expected {what} to close around a body for --signed-distance (got "
                             f"{plural(len(open_), 'node')} without exactly two wall edges, the first node "
                             f"{int(ids[i])} with {int(counts[i])}); --wall-distance or --wall-normal take open "
                             "walls")
        return
    edges = np.concatenate([np.stack([f, np.roll(f, -1, axis=1)], axis=2).reshape(-1, 2) for f in facets])
    keys, counts = np.unique(np.sort(edges, axis=1), axis=0, return_counts=True)
    open_ = np.flatnonzero(counts != 2)
    if len(open_):
        i = open_[0]
        raise ValueError(f"{path}: Expected {what} to close around a body for --signed-distance (got "
                         f"{plural(len(open_), 'edge')} not shared by exactly two wall faces, the first "
                         f"{keys[i].tolist()} by {int(counts[i])}); --wall-distance or --wall-normal take open walls")


def signed_distance(mesh: Any, patches: Sequence[str], path: Path) -> np.ndarray:
    """``--signed-distance``: at every node, the distance to the nearest node of the closed wall,
    negative inside a body, 0 on the wall (see the module docstring).

    Shapes:
        Returns ``(N, 1)`` float64.
    """
    points = np.asarray(mesh.points, dtype=np.float64)
    wall = _wall(mesh, patches, path, "--signed-distance", closed=True)
    _, dist = _nearest(points, wall.nodes)
    return np.where(wall.inside, -dist, dist).reshape(-1, 1)
