"""What the bench scripts share: starting their worker processes and reading what the workers report.

A script runs its own ``--worker`` mode in a child: one process, or R local ranks under torchrun
(``python -m torch.distributed.run`` on a free loopback port). The worker writes its figures as JSON
to a file the script names; peak memory is ``ru_maxrss`` (Linux: KiB), reported in MiB. Scripts
that run the commands themselves start ``meshshard`` as ``meshshard.cli.command_argv`` says
(``$MESHSHARD_COMMAND`` when set: what a command measures of itself, its step and its ranks' memory,
is measured inside it either way) and share :func:`ensure_partition` (a cached ``meshshard partition``).
What a script writes for its own use (meshes, partitions, the workers' JSON) goes to
:func:`scratch_folder`, removed when the script ends.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from meshshard.cli import command_argv

__all__ = ["peak_rss_mb", "worker_arguments", "worker_command", "run_workers", "read_json", "emit", "ensure_partition",
           "scratch_folder"]


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident set so far of this process, or (``children``) of its largest finished child, in MiB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss / 1024


def scratch_folder(prefix: str = "meshshard-bench-") -> Path:
    """A new folder under the system's temporary folder, removed with what is in it when this process
    ends (normally, on an error or on Ctrl-C; not when killed): a bench run of a large mesh writes
    hundreds of MB there (the mesh, its partitions), which a run left behind would keep."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden options of a script's ``--worker`` mode: ``--worker``, ``--partition`` (the folder
    each rank loads its part from) and ``--out-json`` (where the worker writes its figures)."""
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--partition", help=argparse.SUPPRESS)
    parser.add_argument("--out-json", help=argparse.SUPPRESS)


def worker_command(script: str | Path, flags: Sequence[str], ranks: int, torchrun: bool | None = None) -> list[str]:
    """``python SCRIPT FLAGS``; under torchrun on ``ranks`` local ranks when ``torchrun`` (default:
    when ``ranks > 1``)."""
    if not (ranks > 1 if torchrun is None else torchrun):
        return [sys.executable, str(script), *flags]
    # --standalone: torchrun takes a free port itself when it starts (a port picked beforehand can be
    # taken by another run in between, as happened to a bench test in a parallel suite)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            str(script), *flags]


def run_workers(
    script: str | Path, flags: Sequence[str], ranks: int, env: Mapping[str, str], *,
    torchrun: bool | None = None, timeout: float = 1200,
) -> subprocess.CompletedProcess[str]:
    """Run :func:`worker_command` with ``env``, its output captured; a failed run does not raise
    (see :func:`read_json`)."""
    cmd = worker_command(script, flags, ranks, torchrun)
    return subprocess.run(cmd, env=dict(env), capture_output=True, text=True, timeout=timeout)


def read_json(path: str | Path, done: subprocess.CompletedProcess[str], what: str = "the worker run") -> Any:
    """The JSON that the finished run ``done`` wrote to ``path``; if the run failed or wrote nothing,
    exit naming its last line on stderr (or its exit code)."""
    path = Path(path)
    if done.returncode or not path.is_file():
        text = done.stderr or ""
        lines = [t for t in text.splitlines() if t.strip().strip("=-") and not t.startswith(" ")]
        # the cause: a worker's own error, not torchrun's summary of it (ChildFailedError, empty when
        # the worker died without a traceback: then its exit code, from torchrun's table, says how)
        errors = [t for t in lines if ("Error" in t or "error:" in t or "Exception" in t)
                  and "ChildFailedError" not in t and "torch.distributed.elastic" not in t]
        codes = re.findall(r"exitcode\s*:\s*(-?\d+)", text)
        last = errors[-1] if errors else lines[-1] if lines else f"exit code {done.returncode}"
        if codes and not errors:
            last += f" (a worker's exit code: {', '.join(sorted(set(codes)))}; negative: killed by that signal)"
        raise SystemExit(f"{what} failed: {last}")
    return json.loads(path.read_text())


def emit(result: Any, path: str | Path | None) -> None:
    """Print a benchmark's result as one JSON line, and write it indented to ``path`` if given."""
    print(json.dumps(result))
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")


def ensure_partition(data: Path, parts: Path, num_parts: int) -> float:
    """``meshshard partition DATA --parts P`` into PARTS unless a partition of this dataset is there."""
    from meshshard.data import check_partition_matches

    if (parts / "partition.json").is_file():
        try:
            check_partition_matches(data, parts)
            return 0.0
        except ValueError:
            pass
    start = time.perf_counter()
    subprocess.run([*command_argv(), "partition", str(data), "--parts", str(num_parts),
                    "--out", str(parts), "--force", "--quiet"], check=True)
    return time.perf_counter() - start


def end_worker() -> NoReturn:
    """A worker's end, once its results are written: output flushed, then the process leaves without
    the interpreter's teardown, where gloo's threads can still abort a rank (SIGABRT: "terminate
    called without an active exception") and torchrun report the run failed. Seen in parallel test
    suites, one bench run in a few hundred; the commands end their ranks the same way."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
