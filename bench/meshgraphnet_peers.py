"""Benchmark: one MeshGraphNet training step, meshshard against what a user would pick instead.

    python bench/meshgraphnet_peers.py [--side 37] [--latent 64] [--mp-steps 6] [--rounds 3] [--json FILE]
    python bench/meshgraphnet_peers.py --only meshshard,meshshard-bf16     # bf16 autocast, and its error
    python bench/meshgraphnet_peers.py --fit-gb 20 [--latent 128 --mp-steps 15]   # largest mesh in 20 GB
    python bench/meshgraphnet_peers.py --device cuda --only meshshard,pyg,meshshard-bf16  # on a GPU

Every implementation trains the same model (encoder, ``--mp-steps`` processor blocks, decoder;
latent ``--latent``, 2 hidden layers, ReLU, LayerNorm; sum aggregation) on the same jittered tet
lattice (side 37: 50,653 nodes, 693,792 directed edges), the same inputs (3 node features,
``[rel pos, |rel pos|]`` edge features, 1 output) and Adam, one fresh process per run, so peak
RSS is the run's own. Runs are interleaved (A B C ... A B C ...) for ``--rounds`` rounds; each run
times ``--iters`` training steps after one warm-up step. Reported per implementation: median and
min step time over all timed steps, the median CPU seconds per step (all threads and ranks; less
sensitive than wall time to other work on a shared machine), peak RSS (``ru_maxrss``, the whole process: Python, torch and
the mesh included), the parameter count, and ratios to PhysicsNeMo. For the 2-rank run it also gives
the ratio of the memory above each process's peak before its first step (torch, the optimizer's
imports, the mesh and the model: about 330 MB per process), which is what sharding divides.

Implementations:

- ``meshshard``: ``meshshard.nn.MeshGraphNet`` as it ships (lean first layers, MLPs recomputed);
- ``meshshard-saved``: the same with ``recompute=False``;
- ``physicsnemo`` / ``physicsnemo-concat``: ``physicsnemo.models.meshgraphnet.MeshGraphNet``
  (the ``nvidia-physicsnemo`` package) by default and with ``do_concat_trick=True``;
- ``pyg``: a plain PyTorch Geometric implementation (``tests/meshshard/_reference_meshgraphnet.py``);
- ``meshshard-2ranks``: meshshard on a 2-part METIS partition, 2 local ranks of 1 thread each
  (single-process runs use 2 threads); its peak RSS is per rank;
- ``meshshard-unfused``: ``meshshard`` with ``MESHSHARD_TRITON=0``: on a GPU, the processor's edge
  MLPs as separate kernels instead of one Triton kernel each (``meshshard/nn/_edge_triton.py``);
  the same as ``meshshard`` on a CPU. Not in the default set;
- ``meshshard-bf16``: meshshard under bfloat16 autocast (what ``meshshard train --precision
  bf16-mixed`` does: float32 weights, Adam state, sums at destinations and loss). Not in the
  default set; after its timed steps it also reports its error against float32 from the same
  initial weights: relative L2 error of the output, of the loss, and of every parameter's
  gradient (all concatenated, and the worst tensor).

Setting up the peers (optional; not dependencies of meshshard): ``bash bench/setup_peers.sh``.
PhysicsNeMo's MeshGraphNet needs ``torch_scatter``, which has no wheel for torch 2.13 on CPU and is
built against the installed torch (about 5 minutes on 2 cores). ``physicsnemo`` imports
torchvision through timm, and the package index's torchvision wheels need CUDA libraries the CPU
torch lacks; MeshGraphNet uses none of it, so the PhysicsNeMo runs (only they) get a stand-in
``torchvision`` from ``bench/_stubs`` on ``PYTHONPATH``. A peer that cannot be imported is skipped
and the output says so.

Every process runs with ``MALLOC_MMAP_THRESHOLD_=4194304`` (see ``bench/meshgraphnet.py``).

``--fit-gb G``: the largest mesh for which one training step fits in G GB of peak RSS, for
meshshard and the best peer that runs: peak RSS grows linearly with the mesh, so two sizes are
measured, the side at G GB is extrapolated, and a run at that side confirms it; while it misses,
the line through the last two runs gives the next side (``--fit-refine``). GB = 10^9 bytes;
``--iters 1`` is enough there: the peak is reached in the first step's backward.

``--device cuda``: everything runs on the first GPU (inputs, model, optimizer; bf16 autocast on
CUDA). Step times are taken between ``torch.cuda.synchronize()`` calls, and memory is the peak GPU
memory that PyTorch allocated (``torch.cuda.max_memory_allocated``; no torch import, no CUDA
context): the memory ratios and ``--fit-gb`` use it, and peak RSS is shown beside it. With fewer
GPUs than ranks, ``meshshard-2ranks`` puts both ranks on the one GPU and exchanges through gloo
(NCCL wants one GPU per rank): its memory per rank is right, its step time is not NCCL's.

Targets (issue 12, ratios within one run): peak memory <= 0.5x PhysicsNeMo's default and <= 0.75x
its concat trick; step time <= 0.8x both; 2 ranks <= 0.55x our own single process per rank.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _runner import end_worker, peak_rss_mb, run_workers, scratch_folder, worker_arguments

ROOT = Path(__file__).resolve().parents[1]
STUBS = Path(__file__).resolve().parent / "_stubs"
IMPLEMENTATIONS = ("meshshard", "meshshard-saved", "physicsnemo", "physicsnemo-concat", "pyg", "meshshard-2ranks", "meshshard-bf16",
                   "meshshard-unfused")
DEFAULT = IMPLEMENTATIONS[:-2]  # meshshard-bf16 and meshshard-unfused with --only


# ----------------------------------------------------------------------------- worker side


def _build(impl: str, node_in: int, edge_in: int, latent: int, steps: int):
    if impl.startswith("meshshard"):
        from meshshard.nn import MeshGraphNet

        return MeshGraphNet(node_in, edge_in, 1, latent_size=latent, hidden_layers=2, message_passing_steps=steps,
                            recompute=impl != "meshshard-saved")
    if impl.startswith("physicsnemo"):
        from physicsnemo.models.meshgraphnet import MeshGraphNet as PNMeshGraphNet

        return PNMeshGraphNet(
            node_in, edge_in, 1, processor_size=steps, num_layers_node_processor=2, num_layers_edge_processor=2,
            hidden_dim_processor=latent, hidden_dim_node_encoder=latent, num_layers_node_encoder=2,
            hidden_dim_edge_encoder=latent, num_layers_edge_encoder=2, hidden_dim_node_decoder=latent,
            num_layers_node_decoder=2, aggregation="sum", do_concat_trick=impl == "physicsnemo-concat",
        )
    if impl == "pyg":
        sys.path.insert(0, str(ROOT))
        from tests.meshshard._reference_meshgraphnet import ReferenceMeshGraphNet

        return ReferenceMeshGraphNet(node_in, edge_in, 1, latent=latent, hidden_layers=2, steps=steps)
    raise ValueError(impl)


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from meshshard import ShardGraph, ShardTensor, edge_features
    from meshshard.comm import init_distributed, sum_gradients

    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision(args.matmul_precision)
    torch.manual_seed(0)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    result: dict = {"impl": args.impl, "status": "ok"}
    initial = None  # meshshard-bf16: the weights before training, for the error against float32
    try:
        if args.impl == "meshshard-2ranks":
            from meshshard.partition import load_partition

            ctx = init_distributed()
            graph = ShardGraph.from_partition(load_partition(args.partition, ctx.rank), device=device)
            ea = edge_features(graph.pos, graph.edge_index)
            g = torch.Generator().manual_seed(0)
            x_full = torch.randn(args.num_nodes, 3, generator=g)
            y_full = torch.randn(args.num_nodes, 1, generator=g)
            own = graph.spec.owned_ids.cpu()
            x = ShardTensor.from_local(x_full[own].to(device), graph.spec)
            y = ShardTensor.from_local(y_full[own].to(device), graph.spec)
            del x_full, y_full
            inputs: tuple = (x, graph, ea)
        else:
            ctx = None
            pos = torch.from_numpy(np.load(Path(args.mesh) / "pos.npy")).to(device)
            edge_index = torch.from_numpy(np.load(Path(args.mesh) / "edge_index.npy")).to(device)
            ea = edge_features(pos, edge_index)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(len(pos), 3, generator=g).to(device)
            y = torch.randn(len(pos), 1, generator=g).to(device)
            if args.impl.startswith("physicsnemo"):
                from torch_geometric.data import Data

                inputs = (x, ea, Data(edge_index=edge_index, num_nodes=len(pos)))
            else:
                inputs = (x, edge_index, ea)
        model = _build(args.impl, 3, ea.shape[1], args.latent, args.mp_steps).to(device)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        bf16 = args.impl == "meshshard-bf16"
        if bf16:
            initial = {k: v.clone() for k, v in model.state_dict().items()}
        result["rss_before_mb"] = peak_rss_mb()
        if cuda:
            sync()
            result["gpu_before_mb"] = torch.cuda.max_memory_allocated() / 2**20
        times, cpu = [], []
        for i in range(args.iters + 1):
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model(*inputs)
            loss = ((out.float() - y) ** 2).mean()
            del out
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if ctx is not None:
                sum_gradients(model.parameters())
            opt.step()
            sync()
            if i:
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
        result["step_s"], result["step_cpu_s"] = times, cpu
        result["loss"] = float(loss)
    except (RuntimeError, MemoryError, ImportError) as err:
        result["status"] = f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    result["peak_rss_mb"] = peak_rss_mb()
    if cuda:
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if result["status"] == "ok" and initial is not None:
        model.load_state_dict(initial)
        result["error_vs_fp32"] = _error_vs_fp32(model, inputs, y)
    rank = int(os.environ.get("RANK", "0"))
    Path(f"{args.out_json}.rank{rank}").write_text(json.dumps(result))


def _error_vs_fp32(model, inputs: tuple, y) -> dict[str, float]:
    """Relative L2 errors of one bf16-autocast forward and backward against float32's, same weights."""
    import torch

    def run(enabled: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast(y.device.type, dtype=torch.bfloat16, enabled=enabled):
            out = model(*inputs)
        loss = ((out.float() - y) ** 2).mean()
        loss.backward()
        return out.detach().float(), loss.detach(), [p.grad.detach().clone() for p in model.parameters()]

    out32, loss32, grads32 = run(False)
    out16, loss16, grads16 = run(True)

    def rel(a, b) -> float:
        return float((a - b).norm() / b.norm())

    return {"output": rel(out16, out32), "loss": rel(loss16, loss32),
            "gradients": rel(torch.cat([g.flatten() for g in grads16]), torch.cat([g.flatten() for g in grads32])),
            "worst_gradient_tensor": max(rel(a, b) for a, b in zip(grads16, grads32))}


# ----------------------------------------------------------------------------- driver side


@functools.cache
def _cuda_devices() -> int:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True, text=True)
    return int(done.stdout.strip() or 0)


def _peer_available(impl: str) -> str | None:
    """None if ``impl`` imports here, else the reason it is skipped."""
    probe = {
        "physicsnemo": "import torch_scatter, physicsnemo.models.meshgraphnet",
        "pyg": "import torch_geometric.nn",
    }.get(impl.split("-")[0])
    if probe is None:
        return None
    env = _env(impl)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"skipped: {last} (run bash bench/setup_peers.sh)"
    return None


def _env(impl: str, threads: int = 2) -> dict[str, str]:
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": str(4 * 2**20), "MESHSHARD_TIMEOUT": "600"}
    if impl == "meshshard-unfused":
        env["MESHSHARD_TRITON"] = "0"
    if impl.startswith("physicsnemo"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUBS), env.get("PYTHONPATH", "")) if p)
        env.setdefault("WARP_CACHE_PATH", tempfile.gettempdir())
    return env


def run_one(impl: str, work: Path, args: argparse.Namespace, side: int, num_nodes: int) -> dict:
    out = tempfile.mktemp(prefix="mgn-peers-", dir=work)
    ranks = 2 if impl == "meshshard-2ranks" else 1
    threads = 1 if ranks > 1 else 2
    flags = ["--worker", "--impl", impl, "--mesh", str(work / f"mesh{side}"),
             "--partition", str(work / f"parts{side}"), "--num-nodes", str(num_nodes), "--threads", str(threads),
             "--latent", str(args.latent), "--mp-steps", str(args.mp_steps), "--iters", str(args.iters), "--out-json", out,
             "--device", args.device, "--matmul-precision", args.matmul_precision]
    env = _env(impl, threads)
    if ranks > 1 and args.device == "cuda" and _cuda_devices() < ranks:
        env["MESHSHARD_BACKEND"] = "gloo"  # NCCL wants a GPU per rank: share one GPU, exchange through gloo
    done = run_workers(__file__, flags, ranks, env, timeout=3600)
    rows = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(ranks) if Path(f"{out}.rank{r}").exists()]
    if not rows:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"impl": impl, "status": f"no result (exit {done.returncode}: {tail})"}
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        return bad[0]
    return {
        "impl": impl, "status": "ok", "parameters": rows[0]["parameters"],
        "step_s": [max(ts) for ts in zip(*(r["step_s"] for r in rows))],  # a step ends when its slowest rank does
        "step_cpu_s": [sum(ts) for ts in zip(*(r["step_cpu_s"] for r in rows))],  # CPU seconds, all ranks
        "peak_rss_mb": max(r["peak_rss_mb"] for r in rows), "rss_before_mb": max(r["rss_before_mb"] for r in rows),
        **({"peak_gpu_mb": max(r["peak_gpu_mb"] for r in rows), "gpu_before_mb": max(r["gpu_before_mb"] for r in rows)}
           if "peak_gpu_mb" in rows[0] else {}),
        "loss": rows[0]["loss"], **({"error_vs_fp32": rows[0]["error_vs_fp32"]} if "error_vs_fp32" in rows[0] else {}),
    }


def prepare(work: Path, side: int, need_partition: bool) -> int:
    """Write the lattice (pos.npy, edge_index.npy) and, if asked, its 2-part partition; returns N."""
    import meshio
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _meshes import make_box_mesh

    from meshshard.partition import build_graph, partition_file, read_input

    mesh_dir = work / f"mesh{side}"
    if mesh_dir.exists():
        return int(np.load(mesh_dir / "pos.npy", mmap_mode="r").shape[0])
    points, tets = make_box_mesh(side)
    vtk = work / f"box{side}.vtk"
    meshio.write(vtk, meshio.Mesh(points, [("tetra", tets)]), binary=True)
    graph = build_graph(read_input(vtk), "nodal")
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    mesh_dir.mkdir()
    np.save(mesh_dir / "pos.npy", graph.pos.astype(np.float32))
    np.save(mesh_dir / "edge_index.npy", np.stack([graph.indices, dst]).astype(np.int64))
    if need_partition:
        partition_file(vtk, work / f"parts{side}", 2)
    return graph.num_nodes


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    for impl, rows in runs.items():
        ok = [r for r in rows if r["status"] == "ok"]
        if not ok:
            out[impl] = {"status": rows[0]["status"]}
            continue
        medians = [statistics.median(r["step_s"]) for r in ok]
        out[impl] = {
            "status": "ok", "parameters": ok[0]["parameters"],
            "step_s_median": round(statistics.median([t for r in ok for t in r["step_s"]]), 3),
            "step_s_min": round(min(t for r in ok for t in r["step_s"]), 3),
            "step_s_round_medians": [round(m, 3) for m in medians],
            "step_cpu_s_median": round(statistics.median([t for r in ok for t in r["step_cpu_s"]]), 3),
            "peak_rss_mb": round(statistics.median(r["peak_rss_mb"] for r in ok), 1),
            "rss_before_mb": round(statistics.median(r["rss_before_mb"] for r in ok), 1),
            **({"peak_gpu_mb": round(statistics.median(r["peak_gpu_mb"] for r in ok), 1),
                "gpu_before_mb": round(statistics.median(r["gpu_before_mb"] for r in ok), 1)} if "peak_gpu_mb" in ok[0] else {}),
            **({"error_vs_fp32": ok[0]["error_vs_fp32"]} if "error_vs_fp32" in ok[0] else {}),
        }
    return out


def _memory_key(table: dict[str, dict]) -> str:
    """The memory a table compares: peak GPU memory when its runs were on a GPU, else peak RSS."""
    return "peak_gpu_mb" if any("peak_gpu_mb" in row for row in table.values()) else "peak_rss_mb"


def ratios(table: dict[str, dict]) -> dict[str, float]:
    def get(impl: str, key: str) -> float | None:
        row = table.get(impl, {})
        return row.get(key) if row.get("status") == "ok" else None

    out = {}
    mem = _memory_key(table)
    gpu = mem == "peak_gpu_mb"
    for peer in ("physicsnemo", "physicsnemo-concat", "pyg"):
        for key, name in ((mem, "memory"), ("step_s_median", "time"), ("step_cpu_s_median", "CPU time")):
            a, b = get("meshshard", key), get(peer, key)
            if a and b:
                out[f"{name} meshshard / {peer}"] = round(a / b, 3)
    a, b = get("meshshard-2ranks", mem), get("meshshard", mem)
    if a and b:
        out["memory per rank, 2 ranks / meshshard 1 process"] = round(a / b, 3)
        before = "gpu_before_mb" if gpu else "rss_before_mb"
        a0, b0 = get("meshshard-2ranks", before), get("meshshard", before)
        out["same, above each process's memory at its first step"] = round((a - a0) / (b - b0), 3)
    for other in ("meshshard-bf16", "meshshard-unfused"):
        for key, name in ((mem, "memory"), ("step_s_median", "time")):
            a, b = get(other, key), get("meshshard", key)
            if a and b:
                out[f"{name} {other} / meshshard"] = round(a / b, 3)
    a, b = get("meshshard-unfused", "step_s_median"), get("pyg", "step_s_median")
    if a and b:
        out["time meshshard-unfused / pyg"] = round(a / b, 3)
    return out


def print_table(table: dict[str, dict], rat: dict[str, float]) -> None:
    gpu = _memory_key(table) == "peak_gpu_mb"
    print(f"\n{'implementation':<22} {'median step s':>13} {'min step s':>10} {'CPU s/step':>10} {'peak RSS MB':>12} "
          + (f"{'peak GPU MB':>12} " if gpu else "") + f"{'parameters':>11}")
    for impl, row in table.items():
        if row["status"] != "ok":
            print(f"{impl:<22} {row['status']}")
            continue
        digits = 4 if gpu else 2
        print(f"{impl:<22} {row['step_s_median']:>13.{digits}f} {row['step_s_min']:>10.{digits}f} {row['step_cpu_s_median']:>10.2f} "
              f"{row['peak_rss_mb']:>12,.0f} " + (f"{row.get('peak_gpu_mb', float('nan')):>12,.0f} " if gpu else "")
              + f"{row['parameters']:>11,}")
    for name, value in rat.items():
        print(f"  {name:<52} {value:.2f}")
    for impl, row in table.items():
        if "error_vs_fp32" in row:
            err = row["error_vs_fp32"]
            print(f"  {impl} against float32, same weights, relative L2: output {err['output']:.2e}, loss {err['loss']:.2e}, "
                  f"gradients {err['gradients']:.2e} (worst tensor {err['worst_gradient_tensor']:.2e})")


def fit(work: Path, args: argparse.Namespace, impls: list[str]) -> dict:
    """Peak RSS at two sides, linear in N; the side at ``--fit-gb``; confirming runs there.

    A lattice's edges per node grow with its side (fewer nodes on the boundary), so a line through
    two small sizes underestimates a large one: while a confirming run misses the limit (over it, or
    under it by more than 5%), the line through the last two runs gives the next side, up to
    ``--fit-refine`` more runs. The largest confirmed side that fits is reported."""
    out = {}
    limit_mb = args.fit_gb * 1e9 / 2**20  # GB = 10^9 bytes; peak RSS is in MiB
    mem = "peak_gpu_mb" if args.device == "cuda" else "peak_rss_mb"
    for impl in impls:
        points: list[tuple[int, float]] = []
        confirms: list[dict] = []
        for side in args.fit_sides:
            n = prepare(work, side, False)
            row = run_one(impl, work, args, side, n)
            if row["status"] != "ok":
                break
            points.append((n, row[mem]))
            print(f"  {impl}: {n:,} nodes -> {row[mem]:,.0f} MB", flush=True)
        while len(points) >= 2 and len(confirms) <= args.fit_refine:
            (n0, m0), (n1, m1) = points[-2:]
            per_node = (m1 - m0) / (n1 - n0)
            n_fit = n1 + (limit_mb - m1) / per_node
            side = int(n_fit ** (1 / 3))
            tried = {c["side"]: c["fits"] for c in confirms}
            while side in tried and not tried[side]:
                side -= 1  # the line points back at a side that did not fit: one smaller
            if side in tried:
                break
            n = prepare(work, side, False)
            check = run_one(impl, work, args, side, n)
            peak = check.get(mem)
            fits = check["status"] == "ok" and peak <= limit_mb
            confirms.append({"side": side, "nodes": n, "extrapolated_nodes": int(n_fit), "kb_per_node": round(per_node * 1024, 1),
                             "status": check["status"], "peak_mb": peak, "memory": mem, "fits": fits})
            print(f"  {impl}: {per_node * 1024:,.0f} KB/node -> {int(n_fit):,} nodes in {args.fit_gb} GB; confirm side {side} "
                  f"({n:,} nodes): {check['status']}, {peak or float('nan'):,.0f} MB (limit {limit_mb:,.0f} MB: "
                  f"{'fits' if fits else 'does not fit'})", flush=True)
            if check["status"] != "ok" or (fits and peak >= 0.95 * limit_mb):
                break
            points.append((n, peak))
        best = max((c for c in confirms if c["fits"]), key=lambda c: c["nodes"], default=None)
        out[impl] = {"status": "ok" if best else "no confirmed fit", "limit_mb": round(limit_mb), "measured": points[: len(args.fit_sides)],
                     "confirms": confirms, "largest_confirmed_nodes": best["nodes"] if best else None,
                     "largest_confirmed_side": best["side"] if best else None}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=37)
    parser.add_argument("--latent", type=int, default=64)
    parser.add_argument("--mp-steps", type=int, default=6)
    parser.add_argument("--iters", type=int, default=3, help="timed steps per run, after one warm-up step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(IMPLEMENTATIONS))
    parser.add_argument("--fit-gb", type=float, help="find the largest mesh whose step fits in this many GB")
    parser.add_argument("--fit-sides", type=int, nargs=2, default=(20, 28))
    parser.add_argument("--fit-refine", type=int, default=2, help="confirming runs after the first, while one misses")
    parser.add_argument("--json")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: on the first GPU; memory is then the peak GPU memory allocated (see above)")
    parser.add_argument("--matmul-precision", default="highest", choices=("highest", "high"),
                        help="torch.set_float32_matmul_precision in every run: high lets float32 products use "
                             "TF32 on a GPU (cuBLAS's, and meshshard's fused edge MLPs, which run only then)")
    worker_arguments(parser)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--mesh", help=argparse.SUPPRESS)
    parser.add_argument("--num-nodes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        end_worker()

    impls = args.only.split(",") if args.only else list(DEFAULT)
    unknown = sorted(set(impls) - set(IMPLEMENTATIONS))
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; choose from {list(IMPLEMENTATIONS)}")
    if args.device == "cuda" and not _cuda_devices():
        parser.error("--device cuda: torch sees no CUDA device here")
    skipped = {impl: why for impl in impls if (why := _peer_available(impl))}
    for impl, why in skipped.items():
        print(f"{impl}: {why}", flush=True)
    impls = [i for i in impls if i not in skipped]
    work = scratch_folder("meshshard-bench-peers-")

    if args.fit_gb:
        peers = [i for i in ("physicsnemo-concat", "physicsnemo", "pyg") if i in impls][:1]
        fitted = [i for i in ("meshshard", *peers) if i in impls]  # --only meshshard or --only PEER: just that one
        print(f"largest mesh in {args.fit_gb} GB, latent {args.latent}, {args.mp_steps} steps: {fitted}", flush=True)
        result = {"device": args.device, "fit_gb": args.fit_gb, "latent": args.latent, "mp_steps": args.mp_steps, "skipped": skipped,
                  "fit": fit(work, args, fitted)}
        print(json.dumps(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0

    n = prepare(work, args.side, "meshshard-2ranks" in impls)
    edges = int(__import__("numpy").load(work / f"mesh{args.side}" / "edge_index.npy", mmap_mode="r").shape[1])
    print(f"mesh: {n:,} nodes, {edges:,} directed edges; latent {args.latent}, 2 hidden layers, {args.mp_steps} steps; "
          f"{args.rounds} rounds x {args.iters} timed steps; implementations: {impls}", flush=True)
    runs: dict[str, list[dict]] = {impl: [] for impl in impls}
    for r in range(args.rounds):
        for impl in impls:
            row = run_one(impl, work, args, args.side, n)
            runs[impl].append(row)
            shown = f"{statistics.median(row['step_s']):.2f} s, {row['peak_rss_mb']:,.0f} MB" if row["status"] == "ok" else row["status"]
            print(f"  round {r + 1}: {impl:<20} {shown}", flush=True)
    table = summarize(runs)
    for impl, why in skipped.items():
        table[impl] = {"status": why}
    rat = ratios(table)
    print_table(table, rat)
    result = {"device": args.device, "matmul_precision": args.matmul_precision, "nodes": n, "directed_edges": edges, "latent": args.latent, "mp_steps": args.mp_steps, "rounds": args.rounds,
              "iters": args.iters, "malloc_mmap_threshold": 4 * 2**20, "results": table, "ratios": rat}
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
