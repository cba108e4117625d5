"""Point-cloud samples: what ``meshshard dataset`` does with samples that have no volume cells,
and the geometric halo radius a partition of them records.

Sources. A ``.npz`` archive holds a cloud: ``pos`` ``(N, 2)`` or ``(N, 3)`` coordinates and any
other arrays as point fields, each with one row per point, real numbers or booleans
(:func:`read_npz_cloud`; nothing is unpickled). Surfaces (``.vtp``, legacy ``.vtk`` PolyData,
``.ply``, ``.stl``) and ``.vtu`` files of vertex cells come through the mesh readers.

Surfaces. A sample whose points are 3-D and whose cells are faces (triangles, quads, polygons
split into a fan of triangles from their first node), with no 3-D cells, has two derived point
fields, available to ``--inputs`` by name unless the file has fields of those names
(:func:`add_surface_fields`): ``area``, the point's share of the faces around it (each face's
area split equally among its nodes, so the areas add up to the surface's area), and ``normal``,
the unit vector of the point's lumped area vector (:func:`meshshard.partition._surface.surface_area_vectors`:
the faces' winding sets the side), zero at a point on no face. The area vectors themselves are
stored with the mesh (``surface-area.npy``) for force integrals.

Graphs (``--graph``, :class:`GraphRule`): ``mesh`` takes the edges of the cells; ``knn:K`` joins
each point to its ``K`` nearest neighbours, then adds the reverse of every edge (symmetrised: a
point may end with more than ``K``); ``radius:R`` joins the points at most ``R`` apart. Both are
built with ``scipy.spatial.cKDTree`` over the whole sample at once. By default a sample whose cells
give edges keeps them and any other (no cells, or vertex cells only) gets ``knn:8``. A point graph
refuses duplicate points (a nearest neighbour at distance 0 is no geometry), non-finite
coordinates and a sample with fewer points than it needs (``K + 1`` for kNN, 2 for a radius).

Halo radius (``meshshard partition DATA --radius R``). A ball-query layer
(:class:`meshshard.nn.BallQueryPlan`) builds its geometric halo at run time from the model's
radius; a partition may record the radius it was made for, with each part's exact geometric halo
at that radius (:func:`geometric_halo_counts`), and :func:`check_radius` refuses a model whose
radius is larger, in one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_POINT_GRAPH", "SURFACE_FIELDS", "GraphRule", "parse_graph_rule", "read_npz_cloud",
           "is_legacy_polydata", "triangulate", "surface_faces", "surface_fields", "add_surface_fields",
           "point_graph", "sample_graph", "gives_edges", "geometric_halo_counts", "check_radius", "halo_radius_of",
           "record_halo_radius", "check_halo_radius"]

#: The derived fields of a surface, by name.
SURFACE_FIELDS = ("normal", "area")
#: The graph of a sample with no cells that give edges, unless ``--graph`` says otherwise.
DEFAULT_POINT_GRAPH = "knn:8"

_RULE = re.compile(r"^\s*(mesh|knn|radius)\s*(?::\s*(\S+)\s*)?$")


@dataclass(frozen=True)
class GraphRule:
    """How a sample's graph is made: ``rule`` ``"mesh"`` (its cells' edges), ``"knn"`` (``k``
    nearest neighbours, symmetrised) or ``"radius"`` (points at most ``radius`` apart)."""

    rule: str
    k: int | None = None
    radius: float | None = None

    def __str__(self) -> str:
        if self.rule == "knn":
            return f"knn:{self.k}"
        return f"radius:{self.radius!r}" if self.rule == "radius" else self.rule

    @property
    def min_points(self) -> int:
        """The fewest points a sample needs for this graph."""
        return {"mesh": 1, "knn": (self.k or 0) + 1, "radius": 2}[self.rule]

    def to_dict(self) -> dict[str, Any]:
        """The record ``dataset.json`` keeps of a mesh's point graph."""
        if self.rule == "knn":
            return {"rule": "knn", "k": self.k, "symmetric": True}
        return {"rule": self.rule, "radius": self.radius} if self.rule == "radius" else {"rule": "mesh"}


def parse_graph_rule(text: str) -> GraphRule:
    """``"mesh"``, ``"knn:8"`` or ``"radius:0.05"`` as a :class:`GraphRule` (one-line error)."""
    match = _RULE.match(str(text))
    bad = f"Expected --graph mesh, knn:K (K >= 1) or radius:R (R > 0) (got {text!r})"
    if not match:
        raise ValueError(bad)
    rule, value = match.group(1), match.group(2)
    if rule == "mesh":
        if value is not None:
            raise ValueError(bad)
        return GraphRule("mesh")
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        raise ValueError(bad) from None
    if rule == "knn":
        if not (number >= 1 and number == int(number)) or number > 1000:
            raise ValueError(bad)
        return GraphRule("knn", k=int(number))
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(bad)
    return GraphRule("radius", radius=number)


# ---------------------------------------------------------------------------------------------
# Reading


def read_npz_cloud(path: str | Path) -> Any:
    """A ``.npz`` point cloud as a ``meshio.Mesh`` without cells: ``pos`` as its points, every
    other array as a point field. One-line errors naming the file: no ``pos``, a ``pos`` not
    ``(N, 2)`` / ``(N, 3)`` real numbers, a field of complex numbers, Python objects (never
    unpickled) or the wrong length."""
    import meshio

    from ._safe_io import read_npz, read_regular

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
    from ._surface import _facet_vectors, surface_area_vectors

    points = np.asarray(points, dtype=np.float64)
    vectors = surface_area_vectors(points, faces)
    area = np.zeros(len(points))
    for _, conn in faces:
        size = np.linalg.norm(_facet_vectors(points, conn, None), axis=1)
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


# ---------------------------------------------------------------------------------------------
# Graphs


def gives_edges(cells: Sequence[tuple[str, np.ndarray]]) -> bool:
    """Whether some cell joins two nodes (anything but vertex cells)."""
    return any(t != "vertex" and np.shape(c)[0] and np.shape(c)[1] > 1 for t, c in cells)


def _check_cloud(pos: np.ndarray, rule: GraphRule, path: object) -> None:
    """NaN or inf coordinates, too few points for ``rule``, duplicate points: one line naming ``path``."""
    bad = ~np.isfinite(pos).all(axis=1)
    if bad.any():
        raise ValueError(f"{path}: Expected finite coordinates (got NaN or inf at point {int(np.flatnonzero(bad)[0])}, "
                         f"{int(bad.sum()):,} in all)")
    if len(pos) < rule.min_points:
        raise ValueError(f"{path}: Expected at least {rule.min_points} points for --graph {rule} (got {len(pos)})")
    order = np.lexsort((pos + 0.0).T[::-1])
    same = (np.diff(pos[order], axis=0) == 0).all(axis=1)
    if same.any():
        at = int(np.flatnonzero(same)[0])
        a, b = sorted((int(order[at]), int(order[at + 1])))
        raise ValueError(f"{path}: Expected distinct points for --graph {rule} (got points {a} and {b} at the same "
                         f"coordinates, {int(same.sum()):,} duplicates in all); merge or drop them first")


def point_graph(pos: np.ndarray, rule: GraphRule, path: object = "points") -> np.ndarray:
    """The edges of ``rule`` (``knn`` or ``radius``) on ``pos``, both directions of each,
    ``(2, E)`` int64 in the order of :meth:`Graph.edge_index` (by target, then source)."""
    from ._graph import knn_graph, radius_graph

    pos = np.asarray(pos, dtype=np.float64)
    if rule.rule not in ("knn", "radius"):
        raise ValueError(f"Expected a point graph rule, knn or radius (got {rule})")
    _check_cloud(pos, rule, path)
    graph = knn_graph(pos, int(rule.k or 0)) if rule.rule == "knn" else radius_graph(pos, float(rule.radius or 0))
    return graph.edge_index()


# ---------------------------------------------------------------------------------------------
# Partitions: the geometric halo radius


def geometric_halo_counts(points: np.ndarray, parts: np.ndarray, num_parts: int, radius: float) -> list[int]:
    """For each part, how many points of other parts lie within ``radius`` of one of its own
    points (the halo a ball query of that radius needs, exactly): one k-d tree per part.

    Shapes:
        points ``(N, D)``, parts ``(N,)`` -> ``num_parts`` counts.
    """
    from scipy.spatial import cKDTree

    points = np.asarray(points, dtype=np.float64)
    parts = np.asarray(parts, dtype=np.int64)
    counts = []
    for r in range(num_parts):  # parts, not points
        own = parts == r
        if not own.any() or own.all():
            counts.append(0)
            continue
        dist, _ = cKDTree(points[own]).query(points[~own], k=1, distance_upper_bound=radius * (1 + 1e-12))
        counts.append(int(np.count_nonzero(dist <= radius)))
    return counts


def halo_radius_of(parts_meta: Mapping[str, Any]) -> float | None:
    """The halo radius a partition (``partition.json``) or a dataset's partitions
    (``partitions.json``, or :func:`read_partitions_metadata`'s dict) records, or None."""
    value = parts_meta.get("halo_radius")
    if isinstance(value, Mapping):
        value = value.get("radius")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"Expected the recorded 'halo_radius' to be a positive number (got {value!r})")
    return float(value)


def check_radius(parts_meta: Mapping[str, Any], model_radius: float) -> None:
    """Raise a one-line ``ValueError`` when the model's ball radius is larger than the halo
    radius the partition was made for (``meshshard partition DATA --radius R``); a partition that
    records none is accepted (the halo is then built at run time for any radius)."""
    try:
        r = float(model_radius)
    except (TypeError, ValueError):
        raise ValueError(f"Expected the model's radius to be a number (got {model_radius!r})") from None
    if not (r > 0 and math.isfinite(r)):
        raise ValueError(f"Expected the model's radius to be positive and finite (got {model_radius!r})")
    recorded = halo_radius_of(parts_meta)
    if recorded is not None and r > recorded:
        raise ValueError(f"Expected a model radius of at most {recorded:g}, the halo radius the partition was made "
                         f"for (got {r:g}); partition again with meshshard partition DATA --radius {r:g}")


def sample_graph(pos: np.ndarray, cells: Sequence[tuple[str, np.ndarray]], rule: GraphRule | None,
                 path: object) -> tuple[np.ndarray | None, dict[str, Any] | None]:
    """A sample's point graph and its record, or ``(None, None)`` where its cells' edges serve:
    ``rule`` None keeps the edges of cells that give some and builds ``knn:8`` otherwise;
    ``mesh`` requires such cells; ``knn`` / ``radius`` build it for every sample."""
    if rule is None:
        if gives_edges(cells):
            return None, None
        rule = parse_graph_rule(DEFAULT_POINT_GRAPH)
    if rule.rule == "mesh":
        if not gives_edges(cells):
            kinds = ", ".join(dict.fromkeys(t for t, _ in cells)) or "no cells"
            raise ValueError(f"{path}: Expected cells that join points for --graph mesh (got {kinds}); "
                             f"use --graph knn:K or radius:R for a point cloud")
        return None, None
    return point_graph(pos, rule, path), rule.to_dict()


def record_halo_radius(folder: Path, points: np.ndarray, parts: np.ndarray, radius: float) -> None:
    """Add ``"halo_radius": radius`` and ``"radius_ghosts"`` (each part's
    :func:`geometric_halo_counts`) to the partition in ``folder`` (its metadata checksum renewed)."""
    from ._format import METADATA_FILE, dump_metadata, read_metadata
    from ._json_io import write_text_file

    meta = read_metadata(folder)
    meta["halo_radius"] = float(radius)
    meta["radius_ghosts"] = geometric_halo_counts(points, parts, int(meta["num_parts"]), float(radius))
    write_text_file(Path(folder) / METADATA_FILE, dump_metadata(meta))


def check_halo_radius(radius: Any) -> float | None:
    """``--radius`` of ``meshshard partition DATA``: None, or a positive finite number."""
    if radius is None:
        return None
    try:
        r = float(radius)
    except (TypeError, ValueError):
        r = math.nan
    if not (r > 0 and math.isfinite(r)):
        raise ValueError(f"Expected --radius to be a positive number (got {radius!r})")
    return r
