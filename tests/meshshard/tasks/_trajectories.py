"""A small trajectory dataset for the transient task's tests: an advected, decaying bump on a
triangle grid, its left and right columns a boundary class (held at their values), written
through ``write_trajectories`` in float64."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshshard.data import Trajectory, partition_dataset, write_trajectories
from tests.partition.conftest import grid_triangles

NX, NY = 11, 7  # 77 nodes: uneven shards on 2, 3 and 4 ranks
STATE = [{"name": "u", "components": 2}]
INPUTS = [{"name": "c", "components": 1}]


def trajectories(steps: int = 8, count: int = 3) -> list[dict]:
    """``count`` trajectories of ``steps`` steps: ``pos``, ``tri``, ``times``, ``states`` (T, N, 2),
    ``inputs`` (N, 1), ``classes`` (N,) (1 on the left and right columns, else 0)."""
    pts, tri = grid_triangles(NX, NY)
    x, y = pts[:, 0], pts[:, 1]
    classes = ((x == 0) | (x == 1)).astype(np.int64)
    out = []
    for k in range(count):
        c = 0.5 + 0.25 * k
        times = 0.1 * np.arange(steps)
        states = np.stack([np.stack([np.exp(-8 * ((x - 0.3 - c * t) ** 2 + (y - 0.5) ** 2)) * np.exp(-t),
                                     np.sin(np.pi * x + c * t) * y], axis=1) for t in times])
        out.append({"pos": pts, "tri": tri, "times": times, "states": states,
                    "inputs": np.full((len(pts), 1), c), "classes": classes})
    return out


def write(root: Path, parts: tuple[int, ...] = (1, 3), steps: int = 8, stride: int = 1) -> dict:
    """The dataset (the last trajectory for validation) and its partitions into each of ``parts``."""
    whole = trajectories(steps)
    names = [f"run{k}" for k in range(len(whole))]
    write_trajectories(root / "data", (Trajectory(n, w["pos"], [("triangle", w["tri"])], w["times"],
                                                  iter(w["states"]), w["inputs"], w["classes"])
                                       for n, w in zip(names, whole, strict=True)),
                       names, state_fields=STATE, input_fields=INPUTS, time_stride=stride, node_type_source="test",
                       val_samples=[names[-1]], dtype="float64")
    out = {"root": root, "data": str(root / "data"), "whole": whole}
    for r in parts:
        partition_dataset(root / "data", root / f"parts{r}", r)
        out[r] = str(root / f"parts{r}")
    return out
