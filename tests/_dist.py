"""Run a function on R local ranks (CPU, gloo) and re-raise the first failure in pytest.

    from tests._dist import run_ranks

    def _check(rank, world_size, n):      # module level, so child processes can import it
        ...
        return some_small_result

    results = run_ranks(_check, 3, 10)   # one entry per rank

Ranks start from a forkserver that has torch, torch._dynamo (every optimizer loads it), PyG and the
library preloaded (a fork costs a fraction of a second, and no rank inherits a parent's OpenMP
threads): ranks that train start 2-3 s of a core sooner than ranks importing these themselves. They rendezvous through a file, so no port can clash.
The first rank that raises (or dies) stops the run at once: the others are killed, and its
traceback is raised here as :class:`RankFailure`. Nothing waits longer than ``timeout`` seconds,
and collectives time out after ``timeout`` seconds too.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from meshshard.comm import free_port

__all__ = ["RankFailure", "free_port", "run_ranks"]

DEFAULT_TIMEOUT_S = 90.0
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy", "meshshard.comm", "meshshard.nn", "meshshard.tasks", "meshshard.run",
            "torch_geometric.nn", "scipy.spatial"]
_context: Any = None


class RankFailure(AssertionError):
    """A rank raised or died; the message holds its traceback."""

    def __init__(self, rank: int, details: str) -> None:
        super().__init__(f"rank {rank} failed:\n{details}")
        self.rank = rank
        self.details = details


def _mp_context() -> Any:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def _child(fn: Callable[..., Any], rank: int, world_size: int, args: tuple, init_file: str, timeout: float, results: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # R ranks share two cores
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, False, traceback.format_exc()))
        return
    dist.destroy_process_group()


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes in one gloo group.

    Returns each rank's return value, in rank order. Raises :class:`RankFailure` with the first
    failing rank's traceback, or ``TimeoutError`` naming the ranks still running after ``timeout``.
    """
    ctx = _mp_context()
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="meshshard-dist-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_child, args=(fn, r, world_size, args, init_file, timeout, results), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        done: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(done) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(world_size)) - set(done))
                    raise TimeoutError(f"ranks {missing} of {world_size} did not finish within {timeout:.0f} s")
                try:
                    rank, ok, value = results.get(timeout=min(left, 0.2))
                except queue.Empty:
                    for r, p in enumerate(procs):
                        if r not in done and p.exitcode not in (None, 0):
                            raise RankFailure(r, f"process died with exit code {p.exitcode}") from None
                    continue
                if not ok:
                    raise RankFailure(rank, value)
                done[rank] = value
        finally:
            _stop(procs)
    return [done[r] for r in range(world_size)]
