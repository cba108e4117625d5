"""Hostile input at the command level (issue 36): a file of the wrong kind where a command reads or
writes one, numbers that ask for unbounded work or memory, and what must stay one line and exit 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from meshshard.data import write_dataset
from tests._warm import warm_command
from tests.partition.conftest import grid_triangles


def _meshshard(*argv: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``meshshard ARGV`` in a subprocess; one still running after ``timeout`` seconds fails the test
    (it hung) instead of hanging the suite."""
    try:
        return subprocess.run([*warm_command(), *argv], capture_output=True, text=True,
                              timeout=timeout, env=None if env is None else os.environ | env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"meshshard {' '.join(argv)} still running after {timeout:g} s (it hangs)")


def _one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr
    assert proc.returncode == 2, (proc.stdout, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of 4 samples on a 6 x 6 triangle grid: inputs a, b; target c."""
    root = tmp_path_factory.mktemp("hostile")
    points, tri = grid_triangles(6, 6)
    inputs = np.random.default_rng(0).normal(size=(4, len(points), 2))
    write_dataset(root / "data", inputs, inputs[:, :, :1] * inputs[:, :, 1:], pos=points, cells=[("triangle", tri)],
                  input_names=["a", "b"], target_names=["c"], val_samples=[3])
    return root / "data"


def test_predict_with_a_fifo_for_a_checkpoint_is_refused_at_once(data: Path, tmp_path: Path) -> None:
    """Defect 1 (a regression): ``predict RUN`` with RUN/checkpoint.pt a FIFO hung in a blocking open;
    so did RUN/best.pt. Both are refused in one line naming the file."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "checkpoint.pt")
    for checkpoint in ("last", "best"):  # no best.pt: best is the last one
        proc = _meshshard("predict", str(run), "--data", str(data), "--out", str(tmp_path / "pred"),
                          "--checkpoint", checkpoint, timeout=60)
        _one_line_exit_2(proc, f"{run / 'checkpoint.pt'}: is not a regular file")
    os.mkfifo(run / "best.pt")
    proc = _meshshard("predict", str(run), "--data", str(data), "--out", str(tmp_path / "pred"), timeout=60)
    _one_line_exit_2(proc, f"{run / 'best.pt'}: is not a regular file")
    assert not (tmp_path / "pred").exists()


def test_selftest_and_predict_refuse_more_local_ranks_than_the_cap(data: Path, tmp_path: Path) -> None:
    """Defect 8: ``selftest --ranks 100000`` started ranks without a cap; every command that starts
    local ranks refuses more than the cap in one line, before any rank starts."""
    proc = _meshshard("selftest", "--nproc", "100000", timeout=60)
    _one_line_exit_2(proc, "--nproc: Expected at most", "local ranks on this machine", "(got 100000)")
    assert "starting" not in proc.stdout
    proc = _meshshard("selftest", "--nproc", "3", timeout=60, env={"MESHSHARD_MAX_LOCAL_RANKS": "2"})
    _one_line_exit_2(proc, "Expected at most 2 local ranks")


@pytest.mark.parametrize(("argv", "message"), [
    (["--warmup", "-1"], "argument --warmup: Expected auto, 0 (none) or a positive number of steps (got '-1')"),
    (["--warmup", "100", "--steps", "3"], "Expected --warmup at most --steps (got 100 > 3)"),
    (["--noise-std", "1e300"], "Expected --noise-std in the state's normalised units, at most 10 (got 1e+300)"),
])
def test_train_settings_accepted_silently_before_are_refused(tmp_path: Path, argv: list[str], message: str) -> None:
    """Issue 36 (minors): --warmup -1 (how auto is stored) and --warmup beyond --steps were accepted;
    --noise-std 1e300 ended in "fix the dataset" instead of naming the flag."""
    proc = _meshshard("train", str(tmp_path / "parts"), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"),
                      *argv, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink"])
def test_a_lock_of_the_wrong_kind_is_one_line_and_exit_2_in_train_and_dataset(tmp_path: Path, kind: str) -> None:
    """Issue 36 (minor): a symlink or a folder in a lock's place made train exit 1 (dataset 2); a FIFO
    said only "[Errno 22] Invalid argument"."""
    lock = tmp_path / ".run.meshshard-lock"
    {"fifo": lambda: os.mkfifo(lock), "folder": lock.mkdir,
     "symlink": lambda: lock.symlink_to(tmp_path / "elsewhere")}[kind]()
    what = {"fifo": "a FIFO", "folder": "a folder", "symlink": "a symbolic link"}[kind]
    for argv in (["train", str(tmp_path / "parts"), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run")],
                 ["dataset", str(tmp_path / "x.vtu"), "--out", str(tmp_path / "run"), "--inputs", "a"]):
        _one_line_exit_2(_meshshard(*argv, timeout=60), f"{lock}: is {what}, not a lock file of meshshard's")
