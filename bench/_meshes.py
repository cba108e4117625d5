"""Synthetic meshes for the benchmarks (no download): a jittered tetrahedral lattice."""

from __future__ import annotations

import numpy as np

__all__ = ["make_box_mesh"]


def make_box_mesh(side: int, seed: int = 0, dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """A jittered ``side^3`` lattice on the unit cube, every cube cut into 6 tets (Kuhn).

    Tets are in cube order (the 6 of a cube together), as a mesher writes them; ``dtype`` is
    the node id type (int32 halves the memory of a 20M-node mesh's 120M tets).

    Shapes:
        Returns points ``(side^3, 3)`` and tets ``(6 (side - 1)^3, 4)``.
    """
    rng = np.random.default_rng(seed)
    h = 1.0 / (side - 1)
    points = np.empty((side**3, 3))
    grid = np.arange(side, dtype=np.float64) * h
    points[:, 0] = np.repeat(grid, side * side)
    points[:, 1] = np.tile(np.repeat(grid, side), side)
    points[:, 2] = np.tile(grid, side * side)
    points += rng.uniform(-0.2 * h, 0.2 * h, (side**3, 3))
    c = np.arange(side - 1, dtype=dtype)
    base = ((c[:, None, None] * side + c[None, :, None]) * side + c[None, None, :]).ravel()
    step = np.array([side * side, side, 1], dtype=dtype)
    tets = np.empty((len(base), 6, 4), dtype=dtype)
    for t, p in enumerate(((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))):
        tets[:, t, 0] = base
        tets[:, t, 1] = base + step[p[0]]
        tets[:, t, 2] = tets[:, t, 1] + step[p[1]]
        tets[:, t, 3] = base + step.sum()
    return points, tets.reshape(-1, 4)
