"""Benchmark: ``ShardTensor.with_halo()`` forward+backward against bare ``all_to_all_single``.

    python bench/halo.py [--side 59] [--features 128] [--ranks 2] [--repeats 15]

A jittered ``side^3`` tetrahedral lattice (side 59: 205,379 nodes) is partitioned with METIS into
``--ranks`` parts; each rank loads its part and times ``with_halo()`` on ``(N_own, features)``
float32 rows, forward and backward (``x.with_halo().backward(g)`` with a fixed ``g``), against two bare
``all_to_all_single`` calls of the same ghost bytes (the forward and backward exchanges) in the
same run, interleaved: BEFORE (the concatenating exchange as before issue 37: fresh result and
gradient) and AFTER (``append_halo``: the owned rows copied while the ghost rows travel; the
gradient here is held by the caller, so the owned rows' gradient is copied too, into recycled
memory), and the same for rows made with room for the ghosts (``HaloPlan.empty_owned``: no forward
copy). A layer's case is the consumer's: its backward makes a fresh gradient, into which autograd
adds the ghost rows' gradients in place, so no owned-row pass is left either way; it is timed as a
consumer ``(h * w).sum()`` on the result minus the same consumer on rows that exist plus the bare
exchanges, over the bare exchange. CPU time ratios (the process's, all threads) are printed too:
on a shared machine they vary less than wall time.

``with_halo()`` of a tensor that already exists copies its owned rows into the owned + ghost result,
and their gradient back: memory passes over all ``N_own`` rows for an exchange of the ghost rows.
A layer that makes the rows it exchanges avoids both: MeshGraphNet's source products are
``HaloPlan.linear(h, W)``, the GEMM written into a buffer with room for the ghost rows. The
second table times that layer step (``(N_own, F) -> (N_own + N_ghost, F)``) against the same
GEMM on the owned rows followed by the bare exchanges (same points where the ranks wait for each
other), forward and backward: BEFORE ``with_halo(F.linear(h, W))`` on the old exchange, AFTER
``HaloPlan.linear``; the halo's cost to the layer is the step minus the GEMM's share
(``step - (GEMM + bare) + bare``), reported over the bare exchange. Targets (issue 37): with glibc's defaults, <= 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardSpec, ShardTensor
    from meshshard.comm import _collectives, count_collectives, init_distributed
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

    weight = (torch.randn(args.features, args.features, generator=g) / args.features**0.5).requires_grad_()

    index = spec.halo.index_on("cpu")
    room = spec.halo.empty_owned(args.features)  # the same rows, written into a buffer with room for the ghosts
    room.copy_(local.detach())
    room.requires_grad_()
    weights = torch.randn(spec.num_owned + spec.num_ghost, args.features, generator=g)
    full = torch.randn(spec.num_owned + spec.num_ghost, args.features, generator=g).requires_grad_()

    def halo() -> None:
        local.grad = None
        x.with_halo().backward(grad)

    def halo_before() -> None:  # the concatenating exchange, as before issue 37
        local.grad = None
        with _collectives._reference_path():
            _collectives._HaloPass.apply(local, index, send_counts, recv_counts, ctx.rank, None, False).backward(grad)

    def halo_room() -> None:
        room.grad = None
        ShardTensor.from_local(room, spec).with_halo().backward(grad)

    def consumer_before() -> None:  # a consumer whose backward makes the gradient (a layer's case)
        local.grad = None
        with _collectives._reference_path():
            h = _collectives._HaloPass.apply(local, index, send_counts, recv_counts, ctx.rank, None, False)
            (h * weights).sum().backward()

    def consumer_after() -> None:
        room.grad = None
        (ShardTensor.from_local(room, spec).with_halo() * weights).sum().backward()

    def consumer_plain() -> None:  # rows without room: the forward copies them once
        local.grad = None
        (x.with_halo() * weights).sum().backward()

    def consumer_bare() -> None:  # the same consumer on owned + ghost rows that exist, and the bare exchanges
        full.grad = None
        (full * weights).sum().backward()
        bare()

    def gemm() -> None:  # the GEMM and the bare exchanges, in the order of the layer's (same sync points)
        local.grad = weight.grad = None
        y = torch.nn.functional.linear(local, weight)
        dist.all_to_all_single(recv_buf, send_buf, recv_counts, send_counts)
        y.backward(grad[: spec.num_owned])
        dist.all_to_all_single(send_buf, recv_buf, send_counts, recv_counts)

    def layer_before() -> None:
        local.grad = weight.grad = None
        with _collectives._reference_path():
            ShardTensor(torch.nn.functional.linear(local, weight), spec).with_halo().backward(grad)

    def layer_after() -> None:
        local.grad = weight.grad = None
        spec.halo.linear(local, weight).backward(grad)

    def bare() -> None:
        dist.all_to_all_single(recv_buf, send_buf, recv_counts, send_counts)
        dist.all_to_all_single(send_buf, recv_buf, send_counts, recv_counts)

    paths = {"before": halo_before, "after": halo, "room": halo_room, "bare": bare, "gemm": gemm,
             "layer_before": layer_before, "layer_after": layer_after, "consumer_before": consumer_before,
             "consumer_after": consumer_after, "consumer_plain": consumer_plain, "consumer_bare": consumer_bare}
    for _ in range(3):
        for fn in paths.values():
            fn()
    with count_collectives() as log:
        halo()
    times: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeats):
        for name, fn in paths.items():
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - start_cpu)  # this process's CPU time, all its threads
            times[name].append(time.perf_counter() - start)
    med = torch.tensor([statistics.median(times[name]) for name in paths]
                       + [statistics.median(cpu[name]) for name in paths], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    t = dict(zip(paths, med.tolist()[: len(paths)]))
    c = dict(zip(paths, med.tolist()[len(paths) :]))
    if ctx.rank == 0:
        result = {
            "ranks": ctx.world_size, "features": args.features, "num_nodes": spec.num_nodes,
            "owned_rank0": spec.num_owned, "ghosts_rank0": spec.num_ghost,
            "ghost_mib_rank0": round(spec.num_ghost * args.features * 4 / 2**20, 2),
            "collectives_fwd_bwd": [log.count(phase="forward"), log.count(phase="backward")],
            "with_halo_before_ms": round(1e3 * t["before"], 3),
            "with_halo_fwd_bwd_ms": round(1e3 * t["after"], 3),
            "bare_2x_all_to_all_single_ms": round(1e3 * t["bare"], 3),
            "ratio_before": round(t["before"] / t["bare"], 3),
            "ratio": round(t["after"] / t["bare"], 3),
            "with_halo_room_ms": round(1e3 * t["room"], 3),
            "ratio_room": round(t["room"] / t["bare"], 3),
            "cpu_ratio_before": round(c["before"] / c["bare"], 3),
            "cpu_ratio": round(c["after"] / c["bare"], 3),
            "cpu_ratio_room": round(c["room"] / c["bare"], 3),
            "consumer_ratio_before": round((t["consumer_before"] - t["consumer_bare"] + t["bare"]) / t["bare"], 3),
            "consumer_ratio": round((t["consumer_after"] - t["consumer_bare"] + t["bare"]) / t["bare"], 3),
            "consumer_ratio_plain": round((t["consumer_plain"] - t["consumer_bare"] + t["bare"]) / t["bare"], 3),
            "consumer_cpu_ratio_plain": round((c["consumer_plain"] - c["consumer_bare"] + c["bare"]) / c["bare"], 3),
            "consumer_cpu_ratio_before": round((c["consumer_before"] - c["consumer_bare"] + c["bare"]) / c["bare"], 3),
            "consumer_cpu_ratio": round((c["consumer_after"] - c["consumer_bare"] + c["bare"]) / c["bare"], 3),
            "share_outside_collective": round(1 - t["bare"] / t["after"], 3),
            "gemm_and_bare_fwd_bwd_ms": round(1e3 * t["gemm"], 3),
            "layer_before_ms": round(1e3 * t["layer_before"], 3),
            "layer_after_ms": round(1e3 * t["layer_after"], 3),
            "layer_halo_ratio_before": round((t["layer_before"] - t["gemm"] + t["bare"]) / t["bare"], 3),
            "layer_halo_ratio": round((t["layer_after"] - t["gemm"] + t["bare"]) / t["bare"], 3),
        }
        Path(args.out_json).write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> int:
    from _runner import end_worker, read_json, run_workers, scratch_folder, worker_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=59)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    worker_arguments(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        end_worker()

    import meshio
    from _meshes import make_box_mesh

    from meshshard.partition import partition_file

    work = scratch_folder("meshshard-bench-halo-")
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
    print(f"{'ghosts (rank 0)':>16} {'MiB':>7} {'BEFORE ms':>10} {'AFTER ms':>9} {'bare ms':>9} {'BEFORE':>7} {'AFTER':>6}")
    print(f"{r['ghosts_rank0']:>16,} {r['ghost_mib_rank0']:>7} {r['with_halo_before_ms']:>10} {r['with_halo_fwd_bwd_ms']:>9} "
          f"{r['bare_2x_all_to_all_single_ms']:>9} {r['ratio_before']:>7} {r['ratio']:>6}")
    print(f"rows made with room (HaloPlan.empty_owned): {r['with_halo_room_ms']} ms, {r['ratio_room']}x; "
          f"CPU time ratios BEFORE / AFTER / room: {r['cpu_ratio_before']} / {r['cpu_ratio']} / {r['cpu_ratio_room']}")
    print(f"in a consumer whose backward makes the gradient, (step - consumer) / bare: BEFORE "
          f"{r['consumer_ratio_before']}, AFTER {r['consumer_ratio_plain']}, rows with room {r['consumer_ratio']} "
          f"(CPU time: {r['consumer_cpu_ratio_before']} / {r['consumer_cpu_ratio_plain']} / {r['consumer_cpu_ratio']})")
    print("\nthe layer step (source products W h with the halo) vs the GEMM + bare exchange: (step - GEMM) / bare")
    print(f"{'GEMM+bare':>9} {'BEFORE ms':>10} {'AFTER ms':>9} {'bare ms':>9} {'BEFORE':>7} {'AFTER':>6}")
    print(f"{r['gemm_and_bare_fwd_bwd_ms']:>9} {r['layer_before_ms']:>10} {r['layer_after_ms']:>9} {r['bare_2x_all_to_all_single_ms']:>9} "
          f"{r['layer_halo_ratio_before']:>7} {r['layer_halo_ratio']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
