"""A small mixed-cell 3-D mesh for the VTKHDF and distributed-partition tests, and its files.

Hexahedra on one half of a jittered lattice, Kuhn tetrahedra on the other, wedges in a slab, boundary
triangles and quads, a few lines and vertices, two nodes at one place (a tie of Morton codes broken by
global id) and one node in no cell; the node ids shuffled, so that global id order is not space order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def mixed_mesh(shape: tuple[int, int, int] = (9, 7, 6), seed: int = 0) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """``(points (N, 3), cells)`` in meshio's layout (see the module docstring)."""
    rng = np.random.default_rng(seed)
    nx, ny, nz = shape
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape], indexing="ij"), -1).reshape(-1, 3)
    pos = grid + rng.uniform(-0.2, 0.2, grid.shape)
    ids = np.arange(len(pos)).reshape(shape)
    corner = {(i, j, k): ids[i:nx - 1 + i, j:ny - 1 + j, k:nz - 1 + k] for i in (0, 1) for j in (0, 1) for k in (0, 1)}
    half = (nx - 1) // 2
    hexa = np.stack([corner[c] for c in [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0),
                                         (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1)]], -1)[:half].reshape(-1, 8)
    tets = []
    for path in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]:
        step, verts = [0, 0, 0], [corner[(0, 0, 0)]]
        for axis in path:
            step[axis] = 1
            verts.append(corner[tuple(step)])
        tets.append(np.stack(verts, -1)[half:].reshape(-1, 4))
    wedge = np.stack([corner[c] for c in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1)]],
                     -1)[half:, :, :1].reshape(-1, 6)
    bottom = ids[:, :, 0]
    tri = np.stack([bottom[:-1, :-1], bottom[1:, :-1], bottom[1:, 1:]], -1).reshape(-1, 3)
    top = ids[:, :, -1]
    quad = np.stack([top[:-1, :-1], top[1:, :-1], top[1:, 1:], top[:-1, 1:]], -1).reshape(-1, 4)
    lines = np.stack([ids[0, 0, :-1], ids[0, 0, 1:]], -1)
    vertex = ids[-1, -1, -1:].reshape(-1, 1)
    # a twin of node 0 (same place, its own id) in one tetrahedron, and a node in no cell
    pos = np.concatenate([pos, pos[:1], [[nx / 2, ny / 2, nz + 3.0]]])
    twin = len(pos) - 2
    tets.append(np.array([[twin, ids[1, 0, 0], ids[0, 1, 0], ids[0, 0, 1]]]))
    cells = [("hexahedron", hexa), ("tetra", np.concatenate(tets)), ("wedge", wedge), ("triangle", tri),
             ("quad", quad), ("line", lines), ("vertex", vertex)]
    perm = rng.permutation(len(pos))  # new id of each old node
    new_pos = np.empty_like(pos)
    new_pos[perm] = pos
    return new_pos, [(t, perm[c]) for t, c in cells]


def write_mixed_vtkhdf(folder: Path, shape: tuple[int, int, int] = (9, 7, 6), name: str = "mixed.vtkhdf") -> Path:
    """The mixed mesh written as a ``.vtkhdf`` in ``folder``, with a point field ``temperature``."""
    from meshshard.partition import write_vtkhdf

    pos, cells = mixed_mesh(shape)
    return write_vtkhdf(Path(folder) / name, pos, cells, {"temperature": pos[:, 0] * 2.0})
