"""Benchmark: indexed_all_to_all_v forward+backward against bare all_to_all_single of the same bytes.

    torchrun --nproc-per-node 2 bench/collectives.py [--rows 1000,10000,50000,100000,200000] [--features 128]

Each rank sends ``rows`` rows of ``features`` float32 values, picked by a random index from a local
tensor twice that size, to every other rank. The indexed exchange (select, send, receive; backward:
send back, index_add) is timed against two bare ``all_to_all_single`` calls of the same sizes (the
forward and the backward exchange), in the same run, interleaved, twice: BEFORE (every result and
gradient a fresh ``torch.empty``, as before issue 37) and AFTER (results and gradients on recycled
storages that nobody holds any more, ``comm/_recycle.py``, and the gradient's zero fill done while
the rows travel); and LOCAL, the memory passes the pair needs beyond the two exchanges (the gather of
the rows sent; ``x``'s dense gradient zero-filled and the rows received ``index_add``ed), timed with
nothing sent. ``(bare + local) / bare`` is the floor of the ratio where those passes cannot overlap
the transfer (on loopback gloo the transfer is itself memory copies on the same cores). Prints one
JSON object per line (rank 0) and a table. Target (issues 2 and 37): ratio <= 1.25 for 10k rows and
more, with glibc's defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from meshshard.comm import _collectives, indexed_all_to_all_v, init_distributed


def _timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def bench_one(rows: int, features: int, repeats: int, device: torch.device) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    n_local = 2 * rows
    x = torch.randn(n_local, features, generator=g).to(device).requires_grad_()
    counts = [0 if q == rank else rows for q in range(world)]
    index = torch.cat([torch.randperm(n_local, generator=g)[:rows] if c else torch.empty(0, dtype=torch.long) for c in counts]).to(device)
    send_buf = torch.randn(sum(counts), features, generator=g).to(device)
    recv_buf = torch.empty(sum(counts), features, device=device)
    grad_out = torch.ones(sum(counts), features, device=device)
    sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)

    def indexed() -> None:
        x.grad = None
        out = indexed_all_to_all_v(x, index, counts, counts)
        out.backward(grad_out)

    def before() -> None:
        with _collectives._reference_path():
            indexed()

    def bare() -> None:
        dist.all_to_all_single(recv_buf, send_buf, counts, counts)
        dist.all_to_all_single(send_buf, recv_buf, counts, counts)

    grad_x = torch.empty_like(x)
    xd = x.detach()

    def local() -> None:  # the memory passes the adjoint pair needs beyond the exchanges, nothing sent
        torch.index_select(xd, 0, index, out=send_buf)  # forward: the rows to send
        grad_x.zero_().index_add_(0, index, recv_buf)  # backward: x's dense gradient, the rows received added

    paths = {"before": before, "after": indexed, "bare": bare, "local": local}
    for _ in range(3):  # warm up every path
        for fn in paths.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            dist.barrier()
            times[name].append(_timed(fn, sync))
    med = torch.tensor([statistics.median(times[name]) for name in paths], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    t_before, t_after, t_bare, t_local = med.tolist()
    mb = rows * features * 4 * (world - 1) / 2**20
    return {
        "rows_per_peer": rows,
        "features": features,
        "mib_sent_per_rank": round(mb, 2),
        "before_fwd_bwd_ms": round(1e3 * t_before, 3),
        "after_fwd_bwd_ms": round(1e3 * t_after, 3),
        "bare_2x_all_to_all_single_ms": round(1e3 * t_bare, 3),
        "ratio_before": round(t_before / t_bare, 3),
        "ratio": round(t_after / t_bare, 3),
        "local_passes_ms": round(1e3 * t_local, 3),
        "floor_ratio": round((t_bare + t_local) / t_bare, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000,10000,50000,100000,200000")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    ctx = init_distributed()
    if ctx.world_size < 2:
        raise SystemExit("run under torchrun with at least 2 ranks: torchrun --nproc-per-node 2 bench/collectives.py")
    torch.manual_seed(0)
    results = [bench_one(int(r), args.features, args.repeats, ctx.device) for r in args.rows.split(",")]
    if ctx.rank == 0:
        info = {"backend": ctx.backend, "world_size": ctx.world_size, "device": str(ctx.device), "torch": torch.__version__}
        for r in results:
            print(json.dumps({**info, **r}))
        print(f"\nindexed_all_to_all_v fwd+bwd vs 2x bare all_to_all_single ({ctx.backend}, {ctx.world_size} ranks, float32 x {args.features})")
        print(f"{'rows/peer':>10} {'MiB/rank':>9} {'BEFORE ms':>10} {'AFTER ms':>9} {'bare ms':>9} {'BEFORE':>7} {'AFTER':>6} "
              f"{'local ms':>9} {'floor':>6}")
        for r in results:
            print(f"{r['rows_per_peer']:>10} {r['mib_sent_per_rank']:>9} {r['before_fwd_bwd_ms']:>10} {r['after_fwd_bwd_ms']:>9} "
                  f"{r['bare_2x_all_to_all_single_ms']:>9} {r['ratio_before']:>7} {r['ratio']:>6} "
                  f"{r['local_passes_ms']:>9} {r['floor_ratio']:>6}")
        print("local: the gather of the rows sent, the zero fill of x's gradient and the index_add of the rows received,"
              " with nothing sent; floor: (bare + local) / bare, what any exchange that returns x's dense gradient"
              " costs on this machine when its memory passes do not overlap the transfer")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
