"""Start R local ranks with torchrun's environment variables (for commands run without torchrun).

Each worker gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, exactly as under ``torchrun``, so the code path (``init_distributed``) is the one
used in production. If one worker fails, the others are stopped and the failure is reported.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["launch_local", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(local_rank: int, fn: Callable[..., Any], world: int, port: int, args: tuple) -> None:
    os.environ.update(
        RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    os.environ.setdefault("MESHSHARD_TIMEOUT", "120")
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    fn(*args)


def launch_local(fn: Callable[..., Any], nprocs: int, *args: Any) -> None:
    """Run ``fn(*args)`` on ``nprocs`` local processes (spawned) as ranks of one gloo/NCCL world.

    Raises:
        RuntimeError: naming the first rank that failed, with its error.
    """
    import torch.multiprocessing as mp

    if nprocs < 1:
        raise ValueError(f"Expected at least one rank (got {nprocs})")
    try:
        mp.start_processes(_entry, args=(fn, nprocs, free_port(), args), nprocs=nprocs, start_method="spawn")
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as err:
        raise RuntimeError(f"a local rank failed: {err}") from None
