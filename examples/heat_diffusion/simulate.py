"""The heat-diffusion example's simulator: a learning task that needs no download.

``make_plate_mesh`` builds the demo's mesh: an unstructured triangulation of a plate with holes
(Delaunay of jittered points, triangles inside the holes removed). ``simulate_heat`` runs the heat
equation ``du/dt = div(kappa grad u)`` with P1 finite elements (triangles or tetrahedra, lumped mass,
implicit Euler, insulated boundary), over trajectories that vary the initial condition (Gaussian
blobs) and the conductivity field ``kappa`` (a smooth random field), and returns (state, next
state) pairs as MeshGraphNet training samples.

``write_dataset`` writes the samples as a dataset folder (the format of
:mod:`meshshard.data._dataset`): inputs ``u`` (the state), ``kappa`` (the conductivity)
and ``boundary`` (1 on the boundary, 0 inside), target ``du`` (``u_{t+1} - u_t``), all in
physical units; the dataset's statistics normalise them, nothing else does.

This is application code (it sees the whole mesh, offline, like partitioning); the library
keeps none. ``demo.py`` beside it runs the whole example.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.spatial import Delaunay

__all__ = ["make_plate_mesh", "simulate_heat", "write_dataset", "HeatDataset"]


def make_plate_mesh(num_points: int = 20000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A 2-D plate ``[0, 2] x [0, 1]`` with three round holes, triangulated; about ``num_points`` nodes.

    Returns:
        points ``(N, 2)`` float64 and triangles ``(C, 3)`` int64.
    """
    rng = np.random.default_rng(seed)
    h = np.sqrt(2.0 / num_points)
    xs, ys = np.meshgrid(np.arange(0, 2 + h / 2, h), np.arange(0, 1 + h / 2, h), indexing="ij")
    pts = np.stack([xs.ravel(), ys.ravel()], 1)
    interior = (pts[:, 0] > 1e-9) & (pts[:, 0] < 2 - 1e-9) & (pts[:, 1] > 1e-9) & (pts[:, 1] < 1 - 1e-9)
    pts[interior] += rng.uniform(-0.3 * h, 0.3 * h, size=(int(interior.sum()), 2))
    holes = np.array([[0.5, 0.5, 0.18], [1.2, 0.3, 0.12], [1.5, 0.7, 0.15]])
    keep = np.ones(len(pts), bool)
    for cx, cy, r in holes:
        keep &= np.hypot(pts[:, 0] - cx, pts[:, 1] - cy) > r
    pts = pts[keep]
    tri = Delaunay(pts).simplices
    centroids = pts[tri].mean(1)
    inside = np.zeros(len(tri), bool)
    for cx, cy, r in holes:
        inside |= np.hypot(centroids[:, 0] - cx, centroids[:, 1] - cy) < r
    tri = tri[~inside]
    used = np.unique(tri)
    remap = np.full(len(pts), -1, np.int64)
    remap[used] = np.arange(len(used))
    return pts[used], remap[tri].astype(np.int64)


def _p1_matrices(points: np.ndarray, cells: np.ndarray, kappa_cell: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """Stiffness ``K`` (with conductivity) and lumped mass for P1 simplices (D = 2 or 3), vectorised."""
    d = points.shape[1]
    x = points[cells]  # (C, D+1, D)
    edges = x[:, 1:] - x[:, :1]  # (C, D, D)
    det = np.linalg.det(edges)
    vol = np.abs(det) / (2.0 if d == 2 else 6.0)
    # x - x_0 = edges^T lambda', so grad lambda_i (i >= 1) is column i of inv(edges)
    inv = np.linalg.inv(edges)
    grads = np.empty((len(cells), d + 1, d))
    grads[:, 1:] = inv.transpose(0, 2, 1)
    grads[:, 0] = -grads[:, 1:].sum(1)
    local = np.einsum("cid,cjd->cij", grads, grads) * (vol * kappa_cell)[:, None, None]
    k = d + 1
    rows = np.repeat(cells, k, axis=1).ravel()
    cols = np.tile(cells, (1, k)).ravel()
    n = len(points)
    stiffness = sp.csr_matrix((local.ravel(), (rows, cols)), shape=(n, n))
    mass = np.bincount(cells.ravel(), weights=np.repeat(vol / k, k), minlength=n)
    return stiffness, mass


@dataclass(frozen=True)
class HeatDataset:
    inputs: np.ndarray  # (S, N, 3) float64: u, kappa, boundary
    targets: np.ndarray  # (S, N, 1) float64: u_next - u
    info: dict
    points: np.ndarray | None = None  # (N, D)
    cells: np.ndarray | None = None  # (C, D + 1) simplices


def _smooth_field(points: np.ndarray, rng: np.random.Generator, modes: int = 4) -> np.ndarray:
    span = points.max(0) - points.min(0)
    field = np.zeros(len(points))
    for _ in range(modes):
        k = rng.normal(size=points.shape[1]) * 2 * np.pi / span.max()
        field += rng.normal() * np.cos(points @ k + rng.uniform(0, 2 * np.pi))
    return np.exp(0.5 * field / np.sqrt(modes))


def simulate_heat(
    points: np.ndarray,
    cells: np.ndarray,
    *,
    trajectories: int = 4,
    steps: int = 10,
    dt: float | None = None,
    blob_width: tuple[float, float] = (0.02, 0.05),
    seed: int = 0,
) -> HeatDataset:
    """Simulate ``trajectories`` runs of ``steps`` implicit-Euler steps; every step is a sample.

    ``dt`` defaults to the squared mean edge length, so that one step moves heat about one edge
    (the scale a few message-passing steps can learn); larger steps spread it over more hops.
    Initial conditions are three Gaussian blobs of width ``blob_width`` (times the mesh's extent).

    Shapes:
        points: ``(N, D)``; cells: ``(C, D + 1)`` simplices. Result: ``S = trajectories * steps``
        samples of inputs ``(N, 3)`` and targets ``(N, 1)``.
    """
    if cells.ndim != 2 or cells.shape[1] != points.shape[1] + 1:
        raise ValueError(f"Expected simplices of shape (C, {points.shape[1] + 1}) (got {cells.shape})")
    rng = np.random.default_rng(seed)
    span = (points.max(0) - points.min(0)).max()
    edges = np.concatenate([cells[:, [i, j]] for i in range(cells.shape[1]) for j in range(i + 1, cells.shape[1])])
    mean_edge = float(np.linalg.norm(points[edges[:, 0]] - points[edges[:, 1]], axis=1).mean())
    dt = mean_edge**2 if dt is None else dt
    boundary = _boundary_nodes(cells, len(points)).astype(np.float64)
    states, nexts, kappas = [], [], []
    for _ in range(trajectories):
        kappa = _smooth_field(points, rng)
        stiffness, mass = _p1_matrices(points, cells, kappa[cells].mean(1))
        solve = spla.factorized((sp.diags(mass) + dt * stiffness).tocsc())
        u = np.zeros(len(points))
        for _ in range(3):
            c = points[rng.integers(len(points))]
            width = rng.uniform(*blob_width) * span
            u += rng.uniform(0.5, 1.0) * np.exp(-((points - c) ** 2).sum(1) / (2 * width**2))
        for _ in range(steps):
            u_next = solve(mass * u)
            states.append(u)
            nexts.append(u_next)
            kappas.append(kappa)
            u = u_next
    u_t = np.stack(states)
    delta = np.stack(nexts) - u_t
    inputs = np.stack([u_t, np.stack(kappas), np.broadcast_to(boundary, u_t.shape)], -1)
    info = {"dt": dt, "trajectories": trajectories, "steps": steps, "seed": seed,
            "features": ["u", "kappa", "boundary"], "targets": ["du = u_next - u"]}
    return HeatDataset(inputs, delta[..., None], info, points, cells)


def _boundary_nodes(cells: np.ndarray, n: int) -> np.ndarray:
    """Nodes on faces (edges in 2-D) that belong to a single cell."""
    k = cells.shape[1]
    faces = np.sort(np.concatenate([np.delete(cells, i, axis=1) for i in range(k)]), axis=1)
    uniq, counts = np.unique(faces, axis=0, return_counts=True)
    flag = np.zeros(n, bool)
    flag[uniq[counts == 1].ravel()] = True
    return flag


def write_dataset(data: HeatDataset, out: str | os.PathLike[str], **options: object) -> Path:
    """Write the samples as a dataset folder (:func:`meshshard.partition.write_dataset`; the
    ``options`` go to it, e.g. ``val_fraction``, ``dtype``, ``force``)."""
    from meshshard.data import write_dataset as write

    if data.points is None or data.cells is None:
        raise ValueError("Expected a HeatDataset from simulate_heat (with its points and cells)")
    cell_type = "triangle" if data.cells.shape[1] == 3 else "tetra"
    return write(out, data.inputs, data.targets, pos=data.points, cells=[(cell_type, data.cells)],
                 input_names=["u", "kappa", "boundary"], target_names=["du"], **options)  # type: ignore[arg-type]
