"""Benchmark: the ball query, its geometric halo, and BallQueryAttention on shards.

    python bench/ball_query.py [--points 1000000] [--shard-points 200000] [--ranks 2,4]
                               [--neighbors 16] [--attn-points 50000] [--repeats 3] [--quick]

Three parts, each in one run:

1. Single process: ``ball_query`` (torch grid hash) against scipy's ``cKDTree.query_ball_point``
   with the same radius, then truncated the same way (candidate lists flattened, sorted by
   ``(query, d2, id)``, the first ``k`` kept), on ``--points`` uniform random points and on the
   vertices of the real 3-D meshes of ../shared/data. Both answers are checked equal; time ratio.
2. Sharded, on each of ``--ranks`` gloo ranks (spawned here): the plan's points sent per rank,
   against the true geometric halo (the rank's points within ``radius`` of another rank's points,
   counted once per destination) and against the whole-cloud ring exchange (every rank receives
   every other rank's points), for partitions by kNN graph + METIS and by RCB.
3. ``BallQueryAttention`` forward + backward (float32): time and peak memory (resident set growth
   during the step, sampled every millisecond) per rank, against one process on the whole cloud.

The radius is set so that a ball holds ``1.25 * --neighbors`` points on average: truncation is
active. Timings are the minimum over ``--repeats``. Prints one JSON object per measurement and
markdown tables at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshshard.nn._ball_query import ball_query  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MESHES = ["sfepy/cube_cylinder.mesh", "sfepy/piezo_mesh_micro.vtk", "sfepy/wheelset.vtk"]


def radius_for(pos: np.ndarray, neighbors: float) -> float:
    """A radius whose ball holds ``neighbors`` points on average at the cloud's mean density."""
    extent = pos.max(0) - pos.min(0)
    volume = float(np.prod(extent[extent > 0]))
    dims = int((extent > 0).sum())
    density = len(pos) / volume
    unit_ball = math.pi ** (dims / 2) / math.gamma(dims / 2 + 1)
    return (neighbors / (density * unit_ball)) ** (1 / dims)


def kdtree_truncated(pos: np.ndarray, radius: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """scipy's query_ball_point, then the same truncation as ball_query: (index, num_candidates)."""
    from scipy.spatial import cKDTree

    tree = cKDTree(pos)
    # a hair wider, then the exact float64 test of ball_query (scipy's own rounding may differ at r)
    lists = tree.query_ball_point(pos, radius * (1 + 1e-9))
    lengths = np.fromiter((len(c) for c in lists), dtype=np.int64, count=len(lists))
    cols = np.fromiter((j for c in lists for j in c), dtype=np.int64, count=int(lengths.sum()))
    rows = np.repeat(np.arange(len(pos)), lengths)
    d2 = np.zeros(len(cols))
    for d in range(pos.shape[1]):
        d2 = d2 + (pos[cols, d] - pos[rows, d]) ** 2
    keep = d2 <= radius * radius
    rows, cols, d2 = rows[keep], cols[keep], d2[keep]
    order = np.lexsort((cols, d2, rows))
    rows, cols = rows[order], cols[order]
    counts = np.bincount(rows, minlength=len(pos))
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    index = np.full((len(pos), k), -1, dtype=np.int64)
    index[rows[slot < k], slot[slot < k]] = cols[slot < k]
    return index, counts


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def single_process(name: str, pos: np.ndarray, k: int, repeats: int) -> dict:
    radius = radius_for(pos, 1.25 * k)
    pt = torch.from_numpy(pos)
    t_ours, res = best_of(lambda: ball_query(pt, pt, radius, k), repeats)
    t_scipy, (index, counts) = best_of(lambda: kdtree_truncated(pos, radius, k), repeats)
    same = bool(np.array_equal(res.index.numpy(), index)) and bool(np.array_equal(res.num_candidates.numpy(), counts))
    row = {
        "part": "single", "cloud": name, "points": len(pos), "radius": radius, "k": k,
        "truncated_queries": res.num_truncated, "ours_s": t_ours, "scipy_s": t_scipy,
        "ratio": t_ours / t_scipy, "identical": same,
    }
    print(json.dumps(row), flush=True)
    return row


# --- sharded -----------------------------------------------------------------------------------------


def true_halo(pos: np.ndarray, owner: np.ndarray, radius: float, world: int) -> list[int]:
    """Per rank a: the points of a within radius of some point of rank b, summed over b != a."""
    from scipy.spatial import cKDTree

    trees = [cKDTree(pos[owner == b]) if (owner == b).any() else None for b in range(world)]
    out = []
    for a in range(world):
        mine = pos[owner == a]
        total = 0
        for b in range(world):
            if b == a or trees[b] is None or len(mine) == 0:
                continue
            d, _ = trees[b].query(mine, distance_upper_bound=radius * (1 + 1e-12))
            total += int(np.isfinite(d).sum())
        out.append(total)
    return out


class PeakRSS:
    """Peak growth of this process's resident set while the block runs (sampled every ms)."""

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def attention_step(module, x, pos, plan, w):
    x = x.detach().requires_grad_() if not hasattr(x, "spec") else x
    y = module(x, pos, plan)
    local = y.to_local() if hasattr(y, "to_local") else y
    (local * w).sum().backward()


def _worker(rank: int, world: int, init_file: str, job: dict, results) -> None:
    import torch.distributed as dist

    from meshshard import ShardSpec, ShardTensor
    from meshshard.comm import count_collectives
    from meshshard.nn._attention import BallQueryAttention
    from meshshard.nn._ball_halo import BallQueryPlan

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        out: dict = {"rank": rank}
        sharded = job["owner"] is not None
        if sharded:
            dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        pos = torch.from_numpy(job["pos"])
        if job.get("plan", True) and sharded:
            owner = job["owner"]
            spec = ShardSpec.from_counts(np.bincount(owner, minlength=world).tolist(),
                                         owned_ids=np.nonzero(owner == rank)[0])
            own = spec.owned_ids
            t, plan = best_of(lambda: BallQueryPlan.build(pos[own], job["radius"], job["k"], spec), job["repeats"])
            out.update(plan_s=t, sent=sum(plan.send_counts), halo=plan.num_ghost, owned=spec.num_owned)
        if job.get("attention"):
            a = job["attention"]
            torch.manual_seed(0)
            module = BallQueryAttention(a["dim"], a["heads"], job["radius"], job["k"])
            n = pos.shape[0]
            x_full = torch.randn(n, a["dim"], generator=torch.Generator().manual_seed(1))
            w_full = torch.randn(n, a["dim"], generator=torch.Generator().manual_seed(2))
            p32 = pos.float()
            if sharded:
                own = spec.owned_ids
                x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
                p, w, plan = p32[own], w_full[own], module.build_plan(ShardTensor.from_local(p32[own], spec))
            else:
                x, p, w, plan = x_full.requires_grad_(), p32, w_full, module.build_plan(p32)
            attention_step(module, x, p, plan, w)  # warm-up
            times, peaks = [], []
            for _ in range(job["repeats"]):
                if sharded:
                    dist.barrier()
                with PeakRSS() as mem, count_collectives() as log:
                    start = time.perf_counter()
                    attention_step(module, x, p, plan, w)
                    times.append(time.perf_counter() - start)
                peaks.append(mem.growth_mb)
            out.update(attn_s=min(times), attn_peak_mb=min(peaks), attn_collectives=log.count(),
                       attn_bytes_sent=log.bytes_sent(), attn_rows=int(plan.num_owned), attn_halo=plan.num_ghost)
        results.put((rank, out))
        if sharded:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        results.put((rank, {"error": f"{exc!r}\n{traceback.format_exc()}"}))


def spawn(world: int, job: dict) -> list[dict]:
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [ctx.Process(target=_worker, args=(r, world, init, job, results)) for r in range(world)]
        for p in procs:
            p.start()
        got = dict(results.get(timeout=3600) for _ in range(world))
        for p in procs:
            p.join()
    for r in range(world):
        if "error" in got[r]:
            raise RuntimeError(f"rank {r}: {got[r]['error']}")
    return [got[r] for r in range(world)]


def owner_of(pos: np.ndarray, world: int, method: str) -> np.ndarray:
    from meshshard.partition import partition_points

    owner = np.empty(len(pos), np.int64)
    for p in partition_points(pos, world, graph="knn", method=method):
        owner[p.owned_ids] = p.rank
    return owner


def sharded_halo(pos: np.ndarray, k: int, world: int, method: str, repeats: int) -> dict:
    radius = radius_for(pos, 1.25 * k)
    start = time.perf_counter()
    owner = owner_of(pos, world, method)
    t_partition = time.perf_counter() - start
    truth = true_halo(pos, owner, radius, world)
    ranks = spawn(world, {"pos": pos, "owner": owner, "radius": radius, "k": k, "repeats": repeats})
    sent = [r["sent"] for r in ranks]
    ring = [len(pos) - r["owned"] for r in ranks]  # what a whole-cloud ring exchange brings each rank
    row = {
        "part": "halo", "points": len(pos), "ranks": world, "partition": method, "radius": radius,
        "sent_per_rank": sent, "true_halo_per_rank": truth,
        "sent_over_true": sum(sent) / max(1, sum(truth)), "worst_rank_over_true": max(s / max(1, t) for s, t in zip(sent, truth)),
        "ring_per_rank": ring, "sent_over_ring": sum(sent) / max(1, sum(ring)),
        "plan_build_s_max": max(r["plan_s"] for r in ranks), "partition_s": t_partition,
    }
    print(json.dumps(row), flush=True)
    return row


def sharded_attention(pos: np.ndarray, k: int, ranks: list[int], repeats: int, dim: int, heads: int) -> list[dict]:
    radius = radius_for(pos, 1.25 * k)
    job = {"pos": pos, "radius": radius, "k": k, "repeats": repeats, "plan": False,
           "attention": {"dim": dim, "heads": heads}}
    rows = []
    one = spawn(1, {**job, "owner": None})[0]
    rows.append({"part": "attention", "points": len(pos), "ranks": 1, "dim": dim, "heads": heads, "k": k,
                 "fwd_bwd_s_max": one["attn_s"], "peak_mb_max": one["attn_peak_mb"], "halo_rows_max": 0,
                 "collectives": one["attn_collectives"]})
    print(json.dumps(rows[-1]), flush=True)
    for world in ranks:
        owner = owner_of(pos, world, "rcb")
        got = spawn(world, {**job, "owner": owner, "plan": True, "repeats": repeats})
        rows.append({"part": "attention", "points": len(pos), "ranks": world, "dim": dim, "heads": heads, "k": k,
                     "fwd_bwd_s_max": max(r["attn_s"] for r in got), "peak_mb_max": max(r["attn_peak_mb"] for r in got),
                     "halo_rows_max": max(r["attn_halo"] for r in got),
                     "collectives": got[0]["attn_collectives"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--shard-points", type=int, default=200_000)
    ap.add_argument("--attn-points", type=int, default=50_000)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--neighbors", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.points, args.shard_points, args.attn_points, args.repeats = 50_000, 20_000, 5_000, 1
    ranks = [int(r) for r in args.ranks.split(",") if r]
    k = args.neighbors
    rng = np.random.default_rng(0)

    single = [single_process("uniform", rng.random((args.points, 3)), k, args.repeats)]
    from meshshard.partition import read_input

    for mesh in MESHES:
        if (DATA / mesh).exists():
            single.append(single_process(mesh, np.asarray(read_input(DATA / mesh).pos, dtype=np.float64), k, args.repeats))

    shard_pos = rng.random((args.shard_points, 3))
    halos = [sharded_halo(shard_pos, k, w, m, args.repeats) for w in ranks for m in ("metis", "rcb")]
    attn = sharded_attention(rng.random((args.attn_points, 3)), k, ranks, args.repeats, args.dim, args.heads)

    print("\n| cloud | points | k | truncated queries | ball_query s | cKDTree + truncation s | ratio | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for r in single:
        print(f"| {r['cloud']} | {r['points']:,} | {r['k']} | {r['truncated_queries']:,} | {r['ours_s']:.2f} | "
              f"{r['scipy_s']:.2f} | {r['ratio']:.2f} | {r['identical']} |")
    print("\n| points | ranks | partition | sent per rank | true halo per rank | sent / true | worst rank | ring per rank | sent / ring | plan build s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in halos:
        print(f"| {r['points']:,} | {r['ranks']} | {r['partition']} | {r['sent_per_rank']} | {r['true_halo_per_rank']} | "
              f"{r['sent_over_true']:.3f} | {r['worst_rank_over_true']:.3f} | {r['ring_per_rank']} | {r['sent_over_ring']:.4f} | "
              f"{r['plan_build_s_max']:.2f} |")
    print("\n| points | ranks | fwd+bwd s (slowest rank) | peak MB (largest rank) | halo rows (largest) | collectives per step |")
    print("|---|---|---|---|---|---|")
    for r in attn:
        print(f"| {r['points']:,} | {r['ranks']} | {r['fwd_bwd_s_max']:.2f} | {r['peak_mb_max']:.0f} | {r['halo_rows_max']:,} | {r['collectives']} |")


if __name__ == "__main__":
    main()
