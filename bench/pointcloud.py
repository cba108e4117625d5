"""Benchmark: point-cloud models on shards, throughput and memory per rank, and the ball query's halo.

    python bench/pointcloud.py [--points 2000000] [--ranks 1,2,4] [--models ball-attention,transolver]
                               [--attention chunked] [--width 16] [--blocks 2] [--neighbors 8] [--slices 16]
                               [--repeats 1] [--json FILE]

The cloud: ``--points`` points uniformly on a unit sphere's surface (a synthetic surface, like a
body's surface samples), split into R parts by recursive coordinate bisection. For each model and
each R in ``--ranks``, R local ranks (gloo, under torchrun; R = 1: one process on the whole cloud)
each load only their own points and run, on float32:

- ``ball-attention``: :class:`~meshshard.nn.BallAttentionNet`, the model of ``train --model
  ball-attention``, with ``--blocks`` blocks (each a residual ball-query attention and a residual
  MLP; radius such that a ball holds ``1.25 * --neighbors`` points on average, at most
  ``--neighbors`` kept). Its :class:`~meshshard.nn.BallQueryPlan` is built once
  (:meth:`~meshshard.nn.BallAttentionNet.build_plans`) and timed against one forward.
  ``--attention chunked,dense`` runs it both ways, each in its own processes: ``chunked``, the
  attention (projections included) in chunks of points whose backward recomputes each chunk, and
  each block's MLP recomputed in the backward (memory linear in points x width), its plans kept in
  the model's plan cache across steps (``plan_owner``); ``dense``, the
  former path: every ``(points, neighbours, width)`` tensor kept for the backward, and the plans
  rebuilt at every forward by the former build (``meshshard.nn._ball_query.WHOLE_QUERY``: every
  query's cell runs at once and candidate chunks of 4M pairs, where the library's build works in
  blocks of queries and chunks of 256K pairs, a working set of tens of MB).
- ``transolver``: :class:`~meshshard.nn.Transolver` with ``--blocks`` blocks, ``--slices`` slices.

Measured per run: the plan's build time (ball-attention), one forward, and forward + backward of a
sum loss with the plans given (dense) or taken from the plan cache (chunked; the plans of the timed
build are dropped first, so one set is held, as in training) (the median of ``--repeats`` after one
warm-up); for ball-attention also a training step as the loop runs it (``step_s``: forward +
backward with the plans rebuilt (dense) or taken from the cache (chunked), median); the points per second,
``points / (forward + backward time of the slowest rank)``; each rank's peak resident set
(``ru_maxrss``, the whole process: Python, torch, the points and the step); and, for
ball-attention, the points each rank receives from the plan against the true geometric halo (the
points of other ranks within the radius of one of its own, by k-d trees). Parameter gradients are
not all-reduced (that is the data-parallel wrapper's cost, not the model's).

The default (2M points, width 16, 2 blocks, 8 neighbours) measures whether a cloud of DrivAerML's
surface size fits and how the cost splits over ranks on a small CPU machine; the widths are far
below a real model's (128 to 256), so the time per point is a floor. Runs with more ranks than
cores share the cores: their time per rank is then not a speed-up. The one-rank ball-attention run
peaks at about 16 GB (8 KB per point at width 16: the neighbour tensors kept for the backward);
the default takes about 15 minutes on 2 cores. Prints one JSON object per run, a summary JSON line
and a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runner import emit, end_worker, peak_rss_mb, read_json, run_workers  # noqa: E402

MODELS = ("ball-attention", "transolver")


def sphere_cloud(n: int, seed: int = 0) -> np.ndarray:
    """``n`` points uniformly on the unit sphere, float64 ``(n, 3)``."""
    x = np.random.default_rng(seed).normal(size=(n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def surface_radius(n: int, neighbors: float) -> float:
    """The radius whose disc holds ``neighbors`` of ``n`` uniform points on the unit sphere (area 4 pi)."""
    return math.sqrt(neighbors / (math.pi * n / (4 * math.pi)))


# ---------------------------------------------------------------------------------------------
# worker: one rank


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from meshshard import ShardSpec, ShardTensor
    from meshshard.nn import BallAttentionNet, Transolver

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    folder = Path(args.worker)
    job = json.loads((folder / "job.json").read_text())
    if world > 1:
        dist.init_process_group("gloo")
    pos64 = np.load(folder / f"pos-{rank}.npy")
    ids = np.load(folder / f"ids-{rank}.npy")
    spec = ShardSpec.from_counts(job["counts"], owned_ids=torch.from_numpy(ids)) if world > 1 else None
    pos = torch.from_numpy(pos64).float()
    x = torch.cat([pos, pos.abs()], 1)  # 6 input channels per point
    idle_mb = peak_rss_mb()
    torch.manual_seed(0)
    out = {"rank": rank, "owned": len(ids)}
    step = None

    def barrier() -> None:
        if world > 1:
            dist.barrier()

    if job["model"] == "ball-attention":
        # the built-in model of train --model ball-attention, its plan built once and timed apart
        model = BallAttentionNet(6, 1, width=job["width"], layers=job["blocks"], heads=job["heads"],
                                 radius=job["radius"], max_neighbors=job["neighbors"])
        dense = job["attention"] == "dense"
        if dense:  # the former plan build too: every query's runs at once, 4M-pair chunks
            import meshshard.nn._ball_query as ball_query_module

            ball_query_module.WHOLE_QUERY = True
        for block in model.blocks:
            if dense:  # the former path: one pass, every (points, neighbours, width) tensor kept for the backward
                block.attention.chunk_elements = 0
                block.recompute_mlp = False
        barrier()
        start = time.perf_counter()
        plans = model.build_plans(pos, spec)
        out["plan_s"] = time.perf_counter() - start
        (plan,) = plans.values()
        out["received"] = plan.num_ghost
        out["sent"] = int(sum(plan.send_counts))
        features = x if spec is None else ShardTensor.from_local(x, spec)
        owner = type("Sample", (), {})()  # stands for the sample's ShardGraph, the key of the plan cache
        if not dense:  # the plan cache's plans serve every call (held once, as in training)
            plans = plan = None

        def forward() -> torch.Tensor:
            y = model(features, pos, plans, plan_owner=owner)
            return y if spec is None else y.to_local()

        def step() -> None:  # a training step: plans rebuilt at every forward (dense), or cached (chunked)
            model.zero_grad(set_to_none=True)
            y = model(features, pos) if dense else model(features, pos, plan_owner=owner)
            (y if spec is None else y.to_local()).sum().backward()
    else:
        model = Transolver(6, 1, width=job["width"], layers=job["blocks"], heads=job["heads"], slices=job["slices"])

        def forward() -> torch.Tensor:
            return model.forward_local(x, spec)

    def timed(run) -> float:  # noqa: ANN001
        times = []
        for _ in range(job["repeats"]):
            barrier()
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def forward_only() -> None:
        with torch.no_grad():
            forward()

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        forward().sum().backward()

    forward_backward()  # warm-up
    out["forward_s"] = timed(forward_only)
    out["fwd_bwd_s"] = timed(forward_backward)
    if step is not None:
        step()  # warm-up: fills the plan cache (chunked)
        out["step_s"] = timed(step)
    out["idle_rss_mb"] = idle_mb
    out["peak_rss_mb"] = peak_rss_mb()
    (folder / f"result-{rank}.json").write_text(json.dumps(out))
    if world > 1:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# driver


def run(model: str, world: int, pos: np.ndarray, owner: np.ndarray, true_halo: list[int], args: argparse.Namespace,
        radius: float, attention: str = "chunked") -> dict:
    """One model on ``world`` ranks: the row of the table."""
    with tempfile.TemporaryDirectory(prefix="pointcloud-bench-") as tmp:
        folder = Path(tmp)
        counts = np.bincount(owner, minlength=world).tolist()
        for r in range(world):
            ids = np.nonzero(owner == r)[0]
            np.save(folder / f"ids-{r}.npy", ids)
            np.save(folder / f"pos-{r}.npy", pos[ids])
        job = {"model": model, "counts": counts, "radius": radius, "neighbors": args.neighbors, "width": args.width,
               "blocks": args.blocks, "heads": args.heads, "slices": args.slices, "repeats": args.repeats,
               "attention": attention}
        (folder / "job.json").write_text(json.dumps(job))
        env = os.environ | {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
        done = run_workers(__file__, ["--worker", str(folder)], world, env, timeout=args.timeout)
        name = f"{model} ({attention})" if model == "ball-attention" else model
        ranks = [read_json(folder / f"result-{r}.json", done, f"{name} on {world} rank(s)") for r in range(world)]
    slowest = max(r["fwd_bwd_s"] for r in ranks)
    row = {"model": model, "points": len(pos), "ranks": world, "owned": [r["owned"] for r in ranks],
           "forward_s": max(r["forward_s"] for r in ranks), "fwd_bwd_s": slowest,
           "points_per_s": len(pos) / slowest, "peak_rss_mb": [round(r["peak_rss_mb"], 1) for r in ranks],
           "idle_rss_mb": [round(r["idle_rss_mb"], 1) for r in ranks]}
    if model == "ball-attention":
        received = [r["received"] for r in ranks]
        row |= {"attention": attention, "step_s": max(r["step_s"] for r in ranks),
                "radius": radius, "neighbors": args.neighbors, "plan_build_s": max(r["plan_s"] for r in ranks),
                "plan_over_forward": max(r["plan_s"] for r in ranks) / row["forward_s"],
                "halo_received": received, "true_halo": true_halo,
                "halo_over_true": sum(received) / sum(true_halo) if sum(true_halo) else None}
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | ranks | attention | points/s (fwd+bwd) | fwd+bwd s | forward s | plan build s (x forward) | "
             "training step s | peak RSS MB per rank | halo received / true halo |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        plan = f"{r['plan_build_s']:.2f} ({r['plan_over_forward']:.2f}x)" if "plan_build_s" in r else "-"
        halo = (f"{sum(r['halo_received']):,} / {sum(r['true_halo']):,} = {r['halo_over_true']:.3f}"
                if r.get("halo_over_true") else "-")
        peak = ", ".join(f"{m:.0f}" for m in r["peak_rss_mb"])
        step = f"{r['step_s']:.2f}" if "step_s" in r else "-"
        lines.append(f"| {r['model']} | {r['ranks']} | {r.get('attention', '-')} | {r['points_per_s']:,.0f} | {r['fwd_bwd_s']:.2f} | "
                     f"{r['forward_s']:.2f} | {plan} | {step} | {peak} | {halo} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=2_000_000, help="points in the cloud (default 2,000,000)")
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--attention", default="chunked",
                   help="ball-attention's path(s), comma-separated: chunked (the library's), dense (the former one-pass "
                        "path, plans rebuilt every forward) (default chunked)")
    p.add_argument("--width", type=int, default=16, help="latent width (default 16)")
    p.add_argument("--blocks", type=int, default=2, help="attention blocks (default 2)")
    p.add_argument("--heads", type=int, default=2, help="attention heads (default 2)")
    p.add_argument("--neighbors", type=int, default=8, help="ball-query neighbours kept (default 8)")
    p.add_argument("--slices", type=int, default=16, help="Transolver slices (default 16)")
    p.add_argument("--repeats", type=int, default=1, help="timed repeats after a warm-up (default 1)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        end_worker()
    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in MODELS for m in models):
        p.error(f"--models: expected names from {', '.join(MODELS)}, got {args.models!r}")
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        p.error(f"--ranks: expected comma-separated positive rank counts, got {args.ranks!r}")
    attentions = [a for a in args.attention.split(",") if a]
    if not attentions or any(a not in ("chunked", "dense") for a in attentions):
        p.error(f"--attention: expected chunked and / or dense, got {args.attention!r}")
    if args.points < 16 * max(ranks) or args.width % args.heads:
        p.error("--points: expected at least 16 per rank, and --width a multiple of --heads")
    from meshshard.partition._assign import rcb_parts
    from meshshard.partition._points import geometric_halo_counts

    pos = sphere_cloud(args.points)
    radius = surface_radius(args.points, 1.25 * args.neighbors)
    rows = []
    for world in ranks:
        owner = rcb_parts(pos, world) if world > 1 else np.zeros(len(pos), np.int64)
        true_halo = geometric_halo_counts(pos, owner, world, radius) if world > 1 else [0]
        for model in models:
            for attention in attentions if model == "ball-attention" else ["chunked"]:
                rows.append(run(model, world, pos, owner, true_halo, args, radius, attention))
    summary = {"points": args.points, "cpu_count": os.cpu_count(), "width": args.width, "blocks": args.blocks,
               "neighbors": args.neighbors, "radius": radius, "repeats": args.repeats, "rows": rows}
    pairs = {(r["ranks"], r["attention"]): r for r in rows if "attention" in r}
    summary["chunked_over_dense"] = [
        {"ranks": w, "peak_rss": max(c["peak_rss_mb"]) / max(d["peak_rss_mb"]),
         "peak_over_idle": (max(a - b for a, b in zip(c["peak_rss_mb"], c["idle_rss_mb"]))
                            / max(a - b for a, b in zip(d["peak_rss_mb"], d["idle_rss_mb"]))),
         "fwd_bwd": c["fwd_bwd_s"] / d["fwd_bwd_s"], "step": c["step_s"] / d["step_s"]}
        for (w, a), c in pairs.items() if a == "chunked" and (d := pairs.get((w, "dense")))]
    emit(summary, args.json)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
