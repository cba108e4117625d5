"""Point clouds in the partition layer: how a sample with no volume cells gets its graph, and the
geometric halo radius a partition of them records. (Reading clouds and a surface's derived
fields is the dataset layer's: :mod:`meshshard.data._clouds`.)

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

__all__ = ["DEFAULT_POINT_GRAPH", "GraphRule", "parse_graph_rule", "point_graph", "sample_graph", "gives_edges",
           "geometric_halo_counts", "check_radius", "halo_radius_of", "record_halo_radius", "check_halo_radius"]

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
