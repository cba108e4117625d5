"""Benchmark of ``meshshard train``: peak memory per rank on the 1M-node dataset, 1, 2 and 4 ranks.

The dataset is the one of ``bench/dataset.py`` (a ``side^3``-node tetrahedral box, default side
100: 1,000,000 nodes; ``samples`` samples of inputs ``a``, ``b`` and target ``c``), built into the
same cache folder when missing and reused otherwise. For each rank count P it runs::

    meshshard partition DATA --parts P --out PARTS      (reused when present)
    meshshard train PARTS --data DATA --out RUN --nproc P --steps S --latent L --mp-steps M
        --log-every 1 --val-every S

and reads each rank's peak resident memory (``ru_maxrss``) and the throughput from the last step
of ``RUN/log.jsonl``. The validation pass over the validation split runs before the first step,
so the peak covers it. It also measures the baseline of an idle rank on P ranks (the same
launcher, ``import torch`` and the ``meshshard`` layers, the process group, one all-reduce), so
the part that scales with the shard is visible:

- ``peak - idle``: the rank's memory for its graph, sample and activations; O(N/P + halo) means
  it halves from 1 to 2 ranks, and ``(peak - idle) / (owned + ghost)`` stays about constant;
- the ratio of the largest rank's peak to the one-rank peak.

The peak RSS is what the process holds, not what its tensors hold. glibc raises its mmap
threshold after large frees (up to 32 MB), so freed blocks under it stay in the heap and RSS creeps
up from step to step, most where a rank's tensors are a few MB to a few tens of MB (many ranks, or
a small mesh). Each rank of ``meshshard train`` therefore fixes its threshold at 1 MiB
(``meshshard.comm.fix_mmap_threshold``): every larger block is returned to the system when
freed. ``--glibc-dynamic`` runs the ranks with glibc's own dynamic threshold instead
(``MESHSHARD_MMAP_THRESHOLD=0``); ``--mmap-threshold BYTES`` with another fixed one
(``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=BYTES``, which the ranks leave alone).

    python bench/train_memory.py [--side 100] [--samples 20] [--ranks 1,2,4] [--steps 2]
                                 [--latent 16] [--mp-steps 2] [--mmap-threshold BYTES | --glibc-dynamic]
                                 [--cache DIR] [--json FILE]
    python bench/train_memory.py --side 30 --samples 4     # smoke check, about a minute

Prints a table, then one JSON object. Run it under ``flock /tmp/meshshard-heavy.lock``: at side
100 one rank peaks at several GB.
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
from typing import Any

from _runner import emit, ensure_partition

from meshshard.cli import command_argv


def ensure_dataset(cache: Path, side: int, samples: int) -> tuple[Path, float]:
    """The dataset folder of ``bench/dataset.py`` (built when missing); returns it and the seconds spent."""
    from dataset import make_sources

    out = cache / f"dataset-{side}-{samples}-vtu"
    if (out / "dataset.json").is_file():
        return out, 0.0
    start = time.perf_counter()
    src = cache / f"dataset-src-{side}-{samples}-vtu"
    make_sources(src, side, samples, "vtu")
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([*command_argv(), "dataset", str(src), "--out", str(out), "--inputs", "a,b", "--targets", "c", "--quiet"],
                   check=True)
    return out, time.perf_counter() - start


def _idle_worker(report: str) -> None:
    """One idle rank: what every training rank holds before its shard (torch, meshshard, the group)."""
    import torch
    import torch.distributed as dist

    import meshshard.nn  # noqa: F401 - the layers' imports, as a training rank has them
    from meshshard.comm import init_distributed
    from meshshard.run._report import gather_peak_memory

    ctx = init_distributed()
    if dist.is_initialized():
        dist.all_reduce(torch.ones(1))
    memory = gather_peak_memory(ctx.device)
    if ctx.rank == 0:
        Path(report).write_text(json.dumps(memory))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def idle_baseline(num_ranks: int, folder: Path) -> list[float]:
    """Peak RSS (MB) of each of ``num_ranks`` idle ranks, started as ``meshshard train --nproc`` starts them."""
    report = folder / f"idle-{num_ranks}.json"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import train_memory; "
            "from meshshard.comm import launch_local; "
            "launch_local(train_memory._idle_worker, int(sys.argv[2]), sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(num_ranks), str(report)], check=True)
    return json.loads(report.read_text())["peak_rss_mb"]


def last_memory_record(log: Path) -> dict[str, Any]:
    """The last step record of a log.jsonl that carries memory."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "peak_rss_mb" in r]
    if not steps:
        raise SystemExit(f"{log}: no step record with peak_rss_mb")
    return steps[-1]


def run_one(args: argparse.Namespace, data: Path, work: Path, num_ranks: int) -> dict[str, Any]:
    from meshshard.partition import read_metadata

    parts = work / f"parts-{num_ranks}"
    partition_s = ensure_partition(data, parts, num_ranks)
    meta = read_metadata(parts)
    run = work / f"run-{num_ranks}"
    cmd = [*command_argv(), "train", str(parts), "--data", str(data), "--out", str(run), "--nproc", str(num_ranks),
           "--steps", str(args.steps), "--latent", str(args.latent), "--mp-steps", str(args.mp_steps),
           "--log-every", "1", "--force", "--quiet"]
    if not args.no_val:
        cmd += ["--val-every", str(args.steps)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    train_s = time.perf_counter() - start
    record = last_memory_record(run / "log.jsonl")
    idle = idle_baseline(num_ranks, work)
    peak = record["peak_rss_mb"]
    local = [p["num_owned"] + p["num_ghost"] for p in meta["parts"]]
    above = [max(0.0, m - i) for m, i in zip(peak, idle, strict=True)]
    return {
        "ranks": num_ranks, "num_nodes": meta["num_nodes"],
        "owned": [p["num_owned"] for p in meta["parts"]], "ghost": [p["num_ghost"] for p in meta["parts"]],
        "local_edges": [p["num_edges"] for p in meta["parts"]],
        "peak_rss_mb": peak, "idle_rss_mb": idle,
        "max_peak_mb": max(peak), "mean_peak_mb": round(sum(peak) / len(peak), 1),
        "max_above_idle_mb": round(max(above), 1),
        "bytes_per_local_node": [round(a * 2**20 / n) for a, n in zip(above, local, strict=True)],
        "step_s": record["seconds"], "nodes_per_s": record["nodes_per_s"],
        "partition_s": round(partition_s, 1), "train_command_s": round(train_s, 1),
    }


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    one = rows[0] if rows and rows[0]["ranks"] == 1 else None
    table = Table(title=title)
    for col in ["ranks", "owned + ghost per rank (max)", "ghost (max)", "peak RSS MB max", "peak RSS MB mean",
                "x 1 rank", "idle rank MB", "peak - idle MB (max)", "x 1 rank ", "bytes per local node",
                "step s", "nodes/s"]:
        table.add_column(col, justify="right")
    for r in rows:
        local = max(o + g for o, g in zip(r["owned"], r["ghost"], strict=True))
        ratio = f"{r['max_peak_mb'] / one['max_peak_mb']:.2f}" if one else "-"
        ratio_above = f"{r['max_above_idle_mb'] / one['max_above_idle_mb']:.2f}" if one and one["max_above_idle_mb"] else "-"
        table.add_row(str(r["ranks"]), f"{local:,}", f"{max(r['ghost']):,}", f"{r['max_peak_mb']:,.0f}",
                      f"{r['mean_peak_mb']:,.0f}", ratio, f"{max(r['idle_rss_mb']):,.0f}",
                      f"{r['max_above_idle_mb']:,.0f}", ratio_above,
                      f"{min(r['bytes_per_local_node']):,}..{max(r['bytes_per_local_node']):,}",
                      f"{r['step_s']:.2f}", f"{r['nodes_per_s']:,}")
    Console(width=200).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=100, help="lattice side: side^3 nodes")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--latent", type=int, default=16)
    parser.add_argument("--mp-steps", type=int, default=2)
    parser.add_argument("--mmap-threshold", type=int, default=0,
                        help="run the ranks with glibc's mmap threshold fixed at this many bytes (0: glibc's default)")
    parser.add_argument("--glibc-dynamic", action="store_true",
                        help="run the ranks with glibc's dynamic mmap threshold (MESHSHARD_MMAP_THRESHOLD=0)")
    parser.add_argument("--no-val", action="store_true", help="no validation pass (it runs before step 0 otherwise)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/meshshard-bench"),
                        help="folder for the dataset (shared with bench/dataset.py), partitions and runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON result to this file")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    if args.side < 2 or args.steps < 1 or not ranks or min(ranks) < 1:
        parser.error("Expected --side >= 2, --steps >= 1 and positive --ranks")

    data, built_s = ensure_dataset(args.cache, args.side, args.samples)
    if args.glibc_dynamic:
        os.environ["MESHSHARD_MMAP_THRESHOLD"] = "0"
    if args.mmap_threshold:  # read by glibc when each rank starts; this process keeps its allocator
        os.environ["GLIBC_TUNABLES"] = ":".join(
            [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and "mmap_threshold" not in t]
            + [f"glibc.malloc.mmap_threshold={args.mmap_threshold}"])
    work = args.cache / f"train-memory-{args.side}-{args.samples}"
    work.mkdir(parents=True, exist_ok=True)
    rows = [run_one(args, data, work, p) for p in sorted(ranks)]
    title = (f"meshshard train, peak memory per rank: {rows[0]['num_nodes']:,}-node tet mesh, MeshGraphNet latent "
             f"{args.latent}, {args.mp_steps} message-passing steps, float32, {args.steps} steps; allocator: "
             + (f"glibc, mmap threshold {args.mmap_threshold:,} B" if args.mmap_threshold
                else "glibc, dynamic mmap threshold" if args.glibc_dynamic else "meshshard's (mmap threshold fixed at 1 MiB)"))
    print_table(rows, title)
    result = {"benchmark": "train_memory", "side": args.side, "samples": args.samples, "steps": args.steps,
              "latent": args.latent, "mp_steps": args.mp_steps, "validation": not args.no_val,
              "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
              "meshshard_mmap_threshold": os.environ.get("MESHSHARD_MMAP_THRESHOLD", "default (1 MiB)"),
              "dataset_built_s": round(built_s, 1), "cpu_count": os.cpu_count(), "rows": rows}
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
