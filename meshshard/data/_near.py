"""Which nodes lie within a distance of named boundaries: the region of ``predict --near`` (where
the errors are reported) and of ``train --loss-weight NAME:DISTANCE=W`` (where the loss weighs more).

A node is *near* when its distance to the nearest node of the named boundaries (a
``scipy.spatial.cKDTree`` of their points) is at most ``distance``, in the mesh's units; the
boundary's own nodes are at distance 0. ``surface`` names every point of a surface sample.

Only the nodes asked for are read (a rank's own): the boundaries' points are small and read whole,
so the answer for a node is the same on any number of ranks and costs no communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._dataset import SURFACE

__all__ = ["boundary_points", "nodes_near"]


def boundary_points(data: Any, mesh: int, names: Sequence[str]) -> np.ndarray:
    """The points of the named boundaries of mesh ``mesh``, float64 (every point for ``surface``
    on a surface sample)."""
    points = data.mesh_points(mesh)
    stored = [str(b["name"]) for b in data.meta["meshes"][mesh].get("boundaries", [])]
    if any(n == SURFACE and n not in stored for n in names):
        return np.asarray(points, dtype=np.float64)
    ids = np.unique(np.concatenate([data.boundary(mesh, n)[0] for n in names]))
    return np.asarray(points[ids], dtype=np.float64)


def nodes_near(data: Any, mesh: int, node_ids: np.ndarray, names: Sequence[str], distance: float) -> np.ndarray:
    """Which of the nodes ``node_ids`` (sorted global ids of mesh ``mesh``) are within ``distance``
    of the boundaries ``names``: ``(len(node_ids),)`` bool. Positions in float64."""
    from scipy.spatial import cKDTree

    wall = boundary_points(data, mesh, names)
    ids = np.asarray(node_ids, dtype=np.int64)
    if not len(wall) or not len(ids):
        return np.zeros(len(ids), dtype=bool)
    pos = np.asarray(data.mesh_points(mesh)[ids], dtype=np.float64)
    bound = distance * (1 + 1e-9) + 1e-100  # a slightly larger bound (squared, it stays > 0); then exact
    dist, _ = cKDTree(wall).query(pos, k=1, distance_upper_bound=bound)
    return dist <= distance
