"""Benchmark of ``meshshard predict`` on a large mesh: time and peak memory, 1 and 2 ranks.

A generated tetrahedral box mesh of ``side^3`` nodes (default side 50: 125,000 nodes, 0.7 M
tets) with two samples of analytic fields (inputs ``a``, ``b``; target ``c``) is written as a
dataset and partitioned into 2 parts. A run is trained for one step on 2 ranks on a small mesh
carrying the same fields (the model does not depend on the mesh, and the weights do not matter
for timing; training on the large mesh would need far more memory than predicting on it). Then
``meshshard predict`` writes both samples of the large dataset:

- one process, whole mesh, one gathered ``.vtu`` per sample;
- 2 ranks (``--nproc 2``), one piece per rank plus a ``.pvtu`` (``--pieces``).

Each is timed as a command (start-up included) and per sample from ``metrics.json`` (reading and
the forward pass, and the total with writing and the picture); peak memory is the largest
``ru_maxrss`` of each rank, as ``metrics.json`` reports it.

    python bench/predict.py [--side 50] [--latent 32] [--mp-steps 6] [--json FILE]

Prints a table, then one JSON object. The work folder (a temporary folder) is deleted at the end.
At ``--side 100`` (1M nodes) run it under ``flock /tmp/meshshard-heavy.lock``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _meshes import make_box_mesh
from _runner import emit, scratch_folder


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ["case", "command s (all samples)", "read+forward s (mean)", "per sample s: first, next",
                "peak RSS MB per rank"]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["case"], f"{r['command_s']:.1f}", f"{r['forward_s']:.2f}",
                      ", ".join(f"{v:.2f}" for v in r["sample_s"]),
                      ", ".join(f"{v:,.0f}" for v in r["peak_rss_mb_per_rank"]))
    Console(width=160).print(table)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", type=int, default=50)
    p.add_argument("--latent", type=int, default=32)
    p.add_argument("--mp-steps", type=int, default=6)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    return measure(args, scratch_folder("meshshard-bench-predict-"))


def write_box_dataset(folder: Path, side: int) -> int:
    """Two samples of the analytic fields on the ``side^3`` box; returns the node count."""
    from meshshard.data import write_dataset

    points, tets = make_box_mesh(side)
    inputs = np.stack([np.stack([np.sin(3 * points[:, 0] + s), points[:, 1] * points[:, 2]], 1) for s in range(2)])
    targets = inputs[:, :, :1] * inputs[:, :, 1:]
    write_dataset(folder, inputs, targets, pos=points, cells=[("tetra", tets)], input_names=["a", "b"],
                  target_names=["c"], val_samples=[1])
    return len(points)


def measure(args: argparse.Namespace, work: Path) -> int:
    from meshshard.data import partition_dataset

    nodes = write_box_dataset(work / "data", args.side)
    partition_dataset(work / "data", work / "parts", 2)
    # the run that is timed predicting: one step on a small mesh with the same fields
    write_box_dataset(work / "train-data", min(args.side, 12))
    partition_dataset(work / "train-data", work / "train-parts", 2)
    ms = [sys.executable, "-m", "meshshard"]
    subprocess.run([*ms, "train", str(work / "train-parts"), "--data", str(work / "train-data"), "--out", str(work / "run"),
                    "--nproc", "2", "--steps", "1", "--latent", str(args.latent), "--mp-steps", str(args.mp_steps),
                    "--quiet"], check=True)
    rows: list[dict] = []
    for label, extra in (("1 process, gathered .vtu", []),
                         ("2 ranks, pieces + .pvtu", ["--nproc", "2", "--pieces", "--partition", str(work / "parts")])):
        out = work / f"pred-{len(rows)}"
        wall = run([*ms, "predict", str(work / "run"), "--data", str(work / "data"), "--out", str(out),
                         "--samples", "all", "--quiet", *extra])
        metrics = json.loads((out / "metrics.json").read_text())
        per = [s["seconds"] for s in metrics["samples"]]
        rows.append({"case": label, "nodes": nodes, "samples": len(per), "command_s": round(wall, 2),
                     "forward_s": round(float(np.mean([s["read_and_forward"] for s in per])), 3),
                     "per_sample_s": round(float(np.mean([s["total"] for s in per])), 3),
                     "sample_s": [s["total"] for s in per], "peak_rss_mb_per_rank": metrics["peak_rss_mb"]})
    print_table(rows, f"meshshard predict: {nodes:,}-node tet mesh, MeshGraphNet latent {args.latent}, "
                      f"{args.mp_steps} message-passing steps, 2 samples")
    result = {"benchmark": "predict", "side": args.side, "latent": args.latent, "mp_steps": args.mp_steps, "rows": rows}
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
