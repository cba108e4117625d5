"""Benchmark: a MeshGraphNet processor step's edge half, the fused Triton kernel against the unfused path.

    python bench/edge_mlp.py --device cuda [--nodes 50000] [--degree 14] [--latent 64 128] [--iters 20]

On random graphs of ``--nodes`` nodes and ``degree x nodes`` edges (destinations sorted, as a
partition leaves them), times ``edge_step`` (the edge MLP, the sum of its messages at each
destination, ``e + message``) forward and forward + backward, float32, for each latent width:
BEFORE, the unfused path (``MESHSHARD_TRITON=0``: cuBLAS GEMMs and one kernel per element-wise
operation), and AFTER, the edge MLP as one Triton kernel (``meshshard/nn/_edge_triton.py``), each
with the activations recomputed in the backward (the default) and saved (``recompute=False``).
``--matmul-precision high`` lets the products of both use TF32 (cuBLAS's, and the kernel's, which
by default runs only then); ``highest`` (the default here) times the kernel in exact float32
(``MESHSHARD_TRITON=ieee``).
Runs are interleaved, the median of ``--iters`` timed runs after two warm-ups (the first call
autotunes the kernel's block size). Also printed: the peak memory of a forward + backward above
its inputs, and the fused result's difference from the unfused one against float64 (normwise
relative, the output and every gradient), so the timing is of a computation checked in the same run.

Without a GPU (or ``triton``) only BEFORE is timed, and the output says why.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def _case(nodes: int, degree: int, latent: int, device, dtype):
    import torch

    g = torch.Generator().manual_seed(0)
    edges = nodes * degree
    dst = torch.sort(torch.randint(0, nodes, (edges,), generator=g)).values
    src = torch.randint(0, nodes, (edges,), generator=g)
    scale = latent ** -0.5

    def rand(*shape: int):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)

    params = [rand(latent, latent) * scale, None, rand(latent, latent) * scale, rand(latent),
              rand(latent, latent) * scale, rand(latent), 1 + 0.1 * rand(latent), 0.1 * rand(latent)]
    tensors = (rand(edges, latent), rand(nodes, latent), rand(nodes, latent))
    weights = (rand(edges, latent), rand(nodes, latent))
    return tensors, src.to(device), dst.to(device), params, weights


def _step(case, recompute: bool, backward: bool, fused: bool):
    """One edge step (forward, and backward when asked); returns the output and the gradients."""
    import torch

    from meshshard._graph import segment_lengths
    from meshshard.nn._edge_mlp import Scratch, edge_step

    os.environ["MESHSHARD_TRITON"] = "0" if not fused else "ieee" if _exact() else "auto"
    (e, src_proj, dst_proj), src, dst, params, (w_next, w_agg) = case
    leaves = [t.detach().requires_grad_(backward) for t in (e, src_proj, dst_proj)]
    ps = [None if p is None else p.detach().requires_grad_(backward) for p in params]
    nodes = dst_proj.shape[0]
    with torch.set_grad_enabled(backward):
        e_next, aggregate = edge_step(*leaves, src, dst, nodes, e.dtype, ps, 1e-5, recompute,
                                      segment_lengths(dst, nodes), Scratch())
        if backward:
            ((e_next * w_next).sum() + (aggregate * w_agg).sum()).backward()
    grads = [t.grad for t in leaves] + [p.grad for p in ps if p is not None] if backward else []
    return [e_next.detach(), aggregate.detach(), *grads]


def _exact() -> bool:
    import torch

    return torch.get_float32_matmul_precision() == "highest"


def _difference(fused, plain, truth) -> dict[str, float]:
    def rel(a, b) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))

    return {"fused": max(rel(a, t) for a, t in zip(fused, truth)),
            "unfused": max(rel(a, t) for a, t in zip(plain, truth))}


def run(args: argparse.Namespace) -> dict:
    import torch

    from meshshard.nn import _edge_triton

    torch.set_float32_matmul_precision(args.matmul_precision)
    os.environ["MESHSHARD_TRITON"] = "ieee" if _exact() else "auto"
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    probe = _case(8, 2, 16, device, torch.float32)
    fused_ok = _edge_triton.applies(probe[0][0], probe[0][1], probe[0][2], probe[3], None)  # CPU: interpreting only
    why = None if fused_ok else ("no CUDA device" if not cuda else "triton is not importable here")
    result: dict = {"device": str(torch.cuda.get_device_name(device) if cuda else "cpu"), "nodes": args.nodes,
                    "edges": args.nodes * args.degree, "torch": torch.__version__, "fused": why or "ok",
                    "matmul_precision": args.matmul_precision, "widths": {}}
    for latent in args.latent:
        case = _case(args.nodes, args.degree, latent, device, torch.float32)
        row: dict = {}
        if fused_ok:
            case64 = _case(args.nodes, args.degree, latent, device, torch.float64)
            truth = _step(case64, True, True, False)
            row["error vs float64"] = _difference(_step(case, True, True, True), _step(case, True, True, False), truth)
            del truth, case64
        variants = [(name, recompute, backward, fused)
                    for fused in ((False, True) if fused_ok else (False,))
                    for recompute in (True, False)
                    for backward in (False, True)
                    for name in [f"{'fused' if fused else 'unfused'}, {'recompute' if recompute else 'saved'}, "
                                 f"{'fwd+bwd' if backward else 'fwd'}"]
                    if backward or recompute]  # a forward alone is the same whether it saves or not
        times: dict[str, list[float]] = {v[0]: [] for v in variants}
        peaks: dict[str, float] = {}
        for it in range(args.iters + 2):
            for name, recompute, backward, fused in variants:
                sync()
                if cuda and it == 0:
                    torch.cuda.reset_peak_memory_stats(device)
                    base = torch.cuda.memory_allocated(device)
                start = time.perf_counter()
                out = _step(case, recompute, backward, fused)
                sync()
                if it >= 2:
                    times[name].append(time.perf_counter() - start)
                if cuda and it == 0:
                    peaks[name] = (torch.cuda.max_memory_allocated(device) - base) / 1e6
                del out
        row["ms"] = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        if peaks:
            row["peak MB above inputs"] = peaks
        if fused_ok:
            ms = row["ms"]
            row["fused / unfused"] = {k.split(", ", 1)[1]: ms[k] / ms[k.replace("fused", "unfused", 1)]
                                      for k in ms if k.startswith("fused")}
        result["widths"][str(latent)] = row
    return result


def print_table(result: dict) -> None:
    print(f"\nedge step on {result['device']}: {result['nodes']:,} nodes, {result['edges']:,} edges, float32, "
          f"matmul precision {result['matmul_precision']}"
          + ("" if result["fused"] == "ok" else f" (fused kernel not timed: {result['fused']})"))
    for latent, row in result["widths"].items():
        print(f"latent {latent}")
        for name, ms in row["ms"].items():
            peak = row.get("peak MB above inputs", {}).get(name)
            print(f"  {name:32s} {ms:9.3f} ms" + ("" if peak is None else f"  {peak:9.1f} MB"))
        for name, ratio in row.get("fused / unfused", {}).items():
            print(f"  fused / unfused, {name:17s} {ratio:6.2f}x")
        if "error vs float64" in row:
            err = row["error vs float64"]
            print(f"  worst normwise error vs float64: fused {err['fused']:.1e}, unfused {err['unfused']:.1e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--degree", type=int, default=14)
    parser.add_argument("--latent", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                        help="torch.set_float32_matmul_precision: high lets both paths use TF32 (the kernel's "
                             "default is to run only then); highest is exact float32 (the kernel then runs "
                             "as MESHSHARD_TRITON=ieee)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result))
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
