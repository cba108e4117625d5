"""Small datasets that several run tests train on."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np

from meshshard.data import partition_dataset, write_dataset
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
