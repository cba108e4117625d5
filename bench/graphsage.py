"""Benchmark: a 3-layer PyG GraphSAGE training step, sharded on 2 ranks vs one process.

    python bench/graphsage.py [--side 40] [--hidden 64] [--repeats 3] [--json FILE]

The mesh is a ``side^3`` lattice of hexahedra (side 40: 64,000 nodes; its nodal graph, both
directions of each of the ~186,000 cell edges). One process runs the plain PyG model on the whole
graph (``model(x, edge_index)``, both cores); the sharded run is the same model with
``ShardConv`` around each ``SAGEConv`` on a 2-part METIS partition loaded with ``load_partition``
(one core per rank). A step is forward + backward + gradient all-reduce (sharded) + Adam step, in
float32; the time is the median of ``--repeats`` steps after one warm-up, the slower rank's.
Peak RSS is each process's own (fresh processes per configuration). Prints one JSON object and a
table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _runner import end_worker, peak_rss_mb, read_json, run_workers, scratch_folder, worker_arguments

ROOT = Path(__file__).resolve().parents[1]


def hex_mesh(side: int) -> tuple[np.ndarray, np.ndarray]:
    """``side^3`` nodes of a unit lattice, ``(side-1)^3`` hexahedra (meshio's vertex order)."""
    g = np.arange(side)
    points = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3).astype(np.float64)
    idx = np.arange(side**3).reshape(side, side, side)
    c = idx[:-1, :-1, :-1].ravel()
    dx, dy, dz = side * side, side, 1
    cells = np.stack([c, c + dx, c + dx + dy, c + dy, c + dz, c + dx + dz, c + dx + dy + dz, c + dy + dz], 1)
    return points, cells


def model_for(in_ch: int, hidden: int, out_ch: int, shard: bool):
    import torch
    from torch_geometric.nn import SAGEConv

    from meshshard.nn import ShardConv

    wrap = ShardConv if shard else (lambda layer: layer)

    class GraphSAGE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList(
                [wrap(SAGEConv(a, b)) for a, b in ((in_ch, hidden), (hidden, hidden), (hidden, out_ch))]
            )

        def forward(self, x, graph):
            for i, conv in enumerate(self.convs):
                x = conv(x, graph)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    torch.manual_seed(0)
    return GraphSAGE()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardGraph, ShardTensor
    from meshshard.comm import count_collectives, init_distributed, sum_gradients
    from meshshard.partition import load_partition

    ctx = init_distributed()
    torch.set_num_threads(args.threads)
    part = load_partition(args.partition, ctx.rank)
    graph = ShardGraph.from_partition(part)
    shard = ctx.world_size > 1
    pos = graph.pos[: graph.num_owned]
    x, y = torch.cat([pos / args.side, torch.ones_like(pos[:, :1])], 1), torch.sin(pos.sum(1, keepdim=True) / args.side)
    if shard:
        x, y, g = ShardTensor.from_local(x, graph.spec), ShardTensor.from_local(y, graph.spec), graph
    else:
        g = graph.edge_index  # one part: local numbering is the global one; plain PyG, no ShardConv
    model = model_for(4, args.hidden, 1, shard)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    base = peak_rss_mb()
    times, sent = [], 0
    for i in range(args.repeats + 1):
        with count_collectives() as log:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = ((model(x, g) - y) ** 2).mean()
            loss.backward()
            if shard:
                sum_gradients(model.parameters())
            opt.step()
            elapsed = time.perf_counter() - start
        if i:
            times.append(elapsed)
        sent = log.bytes_sent()
    mine = {
        "rank": ctx.rank, "world_size": ctx.world_size, "nodes_owned": graph.num_owned, "nodes_local": graph.num_local,
        "edges_local": int(graph.edge_index.shape[1]), "step_s": statistics.median(times),
        "peak_rss_mb": peak_rss_mb(), "rss_before_step_mb": base,
        "bytes_sent_per_step": sent, "loss": float(loss.detach()),
    }
    everyone = [mine]
    if dist.is_initialized():
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, mine)
    if ctx.rank == 0:
        Path(args.out_json).write_text(json.dumps(everyone))
    if dist.is_initialized():
        dist.destroy_process_group()


def run_config(part_dir: Path, ranks: int, threads: int, args: argparse.Namespace) -> list[dict]:
    out = str(scratch_folder() / "result.json")
    flags = ["--worker", "--partition", str(part_dir), "--threads", str(threads),
             "--hidden", str(args.hidden), "--side", str(args.side), "--repeats", str(args.repeats), "--out-json", out]
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MESHSHARD_TIMEOUT": "120"}
    return read_json(out, run_workers(__file__, flags, ranks, env), f"{ranks}-rank run")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    worker_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        end_worker()

    import meshio

    from meshshard.partition import partition_file

    work = scratch_folder("meshshard-bench-sage-")
    points, cells = hex_mesh(args.side)
    mesh_path = work / "box.vtk"
    meshio.write(mesh_path, meshio.Mesh(points, [("hexahedron", cells)]), binary=True)
    print(f"mesh: {len(points):,} nodes, {len(cells):,} hexahedra; GraphSAGE 3 layers, hidden {args.hidden}", flush=True)
    rows = []
    for name, ranks, threads in (("1 process (plain PyG), 2 threads", 1, 2), ("2 ranks (ShardConv), 1 thread each", 2, 1)):
        print(f"running: {name} ...", flush=True)
        result = run_config(partition_file(mesh_path, work / f"p{ranks}", ranks), ranks, threads, args)
        rows.append({
            "config": name, "ranks": ranks, "step_s": round(max(r["step_s"] for r in result), 4),
            "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in result],
            "nodes_local": [r["nodes_local"] for r in result], "edges_local": [r["edges_local"] for r in result],
            "bytes_sent_per_rank_per_step": max(r["bytes_sent_per_step"] for r in result), "loss": result[0]["loss"],
        })
    single = rows[0]
    for r in rows:
        r["time_vs_single"] = round(r["step_s"] / single["step_s"], 3)
        r["memory_vs_single"] = round(max(r["peak_rss_mb_per_rank"]) / max(single["peak_rss_mb_per_rank"]), 3)
    summary = {"benchmark": "graphsage", "nodes": len(points), "hexahedra": len(cells), "hidden": args.hidden,
               "repeats": args.repeats, "results": rows}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    print(f"\n{'configuration':<36} {'step s':>8} {'x single':>8} {'peak RSS/rank MB':>20} {'x single':>8} {'sent/rank/step':>15}")
    for r in rows:
        rss = " / ".join(f"{v:,.0f}" for v in r["peak_rss_mb_per_rank"])
        print(f"{r['config']:<36} {r['step_s']:>8.3f} {r['time_vs_single']:>8.2f} {rss:>20} {r['memory_vs_single']:>8.2f} "
              f"{r['bytes_sent_per_rank_per_step'] / 2**20:>12.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
