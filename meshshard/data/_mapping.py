"""Mapping a node field of one mesh onto the nodes of another (``meshshard baseline``'s training
cases on a sample's own mesh).

:func:`node_map` builds, once per pair of meshes, a :class:`NodeMap`: for every target node the
source nodes it takes its value from and their weights, so that mapping any field is one gather
and one weighted sum (:meth:`NodeMap.apply`), never a loop over nodes:

- **identical meshes** (the same points, in the same order): the identity;
- **inside the source's convex hull**: piecewise-linear interpolation, the barycentric weights of
  the target node in the simplex of the Delaunay triangulation of the source's points that holds
  it (``scipy.spatial.Delaunay``; the same as ``scipy.interpolate.LinearNDInterpolator``): a field
  linear in the coordinates maps exactly, and a smooth field converges at second order as the
  source mesh is refined. The triangulation is of the source's points, not of its cells: across a
  hole of the source (a body) it interpolates between the nodes around it;
- **outside the hull**: the value of the nearest source node;
- in 1-D: linear between the two neighbouring source nodes, the nearest end outside;
- **point clouds and surfaces** (``cloud=True``: points on a surface in 3-D, where a volume
  triangulation does not apply): inverse-distance weights of the 3 nearest source points (a
  target point on a source point takes its value alone).

A coordinate that is the same constant in both meshes (a 2-D mesh written with z = 0) is left
out before triangulating.

Cost. Most of a map's cost is its source: the triangulation, and the point-location structure
scipy builds at its first query (together about 55 ms for 4,700 points in 2-D; locating another
mesh's 4,900 nodes in it afterwards takes 1-3 ms). A sweep maps N training meshes onto each of M
meshes: with a :class:`SourceCache` given (``node_map(..., cache=, key=)``), each source is
triangulated once, not M times. :class:`MapsOnto` holds the maps onto one target mesh at a time
with such a cache (``meshshard baseline`` and the priors of ``meshshard dataset --mean-field`` on
many meshes): N maps held, not N x M.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MapsOnto", "NodeMap", "SourceCache", "node_map"]

#: Source points an unstructured cloud's value is taken from (inverse-distance weighted).
CLOUD_NEIGHBOURS = 3


@dataclass(frozen=True, eq=False)
class NodeMap:
    """Target node ``i`` takes ``sum_j weights[i, j] * values[index[i, j]]``.

    Shapes:
        index, weights: ``(N_target, k)``; ``outside``: ``(N_target,)`` bool, the target nodes
        given their nearest source node's value (outside the source's hull).
    """

    index: np.ndarray
    weights: np.ndarray
    outside: np.ndarray
    num_source: int

    def apply(self, values: np.ndarray) -> np.ndarray:
        """``values`` ``(N_source, F)`` (or ``(N_source,)``) on the target nodes, float64."""
        v = np.asarray(values, dtype=np.float64)
        if v.shape[0] != self.num_source:
            raise ValueError(f"Expected values with {self.num_source} rows, one per source node (got {v.shape[0]})")
        flat = v.reshape(len(v), -1)
        out = np.einsum("nk,nkf->nf", self.weights, flat[self.index])
        return out.reshape((len(self.index),) + v.shape[1:])


class SourceCache:
    """The source side of maps (a mesh's Delaunay triangulation, warmed for point location, and its
    k-d tree), kept for more maps from the same source onto other meshes; the least recently used
    go first beyond ``max_bytes`` (an estimate of their arrays), and one larger than that alone is
    not kept (a large 3-D mesh's triangulation is let go after its map, as without a cache).
    ``built`` counts what was built."""

    def __init__(self, max_bytes: int = 512 * 2**20) -> None:
        self.max_bytes = int(max_bytes)
        self.built = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: Hashable, build: Callable[[], tuple[Any, int]]) -> Any:
        """The object kept under ``key``, or ``build()``'s ``(object, bytes)``, kept."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key][0]
        item, size = build()
        self.built += 1
        if size > self.max_bytes:
            return item
        while self._items and self._bytes + size > self.max_bytes:
            _, (_, freed) = self._items.popitem(last=False)
            self._bytes -= freed
        self._items[key] = (item, size)
        self._bytes += size
        return item


def _kept(cache: SourceCache | None, key: Hashable | None, what: tuple[Any, ...],
          build: Callable[[], tuple[Any, int]]) -> Any:
    return build()[0] if cache is None or key is None else cache.get((key, *what), build)


def _tree(src: np.ndarray, cache: SourceCache | None, key: Hashable | None, axes: tuple[int, ...]) -> Any:
    from scipy.spatial import cKDTree

    return _kept(cache, key, ("tree", axes), lambda: (cKDTree(src), 3 * src.nbytes))


def _identity(n: int) -> NodeMap:
    return NodeMap(np.arange(n, dtype=np.int64)[:, None], np.ones((n, 1)), np.zeros(n, bool), n)


def _shared_axes(src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """The coordinates that are not one constant shared by both meshes."""
    both = np.concatenate([src, tgt])
    low, high = both.min(0), both.max(0)
    size = float(np.abs(both).max()) if both.size else 0.0
    return np.flatnonzero(high - low > 1e-12 * max(size, 1e-300))


def _one_dimensional(src: np.ndarray, tgt: np.ndarray) -> NodeMap:
    order = np.argsort(src, kind="stable")
    xs = src[order]
    right = np.clip(np.searchsorted(xs, tgt, side="right"), 1, max(len(xs) - 1, 1))
    left = right - 1
    if len(xs) == 1:
        return NodeMap(np.zeros((len(tgt), 1), np.int64), np.ones((len(tgt), 1)), tgt != xs[0], 1)
    span = xs[right] - xs[left]
    t = np.clip(np.divide(tgt - xs[left], span, out=np.zeros(len(tgt)), where=span > 0), 0.0, 1.0)
    outside = (tgt < xs[0]) | (tgt > xs[-1])
    return NodeMap(np.stack([order[left], order[right]], 1), np.stack([1 - t, t], 1), outside, len(src))


def _cloud(src: np.ndarray, tgt: np.ndarray, tree: Any) -> NodeMap:
    k = min(CLOUD_NEIGHBOURS, len(src))
    dist, index = tree.query(tgt, k=k)
    dist, index = dist.reshape(len(tgt), k), index.reshape(len(tgt), k)
    on_point = dist[:, 0] == 0.0
    w = 1.0 / np.where(on_point[:, None], 1.0, dist)
    w[on_point] = 0.0
    w[on_point, 0] = 1.0
    return NodeMap(index.astype(np.int64), w / w.sum(1, keepdims=True), np.zeros(len(tgt), bool), len(src))


def node_map(source: np.ndarray, target: np.ndarray, *, cloud: bool = False, where: str = "source mesh",
             cache: SourceCache | None = None, key: Hashable | None = None) -> NodeMap:
    """The map of a node field from the points ``source`` ``(N_s, D)`` onto ``target`` ``(N_t, D)``
    (see the module docstring); ``cloud``: points on a surface (inverse-distance weights). A
    one-line ``ValueError`` naming ``where`` for points of different dimensions, or a source whose
    points span no simplex (all on a line in 2-D).

    ``cache`` with ``key`` (what names these source points, as a mesh's checksum does): the
    source's triangulation or k-d tree is taken from ``cache``, or built and kept there; the map
    is the same."""
    src = np.asarray(source, dtype=np.float64)
    tgt = np.asarray(target, dtype=np.float64)
    if src.ndim != 2 or tgt.ndim != 2 or src.shape[1] != tgt.shape[1] or not len(src):
        raise ValueError(f"{where}: Expected points of the same dimension as the target's (got {src.shape} and "
                         f"{tgt.shape})")
    if src.shape == tgt.shape and np.array_equal(src, tgt):
        return _identity(len(src))
    if cloud:
        return _cloud(src, tgt, _tree(src, cache, key, ()))
    axes = _shared_axes(src, tgt)
    src, tgt = src[:, axes], tgt[:, axes]
    if len(axes) == 0:
        return NodeMap(np.zeros((len(tgt), 1), np.int64), np.ones((len(tgt), 1)), np.zeros(len(tgt), bool), len(src))
    if len(axes) == 1:
        return _one_dimensional(src[:, 0], tgt[:, 0])
    shared = tuple(int(a) for a in axes)
    tri = _kept(cache, key, ("delaunay", shared), lambda: _triangulation(src, where))
    d = len(axes)
    simplex = tri.find_simplex(tgt)
    inside = simplex >= 0
    index = np.zeros((len(tgt), d + 1), dtype=np.int64)
    weights = np.zeros((len(tgt), d + 1))
    s = simplex[inside]
    transform = tri.transform[s]
    bary = np.einsum("nij,nj->ni", transform[:, :d], tgt[inside] - transform[:, d])
    weights[inside] = np.concatenate([bary, 1.0 - bary.sum(1, keepdims=True)], axis=1)
    index[inside] = tri.simplices[s]
    if (~inside).any():
        _, near = _tree(src, cache, key, shared).query(tgt[~inside])
        index[~inside, 0] = near
        weights[~inside, 0] = 1.0
    return NodeMap(index, weights, ~inside, len(src))


def _triangulation(src: np.ndarray, where: str) -> tuple[Any, int]:
    """The Delaunay triangulation of ``src``, warmed for point location (its first query builds the
    simplices' barycentric transforms), and an estimate of its bytes; a one-line refusal for
    degenerate points."""
    from scipy.spatial import Delaunay, QhullError

    try:
        tri = Delaunay(src)
    except QhullError:
        raise ValueError(f"{where}: Expected points that span a {src.shape[1]}-D region to interpolate in (its "
                         f"{len(src)} points are degenerate: on a line or a plane)") from None
    size = sum(a.nbytes for a in (tri.points, tri.simplices, tri.neighbors, tri.equations, tri.transform))
    return tri, int(size)


class MapsOnto:
    """The maps from source meshes onto one target mesh at a time: those onto the last target are
    kept (its samples come together), each source is triangulated once (:class:`SourceCache`), and
    a source whose checksum is the target's is the identity (None)."""

    def __init__(self, walls: Sequence[str] = (), columns: np.ndarray | None = None,
                 peak: int | None = None) -> None:
        self.sources = SourceCache()
        self.target: Hashable = None
        self.maps: dict[Hashable, Any] = {}
        self.walls = tuple(walls)  # --map-along: maps along these walls (meshshard.data._morph)
        self.columns = columns  # the channels mapped along them (None: every one; the others by position)
        self.outlines: dict[str, Any] = {}  # by mesh checksum: a wall outline is small
        self.peak = peak  # --map-along ...,peak=FIELD: FIELD's channel, whose peak on the wall is a landmark
        self.peaks: dict[Hashable, float] = {}  # by case: where its peak is along its wall

    def outline(self, entry: Mapping[str, Any], folder: Path | None) -> Any:
        """The wall outline of the mesh of dataset entry ``entry`` in ``folder`` (read once per mesh)."""
        from ._morph import outline_of_folder

        key = str(entry["sha256"])
        if key not in self.outlines:
            if folder is None:
                raise ValueError("Expected the mesh folders of a map along walls (--map-along)")
            self.outlines[key] = outline_of_folder(Path(folder), entry, self.walls)
        return self.outlines[key]

    def peak_of(self, case: Hashable, entry: Mapping[str, Any], folder: Path | None,
                values: Callable[[], np.ndarray]) -> float:
        """Where the ``peak`` channel of a source case (named by ``case``, on the mesh of dataset
        entry ``entry`` in ``folder``; ``values()`` its targets ``(N, F)``) is greatest along its wall."""
        if case not in self.peaks:
            from ._morph import peak_position

            self.peaks[case] = peak_position(self.outline(entry, folder), np.asarray(values())[:, self.peak])
        return self.peaks[case]

    def landmarks(self, cases: Sequence[tuple[Hashable, Mapping[str, Any], Path | None, Callable[[], np.ndarray]]],
                  weights: Sequence[float]) -> list[tuple[float, float]]:
        """``get``'s ``landmark`` for each of the weighted source ``cases`` of one target case (each as
        ``peak_of`` takes it): the target's peak place, the same weighted sum of the sources' places
        (:func:`meshshard.data._morph.landmark_position`), beside each source's own."""
        from ._morph import landmark_position

        peaks = [self.peak_of(*case) for case in cases]
        here = landmark_position(peaks, weights)
        return [(here, peak) for peak in peaks]

    def get(self, source: Hashable, source_entry: Mapping[str, Any], source_points: Callable[[], np.ndarray],
            target: Hashable, target_entry: Mapping[str, Any], target_points: Callable[[], np.ndarray],
            where: str, source_folder: Path | None = None, target_folder: Path | None = None,
            landmark: tuple[float, float] | None = None) -> NodeMap | None:
        """The map of mesh ``source`` onto mesh ``target`` (each named by a key, with its dataset
        entry, ``sha256`` and the kind, and its points, read only when a map is built); with
        ``walls``, along them (each mesh's wall read from its folder: :mod:`meshshard.data._morph`),
        and with ``landmark`` (the peak's position on the target's wall and on the source's), the
        peaks made to correspond. A mesh maps onto itself as the identity, landmark or not."""
        if target != self.target:
            self.target, self.maps = target, {}  # another target mesh: the last one's maps let go
        key = source if landmark is None else (source, landmark)
        if key not in self.maps:
            from ._clouds import is_point_cloud

            same = str(source_entry["sha256"]) == str(target_entry["sha256"])
            if same:
                self.maps[key] = None
                return None
            points = target_points()
            cloud, sha, src = is_point_cloud(dict(target_entry)), str(source_entry["sha256"]), source_points()
            if not self.walls:
                self.maps[key] = node_map(src, points, cloud=cloud, where=where, cache=self.sources, key=sha)
                return self.maps[key]
            from ._morph import SplitMap, along_walls

            moved = along_walls(points, self.outline(target_entry, target_folder),
                                self.outline(source_entry, source_folder), landmark)
            along = node_map(src, moved, cloud=cloud, where=where, cache=self.sources, key=sha)
            self.maps[key] = along if self.columns is None else SplitMap(
                node_map(src, points, cloud=cloud, where=where, cache=self.sources, key=sha), along, self.columns)
        return self.maps[key]
