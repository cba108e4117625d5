"""Benchmark of ``meshshard dataset``: build time and peak memory on a 1M-node mesh.

The sources: a generated 3-D tetrahedral mesh of ``side^3`` nodes (default 100: 1,000,000 nodes,
5.8 M tets; the jittered lattice of ``bench/partition.py``), written as ``samples`` files (default
20) that each carry 3 ``point_data`` fields (smooth analytic fields that change per sample):
inputs ``a``, ``b``, target ``c``. Written once into a cache folder (``.vtu`` by default, meshio's
compressed binary XML; ``--format vtk`` for binary legacy VTK, which meshio reads faster).

Then ``meshshard dataset SRC --out DATA --inputs a,b --targets c`` runs as a child process,
timed, with its peak resident memory (``ru_maxrss`` of the child). What a run should show: the
peak is that of one sample (its mesh, fields and nodal graph for the edge statistics), not of
all samples; the time is dominated by meshio's reading of the files.

    python bench/dataset.py [--side 100] [--samples 20] [--format vtu|vtk] [--cache DIR] [--json FILE]
    python bench/dataset.py --generate-only     # write the sources only (slow, not timed)

Prints a table, then one JSON object. Run the timed part under ``flock /tmp/meshshard-heavy.lock``
(generate the sources first, outside the lock).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _runner import peak_rss_mb


def make_sources(folder: Path, side: int, samples: int, fmt: str) -> float:
    """Write the sample files (skipped when present); returns the seconds spent."""
    import meshio
    import numpy as np
    from _meshes import make_box_mesh

    done = folder / ".complete"
    if done.exists():
        return 0.0
    start = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    points, tets = make_box_mesh(side)
    cells = [("tetra", tets.astype(np.int64))]
    x, y, z = points.T
    for s in range(samples):
        k = 1.0 + 0.25 * s
        fields = {"a": np.sin(k * x) * np.cos(y), "b": np.exp(-((x - 0.5) ** 2 + (z - 0.02 * s) ** 2)),
                  "c": np.sin(k * x) * np.cos(y) * z + 0.1 * s}
        meshio.write(folder / f"sample-{s:03d}.{fmt}", meshio.Mesh(points, cells, point_data=fields), binary=True)
        print(f"  wrote sample {s + 1}/{samples}", file=sys.stderr, flush=True)
    done.write_text("")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=100, help="lattice side: side^3 nodes")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--format", choices=("vtu", "vtk"), default="vtu")
    parser.add_argument("--cache", default="/tmp/meshshard-bench", help="folder for the sources and the dataset")
    parser.add_argument("--json", default=None, help="also write the JSON result to this file")
    parser.add_argument("--generate-only", action="store_true", help="write the source files and stop")
    args = parser.parse_args()

    cache = Path(args.cache)
    src = cache / f"dataset-src-{args.side}-{args.samples}-{args.format}"
    generated = make_sources(src, args.side, args.samples, args.format)
    if args.generate_only:
        return
    out = cache / f"dataset-{args.side}-{args.samples}-{args.format}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "meshshard", "dataset", str(src), "--out", str(out),
                           "--inputs", "a,b", "--targets", "c", "--quiet"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"meshshard dataset failed: {done.stderr.strip()}")
    peak = peak_rss_mb(children=True)
    meta = json.loads((out / "dataset.json").read_text())
    source_bytes = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
    data_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    one_sample_fields = meta["meshes"][0]["num_nodes"] * 3 * 8
    result = {
        "nodes": meta["meshes"][0]["num_nodes"], "tets": meta["meshes"][0]["cells"].get("tetra", 0),
        "directed_edges": meta["meshes"][0]["num_edges"], "samples": meta["num_samples"],
        "fields": len(meta["input_channels"]) + len(meta["target_channels"]), "format": args.format,
        "kind": meta["kind"], "build_s": round(seconds, 2), "s_per_sample": round(seconds / meta["num_samples"], 2),
        "peak_rss_mb": round(peak, 1), "source_mb": round(source_bytes / 2**20, 1),
        "dataset_mb": round(data_bytes / 2**20, 1),
        "all_samples_fields_mb": round(one_sample_fields * meta["num_samples"] / 2**20, 1),
        "sources_generated_s": round(generated, 1), "cpu_count": os.cpu_count(),
    }
    rows = [("mesh", f"{result['nodes']:,} nodes, {result['tets']:,} tets, {result['directed_edges']:,} directed edges"),
            ("samples x fields", f"{result['samples']} x {result['fields']} ({args.format}, {result['source_mb']:,} MB of files)"),
            ("build time", f"{result['build_s']} s ({result['s_per_sample']} s per sample)"),
            ("peak RSS", f"{result['peak_rss_mb']:,} MB (all samples' fields in float64 would be "
                         f"{result['all_samples_fields_mb']:,} MB on top of the mesh)"),
            ("dataset folder", f"{result['dataset_mb']:,} MB, kind {result['kind']}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
