"""Training that must stop, and stop cleanly: non-finite data, loss or gradients.

Uses the dataset and 2-part partition of ``test_train.py`` (``setup``). Each spawn runs several
trainings in a row, so the ranks start once.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.data import open_dataset
from meshshard.partition import load_partition
from meshshard.run import TrainConfig, load_checkpoint, sample_index, train
from tests._dist import free_port, run_ranks
from tests._processes import wait_for_line
from tests.meshshard.run.test_train import setup  # noqa: F401 - the shared module fixture


def _outcome(cfg: dict) -> tuple[str, str]:
    try:
        train(TrainConfig.from_dict(cfg))
    except Exception as err:  # noqa: BLE001 - reported to the test, which checks type and message
        return type(err).__name__, str(err)
    return "ok", ""


def _train_several(rank: int, world: int, cfgs: list[dict]) -> list[tuple[str, str]]:
    return [_outcome(cfg) for cfg in cfgs]


def _nan_dataset(setup: dict, name: str, sample: int, node: int, which: str) -> Path:  # noqa: F811
    data = setup["root"] / name
    shutil.copytree(setup["cfg"].data, data)
    file = data / "samples" / f"{sample:05d}" / f"{which}.npy"  # the dataset refuses NaN: damage it after
    values = np.load(file)
    values[node, 0] = np.nan if which == "inputs" else np.inf
    np.save(file, values)
    return data


def test_non_finite_data_loss_or_gradient_stops_every_rank_and_keeps_the_last_good_checkpoint(setup: dict) -> None:  # noqa: F811
    base = asdict(setup["cfg"]) | {"data_parallel": 1, "checkpoint_every": 2}
    train_ids = open_dataset(base["data"]).train

    def sample_at(step: int) -> int:
        return int(train_ids[sample_index(base["seed"], step, 0, 1, len(train_ids))])

    sample = sample_at(2)  # first read at step 2, after a checkpoint
    assert sample not in [sample_at(k) for k in (0, 1)]
    node = int(load_partition(base["partition"], 1).owned_ids[3])  # owned by rank 1 only
    nan_inputs = _nan_dataset(setup, "nan_inputs", sample, node, "inputs")
    inf_targets = _nan_dataset(setup, "inf_targets", sample, node, "targets")
    cfgs = [
        base | {"data": str(nan_inputs), "out": str(setup["root"] / "nan")},
        base | {"data": str(nan_inputs), "out": str(setup["root"] / "nan"), "resume": True},
        base | {"data": str(inf_targets), "out": str(setup["root"] / "inf")},
        base | {"lr": 1e300, "out": str(setup["root"] / "diverges")},
    ]
    outcomes = run_ranks(_train_several, 2, cfgs, timeout=240)
    assert outcomes[0] == outcomes[1], "every rank stops with the same error"
    nan_run, nan_resumed, inf_run, diverged = outcomes[0]
    name = open_dataset(nan_inputs).meta["samples"][sample]["name"]
    expected = (rf"Expected finite training data \(got nan in the inputs of sample {sample} \({name}\) at node {node}, read by "
                rf"rank 1 at step 2\); fix the dataset {nan_inputs}")
    assert nan_run[0] == "ValueError" and nan_run[1] == expected.replace("\\", ""), nan_run
    assert nan_resumed == nan_run  # the resumed run stops at the same place
    assert inf_run[0] == "ValueError" and f"(got inf in the targets of sample {sample} ({name}) at node {node}" in inf_run[1]
    for run in ("nan", "inf"):
        ckpt = load_checkpoint(setup["root"] / run / "checkpoint.pt")
        assert ckpt["step"] == 2, "the last good checkpoint is kept"
        assert all(bool(torch.isfinite(v).all()) for v in ckpt["model"].values())
    assert diverged[0] == "NonFiniteLoss", diverged
    assert re.match(r"step 1: the loss is not finite \(nan\) on sample\(s\) \d+ \(\w+\); ", diverged[1]), diverged
    assert diverged[1].endswith("; training stopped before the optimizer step, so no non-finite weights are saved "
                                "(last checkpoint: none yet). Lower --lr or check the data."), diverged
    assert not (setup["root"] / "diverges" / "checkpoint.pt").exists()


def _finite_checks(rank: int, world: int, cfg: dict) -> list[int]:
    import meshshard.run._training as trainer

    checked: list[int] = []
    real = trainer.non_finite_row
    trainer.non_finite_row = lambda x, y, owned, sample: checked.append(sample) or real(x, y, owned, sample)
    train(TrainConfig.from_dict(cfg))
    return checked


@pytest.mark.slow
def test_each_training_sample_is_checked_for_non_finite_values_once(setup: dict) -> None:  # noqa: F811
    steps = 10
    cfg = asdict(setup["cfg"]) | {"partition": str(setup["root"] / "partition1"), "data_parallel": 1, "steps": steps,
                                  "checkpoint_every": steps, "out": str(setup["root"] / "checked_once")}
    train_ids = open_dataset(cfg["data"]).train
    read = [int(train_ids[sample_index(cfg["seed"], k, 0, 1, len(train_ids))]) for k in range(steps)]
    assert len(set(read)) < len(read), "some sample is read twice"
    assert run_ranks(_finite_checks, 1, cfg, timeout=120)[0] == list(dict.fromkeys(read))  # first reads only


def test_a_non_finite_gradient_is_reported_with_the_step_and_samples() -> None:
    from meshshard.run._failures import NonFiniteLoss, check_finite, local_flags

    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    loss = torch.tensor(0.5)
    flags = local_flags(loss, None, model.parameters(), rank=1, world=2)
    assert check_finite(flags, step=5, samples=[3], data="DATA", last="none yet") == 0.25  # all finite
    model.weight.grad[0, 1] = float("inf")
    flags = local_flags(loss, None, model.parameters(), rank=1, world=2)
    with pytest.raises(NonFiniteLoss, match=r"^step 5: a gradient is not finite \(loss 0\.25\) on sample\(s\) 3; "
                                            r"training stopped before the optimizer step, .*\(last checkpoint: none yet\)"):
        check_finite(flags, step=5, samples=[3], data="DATA", last="none yet")
    with pytest.raises(NonFiniteLoss, match=r"on sample\(s\) 3 \(case-3\), 0 \(a\); training stopped"):
        check_finite(flags, step=5, samples=[3, 0], data="DATA", last="none yet", names=["a", "b", "c", "case-3"])
    flags = local_flags(loss, (4, 17, "targets", float("-inf")), model.parameters(), rank=1, world=2)
    with pytest.raises(ValueError, match=r"^Expected finite training data \(got -inf in the targets of sample 4 at "
                                         r"node 17, read by rank 1 at step 5\); fix the dataset DATA$"):
        check_finite(flags, step=5, samples=[3], data="DATA", last="none yet")


def _cli(setup: dict, out: Path, *extra: str) -> list[str]:  # noqa: F811
    cfg = setup["cfg"]
    return ["train", str(setup["root"] / "partition1"), "--data", cfg.data, "--out", str(out), "--latent", "8",
            "--hidden-layers", "1", "--mp-steps", "2", "--quiet", "--steps", "2", *extra]


def test_missing_folders_and_a_file_as_output_folder_are_one_line_and_exit_2(
    setup: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """train and predict share these refusals (meshshard.partition.check_apart), made before any rank starts."""
    from meshshard.cli import main
    from meshshard.run._pred_folder import check_prediction_folder as check_output

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MESHSHARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    root, data = setup["root"], setup["cfg"].data
    missing, file, out = root / "missing", root / "a-file", root / "never-made"
    file.write_text("x")
    cases = {
        ("train", str(missing), "--data", data, "--out", str(out)): f"meshshard train: error: {missing}: no such partition folder",
        ("train", str(root / "partition1"), "--data", str(missing), "--out", str(out)):
            f"meshshard train: error: {missing}: no such dataset folder",
        ("train", str(root / "partition1"), "--data", data, "--out", str(file)):
            f"meshshard train: error: {file}: exists and is not a folder",
        ("predict", str(missing), "--data", data, "--out", str(out)): f"meshshard predict: error: {missing}: no such run folder",
        ("predict", str(root), "--data", str(missing), "--out", str(out)):
            f"meshshard predict: error: {missing}: no such dataset folder",
    }
    for argv, message in cases.items():
        assert main(list(argv)) == 2, argv
        assert capsys.readouterr().err == message + "\n", argv
    assert not out.exists()
    with pytest.raises(ValueError, match=rf"^{re.escape(str(file))}: exists and is not a folder$"):
        check_output(file, force=True)


def test_bad_counts_environment_and_checkpoints_are_one_line_and_exit_2(
    setup: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from meshshard.cli import main
    from meshshard.run._checkpoint import FORMAT, FORMAT_VERSION, _digest

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MESHSHARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    out = setup["root"] / "counts"
    cases = {
        ("--every", "0"): "Expected --every to be a positive integer (got 0)",
        ("--log-every", "0"): "Expected --log-every to be a positive integer (got 0)",
        ("--val-every", "-2"): "Expected --val-every to be 0 (off) or a positive integer (got -2)",
        ("--nproc", "-1"): "Expected --nproc to be 0 (not launching) or a positive integer (got -1)",
        ("--lr", "nan"): "Expected --lr to be a positive number (got nan)",
    }
    for extra, message in cases.items():
        assert main(_cli(setup, out, *extra)) == 2, extra
        assert capsys.readouterr().err == f"meshshard train: error: {message}\n"
    with pytest.raises(SystemExit) as stopped:  # --steps is a number or auto, which its parser decides
        main(_cli(setup, out, "--steps", "-1"))
    assert stopped.value.code == 2
    assert capsys.readouterr().err.endswith("meshshard train: error: argument --steps: Expected a positive number of "
                                            "steps or auto (got '-1')\n")
    assert not out.exists()

    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "abc")
    assert main(_cli(setup, out)) == 2
    assert capsys.readouterr().err == (
        "meshshard train: error: Expected the environment variable SLURM_NTASKS_PER_NODE to be a task count such as "
        "'2(x3),1' (got 'abc')\n"
    )
    for name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name)

    # a checkpoint with a valid checksum but no optimizer state: refused on --resume, one line
    run = setup["root"] / "no-optimizer"
    run.mkdir()
    body = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": 0, "model": {}, "losses": [],
            "rng": torch.get_rng_state(), "config": {}, "world_size": 1}
    torch.save(body | {"sha256": _digest(body)}, run / "checkpoint.pt")
    assert main(_cli(setup, run, "--resume")) == 2
    assert capsys.readouterr().err == (
        f"meshshard train: error: {run / 'checkpoint.pt'}: incomplete meshshard checkpoint (no 'optimizer' entry)\n"
    )


def _pair(setup: dict, out: Path, env: dict, *extra: str) -> list[subprocess.Popen]:  # noqa: F811
    port = str(free_port())
    cmd = [sys.executable, "-m", "meshshard", *_cli(setup, out, *extra)]
    cmd[cmd.index("--data") - 1] = setup["cfg"].partition  # the 2-part partition
    cmd.remove("--quiet")  # rank 0 prints its step lines (on stdout), which the test waits for
    return [subprocess.Popen(cmd, env=os.environ | env | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                                                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in (0, 1)]


@pytest.mark.slow
def test_a_stopped_rank_fails_its_peer_within_the_configured_timeout(setup: dict) -> None:  # noqa: F811
    """SIGSTOP, not a kill: no connection closes, so only the groups' timeout can end the wait.

    While rank 0 waits, an unreadable checkpoint.pt appears in RUN: rank 0 must still report the
    peer failure (naming the checkpoint as unusable), not fail on the checkpoint instead.
    """
    out = setup["root"] / "stopped"
    procs = _pair(setup, out, {"MESHSHARD_TIMEOUT": "8"}, "--steps", "100000", "--every", "100000")
    try:
        # rank 0 prints step 0's line once that step is in log.jsonl: both ranks are training
        wait_for_line(procs[0], r"^step\s+0\s+loss ", 120, "training did not start")
        assert procs[1].poll() is None, procs[1].communicate()
        procs[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        (out / "checkpoint.pt").write_bytes(b"left over from something else")
        try:
            _, err = procs[0].communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 still waits for the stopped rank 90 s after it stopped (MESHSHARD_TIMEOUT=8)")
        waited = time.monotonic() - stopped
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshshard train: error: rank 0: step "), err
    assert "a peer rank probably died or stopped responding" in err, err
    assert lines[0].endswith(f"Last checkpoint: unusable ({out / 'checkpoint.pt'}: not a readable meshshard checkpoint "
                             "(not a torch.save file: Unsupported operand 108)); rerun from the start."), err
    assert waited < 60, waited


def test_an_os_error_is_one_line_and_its_traceback_only_with_meshshard_debug(
    setup: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from meshshard.cli import main

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MESHSHARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    out = Path("/dev/null/run")  # its parent is not a folder: the run folder cannot be made
    assert main(_cli(setup, out)) == 1
    err = capsys.readouterr().err
    assert err.startswith("meshshard train: error: ") and "/dev/null/run" in err and err.count("\n") == 1, err
    monkeypatch.setenv("MESHSHARD_DEBUG", "1")
    assert main(_cli(setup, out)) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.splitlines()[-1].startswith("meshshard train: error: ")
