"""``meshshard selftest``: check the collectives on this machine, on R local ranks; with
``--model FILE.py:NAME``, check that your model on shards equals one process
(:func:`meshshard.run.check_model_exact`; this module only parses and prints).

Each rank owns rows whose values encode their global ids, so what arrives can be checked exactly,
and the gradient of a known loss can be computed by hand. The check covers the halo exchange
(``indexed_all_to_all_v``, with duplicate indices and one rank sending nothing), ``all_gather_v``
and the adjoint identity, forward and backward, and times the exchange.

Run it under torchrun (``torchrun --nproc-per-node 2 -m meshshard selftest``) or on its own, when it
starts the ranks itself with torchrun's environment variables, so both paths go through
:func:`meshshard.comm.init_distributed`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ._spelling import add_deprecated

__all__ = ["register", "run_worker"]


def _plan(rank: int, world: int) -> tuple[list[int], list[list[Any]]]:
    import torch

    sizes = [0 if (world > 2 and r == world - 1) else 2000 + 371 * r for r in range(world)]
    # rank r sends rank q every (q + 2)-th row, then its first row twice more (duplicates)
    index = [
        [
            torch.cat([torch.arange(0, n, q + 2), torch.zeros(2 if n else 0, dtype=torch.long)])
            for q in range(world)
        ]
        for n in sizes
    ]
    return sizes, index


def run_worker(features: int = 16, repeats: int = 5) -> dict[str, Any]:
    """Run the checks on this rank (process group from torchrun's variables); return a summary."""
    import torch

    from meshshard.comm import all_gather_v, count_collectives, indexed_all_to_all_v, init_distributed

    ctx = init_distributed()
    rank, world = ctx.rank, ctx.world_size
    sizes, index = _plan(rank, world)
    offsets = [sum(sizes[:r]) for r in range(world)]
    column = torch.arange(1, features + 1, dtype=torch.float64)
    gid = offsets[rank] + torch.arange(sizes[rank], dtype=torch.float64)
    x = (gid[:, None] * column).requires_grad_()
    send_index = torch.cat(index[rank])
    send_counts = [len(i) for i in index[rank]]
    recv_counts = [len(index[r][rank]) for r in range(world)]

    with count_collectives() as log:
        out = indexed_all_to_all_v(x, send_index, send_counts, recv_counts)
        (out * (rank + 1)).sum().backward()
    expected_ids = torch.cat([offsets[r] + index[r][rank].double() for r in range(world)])
    failures = []
    if not torch.equal(out.detach(), expected_ids[:, None] * column):
        failures.append("indexed_all_to_all_v forward")
    expected_grad = torch.zeros(sizes[rank], dtype=torch.float64)
    for q in range(world):
        expected_grad.index_add_(0, index[rank][q],
                                 torch.full((len(index[rank][q]),), float(q + 1), dtype=torch.float64))
    if not torch.equal(x.grad, expected_grad[:, None].expand_as(x)):
        failures.append("indexed_all_to_all_v backward")
    if (log.count(phase="forward"), log.count(phase="backward")) != (1, 1):
        failures.append(f"collective count {log}")

    gathered = all_gather_v(gid[:, None], sizes)
    if not torch.equal(gathered[:, 0], torch.arange(sum(sizes), dtype=torch.float64)):
        failures.append("all_gather_v forward")

    payload = x.detach().float()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        y = indexed_all_to_all_v(payload.requires_grad_(), send_index, send_counts, recv_counts)
        y.backward(torch.ones_like(y))
        times.append(time.perf_counter() - start)
    return {
        "rank": rank,
        "world_size": world,
        "launcher": ctx.launcher,
        "backend": ctx.backend,
        "owned_rows": sizes[rank],
        "rows_received": int(sum(recv_counts)),
        "empty_rank": min(sizes) == 0,
        "exchange_ms": 1e3 * sorted(times)[len(times) // 2],
        "failures": failures,
    }


def _check_on_this_rank(features: int) -> None:
    """One rank's part of a local run (started by :func:`meshshard._launch.launch_local`)."""
    summary = run_worker(features)
    _report(summary)
    _finish()
    if summary["failures"]:
        raise SystemExit(f"rank {summary['rank']}: failed checks: {summary['failures']}")


def _gather_summaries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    from meshshard.comm import all_gather_objects

    return all_gather_objects(summary)


def _report(summary: dict[str, Any]) -> None:
    everyone = _gather_summaries(summary) if summary["world_size"] > 1 else [summary]
    if summary["rank"] != 0:
        return
    print(f"{'rank':>4} {'owned':>7} {'received':>9} {'exchange fwd+bwd':>17}  result")
    for s in everyone:
        result = "ok" if not s["failures"] else "FAILED: " + ", ".join(s["failures"])
        print(f"{s['rank']:>4} {s['owned_rows']:>7} {s['rows_received']:>9} {s['exchange_ms']:>14.2f} ms  {result}")
    ok = all(not s["failures"] for s in everyone)
    empty = ", an empty rank" if summary["empty_rank"] else ""
    print(
        f"selftest {'passed' if ok else 'FAILED'}: {summary['world_size']} ranks, backend {summary['backend']}, "
        f"set up from {summary['launcher']} variables; halo exchange with duplicate indices{empty}, "
        "all_gather_v: forward and backward checked exactly."
    )


def _finish() -> None:
    from meshshard.comm import barrier, shutdown

    barrier()
    shutdown()


def _print_report(report: Any, given: str) -> None:
    width = max(len(e.name) for e in report.errors)
    print(f"{'tensor':<{width}}  {'shape':<14} relative error (worst)")
    for e in report.errors:
        flag = "" if e.error <= report.tolerance else "  > tolerance"
        print(f"{e.name:<{width}}  {str(list(e.shape)):<14} {e.error:.1e}{flag}")
    print(f"meshshard selftest --model {given}: {report.verdict}")


def _run_model(args: argparse.Namespace) -> int:
    from meshshard.comm import RankFailed
    from meshshard.run import check_model_exact

    def error(message: str) -> int:
        print(f"meshshard selftest: error: {' '.join(message.split())}", file=sys.stderr)
        return 2

    if "RANK" in os.environ or "SLURM_PROCID" in os.environ:
        return error("--model starts its own --nproc local ranks: run it without torchrun or srun")
    ranks = 3 if args.nproc is None else args.nproc

    def starting(what: str) -> None:
        print(f"meshshard selftest: --model {args.model} on {what} ...", flush=True)

    try:
        report = check_model_exact(args.model, args.model_args, ranks=ranks, mesh=args.mesh, dtype=args.dtype,
                                   node_in=args.node_in, node_out=args.node_out, seed=args.seed, on_start=starting)
    except RankFailed as err:
        print(f"meshshard selftest: FAILED on shards: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    except ValueError as err:
        return error(str(err))
    _print_report(report, args.model)
    return 0 if report.passed else 1


def _run(args: argparse.Namespace) -> int:
    if args.model is not None:
        return _run_model(args)
    if args.nproc is None:
        args.nproc = 2
    if "RANK" in os.environ or "SLURM_PROCID" in os.environ:  # already launched by torchrun / srun
        summary = run_worker(args.features)
        _report(summary)
        _finish()
        return 1 if summary["failures"] else 0
    from meshshard.comm import check_local_ranks, launch_local

    if args.nproc < 1:
        print(f"meshshard selftest: error: Expected --nproc >= 1 (got {args.nproc})")
        return 2
    try:
        check_local_ranks(args.nproc)  # a cap by the cores, before any rank starts
    except ValueError as err:
        print(f"meshshard selftest: error: --nproc: {err}", file=sys.stderr)
        return 2
    print(f"meshshard selftest: starting {args.nproc} local ranks on 127.0.0.1 ...", flush=True)
    try:
        launch_local(_check_on_this_rank, args.nproc, args.features)
    except RuntimeError as err:
        print(f"meshshard selftest: FAILED: {err}")
        return 1
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "selftest", help="check the collectives on R local ranks (or under torchrun); with --model, your model",
        description="Check the collectives on R local ranks (or under torchrun). With --model FILE.py:NAME: build "
        "your model as meshshard train --model does, run it on R METIS parts of a small mesh and on one process "
        "with the same weights, and compare the output and every gradient (exit 0 exact, 1 not).")
    p.add_argument("--nproc", type=int, default=None,
                   help="local ranks to start when not under torchrun (default 2; with --model 3)")
    add_deprecated(p, "--ranks", "--nproc", "selftest", dest="nproc", type=int)
    p.add_argument("--features", type=int, default=16, help="feature columns per row (default 16)")
    p.add_argument("--model", default=None, metavar="FILE.py:NAME",
                   help="check your model: NAME(node_in, edge_in, node_out, **model_args), as meshshard train --model")
    p.add_argument("--model-args", default=None, metavar="JSON", help="keyword arguments of --model, a JSON object")
    p.add_argument("--mesh", default=None, metavar="FILE",
                   help="with --model: a mesh file (default a generated 3-D mesh of 210 nodes)")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="with --model: tolerance 1e-10 in float64 (default), 1e-5 in float32")
    p.add_argument("--node-in", type=int, default=3, help="with --model: input channels (default 3)")
    p.add_argument("--node-out", type=int, default=2, help="with --model: output channels (default 2)")
    p.add_argument("--seed", type=int, default=0, help="with --model: seeds weights, features and loss (default 0)")
    p.set_defaults(func=_run)
