"""Start R local ranks with torchrun's environment variables (for commands run without torchrun).

Each worker gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, exactly as under ``torchrun``, so the code path (``init_distributed``) is the one
used in production.

The launcher owns its ranks:

- if one fails, the others are stopped (SIGTERM, then SIGKILL after a grace period) and
  :class:`RankFailed` reports the first failing rank's error on one line (a rank that died names
  its exit code or signal). The full traceback is printed by the rank only with ``MESHSHARD_DEBUG``;
- SIGINT (Ctrl-C) or SIGTERM sent to the launcher stops every rank the same way, then raises
  ``KeyboardInterrupt`` (exit 130 from the command line) or :class:`Terminated` (exit 143);
- the ranks ignore SIGINT themselves (a terminal's Ctrl-C reaches them too; the launcher decides)
  and die with the launcher, however it ends (SIGKILL too): a parent-death signal on Linux, and
  everywhere a watchdog thread in each rank that ends it when its parent changed, including a
  launcher that died while the rank was still starting;
- at most :func:`max_local_ranks` ranks are started (by the cores; ``MESHSHARD_MAX_LOCAL_RANKS``
  overrides), a larger count refused in one line before any starts.

On Linux the ranks are forked from a fork server (``multiprocessing``'s ``forkserver``) that has
imported torch and the modules the worker comes from, once per launching process: a rank starts in
a fraction of a second instead of importing torch itself (about 2 s of a core each; on a 2-core
machine, ``train --nproc 2`` on a small mesh took 6.7 s, most of it imports). The server never runs
torch code, so no rank inherits threads or a CUDA context. Each rank gets the launcher's environment
and working folder as they are at the launch, as a spawned one would. Elsewhere ranks are spawned.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

__all__ = ["RankFailed", "Terminated", "launch_local", "free_port", "fix_mmap_threshold", "max_local_ranks",
           "check_local_ranks", "rank_threads"]

GRACE_S = 5.0
#: Local ranks per core :func:`launch_local` starts at most (``MESHSHARD_MAX_LOCAL_RANKS`` overrides):
#: ranks beyond the cores only share them, and each holds an interpreter and a process group.
RANKS_PER_CORE = 4
#: The cap on a machine of few cores: ranks enough to test a partition on a laptop.
MIN_RANK_CAP = 8
#: How often a rank's watchdog looks whether its launcher is still there (seconds).
WATCHDOG_S = 1.0
#: The mmap threshold a rank's allocator gets (:func:`fix_mmap_threshold`), in bytes.
MMAP_THRESHOLD = 1 << 20


def fix_mmap_threshold(nbytes: int | None = None) -> bool:
    """Fix glibc's mmap threshold of this process at ``nbytes`` (default ``MESHSHARD_MMAP_THRESHOLD``
    from the environment, else 1 MiB; ``0`` keeps glibc's dynamic threshold), unless the user chose one.

    glibc raises its threshold after large frees (up to 32 MB), so a rank's mid-sized tensors (a
    few MB: node features of a shard) then come from the heap, which fragments and keeps what
    they free: peak RSS per rank grows beyond its live tensors, the more so the smaller the shard.
    A fixed threshold serves every larger block by ``mmap`` and returns it when freed. Measured on a
    50k-node mesh (``bench/meshgraphnet.py``, latent 32): per rank, above its memory at the
    first step, 0.62x / 0.36x of one process on 2 / 4 ranks at 4 MiB, 0.54x / 0.32x at 1 MiB. On
    1M nodes, 2 ranks: 0.82x the peak at 1.01x the wall time of glibc's own threshold.

    Leaves the allocator alone when ``MALLOC_MMAP_THRESHOLD_`` is set or ``GLIBC_TUNABLES`` names
    an mmap threshold, and where there is no glibc. Returns whether it changed the threshold.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in tunables:
        return False
    if nbytes is None:
        given = os.environ.get("MESHSHARD_MMAP_THRESHOLD", str(MMAP_THRESHOLD))
        if not given.strip().isdigit():
            raise ValueError(f"Expected MESHSHARD_MMAP_THRESHOLD to be a number of bytes, 0 for glibc's own threshold "
                             f"(got {given!r})")
        nbytes = int(given)
    if nbytes <= 0:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no glibc (TypeError: Windows' CDLL(None))
        return False
    return bool(mallopt(-3, int(nbytes)))  # -3: M_MMAP_THRESHOLD


class Terminated(SystemExit):
    """SIGTERM reached the launcher; every rank has been stopped. Exit code 143 if not caught."""

    def __init__(self) -> None:
        super().__init__(143)


class RankFailed(RuntimeError):
    """A local rank failed; ``str()`` is its one-line error, ``user_error`` says it was a ``ValueError``."""

    def __init__(self, rank: int, message: str, user_error: bool = False) -> None:
        named = re.match(r"rank \d+\b", message)  # a message naming its rank (perhaps another one, agreed by all)
        super().__init__(message if named else f"rank {rank}: {message}")
        self.rank = rank
        self.user_error = user_error


def free_port() -> int:
    """A free TCP port on the loopback interface, for a local world's ``MASTER_PORT``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _debug() -> bool:
    return os.environ.get("MESHSHARD_DEBUG", "") not in ("", "0")


def max_local_ranks() -> int:
    """The most local ranks :func:`launch_local` starts: ``MESHSHARD_MAX_LOCAL_RANKS`` when set, else
    :data:`RANKS_PER_CORE` per core this process may run on (at least :data:`MIN_RANK_CAP`)."""
    given = os.environ.get("MESHSHARD_MAX_LOCAL_RANKS", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ValueError(f"Expected MESHSHARD_MAX_LOCAL_RANKS to be a positive number of ranks (got {given!r})")
        return int(given)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity (macOS)
        cores = os.cpu_count() or 1
    return max(MIN_RANK_CAP, RANKS_PER_CORE * cores)


def check_local_ranks(nprocs: int) -> None:
    """Raise a one-line ``ValueError`` unless ``nprocs`` local ranks may be started: at least one, at
    most :func:`max_local_ranks`."""
    if nprocs < 1:
        raise ValueError(f"Expected at least one rank (got {nprocs})")
    cap = max_local_ranks()
    if nprocs > cap:
        raise ValueError(f"Expected at most {cap} local ranks on this machine ({RANKS_PER_CORE} per core; "
                         f"MESHSHARD_MAX_LOCAL_RANKS sets another cap) (got {nprocs})")


def rank_threads(world: int) -> int:
    """The threads of each of ``world`` local ranks: ``OMP_NUM_THREADS`` where it is set to a
    positive number (two ensemble members side by side, one thread each, say), else the rank's
    share of the cores, at least one."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // world)


def _parent_of(pid: int) -> int | None:
    """The parent of process ``pid`` (Linux ``/proc``), or None when it is gone or unknown."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _die_with_parent(launcher: int) -> None:
    """This rank ends with its launcher (pid ``launcher``), however the launcher ends (SIGKILL too).

    The rank's parent is the launcher (spawned) or the launcher's fork server, which leaves as soon
    as the launcher is gone. Linux: the kernel sends SIGTERM when that parent dies
    (``PR_SET_PDEATHSIG``). That is set only once the rank runs this, after it started, so a
    launcher that died before is seen here (the parent is neither the launcher nor its child) and
    the rank leaves at once. Everywhere: a watchdog thread looks at the parent every
    :data:`WATCHDOG_S` seconds and ends the rank when it changed.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):
        pass
    parent = os.getppid()
    if parent != launcher and _parent_of(parent) != launcher:  # the launcher died while this rank was starting
        os._exit(143)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_S)
        os._exit(143)

    threading.Thread(target=watch, name="meshshard-launcher-watchdog", daemon=True).start()


def _entry(
    local_rank: int, fn: Callable[..., Any], world: int, port: int, args: tuple, report: str, backend: str,
    parent: int, environment: dict[str, str],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    if environment != os.environ:  # a fork server's environment is the one it started with
        os.environ.clear()
        os.environ.update(environment)
    os.environ.update(
        RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MESHSHARD_BACKEND=backend,
    )
    os.environ.setdefault("MESHSHARD_TIMEOUT", "120")
    try:
        fix_mmap_threshold()  # in here: a bad MESHSHARD_MMAP_THRESHOLD is reported like any rank error
        import torch

        torch.set_num_threads(rank_threads(world))
        fn(*args)
        # Done: leave without the interpreter's teardown, where gloo's threads can still abort the
        # rank ("terminate called without an active exception") after its work is all written.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException as err:  # noqa: BLE001 - every failure is reported to the launcher, on one line
        if _debug():
            traceback.print_exc()
        message = " ".join(str(err).split()) or type(err).__name__
        if not isinstance(err, ValueError | RuntimeError | OSError):
            message = f"{type(err).__name__}: {message}"
        tmp = Path(report) / f".rank-{local_rank}.json"
        tmp.write_text(json.dumps({"message": message, "user_error": isinstance(err, ValueError),
                                   "peer": type(err).__name__ == "PeerFailure"}))
        os.replace(tmp, Path(report) / f"rank-{local_rank}.json")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2 if isinstance(err, ValueError) else 1)


def _stop(procs: list[Any], grace_s: float) -> None:
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join(5)


def _failure(rank: int, exitcode: int, report: Path) -> tuple[int, RankFailed]:
    """The failure of a rank that exited, and its priority (its own error first, a peer's echo last)."""
    try:
        info = json.loads((report / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        how = f"was killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exited with code {exitcode}"
        return 1, RankFailed(rank, f"rank {rank} {how}")
    return (2 if info["peer"] else 0), RankFailed(rank, info["message"], info["user_error"])


def _modules_of(fn: Any) -> list[str]:
    """The modules ``fn``'s code comes from: its own, and those of what a ``functools.partial`` binds."""
    found: list[str] = []
    todo = [fn]
    while todo:
        item = todo.pop()
        if isinstance(item, functools.partial):
            todo += [item.func, *item.args, *item.keywords.values()]
        module = getattr(item, "__module__", None) if callable(item) else None
        if isinstance(module, str) and module != "__main__" and module not in found:
            found.append(module)
    return found


#: How :func:`launch_local` starts ranks: None (the default) for a fork server on Linux, else
#: spawn (see :func:`_rank_context`); or a ``multiprocessing`` start method by name. ``"fork"``
#: suits only a process that has run no torch work in threads and holds no GPU context (the test
#: suite's warm command server sets it in its forked commands).
START_METHOD: str | None = None


def _rank_context(fn: Callable[..., Any]) -> Any:
    """How ranks start: forked from a fork server that imported torch and ``fn``'s modules (Linux),
    else spawned; :data:`START_METHOD` when set. The server is started at the first launch of this
    process, and lives as long as it; a later launch reuses it (what it imported then stays
    imported)."""
    if START_METHOD is not None:
        return multiprocessing.get_context(START_METHOD)
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", *_modules_of(fn)])
    return ctx


def launch_local(fn: Callable[..., Any], nprocs: int, *args: Any, grace_s: float = GRACE_S) -> None:
    """Run ``fn(*args)`` on ``nprocs`` local processes as ranks of one gloo/NCCL world.

    The backend is NCCL when there is a GPU for each rank, else gloo with the ranks on the CPU (a
    note says so when GPUs are there); ``MESHSHARD_BACKEND`` decides when set
    (:func:`meshshard.comm.local_ranks_backend`).

    Raises:
        RankFailed: (a ``RuntimeError``) the first rank that failed, with its error on one line.
        KeyboardInterrupt: on SIGINT, after every rank has stopped.
        Terminated: (a ``SystemExit`` with code 143) on SIGTERM, after every rank has stopped.
    """
    check_local_ranks(nprocs)
    from ._context import local_ranks_backend

    backend, note = local_ranks_backend(nprocs)  # NCCL with a GPU for each rank, else gloo on the CPU
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    ctx = _rank_context(fn)
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)

    # Python runs signal handlers in the main thread only; elsewhere the caller keeps its own.
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    with tempfile.TemporaryDirectory(prefix="meshshard-launch-") as report:
        port = free_port()
        procs = [ctx.Process(target=_entry, args=(r, fn, nprocs, port, args, report, backend, os.getpid(),
                                                      dict(os.environ)))
                 for r in range(nprocs)]
        try:
            for p in procs:
                if not received:
                    if main:  # ignored dispositions survive exec: a rank ignores Ctrl-C from its first instruction
                        signal.signal(signal.SIGINT, signal.SIG_IGN)
                    try:
                        p.start()
                    finally:
                        if main:
                            signal.signal(signal.SIGINT, on_signal)
            while not received:
                running = [p for p in procs if p.exitcode is None and p.pid is not None]
                failed = [(*_failure(r, p.exitcode, Path(report)), r) for r, p in enumerate(procs)
                          if p.exitcode not in (None, 0)]
                if failed:
                    raise min(failed, key=lambda f: (f[0], f[2]))[1]
                if not running:
                    return
                wait([p.sentinel for p in running], timeout=0.5)
        finally:
            _stop([p for p in procs if p.pid is not None], grace_s)
            for s, handler in previous.items():
                signal.signal(s, handler)
    if received[0] == signal.SIGTERM:
        raise Terminated
    raise KeyboardInterrupt
