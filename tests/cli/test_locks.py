"""One writer per output folder: every command that writes a folder holds its lock for the whole
command (``meshshard.partition.folder_lock``, taken in the command's own process before any slow
work and before any rank starts), so a second command into it is refused at once, in one line
naming the holder, and a lock left by a killed command is taken over."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.data import partition_dataset, write_dataset
from meshshard.run import load_checkpoint
from tests._processes import hold_folder_lock, wait_for_line
from tests.partition.conftest import grid_triangles


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 10 x 10 triangle grid, 4 samples of two inputs and one target, partitions into 1 and 2 parts."""
    root = tmp_path_factory.mktemp("locks")
    points, tri = grid_triangles(10, 10)
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(4, len(points), 2))
    write_dataset(root / "data", inputs, inputs[:, :, :1] * inputs[:, :, 1:], pos=points, cells=[("triangle", tri)],
                  input_names=["a", "b"], target_names=["c"], val_samples=[3])
    partition_dataset(root / "data", root / "parts1", 1)
    partition_dataset(root / "data", root / "parts2", 2)
    return {"root": root, "data": str(root / "data")}


def _train(case: dict, out: Path, *extra: str, parts: int = 1) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "meshshard", "train", str(case["root"] / f"parts{parts}"), "--data", case["data"],
           "--out", str(out), "--latent", "4", "--hidden-layers", "1", "--mp-steps", "1", "--log-every", "1",
           "--every", "1", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _holder_message(out: Path, pid: int, command: str = r"\S*meshshard train .*") -> str:
    return (rf"^meshshard train: error: {re.escape(str(out))}: is being written by another meshshard command "
            rf"\(pid {pid} on {re.escape(socket.gethostname())}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC: "
            rf"{command}\); wait for it to end, or pick another folder \(the lock is "
            rf"{re.escape('.' + out.name)}\.meshshard-lock beside it\)\n$")


def _one_refused(procs: list[subprocess.Popen], timeout: float) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    """Of two commands started together, the one that ends first (refused), the other (still
    running, the holder) and the first one's stderr."""
    deadline = time.monotonic() + timeout
    while not any(p.poll() is not None for p in procs):  # polled: a thread waiting on the holder would outlive us
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            pytest.fail(f"neither of two commands into one folder was refused within {timeout:g} s")
        time.sleep(0.05)
    first = next(p for p in procs if p.poll() is not None)
    other = procs[1 - procs.index(first)]
    out, err = first.communicate()
    assert other.poll() is None, other.communicate()
    assert first.returncode == 2, (out, err)
    return first, other, err


@pytest.mark.slow
def test_two_trains_into_one_folder_one_is_refused_at_once_and_a_killed_holders_lock_is_taken_over(
        case: dict) -> None:
    run = case["root"] / "run"
    lock = case["root"] / ".run.meshshard-lock"
    procs = [_train(case, run, "--steps", "100000") for _ in range(2)]
    try:
        refused, holder, err = _one_refused(procs, 120)
        assert re.match(_holder_message(run, holder.pid), err), err
        wait_for_line(holder, r"^step\s+2\s+loss ", 120, "the holder did not train")
        holder.send_signal(signal.SIGKILL)  # its lock file stays, no longer held
        holder.communicate()
        assert lock.is_file()

        # two --resume at once: one takes the dead holder's lock over, the other is refused naming it
        procs = [_train(case, run, "--resume", "--steps", "100000") for _ in range(2)]
        refused, holder, err = _one_refused(procs, 120)
        assert re.match(_holder_message(run, holder.pid, r"\S*meshshard train .* --resume .*"), err), err
        wait_for_line(holder, r"^step\s+\d+\s+loss ", 120, "the resumed run did not train")
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    # on 2 ranks, to its end: the launcher holds the lock while its ranks train (they never take it)
    done = int(load_checkpoint(run / "checkpoint.pt")["step"])
    proc = _train(case, run, "--resume", "--steps", str(done + 2), "--nproc", "2", parts=2)
    wait_for_line(proc, rf"^step\s+{done + 1}\s+loss ", 120, "the last resume did not train")
    assert lock.is_file() and json.loads(lock.read_text())["pid"] == proc.pid
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not lock.exists()


def _refused_while_held(case: dict, out: Path, argv: list[str], command: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from meshshard.cli import main

    holder = hold_folder_lock(out, "meshshard something --out X")
    try:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
    finally:
        holder.communicate("")
    assert re.match(_holder_message(out, holder.pid, "meshshard something --out X").replace(
        "meshshard train", f"meshshard {command}"), err), err
    assert not out.exists() and not (out.parent / f".{out.name}.meshshard-lock").exists()


@pytest.mark.slow
def test_predict_dataset_and_partition_are_refused_while_their_folder_is_being_written(
        case: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from meshshard.cli import main

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MESHSHARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "run"
    argv = ["train", str(case["root"] / "parts1"), "--data", case["data"], "--out", str(run), "--latent", "4",
            "--hidden-layers", "1", "--mp-steps", "1", "--steps", "1", "--quiet"]
    _refused_while_held(case, run, argv, "train", capsys)
    assert main(argv) == 0, capsys.readouterr().err
    _refused_while_held(case, tmp_path / "pred", ["predict", str(run), "--data", case["data"], "--out",
                                                  str(tmp_path / "pred"), "--no-plots", "--quiet"], "predict", capsys)
    points, tri = grid_triangles(4, 4)
    source = tmp_path / "case.vtu"
    meshio.write(source, meshio.Mesh(np.c_[points, np.zeros(len(points))], [("triangle", tri)],
                                     point_data={"a": points[:, 0], "c": points[:, 1]}))
    _refused_while_held(case, tmp_path / "d", ["dataset", str(source), "--out", str(tmp_path / "d"), "--inputs", "a",
                                               "--targets", "c", "--quiet"], "dataset", capsys)
    _refused_while_held(case, tmp_path / "p", ["partition", str(source), "--parts", "2", "--out",
                                               str(tmp_path / "p"), "--quiet"], "partition", capsys)
    _refused_while_held(case, tmp_path / "pp", ["partition", case["data"], "--parts", "2", "--out",
                                                str(tmp_path / "pp"), "--quiet"], "partition", capsys)
