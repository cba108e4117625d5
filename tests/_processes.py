"""Waiting on a real subprocess (``subprocess.Popen``) until it says it got somewhere.

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_line(proc, r"step\\s+1\\s", 120, "training did not start")

:func:`local_ranks` lists the ranks a launcher (``--nproc``, ``launch_local``) started.

:func:`hold_folder_lock` starts a process that holds an output folder's lock (what another
meshshard command writing there holds) until its stdin closes or it is killed.

The wait blocks on the child's stdout pipe (``select``), so it returns as soon as the line is
printed, with no sleep-and-look loop. A child that exits first, or prints no such line within the
timeout, fails the test with what it printed.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["hold_folder_lock", "local_ranks", "wait_for_line"]


def wait_for_line(proc: subprocess.Popen, pattern: str, timeout: float, what: str) -> str:
    """Block until ``proc`` prints a stdout line matching ``pattern`` (a regex searched in each line).

    Reads the pipe's file descriptor directly, so a later ``proc.communicate()`` gets the rest of
    the output. Returns the stdout read so far. Raises ``AssertionError`` (``what``, the pattern,
    the exit code and both outputs) when ``proc`` ends first or ``timeout`` seconds pass; the
    process is killed then.
    """
    regex = re.compile(pattern)
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    seen = b""
    while not any(regex.search(line) for line in seen.decode(errors="replace").splitlines()):
        left = deadline - time.monotonic()
        ready = left > 0 and bool(select.select([fd], [], [], left)[0])
        chunk = os.read(fd, 1 << 16) if ready else b""
        if not chunk:  # end of file (the process is ending) or the time is up
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10 if ready else 0)
            ended = proc.returncode is not None
            proc.kill()
            out, err = proc.communicate()
            why = f"it ended first (exit code {proc.returncode})" if ended else f"none within {timeout:g} s (killed)"
            raise AssertionError(f"{what}: no line matching {pattern!r} on its stdout: {why}\n"
                                 f"stdout:\n{seen.decode(errors='replace')}{out}\nstderr:\n{err}")
        seen += chunk
    return seen.decode(errors="replace")


_HOLD = """
import sys
from meshshard.partition import folder_lock
with folder_lock(sys.argv[1], command=sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def hold_folder_lock(out: str | Path, command: str = "meshshard train X --out Y") -> subprocess.Popen:
    """A process holding ``out``'s lock (``meshshard.partition.folder_lock``, as ``command``) until
    its stdin closes (``proc.communicate("")``) or it is killed; returns once the lock is held."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(out), command], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_line(proc, "^held$", 60, "the lock was not taken")
    return proc


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def local_ranks(launcher: int) -> list[int]:
    """The pids of the ranks process ``launcher`` started with ``launch_local`` (Linux ``/proc``): its
    fork server's children (or, spawned, its own children that run multiprocessing's ``spawn_main``)."""
    ranks = []
    for child in _children(launcher):
        if "spawn_main" in _cmdline(child):
            ranks.append(child)
        elif "forkserver" in _cmdline(child):
            ranks += _children(child)
    return ranks
