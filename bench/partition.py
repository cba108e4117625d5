"""Benchmark of ``meshshard partition``: time and peak memory per step, against bare METIS.

Cases:

1. a generated 3-D tetrahedral mesh, ``n^3`` nodes (default n = 100: 1,000,000 nodes,
   5.8 M tets), a jittered lattice with each cube split into 6 tets (Kuhn), written once as a
   binary legacy VTK file in a cache folder and read back through meshio (meshio's VTU reader
   decodes base64 XML and is about 5 times slower on the same mesh);
2. ``walshaw/wave.graph.bz2`` (156,317 nodes, 1,059,331 edges) from ``../shared/data``;
3. ``load_partition`` of one rank's shard of a ~200k-node mesh split 8 ways (target < 0.1 s).

The wall-time targets live here, not in the tests (which never assert on time): the read time
of ``wave.graph.bz2`` (the ``read`` column of case 2) and the load time of case 3.

For 1 and 2 one METIS k-way call (same graph, seed 0, ncuts 1) is also made bare, in the same
run; ``total / bare METIS`` is the pipeline's cost over that call, its METIS search included
(``--tries`` x up to two variants; 1 try per variant from 20M directed edges).

    python bench/partition.py [--side 100] [--parts 8] [--cache DIR] [--json FILE]

Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path


from _meshes import make_box_mesh
from meshshard.partition import build_graph, load_partition, partition_file, read_input
from meshshard.partition._progress import Steps

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cached_mesh(side: int, cache: Path) -> Path:
    import meshio

    path = cache / f"lattice-{side}.vtk"
    if not path.exists():
        start = time.perf_counter()
        points, tets = make_box_mesh(side)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.vtk")
        meshio.write(tmp, meshio.Mesh(points, [("tetra", tets)]), binary=True)
        tmp.rename(path)
        print(f"generated {path} ({side**3:,} nodes, {len(tets):,} tets) in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def bare_metis(path: Path, parts: int) -> float:
    """One METIS call (k-way, seed 0, ufactor 30, ncuts 1), timed alone. The pipeline's default
    search makes up to two calls (k-way and recursive) of ``ncuts`` tries each (recorded as
    ``metis`` in the result), so ``total / bare METIS`` includes that search."""
    import pymetis

    graph = build_graph(read_input(path))
    adjacency = pymetis.CSRAdjacency(adj_starts=graph.indptr, adjacent=graph.indices)
    start = time.perf_counter()
    pymetis.part_graph(parts, adjacency=adjacency, recursive=False,
                       options=pymetis.Options(seed=0, ufactor=30))
    return time.perf_counter() - start


def run_case(name: str, path: Path, parts: int, out: Path) -> dict[str, object]:
    steps = Steps()
    start = time.perf_counter()
    folder = partition_file(path, out / name, parts, force=True, steps=steps)
    total = time.perf_counter() - start
    meta = json.loads((folder / "partition.json").read_text())
    metis = bare_metis(path, parts)
    return {
        "case": name, "nodes": meta["num_nodes"], "directed_edges": meta["num_edges"],
        "parts": parts, "edge_cut": meta["edge_cut"], "imbalance": meta["imbalance"],
        "refinement": meta["refinement"], "metis": meta.get("metis"),
        "seconds": {**steps.seconds, "total": total},
        "bare_metis_seconds": metis, "total_over_bare_metis": total / metis,
        "peak_rss_mb_after": peak_rss_mb(),
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

    steps = ["read", "graph", "metis", "refine", "plans", "write", "total"]
    table = Table(title="meshshard partition benchmark (seconds)")
    for col in ["case", "nodes", "edges", *steps, "bare METIS", "total/METIS", "peak RSS MB"]:
        table.add_column(col, justify="right")
    for r in results:
        if "seconds" not in r:
            continue
        s = r["seconds"]
        table.add_row(r["case"], f"{r['nodes']:,}", f"{r['directed_edges']:,}",
                      *(f"{s[k]:.2f}" if k in s else "-" for k in steps),
                      f"{r['bare_metis_seconds']:.2f}", f"{r['total_over_bare_metis']:.2f}",
                      f"{r['peak_rss_mb_after']:.0f}")
    console = Console(stderr=True, width=170)
    console.print(table)
    for r in results:
        if "median_seconds" in r:
            console.print(f"{r['case']}: median {r['median_seconds'] * 1e3:.1f} ms, max "
                          f"{r['max_seconds'] * 1e3:.1f} ms per rank ({r['shard_file_mb']:.1f} "
                          "MB part file)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", type=int, default=100, help="lattice side (nodes = side^3)")
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "meshshard-bench")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    out = args.cache / "out"
    results = [run_case(f"tet lattice {args.side}^3", cached_mesh(args.side, args.cache),
                        args.parts, out)]
    wave = DATA / "walshaw" / "wave.graph.bz2"
    if wave.exists():
        results.append(run_case("wave.graph.bz2", wave, args.parts, out))
    results.append(load_case(args.cache, out))
    print_table(results)
    text = json.dumps({"results": results, "peak_rss_mb": peak_rss_mb()}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
