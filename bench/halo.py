"""Benchmark: ``ShardTensor.with_halo()`` forward+backward against bare ``all_to_all_single``.

    python bench/halo.py [--side 59] [--features 128] [--ranks 2] [--repeats 15]

A jittered ``side^3`` tetrahedral lattice (side 59: 205,379 nodes) is partitioned with METIS into
``--ranks`` parts; each rank loads its part and times ``with_halo()`` on ``(N_own, features)``
float32 rows, forward and backward (``x.with_halo().backward(g)`` with a fixed ``g``), against two bare
``all_to_all_single`` calls of the same ghost bytes (the forward and backward exchanges) in the
same run, interleaved. Reports the ratio and the share of ``with_halo`` time spent outside the
collective. Target (issue 4): ratio <= 1.25.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardSpec, ShardTensor
    from meshshard.comm import count_collectives, init_distributed
    from meshshard.partition import load_partition

    ctx = init_distributed()
    torch.set_num_threads(1)
    spec = ShardSpec.from_partition(load_partition(args.partition, ctx.rank))
    g = torch.Generator().manual_seed(ctx.rank)
    local = torch.randn(spec.num_owned, args.features, generator=g).requires_grad_()
    x = ShardTensor.from_local(local, spec)
    grad = torch.randn(spec.num_owned + spec.num_ghost, args.features, generator=g)
    send_counts, recv_counts = list(spec.send_counts), list(spec.recv_counts)
    send_buf = torch.randn(sum(send_counts), args.features)
    recv_buf = torch.empty(sum(recv_counts), args.features)

    def halo() -> None:
        local.grad = None
        x.with_halo().backward(grad)

    def bare() -> None:
        dist.all_to_all_single(recv_buf, send_buf, recv_counts, send_counts)
        dist.all_to_all_single(send_buf, recv_buf, send_counts, recv_counts)

    for _ in range(3):
        halo()
        bare()
    with count_collectives() as log:
        halo()
    t_halo, t_bare = [], []
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        halo()
        t_halo.append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        bare()
        t_bare.append(time.perf_counter() - start)
    med = torch.tensor([statistics.median(t_halo), statistics.median(t_bare)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if ctx.rank == 0:
        result = {
            "ranks": ctx.world_size, "features": args.features, "num_nodes": spec.num_nodes,
            "owned_rank0": spec.num_owned, "ghosts_rank0": spec.num_ghost,
            "ghost_mib_rank0": round(spec.num_ghost * args.features * 4 / 2**20, 2),
            "collectives_fwd_bwd": [log.count(phase="forward"), log.count(phase="backward")],
            "with_halo_fwd_bwd_ms": round(1e3 * med[0].item(), 3),
            "bare_2x_all_to_all_single_ms": round(1e3 * med[1].item(), 3),
            "ratio": round(med[0].item() / med[1].item(), 3),
            "share_outside_collective": round(1 - med[1].item() / med[0].item(), 3),
        }
        Path(args.out_json).write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> int:
    from _runner import read_json, run_workers, worker_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=59)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    worker_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    import meshio
    from _meshes import make_box_mesh

    from meshshard.partition import partition_file

    work = Path(tempfile.mkdtemp(prefix="meshshard-bench-halo-"))
    points, tets = make_box_mesh(args.side)
    meshio.write(work / "box.vtk", meshio.Mesh(points, [("tetra", tets)]), binary=True)
    part = partition_file(work / "box.vtk", work / "parts", args.ranks)
    out = work / "result.json"
    flags = ["--worker", "--partition", str(part), "--out-json", str(out), "--features", str(args.features),
             "--repeats", str(args.repeats)]
    done = run_workers(__file__, flags, args.ranks, os.environ | {"OMP_NUM_THREADS": "1"}, torchrun=True)
    r = read_json(out, done)
    print(json.dumps(r))
    print(f"\nwith_halo() fwd+bwd vs 2x bare all_to_all_single, {r['num_nodes']:,} nodes, {r['ranks']} ranks, float32 x {r['features']}")
    print(f"{'ghosts (rank 0)':>16} {'MiB':>7} {'with_halo ms':>13} {'bare ms':>9} {'ratio':>6} {'outside collective':>19}")
    print(f"{r['ghosts_rank0']:>16,} {r['ghost_mib_rank0']:>7} {r['with_halo_fwd_bwd_ms']:>13} {r['bare_2x_all_to_all_single_ms']:>9} "
          f"{r['ratio']:>6} {100 * r['share_outside_collective']:>18.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
