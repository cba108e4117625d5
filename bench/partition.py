"""Benchmark of ``meshshard partition``: time and peak memory per step, against bare METIS.

Cases:

1. generated 3-D tetrahedral meshes, ``n^3`` nodes for each ``--side n`` (default 100:
   1,000,000 nodes, 5.8 M tets; ``--side 100 171 272`` is 1M, 5M and 20M nodes), a jittered
   lattice with each cube split into 6 tets (Kuhn), written once as a binary legacy VTK file in
   a cache folder and read back through meshio (meshio's VTU reader decodes base64 XML and is
   about 5 times slower on the same mesh);
2. ``walshaw/wave.graph.bz2`` (156,317 nodes, 1,059,331 edges) from ``../shared/data``;
3. ``load_partition`` of one rank's shard of a ~200k-node mesh split 8 ways (target < 0.1 s).

Each case runs in a fresh process, so that its peak memory is its own. Per step (read, graph,
metis, refine, plans, write) it reports the wall time and the peak resident memory of the
process during the step (Linux ``VmHWM``, reset at the start of each step), and the peak in
bytes per node.

Bare METIS: in another fresh process, the same graph is read and built (not timed), then one
METIS k-way call (seed 0, ncuts 1) is timed, with its own peak memory. ``pipeline - read over
bare METIS`` is the issue's target (<= 2): everything but reading the file, the METIS search
included (``--tries`` x up to two variants; the default is 1 try of k-way alone from 20M
directed edges or more than 16 parts).

The wall-time targets live here, not in the tests (which never assert on time): the read time
of ``wave.graph.bz2`` (the ``read`` column of case 2) and the load time of case 3.

    python bench/partition.py [--side 100 [171 272 ...]] [--parts 64] [--cache DIR] [--json FILE]

Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _meshes import make_box_mesh

from meshshard.partition import build_graph, load_partition, partition_file, read_input
from meshshard.partition._progress import Steps, peak_rss_mb, reset_peak_rss

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
STEPS = ["read", "graph", "metis", "refine", "plans", "write"]


def cached_mesh(side: int, cache: Path) -> Path:
    import meshio

    path = cache / f"lattice-{side}.vtk"
    if not path.exists():
        start = time.perf_counter()
        points, tets = make_box_mesh(side, dtype=np.int32)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.vtk")
        meshio.write(tmp, meshio.Mesh(points, [("tetra", tets)]), binary=True)
        tmp.rename(path)
        print(f"generated {path} ({side**3:,} nodes, {len(tets):,} tets) in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def child(kind: str, path: Path, parts: int, out: Path) -> dict[str, object]:
    """Run one case in this (fresh) process: ``pipeline`` or ``bare`` METIS."""
    import pymetis

    if kind == "bare":
        graph = build_graph(read_input(path))
        adjacency = pymetis.CSRAdjacency(adj_starts=graph.indptr, adjacent=graph.indices)
        reset_peak_rss()
        start = time.perf_counter()
        pymetis.part_graph(parts, adjacency=adjacency, recursive=False,
                           options=pymetis.Options(seed=0, ufactor=30))
        return {"seconds": time.perf_counter() - start, "peak_mb": peak_rss_mb()}
    steps = Steps(track_memory=True)
    start = time.perf_counter()
    folder = partition_file(path, out, parts, force=True, steps=steps)
    total = time.perf_counter() - start
    meta = json.loads((folder / "partition.json").read_text())
    return {"nodes": meta["num_nodes"], "directed_edges": meta["num_edges"],
            "edge_cut": meta["edge_cut"], "imbalance": meta["imbalance"],
            "refinement": meta["refinement"], "metis": meta.get("metis"),
            "seconds": {**steps.seconds, "total": total}, "peak_mb": steps.peak_mb}


def in_child(kind: str, path: Path, parts: int, out: Path) -> dict[str, object]:
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        subprocess.run([sys.executable, __file__, "--child", kind, str(path), str(parts), str(out),
                        result.name], check=True)
        return json.loads(Path(result.name).read_text())


def run_case(name: str, path: Path, parts: int, out: Path) -> dict[str, object]:
    result = in_child("pipeline", path, parts, out / name.replace(" ", "-"))
    shutil.rmtree(out / name.replace(" ", "-"), ignore_errors=True)
    bare = in_child("bare", path, parts, out)
    seconds = result["seconds"]
    without_read = seconds["total"] - seconds.get("read", 0.0)
    peak = max(result["peak_mb"].values())
    return {
        "case": name, "parts": parts, **result, "peak_mb_max": peak,
        "peak_bytes_per_node": peak * 2**20 / result["nodes"],
        "bare_metis_seconds": bare["seconds"], "bare_metis_peak_mb": bare["peak_mb"],
        "without_read_over_bare_metis": without_read / bare["seconds"],
        "file_mb": path.stat().st_size / 2**20,
    }


def load_case(cache: Path, out: Path) -> dict[str, object]:
    path = cached_mesh(59, cache)  # 205,379 nodes
    folder = partition_file(path, out / "load200k", 8, force=True)
    times = []
    for rank in list(range(8)) * 3:
        start = time.perf_counter()
        shard = load_partition(folder, rank)
        times.append(time.perf_counter() - start)
    return {"case": "load_partition 200k/8", "nodes": shard.num_nodes, "parts": 8,
            "median_seconds": statistics.median(times), "max_seconds": max(times),
            "shard_file_mb": (folder / "part-00000.npz").stat().st_size / 2**20}


def print_table(results: list[dict[str, object]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=190)
    table = Table(title="meshshard partition: seconds (peak MiB) per step")
    for col in ["case", "nodes", "edges", "parts", *STEPS, "total", "bare METIS",
                "total-read / METIS", "peak B/node"]:
        table.add_column(col, justify="right")
    for r in results:
        if "seconds" not in r:
            continue
        s, m = r["seconds"], r["peak_mb"]
        cells = [f"{s[k]:.1f} ({m[k]:,.0f})" if k in s else "-" for k in STEPS]
        table.add_row(r["case"], f"{r['nodes']:,}", f"{r['directed_edges']:,}", str(r["parts"]),
                      *cells, f"{s['total']:.1f} ({r['peak_mb_max']:,.0f})",
                      f"{r['bare_metis_seconds']:.1f} ({r['bare_metis_peak_mb']:,.0f})",
                      f"{r['without_read_over_bare_metis']:.2f}",
                      f"{r['peak_bytes_per_node']:,.0f}")
    console.print(table)
    for r in results:
        if "median_seconds" in r:
            console.print(f"{r['case']}: median {r['median_seconds'] * 1e3:.1f} ms, max "
                          f"{r['max_seconds'] * 1e3:.1f} ms per rank ({r['shard_file_mb']:.1f} "
                          "MB part file)")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, path, parts, out, result = sys.argv[2:]
        Path(result).write_text(json.dumps(child(kind, Path(path), int(parts), Path(out))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", type=int, nargs="+", default=[100],
                        help="lattice sides (nodes = side^3), one case each")
    parser.add_argument("--parts", type=int, default=64)
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "meshshard-bench")
    parser.add_argument("--no-wave", action="store_true", help="skip case 2")
    parser.add_argument("--no-load", action="store_true", help="skip case 3")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    out = args.cache / "out"
    results = []
    for side in args.side:
        results.append(run_case(f"tet lattice {side}^3", cached_mesh(side, args.cache),
                                args.parts, out))
    wave = DATA / "walshaw" / "wave.graph.bz2"
    if wave.exists() and not args.no_wave:
        results.append(run_case("wave.graph.bz2", wave, args.parts, out))
    if not args.no_load:
        results.append(load_case(args.cache, out))
    print_table(results)
    text = json.dumps({"results": results}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
