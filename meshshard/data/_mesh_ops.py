"""What ``meshshard dataset`` does to a mesh as read, on request: cell data averaged onto the
nodes, a one-cell-thick 3-D mesh collapsed to 2-D, the distance to a named boundary.

All of it vectorised (``np.bincount``, fancy indexing, one k-d tree query): no Python loop over
nodes or cells, only over cell blocks and field components. The mesh is a ``meshio.Mesh`` (what
:func:`meshshard.data._sources.read_mesh` gives, from meshio or from
:mod:`meshshard.data._vtk_io`); named boundaries are its ``point_sets`` (node ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import plural

__all__ = ["cell_data_to_points", "collapse_2d", "one_cell_thick_note", "WALL_DISTANCE"]

#: The input channel ``--wall-distance`` adds.
WALL_DISTANCE = "wall_distance"

# The faces of a hexahedron and of a wedge (meshio's node order, VTK's for the hexahedron), each
# with the face across the cell, node i of one facing node i of the other.
_FACES = {
    "hexahedron": (np.array([[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 5, 4], [3, 2, 6, 7], [1, 2, 6, 5], [0, 3, 7, 4]]),
                   np.array([[4, 5, 6, 7], [0, 1, 2, 3], [3, 2, 6, 7], [0, 1, 5, 4], [0, 3, 7, 4], [1, 2, 6, 5]])),
    "wedge": (np.array([[0, 1, 2], [3, 4, 5]]), np.array([[3, 4, 5], [0, 1, 2]])),
}
_FLAT = {"hexahedron": "quad", "wedge": "triangle"}


def cell_data_to_points(mesh: Any, name: str, path: Path) -> np.ndarray:
    """The cell field ``name`` averaged onto the nodes: at each node, the mean over the cells that
    use it (of every block that holds the field), as ParaView's Cell Data to Point Data does.

    Shapes:
        Returns ``(N, components)`` float64.
    """
    n = len(mesh.points)
    blocks = mesh.cell_data[name]
    width = int(np.prod(np.shape(blocks[0])[1:], dtype=np.int64)) if len(blocks) else 1
    sums = np.zeros((n, width))
    counts = np.zeros(n)
    for block, values in zip(mesh.cells, blocks):  # cell blocks, not cells: a handful
        conn = np.asarray(block.data)
        v = np.asarray(values)
        if not (np.issubdtype(v.dtype, np.number) or v.dtype == bool) or v.ndim == 0 or len(v) != len(conn):
            raise ValueError(f"{path}: Expected a numeric cell_data field {name!r} with one value per cell "
                             f"(got shape {v.shape}, dtype {v.dtype}, for {plural(len(conn), block.type + ' cell')})")
        v = v.reshape(len(conn), -1).astype(np.float64)
        if v.shape[1] != width:
            raise ValueError(f"{path}: Expected cell_data field {name!r} to have {width} components in every "
                             f"cell block (got {v.shape[1]} for the {block.type} cells)")
        ids = conn.reshape(-1)
        counts += np.bincount(ids, minlength=n)
        for c in range(width):  # components
            sums[:, c] += np.bincount(ids, weights=np.repeat(v[:, c], conn.shape[1]), minlength=n)
    lonely = np.flatnonzero(counts == 0)
    if len(lonely):
        raise ValueError(f"{path}: Expected every node in a cell to average cell field {name!r} onto the nodes "
                         f"(got {plural(len(lonely), 'node')} in no cell, the first node {int(lonely[0])})")
    return sums / counts[:, None]


@dataclass(frozen=True, eq=False)
class _Extrusion:
    """A one-cell-thick mesh: its lower-plane nodes, each node's lower-plane partner, and each
    3-D cell block as its face on the lower plane."""
    keep: np.ndarray              # (N_2d,) ids of the lower-plane nodes, ascending
    partner: np.ndarray           # (N,) the lower-plane node of every node (itself on the lower plane)
    faces: list[tuple[str, np.ndarray]]
    z: tuple[float, float]


def _extrusion(mesh: Any) -> _Extrusion | str:
    """The mesh as an extrusion of its lower z-plane by one cell, or why it is not one."""
    pts = np.asarray(mesh.points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 3 or not len(pts):
        return f"{pts.shape[1] if pts.ndim == 2 else 0}-D points, not 3-D"
    extent = float(np.ptp(pts, axis=0).max())
    tol = 1e-6 * extent
    z = pts[:, 2]
    lo, hi = float(z.min()), float(z.max())
    if hi - lo <= tol:
        return f"every node at z = {lo:.6g}: a 2-D mesh already"
    lower, upper = np.abs(z - lo) <= tol, np.abs(z - hi) <= tol
    between = np.flatnonzero(~(lower | upper))
    if len(between):
        return (f"{plural(len(between), 'node')} between z = {lo:.6g} and z = {hi:.6g} (node {int(between[0])} at "
                f"z = {z[between[0]]:.6g}): more than one cell thick")
    partner = np.full(len(pts), -1, dtype=np.int64)
    partner[lower] = np.flatnonzero(lower)
    faces = []
    for block in mesh.cells:  # cell blocks, not cells
        if block.type not in _FACES:
            return f"{block.type} cells (a one-cell-thick mesh has hexahedra and wedges)"
        conn = np.asarray(block.data, dtype=np.int64)
        face, across = _FACES[block.type]
        on_lower = lower[conn][:, face].all(axis=2) & upper[conn][:, across].all(axis=2)  # (C, faces)
        spans = on_lower.any(axis=1)
        if not spans.all():
            bad = int(np.flatnonzero(~spans)[0])
            return (f"{block.type} cell {bad} does not span the two planes with one face on each "
                    f"(nodes {conn[bad].tolist()})")
        which = on_lower.argmax(axis=1)
        low, high = np.take_along_axis(conn, face[which], 1), np.take_along_axis(conn, across[which], 1)
        partner[high.reshape(-1)] = low.reshape(-1)
        faces.append((_FLAT[block.type], low))
    orphan = np.flatnonzero(partner < 0)
    if len(orphan):
        return f"{plural(len(orphan), 'node')} on the upper plane in no cell (node {int(orphan[0])})"
    moved = np.flatnonzero(np.abs(pts[:, :2] - pts[partner, :2]).max(axis=1) > tol)
    if len(moved):
        return (f"cells not extruded along z: node {int(moved[0])} is at another (x, y) than the node across "
                f"the cell from it")
    return _Extrusion(np.flatnonzero(lower), partner, faces, (lo, hi))


def one_cell_thick_note(mesh: Any, path: Path) -> str | None:
    """A note when ``mesh`` is one cell thick in z (a 2-D case of OpenFOAM), suggesting
    ``--collapse-2d``; None otherwise."""
    found = _extrusion(mesh)
    if isinstance(found, str):
        return None
    return (f"{path}: the mesh is one cell thick in z (every cell spans z = {found.z[0]:.6g} to {found.z[1]:.6g}: a "
            f"2-D case?); --collapse-2d makes it the 2-D mesh of its lower plane ({len(found.keep):,} of "
            f"{len(mesh.points):,} nodes, no z-edges in the graph)")


def collapse_2d(mesh: Any, path: Path) -> Any:
    """A one-cell-thick 3-D mesh (its nodes on two z-planes, each cell a hexahedron or a wedge
    spanning both) as the 2-D mesh of its lower plane: the nodes of that plane with their fields
    and ``(x, y)`` coordinates, hexahedra as quads and wedges as triangles (counter-clockwise),
    cell data kept, named node sets moved to the lower plane (but for those of the two planes, such as
    OpenFOAM's ``empty`` ``frontAndBack``, which would hold every node). Anything else is refused in one line.

    Shapes:
        mesh.points ``(N, 3)`` -> ``(N_2d, 2)``, ``N_2d`` = the nodes of the lower plane.
    """
    import meshio

    found = _extrusion(mesh)
    if isinstance(found, str):
        raise ValueError(f"{path}: Expected a mesh one cell thick in z for --collapse-2d (got {found})")
    n = len(mesh.points)
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[found.keep] = np.arange(len(found.keep))
    to_2d = new_id[found.partner]
    points = np.asarray(mesh.points, dtype=np.float64)[found.keep, :2]
    cells = []
    for cell_type, low in found.faces:
        conn = to_2d[low]
        xy = points[conn]
        area = (xy[:, :, 0] * np.roll(xy[:, :, 1], -1, axis=1) - np.roll(xy[:, :, 0], -1, axis=1) * xy[:, :, 1]).sum(1)
        conn[area < 0] = conn[area < 0, ::-1]
        cells.append((cell_type, conn))
    point_data = {k: np.asarray(v)[found.keep] for k, v in mesh.point_data.items()}
    sets = {k: np.unique(to_2d[np.asarray(v, dtype=np.int64)]) for k, v in (mesh.point_sets or {}).items()}
    # the patches of the two planes (OpenFOAM's "empty" frontAndBack) hold every node once collapsed: not a boundary
    sets = {k: v for k, v in sets.items() if len(v) < len(found.keep)}
    return meshio.Mesh(points, cells, point_data=point_data, cell_data=dict(mesh.cell_data),
                       field_data=dict(getattr(mesh, "field_data", {}) or {}), point_sets=sets)
