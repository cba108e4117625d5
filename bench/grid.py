"""Benchmark: a sharded conv stack on a grid against one process, as the input grows.

    python bench/grid.py [--sizes 256,512,1024,1536] [--channels 8] [--layers 4] [--repeats 3]

For each image size ``S`` (input ``(1, C, S, S)`` float32), a stack of ``--layers`` 3 x 3
``nn.Conv2d`` (``C -> 2C -> ... -> C``, ReLU between) runs one training step (forward, backward,
weight gradients summed over ranks):

- on one process and on 2 ranks (slabs along H), every process with ``--threads`` threads
  (default 1: a per-core comparison that a machine shared with other jobs does not distort), every
  configuration in fresh processes so that peak RSS is its own;
- step time: median over ``--repeats`` after a warm-up (slowest rank);
- peak RSS per rank (``ru_maxrss``), against one process; and the step's own share: peak RSS
  minus the RSS before the first step (torch, the model and the input: about 250 MiB of a
  process's peak is the torch import alone);
- halo bytes: what the ranks sent in one step (``count_collectives``, forward and backward,
  summed over ranks) against the theoretical minimum, computed independently of the plan: every
  layer needs, per rank and per pass, the grid points of its box grown by the kernel radius
  (clipped to the grid) that it does not own, times ``B x C_in x 4`` bytes (the backward skips
  the first layer: the input needs no gradient). A 2 x 2 box layout on
  4 ranks is checked the same way at the smallest size (bytes only).

Allocator: every process runs with ``MALLOC_MMAP_THRESHOLD_=4194304`` as in ``bench/meshgraphnet.py``
(glibc would otherwise keep freed activations on a fragmented heap). Run it alone:
``flock /tmp/meshshard-heavy.lock python bench/grid.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _runner import end_worker, peak_rss_mb, read_json, run_workers, scratch_folder


def _model(channels: int, layers: int):
    from torch import nn

    widths = [channels] + [2 * channels] * (layers - 1) + [channels]
    mods: list[nn.Module] = []
    for i in range(layers):
        mods.append(nn.Conv2d(widths[i], widths[i + 1], 3, padding=1))
        if i < layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods), widths[:-1]


def _minimum_bytes(shape, proc_grid, in_channels, batch) -> int:
    """Halo bytes one step must move at least: per layer and rank, forward; backward for every
    layer but the first (the input needs no gradient)."""
    from meshshard.partition._grid import grid_layout

    lay = grid_layout(shape, proc_grid=proc_grid)
    points = 0
    for r in range(lay.num_parts):
        starts, stops = lay.box(r)
        grown, own = 1, 1
        for a, b, n in zip(starts, stops, shape):
            grown *= min(b + 1, n) - max(a - 1, 0)
            own *= b - a
        points += grown - own
    return points * batch * (sum(in_channels) + sum(in_channels[1:])) * 4


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import GridTensor, grid_layout
    from meshshard.comm import count_collectives, init_distributed, sum_gradients
    from meshshard.nn import shard_grid_layers

    ctx = init_distributed()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = _model(args.channels, args.layers)
    shape = (args.size, args.size)
    proc = tuple(int(p) for p in args.proc_grid.split(","))
    layout = grid_layout(shape, proc_grid=proc)
    gen = torch.Generator().manual_seed(ctx.rank)
    box = layout.box_shape(ctx.rank)
    x = torch.randn(1, args.channels, *box, generator=gen)
    sharded = ctx.world_size > 1
    if sharded:
        shard_grid_layers(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        if sharded:
            y = model(GridTensor.from_local(x, layout)).to_local()
        else:
            y = model(x)
        y.square().mean().backward()
        if sharded:
            sum_gradients(model.parameters())

    rss_idle_mib = peak_rss_mb()  # torch, model, input
    step()
    with count_collectives() as log:
        step()
    times = []
    for _ in range(args.repeats):
        if sharded:
            dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    sent = log.bytes_sent("indexed_all_to_all_v")
    rss_mib = peak_rss_mb()
    row = torch.tensor([statistics.median(times), rss_mib, sent, rss_idle_mib], dtype=torch.float64)
    if sharded:
        rows = [torch.zeros_like(row) for _ in range(ctx.world_size)]
        dist.all_gather(rows, row)
    else:
        rows = [row]
    if ctx.rank == 0:
        Path(args.out_json).write_text(json.dumps({
            "step_s": max(r[0].item() for r in rows),
            "peak_rss_mib_per_rank": [round(r[1].item(), 1) for r in rows],
            "step_rss_mib_per_rank": [round(r[1].item() - r[3].item(), 1) for r in rows],
            "halo_bytes_sent": int(sum(r[2].item() for r in rows)),
            "exchanges_fwd_bwd": [log.count("indexed_all_to_all_v", "forward"),
                                  log.count("indexed_all_to_all_v", "backward")],
        }))
    if sharded:
        dist.destroy_process_group()


def _run(args: argparse.Namespace, size: int, ranks: int, proc_grid: str, work: Path) -> dict:
    out = work / f"r{size}-{ranks}-{proc_grid}.json"
    flags = ["--worker", "--size", str(size), "--proc-grid", proc_grid, "--channels", str(args.channels),
             "--layers", str(args.layers), "--repeats", str(args.repeats), "--threads", str(args.threads),
             "--out-json", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MALLOC_MMAP_THRESHOLD_": "4194304"}
    return read_json(out, run_workers(__file__, flags, ranks, env), f"{ranks}-rank run")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,512,1024,1536")
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--proc-grid", default="1,1", help=argparse.SUPPRESS)
    parser.add_argument("--out-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        end_worker()
    _, in_channels = _model(args.channels, args.layers)
    work = scratch_folder("meshshard-bench-grid-")
    results = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        one = _run(args, size, 1, "1,1", work)
        two = _run(args, size, 2, "2,1", work)
        results.append({
            "size": size, "input_mib": round(args.channels * size * size * 4 / 2**20, 2),
            "one_process_step_s": round(one["step_s"], 4), "two_ranks_step_s": round(two["step_s"], 4),
            "speedup": round(one["step_s"] / two["step_s"], 3),
            "one_process_peak_rss_mib": one["peak_rss_mib_per_rank"][0],
            "two_ranks_peak_rss_mib": two["peak_rss_mib_per_rank"],
            "rss_ratio": round(max(two["peak_rss_mib_per_rank"]) / one["peak_rss_mib_per_rank"][0], 3),
            "one_process_step_rss_mib": one["step_rss_mib_per_rank"][0],
            "two_ranks_step_rss_mib": two["step_rss_mib_per_rank"],
            "step_rss_ratio": round(max(two["step_rss_mib_per_rank"]) / max(one["step_rss_mib_per_rank"][0], 1e-9), 3),
            "halo_bytes_sent": two["halo_bytes_sent"],
            "halo_bytes_minimum": _minimum_bytes((size, size), (2, 1), in_channels, 1),
            "exchanges_fwd_bwd": two["exchanges_fwd_bwd"],
        })
    box = _run(args, sizes[0], 4, "2,2", work)
    boxes = {"size": sizes[0], "proc_grid": [2, 2], "halo_bytes_sent": box["halo_bytes_sent"],
             "halo_bytes_minimum": _minimum_bytes((sizes[0],) * 2, (2, 2), in_channels, 1),
             "exchanges_fwd_bwd": box["exchanges_fwd_bwd"]}
    report = {"channels": args.channels, "layers": args.layers, "dtype": "float32", "batch": 1,
              "threads_per_process": args.threads,
              "slabs_2_ranks": results, "boxes_4_ranks": boxes}
    print(json.dumps(report))
    print(f"\n{args.layers} x Conv2d 3x3 ({args.channels}..{2 * args.channels} channels), one training step, "
          f"1 process vs 2 ranks (slabs along H), {args.threads} thread(s) per process")
    print(f"{'S x S':>11} {'input MiB':>9} {'1 proc s':>9} {'2 ranks s':>10} {'speedup':>8} "
          f"{'1 proc RSS':>11} {'rank RSS':>11} {'ratio':>6} {'step MiB 1/2':>13} {'ratio':>6} "
          f"{'halo bytes':>11} {'minimum':>9}")
    for r in results:
        print(f"{r['size']:>5} x {r['size']:<5} {r['input_mib']:>9} {r['one_process_step_s']:>9} "
              f"{r['two_ranks_step_s']:>10} {r['speedup']:>8} {r['one_process_peak_rss_mib']:>11.0f} "
              f"{max(r['two_ranks_peak_rss_mib']):>11.0f} {r['rss_ratio']:>6} "
              f"{r['one_process_step_rss_mib']:>6.0f}/{max(r['two_ranks_step_rss_mib']):<6.0f} "
              f"{r['step_rss_ratio']:>6} {r['halo_bytes_sent']:>11,} {r['halo_bytes_minimum']:>9,}")
    print(f"2 x 2 boxes on 4 ranks, {boxes['size']} x {boxes['size']}: halo bytes {boxes['halo_bytes_sent']:,}, "
          f"minimum {boxes['halo_bytes_minimum']:,}, exchanges (fwd, bwd) {boxes['exchanges_fwd_bwd']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
