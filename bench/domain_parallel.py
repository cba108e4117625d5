"""Benchmark: DomainParallel's overhead against sum_gradients, one MeshGraphNet training step on 2 ranks.

    python bench/domain_parallel.py [--side 224] [--latent 64] [--mp-steps 6] [--rounds 3] [--json FILE]

The mesh is a ``side x side`` grid of right triangles (side 224: 50,176 nodes), split into 2 METIS
parts (each rank builds the same partition in memory). Each rank runs a training step (forward,
backward, gradient reduction, Adam) of the same MeshGraphNet (float32, ``hidden_layers=2``) in
four ways, interleaved round by round so that load from other processes hits all of them alike:

- ``none``: no gradient reduction at all (wrong training; the compute-only baseline);
- ``sum_gradients``: ``comm.sum_gradients`` after ``backward()`` (one blocking ``all_reduce``);
- ``DomainParallel``: the wrapper with its default 25 MiB buckets;
- ``DomainParallel, small buckets``: 0.25 MiB buckets, so several all-reduces overlap the backward.

Per way: the median step time over ``rounds x 3`` steps (after a warm-up), the time against
``sum_gradients``, and the reduction's share of the step (``1 - none / step``). The ``sum_gradients``
call is also timed on its own. A step is the slowest rank's time. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("none", "sum_gradients", "DomainParallel", "DomainParallel, small buckets")


def grid_mesh(side: int):
    """A ``side x side`` node grid, each square cut into two triangles: (pos (N, 2), edge_index (2, E))."""
    import numpy as np

    ids = np.arange(side * side).reshape(side, side)
    xs, ys = np.meshgrid(np.linspace(0.0, 1.0, side), np.linspace(0.0, 1.0, side), indexing="ij")
    pos = np.stack([xs.ravel(), ys.ravel()], axis=1)
    right = np.stack([ids[:-1, :].ravel(), ids[1:, :].ravel()])
    up = np.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()])
    diagonal = np.stack([ids[:-1, :-1].ravel(), ids[1:, 1:].ravel()])
    undirected = np.concatenate([right, up, diagonal], axis=1)
    return pos, np.concatenate([undirected, undirected[::-1]], axis=1)


def worker(args: dict) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardGraph, ShardTensor, edge_features
    from meshshard.comm import init_distributed, sum_gradients
    from meshshard.nn import DomainParallel, MeshGraphNet
    from meshshard.partition import partition_graph

    ctx = init_distributed()
    torch.set_num_threads(1)
    pos, edge_index = grid_mesh(args["side"])
    part = partition_graph(edge_index, ctx.world_size, num_nodes=len(pos), pos=pos)[ctx.rank]
    graph = ShardGraph.from_partition(part)
    ea = edge_features(graph.pos, graph.edge_index)
    g = torch.Generator().manual_seed(ctx.rank)
    x = ShardTensor.from_local(torch.randn(graph.num_owned, 3, generator=g), graph.spec)
    y = ShardTensor.from_local(torch.randn(graph.num_owned, 1, generator=g), graph.spec)

    def make(way: str):
        torch.manual_seed(0)
        model = MeshGraphNet(3, ea.shape[1], 1, latent_size=args["latent"], hidden_layers=2,
                             message_passing_steps=args["mp_steps"])
        if way == "DomainParallel":
            model = DomainParallel(model)
        elif way == "DomainParallel, small buckets":
            model = DomainParallel(model, bucket_cap_mb=0.25)
        return model, torch.optim.Adam(model.parameters(), lr=1e-4)

    setups = {way: make(way) for way in WAYS}
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    reduce_call: list[float] = []

    def step(way: str) -> float:
        model, opt = setups[way]
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ((model(x, graph, ea) - y) ** 2).mean()
        loss.backward()
        if way == "sum_gradients":
            t = time.perf_counter()
            sum_gradients(model.parameters())
            reduce_call.append(time.perf_counter() - t)
        opt.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
        return float(elapsed)

    for way in WAYS:  # warm-up
        step(way)
    reduce_call.clear()
    for _ in range(args["rounds"]):
        for way in WAYS:
            for _ in range(3):
                times[way].append(step(way))
    if ctx.rank == 0:
        params = sum(p.numel() for p in setups["none"][0].parameters())
        result = {
            "nodes": len(pos), "ranks": ctx.world_size, "latent": args["latent"], "mp_steps": args["mp_steps"],
            "parameters": params, "gradient_bytes": 4 * params, "torch_threads_per_rank": 1,
            "buckets": {way: len(setups[way][0]._buckets) for way in WAYS if way.startswith("DomainParallel")},
            "step_s": {way: statistics.median(t) for way, t in times.items()},
            "step_s_all": times, "sum_gradients_call_s": statistics.median(reduce_call),
        }
        Path(args["out"]).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--latent", type=int, default=64)
    parser.add_argument("--mp-steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from _runner import scratch_folder

    from meshshard.comm import launch_local

    out = str(scratch_folder() / "result.json")
    launch_local(worker, args.ranks, {"side": args.side, "latent": args.latent, "mp_steps": args.mp_steps,
                                      "rounds": args.rounds, "out": out})
    result = json.loads(Path(out).read_text())
    base, none = result["step_s"]["sum_gradients"], result["step_s"]["none"]
    rows = []
    for way in WAYS:
        s = result["step_s"][way]
        rows.append({"way": way, "step_s": round(s, 4), "vs_sum_gradients": round(s / base, 3),
                     "reduction_share": None if way == "none" else round(1 - none / s, 3)})
    result["table"] = rows
    print(f"mesh {result['nodes']:,} nodes on {result['ranks']} ranks (1 thread each); MeshGraphNet latent "
          f"{result['latent']}, {result['mp_steps']} steps, {result['parameters']:,} parameters "
          f"({result['gradient_bytes'] / 2**20:.2f} MiB of float32 gradients); buckets {result['buckets']}")
    print(f"\n{'way':<32} {'step s':>8} {'x sum_gradients':>16} {'reduction share':>16}")
    for r in rows:
        share = "-" if r["reduction_share"] is None else f"{100 * r['reduction_share']:.1f} %"
        print(f"{r['way']:<32} {r['step_s']:>8.4f} {r['vs_sum_gradients']:>16.3f} {share:>16}")
    print(f"\nsum_gradients call alone: {result['sum_gradients_call_s'] * 1e3:.2f} ms (median)")
    summary = {k: v for k, v in result.items() if k != "step_s_all"}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
