"""Benchmark of the distributed ``meshshard partition``: what each process holds, at P = 1, 2, 4.

A jittered ``side^3`` tetrahedral lattice (``bench/_meshes.py``; ``--side 100``: 1,000,000 nodes, 5.8 M
tets) is written once as a ``.vtkhdf``. Then, each in fresh processes:

- ``one``: the one-process pipeline, ``partition_file(MESH.vtkhdf, method="morton")``;
- ``P = 1, 2, 4``: ``torchrun --nproc-per-node P`` processes running ``partition_distributed`` (gloo).

Per process it reports the peak resident memory during the partition above what the process held before
it (Linux ``VmHWM`` after a reset; the interpreter, numpy, h5py and torch are loaded before), that peak in
bytes per node of the mesh and per node of the process's share (``N / P``), and numpy's own peak
(``tracemalloc``; numpy reports its arrays to it). Wall times are printed too; nothing asserts on them.
The largest array a process holds is checked by ``tests/comm/test_partition_ranks.py``.

    python bench/partition_distributed.py [--side 100] [--parts 16] [--procs 1 2 4] [--json FILE]

``--engines`` instead compares the quality of each engine's parts on the same mesh and graph: the edge cut
and load imbalance of one-process METIS (the reference), of the Morton cut (one process and the geometric
engine at each P), of PT-Scotch under ``mpirun -n P`` and of KaMinPar (one process, threads), where
installed; wall times beside them (nothing asserts on them):

    python bench/partition_distributed.py --engines [--side 60] [--parts 16] [--procs 1 2 4] [--json FILE]

Run it under ``prlimit --as=6000000000`` on a shared machine. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _meshes import make_box_mesh


def _measure(run) -> dict:
    """Run ``run()`` with the peak resident memory reset before and tracemalloc on."""
    import tracemalloc

    from meshshard.partition._progress import peak_rss_mb, reset_peak_rss

    with open("/proc/self/statm") as file:
        before_mb = int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    reset_peak_rss()
    tracemalloc.start()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"seconds": seconds, "rss_before_mb": before_mb, "peak_rss_mb": peak_rss_mb(),
            "numpy_peak_mb": traced / 2**20}


def worker(mesh: str, out: str, parts: int, result: str) -> None:
    """One process of ``torchrun``: partition, then process 0 writes every process's figures."""
    import h5py  # noqa: F401 - loaded before the measure, as torch is

    from meshshard.comm import ArrayExchange, init_distributed
    from meshshard.partition import partition_distributed

    init_distributed("gloo")
    ex = ArrayExchange()
    found = _measure(lambda: partition_distributed(mesh, out, parts, ex, force=True))
    every = ex.all_gather(found)
    if ex.rank == 0:
        Path(result).write_text(json.dumps(every))


def one_process(mesh: str, out: str, parts: int, result: str) -> None:
    """The one-process pipeline, in this (fresh) process."""
    import h5py  # noqa: F401

    from meshshard.partition import partition_file

    found = _measure(lambda: partition_file(mesh, out, parts, method="morton", force=True))
    Path(result).write_text(json.dumps([found]))


def run_case(mode: str, procs: int, mesh: Path, parts: int, tmp: Path) -> list[dict]:
    result = tmp / f"{mode}-{procs}.json"
    here = str(Path(__file__).resolve())
    args = [str(mesh), str(tmp / f"parts-{mode}-{procs}"), str(parts), str(result)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "600"}
    if mode == "one":
        cmd = [sys.executable, here, "--one", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), here,
               "--worker", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(result.read_text())


def _quality(folder: Path, engine: str, processes: int, seconds: float) -> dict:
    from meshshard.partition import read_metadata

    meta = read_metadata(folder)
    return {"engine": engine, "processes": processes, "edge_cut": meta["edge_cut"],
            "load_imbalance": meta["load_imbalance"], "seconds": seconds}


def scotch_worker(mesh: str, out: str, parts: int) -> None:
    """One process of ``mpirun``: the PT-Scotch partition."""
    from meshshard.comm import MPIExchange
    from meshshard.partition import partition_distributed

    partition_distributed(mesh, out, parts, MPIExchange(), engine="ptscotch", force=True)


def engine_quality(mesh: Path, parts: int, procs: list[int], tmp: Path) -> list[dict]:
    """Edge cut and load imbalance of every engine against one-process METIS on the same graph (``--engines``)."""
    import importlib.util
    import shutil

    from meshshard.partition import partition_file

    rows = []
    for method in ("metis", "morton", "kaminpar"):
        if method == "kaminpar" and importlib.util.find_spec("kaminpar") is None:
            print("kaminpar: not installed (pip install kaminpar)", file=sys.stderr)
            continue
        start = time.perf_counter()
        folder = partition_file(mesh, tmp / f"q-{method}", parts, method=method, force=True)
        rows.append(_quality(folder, method if method != "morton" else "morton (one process)", 1,
                             time.perf_counter() - start))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "600", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    here = str(Path(__file__).resolve())
    for p in procs:
        runs = {"geometric": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(p),
                              "-m", "meshshard", "partition"],
                "ptscotch": ["mpirun", "-n", str(p), sys.executable, here, "--scotch-worker"]}
        for engine, cmd in runs.items():
            if engine == "ptscotch" and (shutil.which("mpirun") is None or importlib.util.find_spec("pyscotch") is None):
                print("ptscotch: mpirun or pyscotch is not installed (docs/partition.md)", file=sys.stderr)
                continue
            out = tmp / f"q-{engine}-{p}"
            args = [str(mesh), str(out), str(parts)] if engine == "ptscotch" else \
                [str(mesh), "--parts", str(parts), "--out", str(out), "--quiet", "--force"]
            start = time.perf_counter()
            done = subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(cmd + args)} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
            rows.append(_quality(out, engine, p, time.perf_counter() - start))
    reference = rows[0]["edge_cut"]
    for r in rows:
        r["cut_vs_metis"] = r["edge_cut"] / reference if reference else None
    return rows


def print_quality(n: int, parts: int, rows: list[dict]) -> None:
    print(f"{n:,} nodes, {parts} parts: edge cut and load imbalance by engine (METIS in one process = 1.00)")
    print(f"{'engine':<22}{'P':>3}{'edge cut':>11}{'vs METIS':>10}{'imbalance':>11}{'seconds':>9}")
    for r in rows:
        print(f"{r['engine']:<22}{r['processes']:>3}{r['edge_cut']:>11,}{r['cut_vs_metis']:>10.2f}"
              f"{r['load_imbalance']:>11.4f}{r['seconds']:>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=100, help="lattice side: side^3 nodes (default 100: 1M)")
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--json", default=None, help="also write the JSON here")
    parser.add_argument("--worker", nargs=4, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=4, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engines", action="store_true",
                        help="compare the edge cut and imbalance of each engine with one-process METIS instead")
    parser.add_argument("--scotch-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scotch_worker:
        return scotch_worker(*args.scotch_worker[:2], int(args.scotch_worker[2]))
    if args.worker:
        return worker(*args.worker[:2], int(args.worker[2]), args.worker[3])
    if args.one:
        return one_process(*args.one[:2], int(args.one[2]), args.one[3])
    from meshshard.partition import write_vtkhdf

    with tempfile.TemporaryDirectory(prefix="meshshard-bench-") as folder:
        tmp = Path(folder)
        points, tets = make_box_mesh(args.side)
        n = len(points)
        mesh = write_vtkhdf(tmp / "lattice.vtkhdf", points, [("tetra", tets)])
        del points, tets
        if args.engines:
            rows = engine_quality(mesh, args.parts, args.procs, tmp)
            print_quality(n, args.parts, rows)
            report = {"nodes": n, "parts": args.parts, "engines": rows}
            print(json.dumps(report))
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=1))
            return
        cases = [("one", 1)] + [("distributed", p) for p in args.procs]
        results = []
        for mode, procs in cases:
            for rank, found in enumerate(run_case(mode, procs, mesh, args.parts, tmp)):
                held = found["peak_rss_mb"] - found["rss_before_mb"] if found["peak_rss_mb"] else None
                results.append({"mode": mode, "processes": procs, "rank": rank, **found, "held_mb": held,
                                "bytes_per_node": None if held is None else held * 2**20 / n,
                                "bytes_per_share_node": None if held is None else held * 2**20 / (n / procs)})
    print(f"{n:,} nodes, {args.parts} parts")
    print(f"{'run':<14}{'rank':>5}{'seconds':>9}{'held MiB':>10}{'B/node':>8}{'B/(N/P)':>9}{'numpy MiB':>11}")
    for r in results:
        name = "one process" if r["mode"] == "one" else f"P = {r['processes']}"
        print(f"{name:<14}{r['rank']:>5}{r['seconds']:>9.1f}{r['held_mb']:>10.0f}{r['bytes_per_node']:>8.0f}"
              f"{r['bytes_per_share_node']:>9.0f}{r['numpy_peak_mb']:>11.0f}")
    report = {"nodes": n, "parts": args.parts, "results": results}
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
