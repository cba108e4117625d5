"""``meshshard train --nproc R``: Ctrl-C and SIGTERM stop every rank; a failure is one line, exit 2 or 1.

Real subprocesses (the launcher is what a user runs), on the dataset and partition of
``tests/meshshard/run/test_train.py``. The mmap-threshold tests of the ranks it starts are in
``tests/comm/test_launch.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._processes import local_ranks, wait_for_line
from tests.meshshard.run.test_train import setup  # noqa: F401 - the shared module fixture


def _command(setup: dict, out: Path, *extra: str, quiet: bool = True) -> list[str]:  # noqa: F811
    cfg = setup["cfg"]
    return [sys.executable, "-m", "meshshard", "train", cfg.partition, "--data", cfg.data, "--out", str(out),
            "--latent", "8", "--hidden-layers", "1", "--mp-steps", "2", *(["--quiet"] if quiet else []), *extra]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _training(setup: dict, out: Path) -> tuple[subprocess.Popen, list[int]]:  # noqa: F811
    """``train --nproc 2`` checkpointing every step, once it has logged two steps; its two ranks' pids.

    Not ``--quiet``, with a line per step: rank 0 prints the second step's line once that step is in
    log.jsonl, after the first step's checkpoint is saved, and the wait is on that line.
    """
    proc = subprocess.Popen(_command(setup, out, "--nproc", "2", "--data-parallel", "1", "--steps", "100000",
                                     "--every", "1", "--log-every", "1", quiet=False),
                            env=os.environ | {"MESHSHARD_TIMEOUT": "60"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_line(proc, r"^step\s+1\s+loss ", 120, "training did not start")
    return proc, local_ranks(proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_the_launcher_stops_every_rank(setup: dict, signum: int, code: int) -> None:  # noqa: F811
    out = setup["root"] / f"signal-{signum}"
    proc, ranks = _training(setup, out)
    try:
        assert len(ranks) == 2
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert all(_gone(r) for r in ranks), "a rank kept training after the launcher exited"
    finally:
        proc.kill()
        for r in ranks:
            if not _gone(r):
                os.kill(r, signal.SIGKILL)
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"meshshard train: (interrupted|terminated \(SIGTERM\); every local rank was stopped); "
                        rf"{re.escape(str(out / 'checkpoint.pt'))} holds step \d+: continue with --resume", last), err
    assert "Traceback" not in err, err


@pytest.mark.slow
def test_a_rank_killed_is_reported_with_the_step_to_resume_from(setup: dict) -> None:  # noqa: F811
    out = setup["root"] / "rank-killed"
    proc, ranks = _training(setup, out)
    try:
        os.kill(ranks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert re.fullmatch(r"meshshard train: error: rank 1 was killed by SIGKILL.*; "
                        rf"{re.escape(str(out / 'checkpoint.pt'))} holds step \d+: continue with --resume",
                        err.strip().splitlines()[-1]), err


@pytest.mark.slow
def test_errors_under_nproc_are_one_line_with_the_first_failing_rank(setup: dict) -> None:  # noqa: F811
    # every rank refuses the partition: exit 2, one line, no traceback unless MESHSHARD_DEBUG
    cmd = _command(setup, setup["root"] / "nproc-bad", "--nproc", "2", "--data-parallel", "2", "--steps", "2")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert re.fullmatch(r"meshshard train: error: rank [01]: Expected a partition into 1 part \(2 ranks / 2 "
                        rf"data-parallel\) \(got 2 parts in {re.escape(setup['cfg'].partition)}\); make one with "
                        rf"meshshard partition {re.escape(setup['cfg'].data)} --parts 1 --out NEW_PARTS", lines[0]), lines
    # both ranks fail alike; whichever exits first is reported
    debug = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ | {"MESHSHARD_DEBUG": "1"})
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr, debug.stderr
    # a rank that dies: the launcher names it (and not the peers it takes down), exit 1
    cmd = _command(setup, setup["root"] / "nproc-dies", "--nproc", "2", "--data-parallel", "1", "--steps", "4")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ | {"MESHSHARD_FAIL_AT": "1:1"})
    assert run.returncode == 1, run.stderr
    assert "rank 1: MESHSHARD_FAIL_AT=1:1: dying in the middle of step 1" in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (f"meshshard train: error: rank 1 exited with code 17; {setup['root'] / 'nproc-dies'} "
                                                   "has no checkpoint yet: start it over with --force"), run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_command_run_in_this_process_fixes_the_threshold_before_its_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshshard.cli import _launch

    calls: list[str] = []
    monkeypatch.setattr(_launch, "fix_mmap_threshold", lambda: calls.append("fixed"))
    assert _launch.run_command("probe", lambda payload: calls.append(payload["work"]), 0, {"work": "worked"}) == 0
    assert calls == ["fixed", "worked"]
