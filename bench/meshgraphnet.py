"""Benchmark: one MeshGraphNet training step, one process vs 2 and 4 ranks (1-hop) vs k-hop.

    python bench/meshgraphnet.py [--side 37] [--latent 32] [--steps 4] [--json FILE]

The mesh is a jittered ``side^3`` lattice of tetrahedra (side 37: 50,653 nodes). Each
configuration runs in fresh processes (so peak RSS is its own) and loads its shard with
``load_partition`` from a partition made once per part count; one process is the same code on a
1-part partition. Per configuration: time of a training step (forward + backward + gradient
all-reduce; median of 3 after a warm-up), peak RSS per rank, and the part of it above the
rank's memory before its first step (torch, the shard, the model: what sharding cannot divide),
each as a ratio to one process; bytes each rank sends per step.
One process uses both cores; each of 2 ranks uses one.

Then the memory cap: every process runs under ``RLIMIT_AS`` (the limit ``prlimit --as`` sets) set
halfway between the one-process peak address space and the 2-rank one; the one-process step is
expected to fail and the 2-rank step to succeed under the same cap per rank.

Allocator: every process runs with ``MALLOC_MMAP_THRESHOLD_=1048576`` (glibc; ``--mmap-threshold``),
the threshold each rank of ``meshshard train`` fixes for itself. By default glibc raises its mmap
threshold after large frees (up to 32 MB), so the mid-sized activations of a shard land on the
heap and fragment it: peak RSS then grows beyond the live memory, and more so the smaller the
shard (measured on 50k nodes, latent 32, per rank above its memory at the first step: 2 / 4 ranks
0.62x / 0.36x of one process at 4 MiB, 0.54x / 0.32x at 1 MiB). ``--default-malloc`` keeps glibc's
dynamic threshold.

Targets (issue 5): peak RSS per rank <= 0.6x one process at 2 ranks, <= 0.35x at 4; 2 ranks on
2 cores no slower than one process on both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from _runner import end_worker, peak_rss_mb, run_workers, scratch_folder, worker_arguments

ROOT = Path(__file__).resolve().parents[1]


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardGraph, ShardTensor, edge_features
    from meshshard.comm import count_collectives, init_distributed, sum_gradients
    from meshshard.nn import MeshGraphNet
    from meshshard.partition import load_partition

    ctx = init_distributed()
    torch.set_num_threads(args.threads)
    part = load_partition(args.partition, ctx.rank)
    graph = ShardGraph.from_partition(part)
    ea = edge_features(graph.pos, graph.edge_index)
    torch.manual_seed(0)
    model = MeshGraphNet(3, ea.shape[1], 1, latent_size=args.latent, hidden_layers=2, message_passing_steps=args.steps)
    g = torch.Generator().manual_seed(ctx.rank)
    x = ShardTensor.from_local(torch.randn(graph.num_owned, 3, generator=g), graph.spec)
    y = ShardTensor.from_local(torch.randn(graph.num_owned, 1, generator=g), graph.spec)
    if args.cap_mb:
        resource.setrlimit(resource.RLIMIT_AS, (int(args.cap_mb * 2**20), resource.RLIM_INFINITY))
    base = peak_rss_mb()
    times, status, sent = [], "ok", 0
    try:
        for i in range(4):
            with count_collectives() as log:
                start = time.perf_counter()
                loss = ((model(x, graph, ea) - y) ** 2).mean()
                loss.backward()
                sum_gradients(model.parameters())
                elapsed = time.perf_counter() - start
            model.zero_grad(set_to_none=True)
            if i:
                times.append(elapsed)
            sent = log.bytes_sent()
    except (RuntimeError, MemoryError) as err:
        status = "out of memory" if "memory" in str(err).lower() or isinstance(err, MemoryError) else f"failed: {err}"
    mine = {
        "rank": ctx.rank, "world_size": ctx.world_size, "halo_hops": graph.halo_hops, "status": status,
        "nodes_owned": graph.num_owned, "nodes_local": graph.num_local, "edges_local": int(graph.edge_index.shape[1]),
        "step_s": statistics.median(times) if times else None, "peak_rss_mb": peak_rss_mb(),
        "rss_before_step_mb": base, "peak_address_space_mb": _status_mb("VmPeak"), "bytes_sent_per_step": sent,
    }
    everyone = [mine]
    if dist.is_initialized() and status == "ok":
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, mine)
    if ctx.rank == 0 or status != "ok":
        with open(args.out_json + (f".rank{ctx.rank}" if status != "ok" else ""), "w") as f:
            json.dump(everyone, f)
    if dist.is_initialized() and status == "ok":
        dist.destroy_process_group()


def run_config(part_dir: Path, ranks: int, threads: int, args: argparse.Namespace, cap_mb: float = 0.0) -> list[dict]:
    out = str(scratch_folder() / "result.json")
    flags = ["--worker", "--partition", str(part_dir), "--threads", str(threads),
             "--latent", str(args.latent), "--steps", str(args.steps), "--out-json", out, "--cap-mb", str(cap_mb)]
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MESHSHARD_TIMEOUT": "120"}
    if not args.default_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    run_workers(__file__, flags, ranks, env)  # a capped run may be killed: what it wrote is read below
    results = []
    for path in [out] + [f"{out}.rank{r}" for r in range(ranks)]:
        if os.path.exists(path):
            results += json.loads(Path(path).read_text())
    return results or [{"rank": 0, "world_size": ranks, "status": "no result (killed?)"}]


def summarize(name: str, rows: list[dict], single: dict | None) -> dict:
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return {"config": name, "status": rows[0].get("status")}
    peak = max(r["peak_rss_mb"] for r in ok)
    out = {
        "config": name, "ranks": ok[0]["world_size"], "halo_hops": ok[0]["halo_hops"],
        "step_s": round(max(r["step_s"] for r in ok), 3),
        "peak_rss_mb_per_rank": round(peak, 1),
        "bytes_sent_per_rank_per_step": max(r["bytes_sent_per_step"] for r in ok),
        "max_local_nodes": max(r["nodes_local"] for r in ok),
        "peak_address_space_mb": round(max(r["peak_address_space_mb"] for r in ok), 1),
        "rss_before_step_mb": round(max(r["rss_before_step_mb"] for r in ok), 1),
        "status": "ok",
    }
    if single:
        out["memory_vs_single"] = round(peak / single["peak_rss_mb_per_rank"], 3)
        # what sharding divides: the memory above each process's own before its first step (torch,
        # the shard and the model: about 260 MB per process here, the same at every rank count)
        out["memory_above_start_vs_single"] = round(
            max(r["peak_rss_mb"] - r["rss_before_step_mb"] for r in ok)
            / (single["peak_rss_mb_per_rank"] - single["rss_before_step_mb"]), 3)
        out["time_vs_single"] = round(out["step_s"] / single["step_s"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=37)
    parser.add_argument("--latent", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="message-passing steps")
    parser.add_argument("--json")
    parser.add_argument("--default-malloc", action="store_true", help="keep glibc's dynamic mmap threshold")
    parser.add_argument("--mmap-threshold", type=int, default=2**20,
                        help="MALLOC_MMAP_THRESHOLD_ of every process, in bytes (default 1 MiB)")
    worker_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--cap-mb", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        end_worker()

    import meshio
    from _meshes import make_box_mesh

    from meshshard.partition import partition_file

    work = scratch_folder("meshshard-bench-mgn-")
    points, tets = make_box_mesh(args.side)
    mesh_path = work / "box.vtk"
    meshio.write(mesh_path, meshio.Mesh(points, [("tetra", tets)]), binary=True)
    print(f"mesh: {len(points):,} nodes, {len(tets):,} tets; model latent {args.latent}, 2 hidden layers, {args.steps} steps", flush=True)
    parts = {}
    for k, hops in ((1, 1), (2, 1), (4, 1), (2, args.steps)):
        parts[(k, hops)] = partition_file(mesh_path, work / f"p{k}-h{hops}", k, halo_hops=hops)
    configs = [("1 process, 2 threads", 1, 1, 2), ("2 ranks, 1-hop", 2, 1, 1), ("4 ranks, 1-hop", 4, 1, 1),
               (f"2 ranks, {args.steps}-hop", 2, args.steps, 1)]
    results, single = [], None
    for name, k, hops, threads in configs:
        print(f"running: {name} ...", flush=True)
        row = summarize(name, run_config(parts[(k, hops)], k, threads, args), single)
        single = single or row
        results.append(row)

    single_as = results[0]["peak_address_space_mb"]
    two_as = results[1]["peak_address_space_mb"]
    cap = (single_as + two_as) / 2
    print(f"running: memory cap RLIMIT_AS = {cap:,.0f} MB per process ...", flush=True)
    capped = [
        {"config": f"1 process under {cap:,.0f} MB", "status": run_config(parts[(1, 1)], 1, 2, args, cap)[0]["status"]},
        {"config": f"2 ranks under {cap:,.0f} MB each", "status": summarize("", run_config(parts[(2, 1)], 2, 1, args, cap), None)["status"]},
    ]

    print(f"\n{'configuration':<24} {'step s':>8} {'x single':>8} {'peak RSS/rank MB':>17} {'x single':>8} {'above start':>11} "
          f"{'sent/rank/step':>15} {'local nodes':>12}")
    for r in results:
        if r["status"] != "ok":
            print(f"{r['config']:<24} {r['status']}")
            continue
        print(f"{r['config']:<24} {r['step_s']:>8.2f} {r.get('time_vs_single', 1.0):>8.2f} {r['peak_rss_mb_per_rank']:>17,.0f} "
              f"{r.get('memory_vs_single', 1.0):>8.2f} {r.get('memory_above_start_vs_single', 1.0):>11.2f} "
              f"{r['bytes_sent_per_rank_per_step'] / 2**20:>12.2f} MB {r['max_local_nodes']:>12,}")
    for c in capped:
        print(f"{c['config']:<40} {c['status']}")
    summary = {"malloc_mmap_threshold": None if args.default_malloc else args.mmap_threshold, "nodes": len(points), "tets": len(tets), "latent": args.latent, "mp_steps": args.steps, "results": results, "memory_cap": capped}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
