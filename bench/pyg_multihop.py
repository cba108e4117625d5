"""Benchmark: the multi-hop halo against the adapters, for GCNConv and ChebConv(K=3), on a real mesh.

    python bench/pyg_multihop.py [--mesh FILE] [--ranks 2] [--features 32] [--repeats 5] [--json FILE]

The mesh is ``../shared/data/sfepy/wheelset.vtk`` (3-D tetrahedra, SfePy) when it is there, else a
jittered ``--side^3`` tetrahedral lattice; METIS splits it into ``--ranks`` parts. Each rank runs,
in float32 with one thread: ``ShardConv(GCNConv)`` (adapter ``gcn``: one exchange of 1-hop ghost
rows), ``ShardConv(GCNConv, hops=1)`` (the multi-hop halo: 2 hops of nodes), ``ShardConv(ChebConv(K=3))``
(adapter ``khop``: one exchange per hop) and ``ShardConv(ChebConv(K=3), hops=3)`` (the multi-hop
halo: 4 hops of nodes; ChebConv's out-degrees need the extra hop, exact on a mesh because its
graph is symmetric). Per configuration: halo rows per rank (non-owned rows the layer reads), the
numbers sent per rank in one forward + backward (the collectives' bytes over 4), the exchanges, the
median time of ``--repeats`` forward + backward after one warm-up (the slower rank's), the one-off
time to build the multi-hop halo, and the largest difference between the adapter's and the
multi-hop output (both exact: about float32 rounding). Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _runner import emit, end_worker, read_json, run_workers, scratch_folder, worker_arguments

ROOT = Path(__file__).resolve().parents[1]
REAL_MESH = ROOT.parent / "shared" / "data" / "sfepy" / "wheelset.vtk"
CONFIGS = (("GCNConv", None), ("GCNConv", 1), ("ChebConv(K=3)", None), ("ChebConv(K=3)", 3))


def _layer(kind: str, features: int):
    import torch
    from torch_geometric.nn import ChebConv, GCNConv

    torch.manual_seed(0)
    return GCNConv(features, features) if kind == "GCNConv" else ChebConv(features, features, K=3)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardGraph, ShardTensor
    from meshshard.comm import count_collectives, init_distributed
    from meshshard.nn import ShardConv
    from meshshard.nn._multihop import multihop_halo
    from meshshard.partition import load_partition

    ctx = init_distributed()
    torch.set_num_threads(1)
    graph = ShardGraph.from_partition(load_partition(args.partition, ctx.rank))
    pos = graph.pos[: graph.num_owned]
    freq = torch.arange(1, args.features + 1, dtype=pos.dtype)
    x_own = torch.sin(pos.sum(1, keepdim=True) * freq)  # a function of the position: the same on any layout
    rows, outputs = [], {}
    for kind, hops in CONFIGS:
        conv = ShardConv(_layer(kind, args.features), hops=hops)
        build = 0.0
        if hops is not None:
            start = time.perf_counter()
            halo = multihop_halo(graph, hops)
            build = time.perf_counter() - start
            halo_rows = halo.num_nodes - graph.num_owned
        else:
            halo_rows = graph.spec.num_ghost
        times = []
        for i in range(args.repeats + 1):
            x = ShardTensor.from_local(x_own.clone().requires_grad_(), graph.spec)
            with count_collectives() as log:
                start = time.perf_counter()
                y = conv(x, graph)
                y.to_local().square().sum().backward()
                elapsed = time.perf_counter() - start
            if i:
                times.append(elapsed)
        outputs[(kind, hops)] = y.to_local().detach()
        rows.append({
            "layer": kind, "mechanism": f"multihop, hops={hops}" if hops else f"adapter {conv.mode}",
            "halo_rows": halo_rows, "numbers_sent": log.bytes_sent() // 4,
            "exchanges": log.count("indexed_all_to_all_v"), "collectives": log.count(),
            "step_s": statistics.median(times), "build_s": build,
        })
    for row, (kind, hops) in zip(rows, CONFIGS):
        ref = outputs[(kind, None)]
        row["max_diff_vs_adapter"] = float((outputs[(kind, hops)] - ref).abs().max()) if ref.numel() else 0.0
    mine = {"rank": ctx.rank, "owned": graph.num_owned, "rows": rows}
    everyone = [mine]
    if dist.is_initialized():
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, mine)
    if ctx.rank == 0:
        Path(args.out_json).write_text(json.dumps(everyone))
    if dist.is_initialized():
        dist.destroy_process_group()


def _mesh(args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    if args.mesh:
        return Path(args.mesh), Path(args.mesh).name
    if REAL_MESH.is_file() and not args.side:
        return REAL_MESH, "sfepy/wheelset.vtk"
    import meshio
    from _meshes import make_box_mesh

    points, tets = make_box_mesh(args.side or 12)
    path = work / "box.vtk"
    meshio.write(path, meshio.Mesh(points, [("tetra", tets)]), binary=True)
    return path, f"box lattice {args.side or 12}^3"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh", help="a mesh file (default: ../shared/data/sfepy/wheelset.vtk)")
    parser.add_argument("--side", type=int, default=0, help="a generated lattice of side^3 nodes instead")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    worker_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        end_worker()

    from meshshard.partition import partition_file

    work = scratch_folder("meshshard-bench-multihop-")
    mesh, label = _mesh(args, work)
    parts = partition_file(mesh, work / "parts", args.ranks)
    out = work / "result.json"
    flags = ["--worker", "--partition", str(parts), "--features", str(args.features), "--repeats", str(args.repeats),
             "--out-json", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "120"}
    ranks = read_json(out, run_workers(__file__, flags, args.ranks, env, torchrun=True), f"{args.ranks}-rank run")
    results = []
    for i, (kind, hops) in enumerate(CONFIGS):
        per_rank = [r["rows"][i] for r in ranks]
        results.append({
            "layer": kind, "mechanism": per_rank[0]["mechanism"],
            "halo_rows_per_rank": [r["halo_rows"] for r in per_rank],
            "numbers_sent_per_rank": [r["numbers_sent"] for r in per_rank],
            "exchanges": per_rank[0]["exchanges"], "collectives": max(r["collectives"] for r in per_rank),
            "step_s": round(max(r["step_s"] for r in per_rank), 5),
            "build_s": round(max(r["build_s"] for r in per_rank), 4),
            "max_diff_vs_adapter": max(r["max_diff_vs_adapter"] for r in per_rank),
        })
    summary = {"benchmark": "pyg_multihop", "mesh": label, "ranks": args.ranks, "features": args.features,
               "owned_per_rank": [r["owned"] for r in ranks], "repeats": args.repeats, "dtype": "float32",
               "results": results}
    emit(summary, args.json)
    print(f"\nmesh {label}, {args.ranks} ranks owning {summary['owned_per_rank']}, {args.features} features, float32")
    print(f"{'layer':<15} {'mechanism':<20} {'halo rows/rank':>18} {'numbers sent/rank':>22} {'exch':>5} "
          f"{'fwd+bwd s':>10} {'build s':>8} {'diff':>9}")
    for r in results:
        halo = "/".join(str(v) for v in r["halo_rows_per_rank"])
        sent = "/".join(f"{v:,}" for v in r["numbers_sent_per_rank"])
        print(f"{r['layer']:<15} {r['mechanism']:<20} {halo:>18} {sent:>22} {r['exchanges']:>5} {r['step_s']:>10.4f} "
              f"{r['build_s']:>8.3f} {r['max_diff_vs_adapter']:>9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
