"""Synthetic meshes for the benchmarks (no download): a jittered tetrahedral lattice, a jittered triangle grid."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["box_mesh_slabs", "make_box_mesh", "make_square_mesh"]


def box_mesh_slabs(side: int, seed: int = 0, dtype: type = np.int64,
                   layers: int = 8) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """:func:`make_box_mesh`'s mesh in slabs of ``layers`` lattice layers (along x), in order.

    Slab ``s`` holds the points of layers ``[s layers, (s + 1) layers)`` and the tets of the cubes
    whose first corner is in them (global node ids); the jitter is drawn in the same order, so the
    slabs put together are :func:`make_box_mesh`'s arrays. Memory: one slab (``layers side^2`` points).

    Shapes:
        Yields points ``(layers side^2, 3)`` and tets ``(6 layers (side - 1)^2, 4)`` (fewer in the last slab).
    """
    rng = np.random.default_rng(seed)
    h = 1.0 / (side - 1)
    grid = np.arange(side, dtype=np.float64) * h
    c = np.arange(side - 1, dtype=dtype)
    step = np.array([side * side, side, 1], dtype=dtype)
    for first in range(0, side, layers):
        x = grid[first:first + layers]
        points = np.empty((len(x) * side * side, 3))
        points[:, 0] = np.repeat(x, side * side)
        points[:, 1] = np.tile(np.repeat(grid, side), len(x))
        points[:, 2] = np.tile(grid, len(x) * side)
        points += rng.uniform(-0.2 * h, 0.2 * h, points.shape)
        cx = np.arange(first, min(first + layers, side - 1), dtype=dtype)
        base = ((cx[:, None, None] * side + c[None, :, None]) * side + c[None, None, :]).ravel()
        tets = np.empty((len(base), 6, 4), dtype=dtype)
        for t, p in enumerate(((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))):
            tets[:, t, 0] = base
            tets[:, t, 1] = base + step[p[0]]
            tets[:, t, 2] = tets[:, t, 1] + step[p[1]]
            tets[:, t, 3] = base + step.sum()
        yield points, tets.reshape(-1, 4)


def make_box_mesh(side: int, seed: int = 0, dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """A jittered ``side^3`` lattice on the unit cube, every cube cut into 6 tets (Kuhn).

    Tets are in cube order (the 6 of a cube together), as a mesher writes them; ``dtype`` is
    the node id type (int32 halves the memory of a 20M-node mesh's 120M tets). Built from
    :func:`box_mesh_slabs` into arrays allocated once.

    Shapes:
        Returns points ``(side^3, 3)`` and tets ``(6 (side - 1)^3, 4)``.
    """
    points = np.empty((side**3, 3))
    tets = np.empty((6 * (side - 1) ** 3, 4), dtype=dtype)
    p = t = 0
    for slab_points, slab_tets in box_mesh_slabs(side, seed, dtype):
        points[p:p + len(slab_points)], tets[t:t + len(slab_tets)] = slab_points, slab_tets
        p, t = p + len(slab_points), t + len(slab_tets)
    return points, tets


def make_square_mesh(side: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A jittered ``side^2`` grid on the unit square, every square cut into 2 triangles.

    Node ``i * side + j`` lies near ``(i, j) / (side - 1)``; the first and last rows (``i = 0`` and
    ``i = side - 1``) are not jittered across, so they stay on ``x = 0`` and ``x = 1``.

    Shapes:
        Returns points ``(side^2, 2)`` and triangles ``(2 (side - 1)^2, 3)``.
    """
    rng = np.random.default_rng(seed)
    h = 1.0 / (side - 1)
    grid = np.arange(side, dtype=np.float64) * h
    points = np.stack([np.repeat(grid, side), np.tile(grid, side)], 1)
    points += rng.uniform(-0.2 * h, 0.2 * h, points.shape)
    points[:side, 0], points[-side:, 0] = 0.0, 1.0
    c = np.arange(side - 1, dtype=np.int64)
    a = (c[:, None] * side + c[None, :]).ravel()
    triangles = np.concatenate([np.stack([a, a + side, a + side + 1], 1), np.stack([a, a + side + 1, a + 1], 1)])
    return points, triangles
