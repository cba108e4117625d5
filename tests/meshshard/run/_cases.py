"""Small datasets that several run tests train on."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np

from meshshard.data import partition_dataset, write_dataset
from meshshard.run import TrainConfig, train
from tests._meshes import mesh_file


def waves_on_big_mesh(root: Path, samples: int, seed: int, gain: float, offset: float, parts: tuple[int, ...]) -> dict:
    """A float64 dataset on the triangles of ``sfepy/big.mesh`` (in 2-D), partitioned into each of ``parts``.

    Sample ``s`` has the inputs ``a, b = cos(pos @ w_s)`` for random waves ``w_s`` (``seed``) and
    the target ``T = gain * a * b + offset``; the last sample is the validation sample. Returns
    ``{"root": root, "data": "ROOT/data"}``; the partitions are ``ROOT/parts{k}``.
    """
    mesh = meshio.read(mesh_file("sfepy/big.mesh", root))
    points = np.asarray(mesh.points[:, :2], dtype=np.float64)
    tri = np.concatenate([b.data for b in mesh.cells if b.type == "triangle"]).astype(np.int64)
    rng = np.random.default_rng(seed)
    waves = rng.normal(size=(samples, 2, 2)) * 3
    inputs = np.stack([np.cos(points @ w) for w in waves])  # (samples, N, 2)
    targets = (inputs[:, :, :1] * inputs[:, :, 1:]) * gain + offset
    write_dataset(root / "data", inputs, targets, pos=points, cells=[("triangle", tri)],
                  input_names=["a", "b"], target_names=["T"], val_samples=[samples - 1], dtype="float64")
    for k in parts:
        partition_dataset(root / "data", root / f"parts{k}", k)
    return {"root": root, "data": str(root / "data")}


def hex_lattice(side: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes ``(side^3, 3)`` of a unit cube's lattice and its hexahedra ``((side-1)^3, 8)``, in
    VTK's corner order."""
    axis = np.arange(side)
    i, j, k = (a.ravel() for a in np.meshgrid(axis, axis, axis, indexing="ij"))
    points = np.stack([i, j, k], 1) / (side - 1.0)
    c = np.arange(side - 1)
    ci, cj, ck = (a.ravel() for a in np.meshgrid(c, c, c, indexing="ij"))
    b = (ci * side + cj) * side + ck
    sx, sy = side * side, side
    return points, np.stack([b, b + sx, b + sx + sy, b + sy, b + 1, b + sx + 1, b + sx + sy + 1, b + sy + 1], 1)


def quad_grid(nx: int, ny: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(nx+1)(ny+1)`` nodes of ``[0, 2] x [0, 1]`` and its ``nx * ny`` quads."""
    x, y = np.meshgrid(np.linspace(0.0, 2.0, nx + 1), np.linspace(0.0, 1.0, ny + 1), indexing="xy")
    pts = np.stack([x.ravel(), y.ravel()], 1)
    i, j = np.meshgrid(np.arange(nx), np.arange(ny), indexing="xy")
    a = (j * (nx + 1) + i).ravel()
    return pts, np.stack([a, a + 1, a + nx + 2, a + nx + 1], 1)


def walls_on_grid(root: Path, nx: int = 16, ny: int = 8, seed: int = 4, parts: tuple[int, ...] = (1, 2, 3, 4)) -> dict:
    """A float64 dataset on :func:`quad_grid` with the boundaries ``bottom`` (y = 0) and ``left``
    (x = 0), partitioned into each of ``parts``, and a small MeshGraphNet trained on it for 2 steps.

    Sample ``s`` has the inputs ``a = cos(pos @ w_s)`` (2 channels, random waves ``w_s``) and the
    targets ``p = 3 + a[0] + x`` and ``U = (a[1], a[0] a[1])``; samples 2 and 3 are validation.
    Returns ``{"root", "data", "run", "pts", "walls"}``; the partitions are ``ROOT/parts{k}``.
    """
    pts, quads = quad_grid(nx, ny)
    waves = np.random.default_rng(seed).normal(size=(4, 2, 2))
    inputs = np.stack([np.cos(pts @ w) for w in waves])
    targets = np.stack([np.stack([3 + x[:, 0] + pts[:, 0], x[:, 1], x[:, 0] * x[:, 1]], 1) for x in inputs])
    walls = {"bottom": np.flatnonzero(pts[:, 1] == 0.0), "left": np.flatnonzero(pts[:, 0] == 0.0)}
    write_dataset(root / "data", inputs, targets, pos=pts, cells=[("quad", quads)], input_names=[("a", 2)],
                  target_names=["p", ("U", 2)], val_samples=[2, 3], dtype="float64", boundaries=walls)
    for k in parts:
        partition_dataset(root / "data", root / f"parts{k}", k)
    train(TrainConfig(partition=str(root / "parts1"), data=str(root / "data"), out=str(root / "run"), steps=2,
                      lr=1e-2, latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64"))
    return {"root": root, "data": str(root / "data"), "run": str(root / "run"), "pts": pts, "walls": walls}


def uv_ellipsoid(scale: np.ndarray | float = 1.0, n_lat: int = 10, n_lon: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A UV ellipsoid of semi-axes ``scale`` (a unit sphere by default): its points and its
    triangles, wound outward."""
    th = np.linspace(0, np.pi, n_lat + 1)[1:-1]
    ph = np.linspace(0, 2 * np.pi, n_lon, endpoint=False)
    t, p = np.meshgrid(th, ph, indexing="ij")
    ring = np.stack([np.sin(t) * np.cos(p), np.sin(t) * np.sin(p), np.cos(t)], -1).reshape(-1, 3)
    pts = np.concatenate([[[0, 0, 1]], ring, [[0, 0, -1]]])
    idx = 1 + np.arange(len(ring)).reshape(n_lat - 1, n_lon)
    nxt = np.roll(idx, -1, axis=1)
    a, b, c, d = idx[:-1].ravel(), nxt[:-1].ravel(), nxt[1:].ravel(), idx[1:].ravel()
    tris = np.concatenate([np.stack([np.zeros(n_lon, int), idx[0], nxt[0]], 1),
                           np.stack([np.full(n_lon, len(pts) - 1), nxt[-1], idx[-1]], 1),
                           np.stack([a, d, c], 1), np.stack([a, c, b], 1)])
    v = pts[tris]
    outward = np.einsum("fd,fd->f", np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]), v.mean(1)) > 0
    tris[~outward] = tris[~outward][:, ::-1]
    return pts * scale, tris
