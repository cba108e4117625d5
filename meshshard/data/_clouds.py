"""Point-cloud and surface samples: what ``meshshard dataset`` reads from samples that have no
volume cells, and the fields it derives on a surface.

Sources. A ``.npz`` archive holds a cloud: ``pos`` ``(N, 2)`` or ``(N, 3)`` coordinates and any
other arrays as point fields, each with one row per point, real numbers or booleans
(:func:`read_npz_cloud`; nothing is unpickled). Surfaces (``.vtp``, legacy ``.vtk`` PolyData,
``.ply``, ``.stl``) and ``.vtu`` files of vertex cells come through the mesh readers.

Surfaces. A sample whose points are 3-D and whose cells are faces (triangles, quads, polygons
split into a fan of triangles from their first node), with no 3-D cells, has two derived point
fields, available to ``--inputs`` by name unless the file has fields of those names
(:func:`add_surface_fields`): ``area``, the point's share of the faces around it (each face's
area split equally among its nodes, so the areas add up to the surface's area), and ``normal``,
the unit vector of the point's lumped area vector (:func:`meshshard.data.surface_area_vectors`:
the faces' winding sets the side), zero at a point on no face. The area vectors themselves are
stored with the mesh (``surface-area.npy``) for force integrals.

How such a sample gets its graph (``--graph``) and a partition its geometric halo radius:
:mod:`meshshard.partition._points`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SURFACE_FIELDS", "is_point_cloud", "read_npz_cloud", "is_legacy_polydata", "triangulate", "surface_faces",
           "surface_fields", "add_surface_fields"]

#: The derived fields of a surface, by name.
SURFACE_FIELDS = ("normal", "area")


#: Cell types that are not volume cells in 3-D (faces, lines, vertices) and in 2-D (lines, vertices).
_SURFACE_TYPES = frozenset({"vertex", "line", "line3", "triangle", "triangle6", "quad", "quad8", "quad9", "polygon"})
_POINT_TYPES = frozenset({"vertex", "line", "line3"})


def is_point_cloud(entry: dict[str, Any]) -> bool:
    """Whether a dataset mesh (its ``meshes[m]`` entry) is a point cloud: no volume cells, that
    is a surface in 3-D (faces only), or bare points (vertex cells, or no cells and a graph built
    from the points), but not a flat mesh of faces at one z (``"planar"``: a 2-D mesh written in
    3-D, as many solvers do). Its predictions are written as PolyData (``.vtp`` / ``.pvtp``), and a
    field is mapped onto it by inverse distance (:func:`meshshard.data.node_map`, ``cloud=True``)."""
    types = set(entry.get("cells") or {})
    if entry.get("planar"):  # a 2-D mesh written with a constant z: an unstructured grid, drawn in 2-D
        return False
    if "surface_area" in entry:
        return True
    if not types:
        return "graph" in entry  # a graph given as edges, without cells, stays an unstructured grid
    return types <= (_SURFACE_TYPES if int(entry.get("pos_dim", 0)) == 3 else _POINT_TYPES)


# ---------------------------------------------------------------------------------------------
# Reading


def read_npz_cloud(path: str | Path) -> Any:
    """A ``.npz`` point cloud as a ``meshio.Mesh`` without cells: ``pos`` as its points, every
    other array as a point field. One-line errors naming the file: no ``pos``, a ``pos`` not
    ``(N, 2)`` / ``(N, 3)`` real numbers, a field of complex numbers, Python objects (never
    unpickled) or the wrong length."""
    import meshio

    from meshshard.partition.files import read_npz, read_regular

    path = Path(path)
    arrays = read_npz(read_regular(path), path)
    if "pos" not in arrays:
        raise ValueError(f"{path}: Expected a 'pos' array of point coordinates (got "
                         f"{', '.join(map(repr, arrays)) or 'no arrays'})")
    pos = arrays.pop("pos")
    if pos.ndim != 2 or pos.shape[1] not in (2, 3) or len(pos) == 0 or pos.dtype.kind not in "iuf":
        raise ValueError(f"{path}: Expected 'pos' of real numbers of shape (N, 2) or (N, 3), N >= 1 (got "
                         f"{pos.dtype} {pos.shape})")
    n = len(pos)
    for name, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise ValueError(f"{path}: Expected real numbers in field {name!r} (got {a.dtype})")
        if a.ndim == 0 or a.shape[0] != n:
            raise ValueError(f"{path}: Expected field {name!r} to have one value per point, {n} (got shape {a.shape})")
    return meshio.Mesh(pos.astype(np.float64), [], point_data=arrays)


def is_legacy_polydata(path: str | Path) -> bool:
    """Whether ``path`` is a legacy VTK file of PolyData (which meshio does not read)."""
    path = Path(path)
    if not path.is_file():  # never a FIFO or a device: read only the first bytes of a regular file
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    lines = head.split(b"\n", 4)
    return head.startswith(b"# vtk DataFile") and len(lines) > 3 and lines[3].split()[-1:] == [b"POLYDATA"]


# ---------------------------------------------------------------------------------------------
# Surfaces


def triangulate(cells: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """``cells`` with every ``polygon`` block ``(C, k)`` split into the ``k - 2`` triangles of a fan
    from each polygon's first node (a triangle block in its place); other blocks as they are."""
    out = []
    for cell_type, conn in cells:
        conn = np.asarray(conn)
        if cell_type == "polygon" and conn.ndim == 2 and conn.shape[1] >= 3:
            i = np.arange(1, conn.shape[1] - 1)
            fan = np.stack([np.broadcast_to(conn[:, :1], (len(conn), len(i))), conn[:, i], conn[:, i + 1]], axis=2)
            out.append(("triangle", fan.reshape(-1, 3)))
        else:
            out.append((str(cell_type), conn))
    return out


_SOLID = {"tetra", "hexahedron", "wedge", "pyramid", "tetra10", "hexahedron20", "hexahedron27", "wedge15",
          "pyramid13", "polyhedron"}


def surface_faces(points: np.ndarray, cells: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """The faces (triangles and quads, polygons triangulated) of a surface in 3-D; empty when the
    points are not 3-D, a cell is 3-D, or there are no faces."""
    cells = triangulate(cells)
    if np.shape(points)[1:] != (3,) or any(t in _SOLID for t, _ in cells):
        return []
    return [(t, np.asarray(c, dtype=np.int64)) for t, c in cells if t in ("triangle", "quad") and len(c)]


def surface_fields(points: np.ndarray, faces: Sequence[tuple[str, np.ndarray]]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A surface's per-point ``normal`` (unit, or zero on no face), ``area`` (each face's area
    split equally among its nodes) and area vectors (:func:`surface_area_vectors`).

    Shapes:
        points ``(N, 3)`` -> normal ``(N, 3)``, area ``(N,)``, area vectors ``(N, 3)``.
    """
    from ._surface import facet_vectors, surface_area_vectors

    points = np.asarray(points, dtype=np.float64)
    vectors = surface_area_vectors(points, faces)
    area = np.zeros(len(points))
    for _, conn in faces:
        size = np.linalg.norm(facet_vectors(points, conn, None), axis=1)
        k = conn.shape[1]
        area += np.bincount(conn.reshape(-1), weights=np.repeat(size / k, k), minlength=len(points))
    length = np.linalg.norm(vectors, axis=1, keepdims=True)
    normal = np.divide(vectors, length, out=np.zeros_like(vectors), where=length > 0)
    return normal, area, vectors


def add_surface_fields(mesh: Any, wanted: Sequence[str], path: Path) -> None:
    """Add ``normal`` and ``area`` to ``mesh.point_data`` when it is a surface (see the module
    docstring) and the file has no fields of those names. A name of ``wanted`` among them that a
    non-surface asks for is a one-line error naming the file."""
    asked = [n for n in wanted if n.split("[")[0] in SURFACE_FIELDS and n.split("[")[0] not in mesh.point_data]
    if not asked:
        return
    points = np.asarray(mesh.points, dtype=np.float64)
    faces = surface_faces(points, [(b.type, b.data) for b in mesh.cells])
    if not faces:
        kinds = ", ".join(dict.fromkeys(b.type for b in mesh.cells)) or "no cells"
        raise ValueError(f"{path}: Expected the faces of a 3-D surface (triangles, quads, polygons) for "
                         f"{', '.join(map(repr, asked))} (got {kinds} on {points.shape[1]}-D points): normal and "
                         "area come from a surface's faces")
    normal, area, _ = surface_fields(points, faces)
    mesh.point_data.setdefault("normal", normal)
    mesh.point_data.setdefault("area", area)
