"""Benchmark of the distributed ``meshshard partition``: what each process holds, at P = 1, 2, 4,
against today's one process (the default ``meshshard partition``: METIS).

A jittered ``side^3`` tetrahedral lattice (``bench/_meshes.py``; ``--side 100``: 1,000,000 nodes, 5.8 M
tets; ``--side 272``: 20.1 M nodes, 119 M tets) is written once as a ``.vtkhdf``, slab by slab
(``write_vtkhdf_slabs``: the generator holds a few lattice layers, never the mesh). Then, each in fresh
processes:

- ``metis``: the default one-process pipeline, ``partition_file(MESH.vtkhdf)`` (METIS): today's peak, and
  the edge cut and imbalance each other run is compared with (``cut / METIS``, ``imbalance / METIS``);
- ``one``: one process, ``--method morton`` (the assignment the geometric engine makes);
- ``P = 1, 2, 4``: ``torchrun --nproc-per-node P`` processes running ``partition_distributed`` (gloo).

Per process it reports the peak resident memory during the partition above what the process held before
it (Linux ``VmHWM`` after a reset; the interpreter, numpy, h5py and torch are loaded before), that peak in
bytes per node of the mesh and per node of the process's share (``N / P``), numpy's own peak
(``tracemalloc``; numpy reports its arrays to it), the process's peak address space (``VmPeak``, what
``prlimit --as`` bounds), and the wall time and peak resident memory of each stage. Per run: the edge cut
and the imbalance. Nothing asserts on time. The largest array a process holds is checked by
``tests/comm/test_partition_ranks.py``.

``--cap BYTES`` is the memory-cap demonstration instead: the same mesh, ``meshshard partition`` in one
process (METIS) and then ``torchrun --nproc-per-node 4 -m meshshard partition`` (``--cap-procs``), each
process under an address-space limit of ``BYTES`` (``setrlimit(RLIMIT_AS)`` in the child, as ``prlimit
--as`` sets it; a cgroup's memory limit is the batch system's, not this script's), then ``meshshard
verify`` on what the processes wrote. Pick ``BYTES`` between the two runs' ``VmPeak`` of the table. It
reports each run's exit, how it ended (``ok``, ``out of memory``: the command's one line on
``MemoryError``, or killed by a signal) and its largest process's peak resident memory.

    python bench/partition_distributed.py [--side 100] [--parts 16] [--procs 1 2 4] [--json FILE]
    python bench/partition_distributed.py --side 100 --parts 16 --cap 1500000000
    python bench/partition_distributed.py --side 272 --parts 64     # 20M nodes: ~15 GB free, TMPDIR with 25 GB

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
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _meshes import box_mesh_slabs

#: The one-process runs: name -> ``--method`` (``metis`` is ``meshshard partition``'s default).
ONE_PROCESS = {"metis": "metis", "one": "morton"}


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as file:
            line = next((x for x in file if x.startswith(field + ":")), None)
    except OSError:
        return None
    return int(line.split()[1]) / 1024 if line else None


def _measure(run) -> dict:
    """Run ``run(steps)`` with the peak resident memory reset before, each stage's peak, and tracemalloc on."""
    import tracemalloc

    from meshshard.partition._progress import Steps, peak_rss_mb, reset_peak_rss

    with open("/proc/self/statm") as file:
        before_mb = int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    steps = Steps(track_memory=True)  # resets the peak at each stage: the peak is the stages' largest
    reset_peak_rss()
    tracemalloc.start()
    start = time.perf_counter()
    run(steps)
    seconds = time.perf_counter() - start
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    peak = max([peak_rss_mb() or 0.0, *steps.peak_mb.values()]) or None
    return {"seconds": seconds, "rss_before_mb": before_mb, "peak_rss_mb": peak, "numpy_peak_mb": traced / 2**20,
            "vm_peak_mb": _status_mb("VmPeak"), "stage_seconds": steps.seconds, "stage_peak_mb": steps.peak_mb}


def worker(mesh: str, out: str, parts: int, result: str) -> None:
    """One process of ``torchrun``: partition, then process 0 writes every process's figures."""
    import h5py  # noqa: F401 - loaded before the measure, as torch is

    from meshshard.comm import ArrayExchange, init_distributed
    from meshshard.partition import partition_distributed

    init_distributed("gloo")
    ex = ArrayExchange()
    found = _measure(lambda steps: partition_distributed(mesh, out, parts, ex, force=True, steps=steps))
    every = ex.all_gather(found)
    if ex.rank == 0:
        Path(result).write_text(json.dumps(every))


def one_process(method: str, mesh: str, out: str, parts: int, result: str) -> None:
    """The one-process pipeline with ``method``, in this (fresh) process."""
    import h5py  # noqa: F401

    from meshshard.partition import partition_file

    found = _measure(lambda steps: partition_file(mesh, out, parts, method=method, force=True, steps=steps))
    Path(result).write_text(json.dumps([found]))


def _folder_quality(folder: Path) -> dict:
    """The edge cut and imbalance a run recorded."""
    meta = json.loads((folder / "partition.json").read_text())
    return {"edge_cut": meta["edge_cut"], "imbalance": meta["imbalance"], "directed_edges": meta["num_edges"]}


def run_case(mode: str, procs: int, mesh: Path, parts: int, tmp: Path) -> tuple[list[dict], dict]:
    """One run in fresh processes: every process's figures, and the partition's quality (its folder is
    then removed: at 20M nodes each is 7 GB)."""
    result = tmp / f"{mode}-{procs}.json"
    folder = tmp / f"parts-{mode}-{procs}"
    here = str(Path(__file__).resolve())
    args = [str(mesh), str(folder), str(parts), str(result)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "1800"}
    if mode in ONE_PROCESS:
        cmd = [sys.executable, here, "--one", ONE_PROCESS[mode], *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), here,
               "--worker", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    quality = _folder_quality(folder)
    shutil.rmtree(folder)
    return json.loads(result.read_text()), quality


def against_metis(runs: list[dict]) -> None:
    """Each run's edge cut and imbalance over the METIS run's (on the same graph), in place."""
    metis = next((r for r in runs if r["mode"] == "metis"), None)
    for r in runs:
        r["cut_vs_metis"] = r["edge_cut"] / metis["edge_cut"] if metis and metis["edge_cut"] else None
        r["imbalance_vs_metis"] = r["imbalance"] / metis["imbalance"] if metis else None


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


def _run_name(mode: str, procs: int) -> str:
    return {"metis": "METIS, 1 proc", "one": "morton, 1 proc"}.get(mode, f"P = {procs}")


def print_tables(n: int, parts: int, results: list[dict], runs: list[dict]) -> None:
    print(f"{n:,} nodes, {parts} parts")
    print(f"{'run':<16}{'rank':>5}{'seconds':>9}{'held MiB':>10}{'B/node':>8}{'B/(N/P)':>9}{'numpy MiB':>11}"
          f"{'VmPeak MiB':>12}")
    for r in results:
        print(f"{_run_name(r['mode'], r['processes']):<16}{r['rank']:>5}{r['seconds']:>9.1f}{r['held_mb']:>10.0f}"
              f"{r['bytes_per_node']:>8.0f}{r['bytes_per_share_node']:>9.0f}{r['numpy_peak_mb']:>11.0f}"
              f"{r['vm_peak_mb'] or 0:>12.0f}")
    print(f"\n{'run':<16}{'edge cut':>11}{'/ METIS':>9}{'imbalance':>11}{'/ METIS':>9}  seconds per stage (slowest process)")
    for r in runs:
        cut, imb = r["cut_vs_metis"], r["imbalance_vs_metis"]
        stages = "  ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds"].items())
        print(f"{_run_name(r['mode'], r['processes']):<16}{r['edge_cut']:>11,}{'-' if cut is None else f'{cut:.2f}':>9}"
              f"{r['imbalance']:>11.4f}{'-' if imb is None else f'{imb:.3f}':>9}  {stages}")


def _capped(cap: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return limit


def run_capped(cap: int, result: str, cmd: list[str]) -> None:
    """In this (fresh) process: run ``cmd`` with its address space capped at ``cap`` bytes (every process
    it starts inherits the cap), and write how it ended and its largest process's peak resident memory."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "600"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, preexec_fn=_capped(cap))
    lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
    said = "\n".join(lines)
    if done.returncode == 0:
        outcome = "ok"
    elif done.returncode < 0:
        outcome = f"killed by {signal.Signals(-done.returncode).name}"
    elif "MemoryError" in said or "out of memory" in said.lower() or "Cannot allocate memory" in said:
        outcome = "out of memory"
    elif any(s in said for s in ("SIGSEGV", "SIGKILL", "SIGABRT", "Signal 11", "Signal 9", "Signal 6")):
        outcome = "killed by a signal"
    else:
        outcome = "failed"
    error_lines = [x for x in lines if x.startswith("meshshard")]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    Path(result).write_text(json.dumps({"exit": done.returncode, "outcome": outcome, "largest_peak_rss_mb": peak,
                                        "message": (error_lines or lines or [""])[-1][:400]}))


def cap_demo(mesh: Path, parts: int, cap: int, procs: int, tmp: Path) -> dict:
    """One process, then ``procs`` processes, each under the address-space cap ``cap``; then verify."""
    here = str(Path(__file__).resolve())
    meshshard = [sys.executable, "-m", "meshshard"]
    runs = {"one process (METIS)": [*meshshard, "partition", str(mesh), "--parts", str(parts), "--out",
                                    str(tmp / "capped-one"), "--quiet"],
            f"{procs} processes": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                   str(procs), "-m", "meshshard", "partition", str(mesh), "--parts", str(parts),
                                   "--out", str(tmp / "capped-dist"), "--quiet"]}
    report = {"cap_bytes": cap, "runs": {}}
    for name, cmd in runs.items():
        result = tmp / "capped.json"
        subprocess.run([sys.executable, here, "--run-capped", str(cap), str(result), "--", *cmd], check=True,
                       timeout=3600)
        report["runs"][name] = json.loads(result.read_text())
        result.unlink()
    if report["runs"][f"{procs} processes"]["outcome"] == "ok":
        done = subprocess.run([*meshshard, "verify", str(tmp / "capped-dist")], capture_output=True, text=True,
                              timeout=3600)
        report["verify"] = {"exit": done.returncode, "message": (done.stdout + done.stderr).strip()[-400:]}
    return report


def print_cap(n: int, parts: int, report: dict) -> None:
    print(f"{n:,} nodes, {parts} parts, each process's address space capped at {report['cap_bytes']:,} bytes")
    for name, r in report["runs"].items():
        print(f"{name:<22} exit {r['exit']:>4}  {r['outcome']:<20} largest process {r['largest_peak_rss_mb']:,.0f} MiB"
              f"  {r['message']}")
    if "verify" in report:
        print(f"meshshard verify: exit {report['verify']['exit']}")


def write_mesh(side: int, path: Path) -> Path:
    from meshshard.partition._vtkhdf import write_vtkhdf_slabs

    return write_vtkhdf_slabs(path, side**3, 6 * (side - 1) ** 3, "tetra", box_mesh_slabs(side))


def bench(args: argparse.Namespace, mesh: Path, n: int, tmp: Path) -> dict:
    cases = [(mode, 1) for mode in args.one_process] + [("distributed", p) for p in args.procs]
    results, runs = [], []
    for mode, procs in cases:
        every, quality = run_case(mode, procs, mesh, args.parts, tmp)
        stage_seconds = {k: max(f["stage_seconds"][k] for f in every) for k in every[0]["stage_seconds"]}
        runs.append({"mode": mode, "processes": procs, **quality, "stage_seconds": stage_seconds})
        for rank, found in enumerate(every):
            held = found["peak_rss_mb"] - found["rss_before_mb"] if found["peak_rss_mb"] else None
            results.append({"mode": mode, "processes": procs, "rank": rank, **found, "held_mb": held,
                            "bytes_per_node": None if held is None else held * 2**20 / n,
                            "bytes_per_share_node": None if held is None else held * 2**20 / (n / procs)})
    against_metis(runs)
    print_tables(n, args.parts, results, runs)
    return {"nodes": n, "parts": args.parts, "results": results, "runs": runs}


def main() -> None:
    if sys.argv[1:2] == ["--run-capped"]:  # --run-capped CAP RESULT -- COMMAND...: a child of cap_demo
        cap, result, _, *cmd = sys.argv[2:]
        return run_capped(int(cap), result, cmd)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=100, help="lattice side: side^3 nodes (default 100: 1M)")
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--one-process", nargs="*", choices=list(ONE_PROCESS), default=list(ONE_PROCESS),
                        help="the one-process runs (default: metis one); without metis, no ratios to METIS")
    parser.add_argument("--cap", type=int, default=None, help="the memory-cap demonstration, at this many bytes")
    parser.add_argument("--cap-procs", type=int, default=4, help="processes of the capped distributed run")
    parser.add_argument("--json", default=None, help="also write the JSON here")
    parser.add_argument("--worker", nargs=4, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=5, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engines", action="store_true",
                        help="compare the edge cut and imbalance of each engine with one-process METIS instead")
    parser.add_argument("--scotch-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scotch_worker:
        return scotch_worker(*args.scotch_worker[:2], int(args.scotch_worker[2]))
    if args.worker:
        return worker(*args.worker[:2], int(args.worker[2]), args.worker[3])
    if args.one:
        return one_process(*args.one[:3], int(args.one[3]), args.one[4])
    with tempfile.TemporaryDirectory(prefix="meshshard-bench-") as folder:
        tmp = Path(folder)
        start = time.perf_counter()
        mesh = write_mesh(args.side, tmp / "lattice.vtkhdf")
        n = args.side**3
        print(f"wrote {mesh.name} ({n:,} nodes) in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        if args.engines:
            rows = engine_quality(mesh, args.parts, args.procs, tmp)
            print_quality(n, args.parts, rows)
            report = {"nodes": n, "parts": args.parts, "engines": rows}
        elif args.cap is not None:
            report = {"nodes": n, "parts": args.parts, **cap_demo(mesh, args.parts, args.cap, args.cap_procs, tmp)}
            print_cap(n, args.parts, report)
        else:
            report = bench(args, mesh, n, tmp)
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
