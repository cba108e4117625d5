"""Maps between the meshes of a family of 2-D bodies along their walls (``--map-along PATCHES``).

A field is carried from one case's mesh onto another's by interpolation at each target node's
position (:mod:`meshshard.data._mapping`). Where the bodies differ, a node near one wall lands at
another distance from the other wall, or inside the other body: the boundary layer, and the
pressure peak where the wall curves most, arrive in the wrong place. Along the wall the map is
better made body to body: each target node is moved by how the source's wall differs from its own
there, and the source field is read at the moved point.

- The wall (the named boundary patches) is one closed curve in 2-D: the mesh's boundary edges
  whose two nodes are on it, in order, counter-clockwise.
- Two landmarks on it correspond from shape to shape: the wall node of the greatest first
  coordinate (for a body in a stream along x, its downstream end: an aerofoil's trailing edge),
  and the wall node farthest from that one (its leading edge). The bodies of one sweep share the
  frame, so the landmarks are the same points of each (a symmetric body needs no tie broken). A
  wall node's position along the wall is its arc length from the first landmark, normalised to
  0..0.5 up to the second and 0.5..1 back (so each side maps onto the same side).
- A target node's nearest wall node sits at position ``s`` of the target's wall; it is moved by
  the offset from there to position ``s`` of the source's wall, times ``exp(-(d / L)**2)``, ``d`` its
  distance to that wall node and ``L`` half the distance between the landmarks. At the wall the
  node moves onto the source's wall; a chord away, hardly at all.

- ``peak=FIELD`` (``--map-along body,peak=p``): the place along each source case's wall where
  FIELD is greatest (:func:`peak_position`) is a third landmark. The target case's place is the
  same weighted sum of its sources' places as its prior is of their fields
  (:func:`landmark_position`), and the target's positions are stretched linearly onto the
  source's, from the first landmark to the peak and from the peak back to it, before the offset
  above is taken: a blend of cases whose peaks (a stagnation point) sit at different places keeps
  the peak's height instead of averaging humps at several places.

Exact where it must be: two meshes with the same wall nodes map as by position (the offsets are
zero), and the wall of one maps onto the wall of the other. On the shape sweep
(``examples/shape_sweep``), the nearest solved shape mapped so onto each held-out shape's mesh is
3.7x nearer the truth for U near the body than mapped by position alone (7.1% against 26.2%), and
1.15x for p (13.7% against 15.7%); docs/datasets.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Outline", "outline", "outline_of_folder", "along_walls", "parse_walls", "parse_map_along",
           "parse_along_peak", "peak_column", "peak_position", "landmark_position", "along_columns", "SplitMap"]


@dataclass(frozen=True)
class Outline:
    """A closed 2-D wall in order: its nodes' ``points`` ``(n, 2)`` counter-clockwise from the first
    landmark, their positions ``s`` ``(n,)`` in ``[0, 1)`` along it, and the length ``scale`` (half
    the distance between the landmarks) over which a map along it fades."""

    points: np.ndarray
    s: np.ndarray
    scale: float
    axes: tuple[int, int] = (0, 1)  # the mesh's coordinates the wall lies in (a flat mesh's 3rd is constant)
    nodes: np.ndarray | None = None  # the mesh's node ids of ``points``, in the same order

    def at(self, s: np.ndarray) -> np.ndarray:
        """The points at positions ``s`` along the wall ``(m, 2)``, linear between its nodes."""
        grid = np.r_[self.s, 1.0]
        closed = np.r_[self.points, self.points[:1]]
        return np.stack([np.interp(s, grid, closed[:, 0]), np.interp(s, grid, closed[:, 1])], axis=1)


def parse_walls(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"body"`` or ``"upper,lower"`` (``--map-along``) as patch names, each once; () for none."""
    from ._surface import patch_names

    return patch_names(text, "--map-along") if text else ()


def _split_peak(text: str) -> tuple[str, str | None]:
    """``--map-along``'s text without its ``peak=FIELD`` item, and FIELD (None without one)."""
    items = [item.strip() for item in str(text).split(",")]
    peaks = [item for item in items if item.startswith("peak=")]
    if len(peaks) > 1 or (peaks and not peaks[0][len("peak="):].strip()):
        raise ValueError(f"Expected --map-along's peak=FIELD once, naming one target field (got {text!r})")
    rest = ",".join(item for item in items if not item.startswith("peak="))
    return rest, (peaks[0][len("peak="):].strip() if peaks else None)


def parse_map_along(text: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--map-along PATCHES[:FIELDS][,peak=FIELD]`` (``"body"``, ``"body:U"``, ``"body,peak=p"``):
    the wall's boundary names and the target fields mapped along it (() for every field); the
    ``peak=`` item is :func:`parse_along_peak`'s."""
    if not text:
        return (), ()
    rest, _ = _split_peak(str(text))
    walls, _, fields = rest.partition(":")
    names = parse_walls(walls)
    if not names:
        raise ValueError(f"Expected --map-along as PATCHES[:FIELDS][,peak=FIELD] (got {text!r})")
    chosen = tuple(dict.fromkeys(f.strip() for f in fields.split(","))) if fields else ()
    if fields and not all(chosen):
        raise ValueError(f"Expected --map-along's fields as comma-separated target names (got {text!r})")
    return names, chosen


def parse_along_peak(text: str | None) -> str | None:
    """The FIELD of ``--map-along ...,peak=FIELD``: the target whose greatest value on the wall is a
    third landmark (the module docstring); None without one."""
    return _split_peak(str(text))[1] if text else None


def peak_column(fields: Sequence[Mapping[str, Any]], name: str | None) -> int | None:
    """The channel of the one-component target field ``name`` (``peak=FIELD``) among ``fields``;
    None for no name, a one-line ``ValueError`` for a name that is no such field."""
    if name is None:
        return None
    column = 0
    for f in fields:
        if str(f["name"]) == name:
            if int(f["components"]) != 1:
                raise ValueError(f"Expected --map-along's peak=FIELD to name a field of one component, whose "
                                 f"greatest value on the wall is a point (got {name}, of {f['components']})")
            return column
        column += int(f["components"])
    raise ValueError(f"Expected --map-along's peak=FIELD among the targets "
                     f"{', '.join(str(f['name']) for f in fields)} (got {name})")


def along_columns(fields: Sequence[Mapping[str, Any]], chosen: Sequence[str]) -> np.ndarray | None:
    """``(F,)`` bool over the channels of the target ``fields``: those of the ``chosen`` fields (None:
    every channel); a one-line ``ValueError`` for a name that is no target field."""
    if not chosen:
        return None
    names = [str(f["name"]) for f in fields]
    unknown = [c for c in chosen if c not in names]
    if unknown:
        raise ValueError(f"Expected --map-along's fields among the targets {', '.join(names)} "
                         f"(got {', '.join(unknown)})")
    return np.array([str(f["name"]) in chosen for f in fields for _ in range(int(f["components"]))], dtype=bool)


class SplitMap:
    """Some channels mapped along the walls, the others by position: ``apply`` as a ``NodeMap``'s."""

    def __init__(self, position: Any, along: Any, columns: np.ndarray) -> None:
        self.position, self.along, self.columns = position, along, columns

    def apply(self, values: np.ndarray) -> np.ndarray:
        out = np.array(self.position.apply(values), dtype=np.float64)
        out[:, self.columns] = self.along.apply(np.asarray(values)[:, self.columns])
        return out


_FACES = {"triangle": 3, "quad": 4}


def outline(points: np.ndarray, cells: Mapping[str, np.ndarray], wall: np.ndarray, where: str) -> Outline:
    """The :class:`Outline` of the wall nodes ``wall`` of a 2-D mesh (``points`` ``(N, 2)``, its
    ``cells`` by type); a one-line ``ValueError`` naming ``where`` unless they make one closed curve."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components, depth_first_order

    pts = np.asarray(points, dtype=np.float64)
    axes = tuple(k for k in range(pts.shape[1]) if np.ptp(pts[:, k]) > 0) if pts.ndim == 2 and len(pts) else ()
    if len(axes) != 2:
        raise ValueError(f"{where}: Expected a 2-D mesh for --map-along (got points spanning {len(axes)} "
                         "dimensions; a wall in 3-D is a surface, which has no order along it)")
    pts = pts[:, list(axes)]
    wall = np.unique(np.asarray(wall, dtype=np.int64))
    edges = [np.stack([c[:, k], c[:, (k + 1) % n]], axis=1)
             for kind, n in _FACES.items() if kind in cells for c in [np.asarray(cells[kind], np.int64)]
             for k in range(n)]
    if not edges or len(wall) < 3:
        raise ValueError(f"{where}: Expected triangles or quads and a wall of at least 3 nodes for --map-along "
                         f"(got {', '.join(cells) or 'no cells'} and {len(wall)} wall nodes)")
    pairs = np.sort(np.concatenate(edges), axis=1)
    on = np.zeros(len(pts), dtype=bool)
    on[wall] = True
    pairs = pairs[on[pairs].all(axis=1)]
    pairs, count = np.unique(pairs, axis=0, return_counts=True)
    pairs = pairs[count == 1]  # the mesh's boundary edges along the wall (an edge inside is in two cells)
    local = np.searchsorted(wall, pairs)
    n = len(wall)
    graph = coo_matrix((np.ones(len(local)), (local[:, 0], local[:, 1])), shape=(n, n)).tocsr()
    graph = graph + graph.T
    degree = np.asarray((graph > 0).sum(axis=1)).ravel()
    parts = connected_components(graph, directed=False)[0]
    if parts != 1 or (degree != 2).any():
        raise ValueError(f"{where}: Expected the --map-along wall to be one closed curve (got {parts} piece(s); "
                         f"{int((degree != 2).sum())} of its {n} nodes on other than two of its edges)")
    wp = pts[wall]
    first = int(np.argmax(wp[:, 0]))  # the downstream end, for a body in a stream along the first axis
    order = depth_first_order(graph, first, directed=False, return_predecessors=False)
    ring = wp[order]
    signed = np.sum(ring[:, 0] * np.roll(ring[:, 1], -1) - np.roll(ring[:, 0], -1) * ring[:, 1])
    ids = wall[order]
    if signed < 0:  # counter-clockwise, from the first landmark
        ring, ids = np.concatenate([ring[:1], ring[1:][::-1]]), np.concatenate([ids[:1], ids[1:][::-1]])
    step = np.linalg.norm(np.diff(np.concatenate([ring, ring[:1]]), axis=0), axis=1)
    arc = np.concatenate([[0.0], np.cumsum(step)[:-1]])
    second = int(np.argmax(np.linalg.norm(ring - ring[0], axis=1)))
    half = np.arange(n) <= second
    s = np.where(half, 0.5 * arc / arc[second], 0.5 + 0.5 * (arc - arc[second]) / (step.sum() - arc[second]))
    return Outline(ring, s, 0.5 * float(np.linalg.norm(ring[second] - ring[0])), (int(axes[0]), int(axes[1])), ids)


def outline_of_folder(folder: Path, entry: Mapping[str, Any], walls: Sequence[str]) -> Outline:
    """The :class:`Outline` of the named boundaries ``walls`` of the mesh stored in ``folder`` (a
    dataset's ``meshes/NNNNN``, described by its ``dataset.json`` ``entry``)."""
    names = [str(b["name"]) for b in entry.get("boundaries", [])]
    missing = [w for w in walls if w not in names]
    if missing:
        raise ValueError(f"{folder}: Expected the --map-along boundaries among the mesh's "
                         f"{', '.join(names) or '(none)'} (got {', '.join(missing)})")
    wall = np.concatenate([np.load(folder / f"boundary-{names.index(w):03d}.npy", allow_pickle=False) for w in walls])
    cells = {kind: np.load(folder / f"cells-{kind}.npy", allow_pickle=False) for kind in entry.get("cells", {})
             if kind in _FACES}
    return outline(np.load(folder / "points.npy", allow_pickle=False), cells, wall, str(folder))


# a landmark's position is kept this far inside (0, 1), where the first landmark sits at both ends
_MARGIN = 1e-3


def peak_position(wall: Outline, values: np.ndarray) -> float:
    """The position along ``wall`` of the greatest of ``values`` (a field over the mesh's nodes,
    ``(N,)``): its wall node's, moved to the top of the parabola through it and its two neighbours
    (so that a peak between two nodes is placed between them), within ``(0, 1)``."""
    if wall.nodes is None:
        raise ValueError("Expected an outline with its mesh node ids (meshshard.data.outline) for peak=FIELD")
    v = np.asarray(values, dtype=np.float64)[wall.nodes]
    n = len(v)
    j = int(np.argmax(v))
    left, right = (j - 1) % n, (j + 1) % n
    s = float(wall.s[j])
    curve = v[left] - 2.0 * v[j] + v[right]
    if 0 < j < n - 1 and curve < 0:
        shift = 0.5 * (v[left] - v[right]) / curve  # in (-0.5, 0.5) steps: v[j] is the greatest of the three
        s += shift * float((wall.s[right] - s) if shift > 0 else (s - wall.s[left]))
    return float(np.clip(s, _MARGIN, 1.0 - _MARGIN))


def landmark_position(positions: Sequence[float], weights: Sequence[float]) -> float:
    """A target case's peak position: its sources' ``positions``, weighted as its prior weighs them
    (weights summing to 1; an extrapolation's may leave the wall's range, and is kept inside)."""
    return float(np.clip(np.dot(np.asarray(weights, np.float64), np.asarray(positions, np.float64)),
                         _MARGIN, 1.0 - _MARGIN))


def _warp(s: np.ndarray, target: float, source: float) -> np.ndarray:
    """Positions along the target's wall to the source's: linear from the first landmark (0) to the
    peak (``target`` to ``source``) and from the peak back to the first landmark (1)."""
    return np.where(s <= target, s * (source / target), source + (s - target) * ((1.0 - source) / (1.0 - target)))


def along_walls(points: np.ndarray, target: Outline, source: Outline,
                landmark: tuple[float, float] | None = None) -> np.ndarray:
    """``points`` ``(N, D)`` of the target mesh (``D`` 2, or 3 for a flat mesh), each moved toward
    where it is relative to the source's wall (see the module docstring): where to read the
    source's fields for it. ``landmark``: the positions of the peak on the target's wall and on the
    source's (``peak=FIELD``), which then correspond too."""
    from scipy.spatial import cKDTree

    pts = np.array(points, dtype=np.float64)
    plane = pts[:, list(target.axes)]
    distance, nearest = cKDTree(target.points).query(plane)
    s = target.s[nearest] if landmark is None else _warp(target.s[nearest], *landmark)
    offset = source.at(s) - target.points[nearest]
    pts[:, list(target.axes)] = plane + offset * np.exp(-(distance / target.scale) ** 2)[:, None]
    return pts
