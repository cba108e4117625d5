"""Tiny parameter sweeps for the baseline tests: datasets written with per-sample parameters (as
``meshshard dataset --params`` records them) on one mesh or on a mesh per sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.spatial import Delaunay

from meshshard.data import Sample, write_samples

#: (a, b) of the training samples (a 4 x 2 grid), then of the validation samples.
TRAIN = [(a, b) for b in (1.0, 2.0) for a in (0.0, 1.0, 2.0, 3.0)]
VAL = [(1.5, 1.0), (4.0, 2.0), (2.5, 1.8)]
PARAMS = np.array(TRAIN + VAL)
NAMES = [f"t{i}" for i in range(len(TRAIN))] + [f"v{i}" for i in range(len(VAL))]


def grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The unit square's (n+1)^2 nodes and its triangles."""
    x, y = np.meshgrid(np.linspace(0.0, 1.0, n + 1), np.linspace(0.0, 1.0, n + 1), indexing="xy")
    pts = np.stack([x.ravel(), y.ravel()], 1)
    return pts, Delaunay(pts).simplices


def fields(pts: np.ndarray, a: float, b: float) -> np.ndarray:
    """Physical targets p (one channel), U (two) of parameters (a, b): linear in x and y, so that
    they map exactly between meshes of the square."""
    x, y = pts[:, 0], pts[:, 1]
    return np.stack([b ** 2 * (1.0 + a * x - 0.5 * y), a * y + b, b * x - a], 1)


def write_sweep(out: Path, *, meshes: str = "one", parameters: bool = True, scale: bool = True,
                targets: bool = True) -> dict:
    """The sweep as a dataset: ``meshes="one"`` (a 6 x 6 grid) or ``"many"`` (each sample its own
    random points of the square, corners included); targets ``p`` (divided by ``b**2`` when
    ``scale``: ``--target-scale p=b**2``) and ``U``; boundary ``bottom`` (y = 0) on one mesh.
    Returns the points per sample and the physical targets."""
    rng = np.random.default_rng(3)
    samples, points, truth = [], [], []
    for i, (a, b) in enumerate(PARAMS):
        if meshes == "one":
            pts, tri = grid(6)
        else:
            pts = np.concatenate([[[0, 0], [1, 0], [0, 1], [1, 1]], rng.random((40 + 3 * i, 2))])
            tri = Delaunay(pts).simplices
        y = fields(pts, a, b)
        stored = y / np.array([b ** 2, 1.0, 1.0]) if scale else y
        x = np.stack([pts[:, 0] * 0.0 + 1.0] + ([np.full(len(pts), a), np.full(len(pts), b)] if parameters else []), 1)
        walls = {"bottom": np.flatnonzero(pts[:, 1] == 0.0)} if meshes == "one" else None
        samples.append(Sample(NAMES[i], pts, x, stored if targets else np.zeros((len(pts), 0)), cells=[("triangle", tri)],
                              boundaries=walls))
        points.append(pts)
        truth.append(y)
    inputs = [{"name": "one", "components": 1}] + ([{"name": "a", "components": 1, "parameter": True},
                                                    {"name": "b", "components": 1, "parameter": True}]
                                                   if parameters else [])
    write_samples(out, iter(samples), NAMES, input_fields=inputs,
                  target_fields=[{"name": "p", "components": 1}, {"name": "U", "components": 2}] if targets else [],
                  val_samples=NAMES[len(TRAIN):] if targets else None, dtype="float64",
                  parameters={"names": ["a", "b"], "values": PARAMS.tolist()} if parameters else None,
                  target_scales={"p": "b**2"} if scale and parameters and targets else None)
    return {"data": str(out), "points": points, "truth": truth}
