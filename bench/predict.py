"""Benchmark of ``meshshard predict`` on a large mesh: time and peak memory, 1 and 2 ranks.

A generated tetrahedral box mesh of ``side^3`` nodes (default side 50: 125,000 nodes, 0.7 M
tets) with two samples of analytic fields (inputs ``a``, ``b``; target ``c``) is written as a
dataset, partitioned into 2 parts, and a run is trained for one step on 2 ranks (the weights do
not matter for timing). Then ``meshshard predict`` writes both samples:

- one process, whole mesh, one gathered ``.vtu`` per sample;
- 2 ranks (``--nproc 2``), one piece per rank plus a ``.pvtu`` (``--pieces``).

Each is timed as a command (start-up included) and per sample from ``metrics.json`` (reading and
the forward pass, and the total with writing and the picture); peak memory is the largest
``ru_maxrss`` of each rank, as ``metrics.json`` reports it.

    python bench/predict.py [--side 50] [--latent 32] [--mp-steps 6] [--json FILE]

Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _meshes import make_box_mesh


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", type=int, default=50)
    p.add_argument("--latent", type=int, default=32)
    p.add_argument("--mp-steps", type=int, default=6)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    from meshshard.partition import partition_dataset, write_dataset

    work = Path(tempfile.mkdtemp(prefix="meshshard-bench-predict-"))
    points, tets = make_box_mesh(args.side)
    inputs = np.stack([np.stack([np.sin(3 * points[:, 0] + s), points[:, 1] * points[:, 2]], 1) for s in range(2)])
    targets = inputs[:, :, :1] * inputs[:, :, 1:]
    write_dataset(work / "data", inputs, targets, pos=points, cells=[("tetra", tets)], input_names=["a", "b"],
                  target_names=["c"], val_samples=[1])
    partition_dataset(work / "data", work / "parts", 2)
    ms = [sys.executable, "-m", "meshshard"]
    subprocess.run([*ms, "train", str(work / "parts"), "--data", str(work / "data"), "--out", str(work / "run"), "--nproc", "2",
                    "--steps", "1", "--latent", str(args.latent), "--mp-steps", str(args.mp_steps), "--quiet"], check=True)
    rows = []
    for label, extra in (("1 process, gathered .vtu", []), ("2 ranks, pieces + .pvtu", ["--nproc", "2", "--pieces"])):
        out = work / f"pred-{len(rows)}"
        wall = run([*ms, "predict", str(work / "run"), "--data", str(work / "data"), "--out", str(out),
                         "--samples", "all", "--quiet", *extra])
        metrics = json.loads((out / "metrics.json").read_text())
        per = [s["seconds"] for s in metrics["samples"]]
        rows.append({"case": label, "nodes": len(points), "samples": len(per), "command_s": round(wall, 2),
                     "forward_s": round(float(np.mean([s["read_and_forward"] for s in per])), 3),
                     "per_sample_s": round(float(np.mean([s["total"] for s in per])), 3),
                     "peak_rss_mb_per_rank": metrics["peak_rss_mb"]})
    print(f"{'case':<28} {'nodes':>9} {'command s':>10} {'read+fwd s':>11} {'per sample s':>13} {'peak RSS MB per rank':>22}")
    for r in rows:
        print(f"{r['case']:<28} {r['nodes']:>9,} {r['command_s']:>10} {r['forward_s']:>11} {r['per_sample_s']:>13} "
              f"{', '.join(f'{v:,.0f}' for v in r['peak_rss_mb_per_rank']):>22}")
    result = {"benchmark": "predict", "side": args.side, "latent": args.latent, "mp_steps": args.mp_steps, "rows": rows}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
