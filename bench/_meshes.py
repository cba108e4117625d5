"""Synthetic meshes for the benchmarks (no download): a jittered tetrahedral lattice."""

from __future__ import annotations

import numpy as np

__all__ = ["make_box_mesh"]


def make_box_mesh(side: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A jittered ``side^3`` lattice on the unit cube, every cube cut into 6 tets.

    Shapes:
        Returns points ``(side^3, 3)`` and tets ``(6 (side - 1)^3, 4)``.
    """
    rng = np.random.default_rng(seed)
    axis = np.arange(side)
    i, j, k = (a.ravel() for a in np.meshgrid(axis, axis, axis, indexing="ij"))
    h = 1.0 / (side - 1)
    points = np.stack([i, j, k], 1) * h + rng.uniform(-0.2 * h, 0.2 * h, (side**3, 3))
    c = np.arange(side - 1)
    ci, cj, ck = (a.ravel() for a in np.meshgrid(c, c, c, indexing="ij"))
    base = (ci * side + cj) * side + ck
    step = np.array([side * side, side, 1])
    tets = []
    for p in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
        a = base + step[p[0]]
        b = a + step[p[1]]
        tets.append(np.stack([base, a, b, base + step.sum()], 1))
    return points, np.concatenate(tets)
