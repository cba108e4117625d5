"""How a command runs: its checks here, then its worker on local ranks or in this process.

:func:`run_command` is the one place where a command's outcome becomes an exit code and a line on
standard error; the ranks themselves are started by :func:`meshshard.comm.launch_local`.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from meshshard.comm import RankFailed, Terminated, fix_mmap_threshold, launch_local
from meshshard.partition import folder_lock

__all__ = ["as_rank", "run_command", "writing", "writing_command"]


def writing_command(name: str, folder: str, body: Callable[[], int]) -> int:
    """``body()``, the command ``meshshard NAME``, holding ``folder``'s lock (:func:`writing`); a
    folder another command is writing is one line and exit 2, a lock file that cannot be made
    (an ``OSError``) one line and exit 1, as :func:`run_command` reports them."""
    try:
        with writing(folder):
            return body()
    except (ValueError, OSError) as err:
        if _debug():
            traceback.print_exc()
        print(f"meshshard {name}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2 if isinstance(err, ValueError) else 1


@contextmanager
def writing(folder: str) -> Iterator[None]:
    """Hold the output ``folder``'s lock (:func:`meshshard.partition.folder_lock`) for the command:
    in this process, which starts the ranks of ``--nproc`` and waits for them (they never take it);
    under torchrun or SLURM, where every rank runs the command, on rank 0 only. A folder another
    command is writing raises its one-line ``ValueError``, before anything is read or started."""
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) != "0":
        yield
        return
    with folder_lock(folder):
        yield


def as_rank(call: Callable[[Any], Any], config: Callable[[dict[str, Any]], Any], payload: dict[str, Any]) -> None:
    """One rank of a command: ``call(config(payload))`` (``train(TrainConfig.from_dict(...))``),
    then its process group shut down. Bound with ``functools.partial`` into the worker that
    :func:`run_command` starts (module-level functions pickle for the spawned ranks)."""
    from meshshard.comm import shutdown

    call(config(payload))
    shutdown()


def _debug() -> bool:
    return os.environ.get("MESHSHARD_DEBUG", "") not in ("", "0")


def run_command(
    name: str,
    worker: Callable[[dict[str, Any]], Any],
    nproc: int,
    payload: dict[str, Any],
    check: Callable[[], Any] | None = None,
    stopped: Callable[[], str | None] | None = None,
) -> int:
    """Run ``worker(payload)`` for the command ``meshshard NAME``: on ``nproc`` local ranks when
    asked and not already launched (torchrun or SLURM), else in this process. ``check`` runs first,
    here: the command's refusals (missing folders, say) before any rank starts. Returns the exit
    code: 0; 2 for bad input (``ValueError``, or an error marked ``user_error``); 1 for a failure;
    130 when stopped by SIGINT (Ctrl-C), 143 by SIGTERM, with what ``stopped()`` says to do next
    (printed once: here, or by rank 0 under torchrun / SLURM). Errors print as one line;
    ``MESHSHARD_DEBUG`` adds the traceback."""
    launched = "RANK" in os.environ or "SLURM_PROCID" in os.environ

    def next_step() -> str:
        if stopped is None or os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) != "0":
            return ""
        try:
            said = stopped()
        except Exception:  # noqa: BLE001 - a hint must never hide how the command stopped
            return ""
        return f"; {said}" if said else ""

    try:
        if check is not None:
            check()
        if nproc and not launched:
            launch_local(worker, nproc, payload)
        else:
            fix_mmap_threshold()  # this process is the rank (torchrun, SLURM, or one process)
            worker(payload)
    except (ValueError, RuntimeError, OSError) as err:
        if _debug() and not isinstance(err, RankFailed):
            traceback.print_exc()  # a rank under --nproc printed its own
        said = " ".join(str(err).split())
        # a rank died, and its error does not say what to do next (a failed step names the last checkpoint itself)
        failed = (isinstance(err, RankFailed) and not getattr(err, "user_error", False)
                  and "--resume" not in said and "--force" not in said)
        print(f"meshshard {name}: error: {said}{next_step() if failed else ''}", file=sys.stderr)
        return 2 if isinstance(err, ValueError) or getattr(err, "user_error", False) else 1
    except Terminated:
        print(f"meshshard {name}: terminated (SIGTERM); every local rank was stopped{next_step()}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"meshshard {name}: interrupted{next_step()}", file=sys.stderr)
        return 130
    return 0
