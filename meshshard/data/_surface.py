"""Named boundaries of a mesh, and the area each boundary node stands for: what force integrals
and boundary errors are made of.

A *named boundary* is a set of node ids: a patch of a foamToVTK ``.vtm`` (``point_sets``), a
node set of the file, or a gmsh physical group of lower-dimensional cells (``cell_sets``).
:func:`named_boundaries` collects them from a ``meshio.Mesh``.

Area vectors. The boundary *facets* of a mesh are the faces of its cells (edges of 2-D cells,
faces of 3-D cells) that belong to one cell only. A facet's area vector is its area (length in
2-D) times its unit normal, pointing **out of the mesh** (out of the fluid, into a wall): the
normal is turned to point from the cell's centroid to the facet's, which is right for the
convex cells solvers write. :func:`boundary_area_vectors` splits each facet's vector equally
among its nodes, over the facets whose nodes all lie in the named set. For a field that varies
linearly along each facet (two-node edges, three-node triangles) the sum over the nodes,
``sum_i f_i a_i``, is then the exact integral of ``f n dA`` over the boundary, and
:func:`boundary_force` is the force the fluid exerts on it. :func:`surface_area_vectors` does the
same for a surface given by its own faces (a ``.vtp`` of a car body), oriented by their winding.

All vectorised: facets are sorted rows of one array and counted with ``np.unique``; no loop over
nodes or cells, only over cell types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["boundary_area_vectors", "boundary_force", "named_boundaries", "patch_names", "surface_area_vectors"]

# The facets of each cell type, in meshio's node order (VTK's): edges of 2-D cells, faces of 3-D cells.
_FACETS: dict[str, tuple[int, list[list[int]]]] = {
    "triangle": (2, [[0, 1], [1, 2], [2, 0]]),
    "quad": (2, [[0, 1], [1, 2], [2, 3], [3, 0]]),
    "tetra": (3, [[0, 2, 1], [0, 1, 3], [1, 2, 3], [0, 3, 2]]),
    "hexahedron": (3, [[0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [1, 2, 6, 5], [2, 3, 7, 6], [3, 0, 4, 7]]),
    "wedge": (3, [[0, 1, 2], [3, 5, 4], [0, 3, 4, 1], [1, 4, 5, 2], [2, 5, 3, 0]]),
    "pyramid": (3, [[0, 3, 2, 1], [0, 1, 4], [1, 2, 4], [2, 3, 4], [3, 0, 4]]),
}
_LOWER = {"vertex": 0, "line": 1, "line3": 1, "triangle": 2, "triangle6": 2, "quad": 2, "quad8": 2, "quad9": 2}


def _dimension(cell_type: str) -> int:
    if cell_type in _FACETS:
        return _FACETS[cell_type][0]
    return _LOWER.get(cell_type, -1)


def named_boundaries(mesh: Any) -> dict[str, np.ndarray]:
    """The named node sets of a ``meshio.Mesh``, in its order: its ``point_sets``, then each
    ``cell_sets`` entry whose cells are all of a lower dimension than the mesh's highest (a gmsh
    physical group of boundary lines or faces; a gmsh 2.2 file's groups, which meshio gives only
    as ``gmsh:physical`` tags and ``field_data``, are read from those), as the nodes of those
    cells. Sorted unique int64 ids per name; a name already taken keeps its first set.

    Shapes:
        Returns ``{name: (n_name,)}``.
    """
    n = len(mesh.points)
    out: dict[str, np.ndarray] = {}
    for name, ids in dict(getattr(mesh, "point_sets", None) or {}).items():
        a = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        out[str(name)] = a[(a >= 0) & (a < n)]
    dims = [int(getattr(b, "dim", _dimension(b.type))) for b in mesh.cells]  # CellBlock.dim: 1 a line
    top = max(dims, default=-1)
    for name, per_block in (getattr(mesh, "cell_sets", None) or _gmsh_sets(mesh, dims)).items():
        if str(name) in out or str(name).startswith("gmsh:") or len(per_block) != len(dims):
            continue
        nodes, lower = [], True
        for block, dim, picked in zip(mesh.cells, dims, per_block):
            picked = np.asarray(picked if picked is not None else [], dtype=np.int64).reshape(-1)
            if not len(picked):
                continue
            lower &= dim < top
            nodes.append(np.asarray(block.data, dtype=np.int64)[picked].reshape(-1))
        if nodes and lower:
            out[str(name)] = np.unique(np.concatenate(nodes))
    return out


def boundary_classes(mesh: Any, registry: dict[str, int]) -> np.ndarray:
    """``(N,)`` int64 node classes from the named boundaries: 0 on none, else the id of the first
    set in the mesh's order that holds the node (ids from ``registry`` by name; a name it lacks is
    added, numbered on)."""
    sets = named_boundaries(mesh)
    for name in sets:
        registry.setdefault(name, len(registry) + 1)
    ids = np.zeros(len(mesh.points), dtype=np.int64)
    for name, nodes in reversed(list(sets.items())):  # the first set wins: written last
        ids[nodes] = registry[name]
    return ids


def _gmsh_sets(mesh: Any, dims: list[int]) -> dict[str, list[np.ndarray]]:
    """The physical groups of a gmsh 2.2 file as cell sets (meshio gives them for gmsh 4.1 only):
    the cells of each block whose ``gmsh:physical`` tag and dimension are the name's in
    ``field_data`` (``{name: [tag, dim]}``), in the file's order of names."""
    tags = (getattr(mesh, "cell_data", None) or {}).get("gmsh:physical")
    names = getattr(mesh, "field_data", None) or {}
    if tags is None or len(tags) != len(dims):
        return {}
    out = {}
    for name, value in names.items():
        value = np.asarray(value).ravel()
        if len(value) != 2:
            continue
        tag, dim = int(value[0]), int(value[1])
        out[str(name)] = [np.flatnonzero(np.asarray(t) == tag) if d == dim else np.zeros(0, dtype=np.int64)
                          for t, d in zip(tags, dims)]
    return out


def _boundary_facets(points: np.ndarray,
                     cells: Sequence[tuple[str, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The boundary facets of the mesh's top-dimensional cells, grouped by node count: for each
    group ``(facets (F, k) int64, owner centroid (F, D))``."""
    top = max((_dimension(t) for t, _ in cells), default=-1)
    if top not in (2, 3):
        return []
    groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for cell_type, conn in cells:
        if _dimension(cell_type) != top or cell_type not in _FACETS:
            continue
        conn = np.asarray(conn, dtype=np.int64)
        centroid = points[conn].mean(axis=1)
        by_size: dict[int, list[list[int]]] = {}
        for facet in _FACETS[cell_type][1]:
            by_size.setdefault(len(facet), []).append(facet)
        for k, table in by_size.items():
            facets = conn[:, np.asarray(table)].reshape(-1, k)  # (C * f, k)
            groups.setdefault(k, []).append((facets, np.repeat(centroid, len(table), axis=0)))
    out = []
    for parts in groups.values():
        facets = np.concatenate([f for f, _ in parts])
        owner = np.concatenate([c for _, c in parts])
        _, first, counts = np.unique(np.sort(facets, axis=1), axis=0, return_index=True, return_counts=True)
        once = first[counts == 1]
        out.append((facets[once], owner[once]))
    return out


def facet_vectors(points: np.ndarray, facets: np.ndarray, owner: np.ndarray | None) -> np.ndarray:
    """Area vectors ``(F, D)`` of facets ``(F, k)``: edges (k = 2) of a 2-D mesh, triangles and
    quads (k = 3, 4) in 3-D; turned away from ``owner`` (centroids) when given."""
    p = points[facets]
    dim = points.shape[1]
    if facets.shape[1] == 2:
        t = p[:, 1] - p[:, 0]
        if dim == 2:
            v = np.stack([t[:, 1], -t[:, 0]], axis=1)
        else:  # an edge of a flat 2-D mesh in 3-D coordinates: the normal lies in the cells' plane
            if owner is None:
                raise ValueError("Expected the owning cells of edges in 3-D coordinates")
            plane = np.cross(t, p[:, 0] - owner)
            v = np.cross(t, plane)
            norm = np.linalg.norm(v, axis=1, keepdims=True)
            v = np.divide(v * np.linalg.norm(t, axis=1, keepdims=True), norm, out=np.zeros_like(v), where=norm > 0)
    elif dim == 3 and facets.shape[1] == 3:
        v = 0.5 * np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    elif dim == 3 and facets.shape[1] == 4:
        v = 0.5 * np.cross(p[:, 2] - p[:, 0], p[:, 3] - p[:, 1])
    else:
        raise ValueError(f"Expected edges in 2-D or triangles and quads in 3-D (got {facets.shape[1]}-node "
                         f"facets in {dim}-D)")
    if owner is not None:
        outward = np.einsum("fd,fd->f", v, p.mean(axis=1) - owner)
        v = np.where((outward < 0)[:, None], -v, v)
    return v


def _lump(facets: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each facet's vector split equally among its nodes, summed per node of ``ids`` (sorted)."""
    out = np.zeros((len(ids), vectors.shape[1]))
    k = facets.shape[1]
    at = np.searchsorted(ids, facets.reshape(-1))
    np.add.at(out, at, np.repeat(vectors / k, k, axis=0))
    return out


def boundary_area_vectors(points: np.ndarray, cells: Sequence[tuple[str, np.ndarray]],
                          node_ids: np.ndarray) -> np.ndarray:
    """The area vector each node of a named boundary stands for (see the module docstring):
    row ``i`` for node ``node_ids[i]``, zero for a node on no boundary facet of the set.

    Shapes:
        points ``(N, D)``, node_ids ``(n,)`` sorted unique -> ``(n, D)``.
    """
    points = np.asarray(points, dtype=np.float64)
    ids = np.asarray(node_ids, dtype=np.int64)
    out = np.zeros((len(ids), points.shape[1]))
    if not len(ids):
        return out
    inside = np.zeros(len(points), dtype=bool)
    inside[ids] = True
    for facets, owner in _boundary_facets(points, cells):
        keep = inside[facets].all(axis=1)
        if keep.any():
            out += _lump(facets[keep], facet_vectors(points, facets[keep], owner[keep]), ids)
    return out


def surface_area_vectors(points: np.ndarray, faces: Sequence[tuple[str, np.ndarray]]) -> np.ndarray:
    """Per point of a surface in 3-D, the lumped area vector of the faces around it (triangles
    and quads), oriented by the faces' winding (right-hand rule): its length is the point's
    area, its direction the point's normal.

    Shapes:
        points ``(N, 3)`` -> ``(N, 3)``.
    """
    points = np.asarray(points, dtype=np.float64)
    out = np.zeros_like(points)
    ids = np.arange(len(points), dtype=np.int64)
    for cell_type, conn in faces:
        if cell_type not in ("triangle", "quad"):
            continue
        conn = np.asarray(conn, dtype=np.int64)
        out += _lump(conn, facet_vectors(points, conn, None), ids)
    return out


def boundary_force(pressure: np.ndarray, area: np.ndarray, shear: np.ndarray | None = None) -> np.ndarray:
    """The force a fluid exerts on a boundary: ``sum_i p_i a_i`` (``a_i`` out of the fluid, so
    positive pressure pushes on the wall), plus ``sum_i tau_i |a_i|`` for a wall shear stress
    ``tau`` given as the traction on the wall. Per unit depth in 2-D; in the pressure's units
    times area (OpenFOAM's incompressible ``p`` is per unit density).

    Shapes:
        pressure ``(n,)`` or ``(n, 1)``, area ``(n, D)``, shear ``(n, D)`` -> ``(D,)``.
    """
    p = np.asarray(pressure, dtype=np.float64).reshape(-1)
    a = np.asarray(area, dtype=np.float64)
    force = (p[:, None] * a).sum(axis=0)
    if shear is not None:
        tau = np.asarray(shear, dtype=np.float64)
        force = force + (tau[:, : a.shape[1]] * np.linalg.norm(a, axis=1, keepdims=True)).sum(axis=0)
    return force


def boundaries_of(mesh: Any, points: np.ndarray, cells: Sequence[tuple[str, np.ndarray]]
                  ) -> Mapping[str, tuple[np.ndarray, np.ndarray]]:
    """Every named boundary of ``mesh`` as ``(node ids, area vectors)`` on ``points`` / ``cells``
    (the mesh as it will be stored)."""
    return {name: (ids, boundary_area_vectors(points, cells, ids)) for name, ids in named_boundaries(mesh).items()}


def patch_names(text: str | Sequence[str], flag: str) -> tuple[str, ...]:
    """Boundary names from ``"lowerWall,upperWall"`` or a list of such strings, each once."""
    items = [text] if isinstance(text, str) else list(text)
    names = [t.strip() for item in items for t in str(item).split(",")]
    if not names or not all(names):
        raise ValueError(f"Expected {flag} as comma-separated boundary names (got "
                         f"{','.join(map(str, items))!r})")
    return tuple(dict.fromkeys(names))
