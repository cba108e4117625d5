"""The run folder of ``meshshard train``: refusing an existing RUN, --force, --resume checks, the
banner, peak memory and throughput in log.jsonl, loss.png kept current (at most every 30 s while
training), a changed lr logged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from meshshard.data import partition_dataset
from meshshard.run import _folder, _report
from tests._examples import example_module
from tests._warm import warm_command

_runlog = SimpleNamespace(**vars(_folder), write_loss_plot=_report.write_loss_plot)  # the run folder, and loss.png


def test_an_existing_run_is_refused_and_force_deletes_only_our_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _runlog.check_run_folder(run, resume=False, force=False) == []
    with pytest.raises(ValueError, match=r"nothing to resume \(no checkpoint.pt\)"):
        _runlog.check_run_folder(run, resume=True, force=False)
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert _runlog.check_run_folder(run, resume=False, force=False) == []  # a folder without a run is fine
    torch.save({"format": "meshshard-checkpoint", "step": 3}, run / "checkpoint.pt")
    (run / "log.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    (run / "loss.png").write_text("x")
    with pytest.raises(ValueError, match=r"holds a run \(checkpoint.pt, log.jsonl\); pass --resume to continue it or --force"):
        _runlog.check_run_folder(run, resume=False, force=False)
    with pytest.raises(ValueError, match="Expected --resume or --force, not both"):
        _runlog.check_run_folder(run, resume=True, force=True)
    stale = _runlog.check_run_folder(run, resume=False, force=True)
    assert sorted(p.name for p in stale) == ["checkpoint.pt", "log.jsonl", "loss.png"]
    _runlog.delete_run_files(stale)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_files_with_a_runs_names_that_are_not_a_run_are_never_written_over(tmp_path: Path) -> None:
    """A folder with the user's own checkpoint.pt, log.jsonl or loss.png is refused as RUN, with
    --force too, and nothing in it is touched."""
    run = tmp_path / "mine"
    run.mkdir()
    torch.save({"model": {"w": torch.ones(2)}}, run / "checkpoint.pt")  # the user's own checkpoint
    for force in (False, True):
        with pytest.raises(ValueError, match=r"mine: holds checkpoint.pt, which is not a readable meshshard checkpoint "
                                             r"\(another program's, or damaged\); refusing to write over it, even with "
                                             r"--force: pick another --out$"):
            _runlog.check_run_folder(run, resume=False, force=force)
    (run / "checkpoint.pt").unlink()
    (run / "log.jsonl").write_text("epoch 1 loss 0.3\n")
    with pytest.raises(ValueError, match="holds log.jsonl, which is not a log of meshshard train's"):
        _runlog.check_run_folder(run, resume=False, force=True)
    (run / "log.jsonl").unlink()
    (run / "loss.png").write_text("my plot")
    with pytest.raises(ValueError, match=r"holds loss.png but no run of meshshard train's \(no checkpoint.pt or log.jsonl\)"):
        _runlog.check_run_folder(run, resume=False, force=True)
    (run / "loss.png").unlink()
    (run / "log.jsonl").write_text('{"step": 0, "loss": 1.0}\n')  # a run's log, beside the user's own first_step.pt
    torch.save({"my": "notes"}, run / "first_step.pt")
    with pytest.raises(ValueError, match="holds first_step.pt, which is not the first step of a meshshard run"):
        _runlog.check_run_folder(run, resume=False, force=True)
    (run / "log.jsonl").unlink()
    (run / "first_step.pt").unlink()
    (run / "checkpoint.pt").symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(ValueError, match="holds checkpoint.pt, which is not a file meshshard train wrote"):
        _runlog.check_run_folder(run, resume=False, force=True)
    assert [p.name for p in run.iterdir()] == ["checkpoint.pt"] and (run / "checkpoint.pt").is_symlink()


def test_a_run_that_stopped_before_its_first_checkpoint_points_to_force_not_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text("")  # a first step that failed: the log is there, no checkpoint
    with pytest.raises(ValueError, match=r"run: holds a run that stopped before it saved a checkpoint \(log.jsonl\); "
                                         r"pass --force to start over$"):
        _runlog.check_run_folder(run, resume=False, force=False)
    with pytest.raises(ValueError, match=r"nothing to resume \(no checkpoint.pt\): the run stopped before it saved "
                                         r"one; pass --force instead of --resume to start it over$"):
        _runlog.check_run_folder(run, resume=True, force=False)
    assert [p.name for p in _runlog.check_run_folder(run, resume=False, force=True)] == ["log.jsonl"]


def _train_args(*argv: str):
    import argparse

    from meshshard.cli._train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["train", "parts", "--data", "data", "--out", "run", *argv])


def test_a_resumed_run_takes_the_settings_left_out_from_its_checkpoint(tmp_path: Path) -> None:
    from meshshard.cli._train import _model_settings

    saved = {"steps": 30, "latent_size": 16, "hidden_layers": 1, "message_passing_steps": 2, "activation": "gelu", "dtype": "float64",
             "precision": "fp32", "seed": 5, "data_parallel": 2, "lr": 3e-4, "checkpoint_every": 7, "log_every": 1,
             "val_every": 3, "checkpoint_steps": True}
    args = _train_args("--resume", "--latent", "32", "--lr", "1e-4", "--val-every", "0")
    assert _model_settings(args, saved) is None
    assert args.steps == 30  # a requeued job's --resume alone finishes the run it started, no more
    assert _model_settings(more := _train_args("--resume", "--steps", "40"), saved) is None and more.steps == 40
    assert (args.latent, args.hidden_layers, args.mp_steps, args.activation, args.dtype, args.seed, args.data_parallel,
            args.lr, args.every, args.log_every, args.val_every, args.checkpoint_steps) == (
        32, 1, 2, "gelu", "float64", 5, 2, 1e-4, 7, 1, 0, True)  # given flags win; the rest are the run's
    own = {"model": "my models/m.py:build", "model_args": {"hidden": 4}}
    assert _model_settings(_train_args("--resume"), own) == (
        "run: the run trained your own model (my models/m.py:build); pass --model 'my models/m.py:build' to resume it "
        "(code is never imported from what a checkpoint says)")
    fresh = _train_args()
    assert _model_settings(fresh, {}) is None
    assert fresh.steps == 100
    assert (fresh.latent, fresh.hidden_layers, fresh.mp_steps, fresh.activation, fresh.dtype, fresh.precision, fresh.seed,
            fresh.data_parallel, fresh.lr, fresh.every, fresh.log_every, fresh.val_every, fresh.checkpoint_steps) == (
        64, 2, 6, "relu", "float32", "fp32", 0, 1, 1e-3, 20, 10, 0, False)
    model = tmp_path / "m.py"
    model.write_text("def build(a, b, c, hidden=4):\n    pass\n")
    mine = {"model": f"{model.resolve()}:build", "model_args": {"hidden": 8}, "seed": 3}
    for argv, expected in ((("--model", f"{model}:build"), {"hidden": 8}),  # the run's arguments
                           (("--model", f"{model}:build", "--model-args", '{"hidden": 2}'), {"hidden": 2})):
        args = _train_args("--resume", *argv)
        assert _model_settings(args, mine) is None and args.model_args == expected and args.seed == 3
    other = tmp_path / "other.py"
    other.write_text(model.read_text())
    args = _train_args("--resume", "--model", f"{other}:build")
    assert _model_settings(args, mine) is None and args.model_args == {}  # another model: not the run's arguments
    args = _train_args("--resume", "--model", f"{model}:build")
    assert _model_settings(args, saved) is None and args.latent == 64  # MeshGraphNet's settings are not a model's


def test_resume_refuses_fewer_steps_than_done_and_notes_a_finished_run(capsys) -> None:
    from meshshard.run._training import TrainConfig, _check_steps_left

    assert _check_steps_left(10, TrainConfig(partition="p", data="d", out="run", steps=30)) is None
    with pytest.raises(ValueError, match=r"^run: Expected --steps of at least the 30 steps the run has done, to resume "
                                         r"it \(got 10\); --steps is the total, not the steps to add$"):
        _check_steps_left(30, TrainConfig(partition="p", data="d", out="run", steps=10))
    assert capsys.readouterr().err == ""
    note = _check_steps_left(30, TrainConfig(partition="p", data="d", out="run", steps=30))
    assert note == "note: run has done its 30 steps already: nothing to train (raise --steps to go on)"


def test_outputs_are_refused_among_the_inputs(tmp_path: Path) -> None:
    from meshshard.partition import check_apart

    (tmp_path / "parts").mkdir()
    folders = ((tmp_path / "parts", "partition folder"), (tmp_path / "data", "dataset folder"))
    check_apart(tmp_path / "run", *folders)
    check_apart(tmp_path / "parts-run", *folders)  # a name that merely starts like an input's
    for out, how in ((tmp_path / "parts", "that folder"), (tmp_path / "data" / "run", "a folder inside it")):
        with pytest.raises(ValueError, match=rf"Expected an output folder apart from the .* folder .* \(got {how}\)$"):
            check_apart(out, *folders)


def test_resume_refuses_changes_that_break_exactness_and_reports_an_lr_change() -> None:
    saved = {"latent_size": 8, "hidden_layers": 1, "message_passing_steps": 2, "activation": "relu",
             "dtype": "float64", "precision": "fp32", "seed": 0, "data_parallel": 1, "lr": 0.01, "out": "run"}
    ident = {"partition_meshes": [[10, "a"]], "dataset": {"meshes": ["m"]}}
    _runlog.check_resume(saved, ident, saved | {"lr": 0.5, "steps": 99}, ident)
    assert _runlog.lr_change(saved, 0.5) == 0.01 and _runlog.lr_change(saved, 0.01) is None
    with pytest.raises(ValueError, match=r"run: cannot resume with changed settings: latent_size 8 -> 16; dtype 'float64' -> 'float32'"):
        _runlog.check_resume(saved, ident, saved | {"latent_size": 16, "dtype": "float32"}, ident)
    with pytest.raises(ValueError, match=r"changed settings: precision 'fp32' -> 'bf16-mixed' \("):
        _runlog.check_resume(saved, ident, saved | {"precision": "bf16-mixed"}, ident)
    older = {k: v for k, v in saved.items() if k != "precision"}  # a run saved before --precision existed
    _runlog.check_resume(older, ident, saved, ident)
    with pytest.raises(ValueError, match=r"the partition's mesh \(parts/ was made for another mesh\)"):
        _runlog.check_resume(saved, ident, saved | {"partition": "parts/"}, ident | {"partition_meshes": [[10, "b"]]})
    with pytest.raises(ValueError, match=r"the dataset \(.* is not the one the run trained on\)"):
        _runlog.check_resume(saved, ident, saved, ident | {"dataset": {"meshes": ["other"]}})


def test_loss_plot_is_written_and_replaced(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)] + [{"step": 4, "val_loss": 0.3}]
    assert _runlog.write_loss_plot(records, tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]  # no temporary file left


def test_loss_plot_is_redrawn_at_most_every_plot_every_s_while_training_and_always_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from meshshard.run import _train_log

    cfg = SimpleNamespace(out=str(tmp_path), quiet=True, steps=10, log_every=1, data_parallel=1, batch=1)
    log = _train_log.TrainLog(True, cfg, 0, 100)
    drawn: list[int] = []  # the steps logged when loss.png was drawn
    monkeypatch.setattr(_train_log._report, "write_loss_plot", lambda records, path, title: drawn.append(len(records)) or True)
    clock = [1000.0]
    monkeypatch.setattr(_train_log.time, "monotonic", lambda: clock[0])
    try:
        log.step(0, 1.0, 0.1)
        log.plot()  # the first drawing
        log.step(1, 0.9, 0.1)
        clock[0] += _train_log.PLOT_EVERY_S - 0.5
        log.plot()  # too soon after it
        clock[0] += 0.5
        log.plot()  # PLOT_EVERY_S after it
        log.step(2, 0.8, 0.1)
        log.plot(final=True)  # the end: always, however soon
    finally:
        log.close()
    assert drawn == [1, 2, 3]


@pytest.fixture(scope="module")
def small_case(tmp_path_factory) -> dict:
    """A 12x12 triangle grid, heat-diffusion samples, a 2-part partition."""
    root = tmp_path_factory.mktemp("runlog")
    side = 12
    i, j = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    points = np.stack([i.ravel(), j.ravel()], 1) / (side - 1.0)
    idx = (i[:-1, :-1] * side + j[:-1, :-1]).ravel()
    tri = np.concatenate([np.stack([idx, idx + side, idx + side + 1], 1), np.stack([idx, idx + side + 1, idx + 1], 1)])
    heat = example_module("heat_diffusion", "simulate")
    heat.write_dataset(heat.simulate_heat(points, tri, trajectories=2, steps=2, seed=0), root / "data")
    partition_dataset(root / "data", root / "parts", 2)
    partition_dataset(root / "data", root / "parts1", 1)
    return {"root": root, "data": str(root / "data"), "parts": str(root / "parts"), "parts1": str(root / "parts1")}


def _train(case: dict, run: Path, *extra: str, parts: str = "parts") -> subprocess.CompletedProcess:
    cmd = [*warm_command(), "train", case[parts], "--data", case["data"], "--out", str(run),
           "--nproc", "2" if parts == "parts" else "0", "--latent", "8", "--hidden-layers", "1", "--mp-steps", "2", "--log-every", "2",
           "--dtype", "float64", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_train_banner_log_plot_refusal_force_and_resume(small_case: dict) -> None:
    run = small_case["root"] / "run"
    first = _train(small_case, run, "--steps", "3", "--lr", "0.01")
    assert first.returncode == 0, first.stderr
    assert "2 rank(s) = 1 data-parallel x 2 domain-parallel" in first.stdout, first.stdout
    assert "parameters" in first.stdout and "per rank owned " in first.stdout and ", ghosts " in first.stdout
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in (records[0], records[2]):  # the logged steps carry every rank's peak memory
        assert len(r["peak_rss_mb"]) == 2 and all(v > 50 for v in r["peak_rss_mb"]), r
        assert r["nodes_per_s"] > 0 and r["samples_per_s"] > 0
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"

    again = _train(small_case, run, "--steps", "3")
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "holds a run (checkpoint.pt, log.jsonl); pass --resume to continue it or --force to start over" in again.stderr

    changed = _train(small_case, run, "--steps", "5", "--resume", "--latent", "16")
    assert changed.returncode == 2 and "cannot resume with changed settings: latent_size 8 -> 16" in changed.stderr

    resumed = _train(small_case, run, "--steps", "5", "--resume", "--lr", "0.002")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step 3" in resumed.stdout
    assert "learning rate changed on resume: 0.01 -> 0.002 (applied from step 3)" in resumed.stdout
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert {"step": 3, "event": "lr", "from": 0.01, "to": 0.002} in records
    assert [r["step"] for r in records if "loss" in r] == [0, 1, 2, 3, 4]

    (run / "mine.txt").write_text("keep")
    forced = _train(small_case, run, "--steps", "1", "--force", "--quiet", parts="parts1")  # one process
    assert forced.returncode == 0, forced.stderr
    assert [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()] == [0]
    assert (run / "mine.txt").read_text() == "keep"

    missing = _train(small_case, small_case["root"] / "new", "--steps", "1", "--resume")
    assert missing.returncode == 2 and "nothing to resume (no checkpoint.pt)" in missing.stderr


def test_a_log_that_is_a_fifo_or_a_link_reads_as_no_records(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "log.jsonl")  # reading it would block (meshshard info RUN hung)
    assert _runlog.read_log(tmp_path / "log.jsonl") == []
    (tmp_path / "real.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "real.jsonl")
    assert _runlog.read_log(tmp_path / "link.jsonl") == [] and _runlog.read_log(tmp_path / "real.jsonl") == [{"step": 0, "loss": 1.0}]


_DEEP = "[" * 200000  # nesting that exhausts Python's recursion in json's decoder


def test_a_damaged_log_is_named_on_resume_not_answered_with_resume(tmp_path: Path) -> None:
    """A line of log.jsonl nested deep enough to exhaust recursion (or holding NaN) made --resume
    crash with a RecursionError, then advise --resume: it is refused as damaged, in one line."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"format": "meshshard-checkpoint", "step": 3}, run / "checkpoint.pt")
    good = '{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n'
    for damage, line in ((_DEEP, 2), ('{"step": 1, "loss": NaN}', 2)):
        (run / "log.jsonl").write_text(good.splitlines()[0] + "\n" + damage + "\n")
        with pytest.raises(ValueError, match=rf"^{run / 'log.jsonl'}: damaged at line {line} \(not valid JSON \(.*\)\); "
                                             r"move it aside to resume from checkpoint.pt, or pass --force to start "
                                             r"over$") as info:
            _runlog.check_run_folder(run, resume=True, force=False)
        assert "--resume" not in str(info.value)
        assert _runlog.read_log(run / "log.jsonl") == [{"step": 0, "loss": 1.0}]  # info RUN still reads the rest
    (run / "log.jsonl").write_text(_DEEP + "\n")  # the first line: still the log of the run beside it
    with pytest.raises(ValueError, match=rf"^{run / 'log.jsonl'}: damaged at line 1 \(not valid JSON \(nested too "
                                         r"deeply\)\); move it aside"):
        _runlog.check_run_folder(run, resume=True, force=False)
    assert sorted(p.name for p in _runlog.check_run_folder(run, resume=False, force=True)) == ["checkpoint.pt",
                                                                                              "log.jsonl"]
    (run / "checkpoint.pt").unlink()
    with pytest.raises(ValueError, match=r"holds log.jsonl, which is not a log of meshshard train's"):
        _runlog.check_run_folder(run, resume=False, force=True)
    torch.save({"format": "meshshard-checkpoint", "step": 3}, run / "checkpoint.pt")
    (run / "log.jsonl").write_text(good + '{"step": 2, "lo')  # a line cut short by a kill: not damage
    assert _runlog.check_run_folder(run, resume=True, force=False) == []


def test_log_records_are_strict_json() -> None:
    """A validation loss that is NaN is logged as null: log.jsonl stays strict JSON."""
    from meshshard.partition import loads_json
    from meshshard.run._train_log import log_line

    line = log_line({"step": 3, "val_loss": float("nan"), "loss": float("inf"), "lr": 1e-3})
    assert line.endswith("\n") and loads_json(line, "line") == {"step": 3, "val_loss": None, "loss": None, "lr": 1e-3}
    records = [{"step": 0, "loss": 1.0}, {"step": 1, "val_loss": None}, {"step": 1, "val_loss": 0.5}]
    assert _runlog.run_val_losses(records) == [(1, 0.5)]
