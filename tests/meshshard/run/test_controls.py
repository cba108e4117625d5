"""Training controls: a time budget (``max_time``) stops with a checkpoint that resumes exactly;
gradient clipping (``clip_grad``) and several samples a step (``batch``) on shards equal one
process on the whole mesh."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from meshshard.cli._train import parse_duration
from meshshard.data import open_dataset
from meshshard.run import AUTO_STEPS, TrainConfig, load_checkpoint, sample_index, train
from tests._dist import run_ranks
from tests.meshshard.run._reference import whole_mesh_training
from tests.meshshard.run.test_train import setup  # noqa: F401 - the shared module fixture

STEPS = 4


def _one_process(setup: dict, name: str, **changes) -> TrainConfig:  # noqa: F811
    return TrainConfig.from_dict(asdict(setup["cfg"]) | {"partition": str(setup["root"] / "partition1"),
                                                         "data_parallel": 1, "out": str(setup["root"] / name)}
                                 | changes)


def test_a_time_budget_stops_with_a_checkpoint_that_resumes_exactly(setup: dict) -> None:  # noqa: F811
    whole = train(_one_process(setup, "budget-whole", steps=STEPS))
    stopped = train(_one_process(setup, "budget", steps=STEPS, max_time=1e-9))  # out of time at the first step
    assert stopped == whole[:1]
    run = Path(setup["root"]) / "budget"
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 1
    events = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert {"step": 1, "event": "max_time", "seconds": 1e-9, "steps": STEPS} in events
    resumed = train(_one_process(setup, "budget", steps=STEPS, resume=True))
    assert resumed == whole  # float64, the same samples in the same order: bit for bit


def test_a_stop_at_the_time_budget_says_what_is_left_of_the_schedule(setup: dict, capsys) -> None:  # noqa: F811
    """With a decaying schedule the stop says the rate it stopped at (a cosine over 4 steps: 1 + cos(pi / 3)
    halved, 75%) and the --steps that fitted;
    with a constant one it says neither."""
    train(_one_process(setup, "budget-cosine", steps=STEPS, max_time=1e-9, quiet=False, lr_schedule="cosine",
                       warmup=0))
    said = capsys.readouterr().out
    assert (f"Its --lr-schedule cosine was set for --steps {STEPS} and stops at 75% of --lr: for a schedule that ends "
            "within the budget, train with --steps 1 (what fitted)") in said, said
    train(_one_process(setup, "budget-constant", steps=STEPS, max_time=1e-9, quiet=False))
    said = capsys.readouterr().out
    assert "stopped at the time budget" in said and "--lr-schedule" not in said


def test_auto_steps_fit_the_budget_and_train_as_that_many_steps_would(setup: dict, capsys) -> None:  # noqa: F811
    """--steps auto: untrained passes time a step, the run takes the steps that fit --max-time and
    records them; it equals the run of --steps N with that N (float64, bit for bit: the passes
    change nothing), and --resume keeps N; without --max-time it is refused."""
    auto = train(_one_process(setup, "auto", steps=AUTO_STEPS, max_time=2.0, quiet=False, val_every=5,
                              lr_schedule="cosine"))
    said = capsys.readouterr().out
    ckpt = load_checkpoint(Path(setup["root"]) / "auto" / "checkpoint.pt")
    n = ckpt["config"]["steps"]
    assert isinstance(n, int) and n >= 1 and f"--steps auto: {n} steps fit the rest of --max-time 2 s" in said, said
    events = [json.loads(line) for line in (Path(setup["root"]) / "auto" / "log.jsonl").read_text().splitlines()]
    fit = [e for e in events if e.get("event") == "fit_steps"]
    assert len(fit) == 1 and fit[0]["steps"] == n and fit[0]["step_s"] > 0 and fit[0]["validation_s"] > 0
    explicit = train(_one_process(setup, "auto-explicit", steps=n, val_every=5, lr_schedule="cosine"))
    assert auto == explicit[:len(auto)]  # the budget may stop the auto run a little early, never otherwise
    # --resume with --steps auto goes on to the n recorded (nothing left when the budget did not stop it)
    train(_one_process(setup, "auto", steps=AUTO_STEPS, max_time=0.0, resume=True, val_every=5, lr_schedule="cosine"))
    resumed = load_checkpoint(Path(setup["root"]) / "auto" / "checkpoint.pt")
    assert resumed["step"] == n and resumed["losses"] == explicit
    with pytest.raises(ValueError, match=r"^Expected --steps auto with --max-time \(it fits the number of steps"):
        train(_one_process(setup, "auto-no-budget", steps=AUTO_STEPS))


def test_auto_steps_on_the_command_line_and_in_a_recipe(setup: dict, capsys) -> None:  # noqa: F811
    from meshshard.cli import main

    root = Path(setup["root"])
    common = ["train", str(root / "partition1"), "--data", str(root / "data"), "--out", str(root / "auto-cli")]
    assert main([*common, "--steps", "auto"]) == 2
    assert capsys.readouterr().err.strip() == ("meshshard train: error: Expected --steps auto with --max-time (it fits "
                                               "the number of steps to that budget)")
    with pytest.raises(SystemExit) as stopped:  # argparse's refusal of the value
        main([*common, "--steps", "0"])
    assert stopped.value.code == 2 and "Expected a positive number of steps or auto (got '0')" in capsys.readouterr().err
    assert main([*common, "--steps", "auto", "--max-time", "5m", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "\nsteps = -1\n" in printed and "# steps = -1 and warmup = -1 are auto" in printed
    (root / "auto.toml").write_text(printed.replace("steps = -1", 'steps = "auto"'))
    assert main(["train", "--config", str(root / "auto.toml"), "--print-config"]) == 0
    assert "\nsteps = -1\n" in capsys.readouterr().out
    assert not (root / "auto-cli").exists()


def _clip_rank(rank: int, world: int, cfg: dict) -> list[float]:
    return train(TrainConfig.from_dict(cfg))


def test_clipping_on_two_ranks_equals_one_process_clipping_the_whole_gradient(setup: dict) -> None:  # noqa: F811
    cfg = setup["cfg"]
    clip = 1e-3  # far below the gradients' norm: every step clips
    out = str(setup["root"] / "clipped")
    run_ranks(_clip_rank, 2, asdict(cfg) | {"out": out, "data_parallel": 1, "clip_grad": clip}, timeout=180)
    sharded = load_checkpoint(Path(out) / "checkpoint.pt")

    train_ids = open_dataset(cfg.data).train
    losses, state, norms = whole_mesh_training(
        cfg, STEPS, lambda step: [train_ids[sample_index(cfg.seed, step, 0, 1, len(train_ids))]], clip=clip)
    assert min(norms) > 10 * clip
    assert sharded["losses"] == pytest.approx(losses, rel=1e-10)
    for name, value in state.items():
        torch.testing.assert_close(sharded["model"][name], value, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize(("text", "seconds"), [("900", 900), ("90s", 90), ("15m", 900), ("1.5h", 5400),
                                               ("1h30m", 5400), ("2d", 172800)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "15x", "1h 30q", "-5m"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^Expected --max-time as a duration such as 900, 90s, 15m"):
        parse_duration(text)


def _batch_reference(setup: dict, batch: int, data_parallel: int) -> tuple[list[float], dict]:  # noqa: F811
    """One process on the whole mesh: each step the mean loss of every data rank's ``batch`` samples."""
    from meshshard.run._training import step_samples

    cfg = TrainConfig.from_dict(asdict(setup["cfg"]) | {"batch": batch, "data_parallel": data_parallel})
    train_ids = open_dataset(cfg.data).train
    picks = [[k for d in range(data_parallel) for k in step_samples(cfg, step, d, train_ids)] for step in range(STEPS)]
    assert all(len(p) == batch * data_parallel for p in picks)
    losses, state, _ = whole_mesh_training(cfg, STEPS, lambda step: picks[step])
    return losses, state


@pytest.mark.parametrize(("world", "data_parallel"), [(2, 1), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_several_samples_a_step_on_shards_equal_one_process(setup: dict, world: int, data_parallel: int) -> None:  # noqa: F811
    out = str(setup["root"] / f"batch-{world}")
    cfg = asdict(setup["cfg"]) | {"out": out, "data_parallel": data_parallel, "batch": 2}
    losses = run_ranks(_clip_rank, world, cfg, timeout=180)[0]
    ref_losses, ref_model = _batch_reference(setup, 2, data_parallel)
    assert losses == pytest.approx(ref_losses, rel=1e-10)
    sharded = load_checkpoint(Path(out) / "checkpoint.pt")["model"]
    for name, value in ref_model.items():
        torch.testing.assert_close(sharded[name], value, rtol=1e-10, atol=1e-12, msg=name)


def test_lr_schedules() -> None:
    from meshshard.run._schedule import lr_at

    cosine = TrainConfig(partition="", data="", out="", steps=11, lr=1.0, lr_schedule="cosine", warmup=0, lr_floor=0.1)
    rates = [lr_at(cosine, s) for s in range(11)]
    assert rates[0] == 1.0 and rates[-1] == pytest.approx(0.1) and rates[5] == pytest.approx(0.55)
    assert all(a > b for a, b in zip(rates, rates[1:]))
    warm = TrainConfig(partition="", data="", out="", steps=11, lr=2.0, lr_schedule="constant", warmup=4)
    assert [lr_at(warm, s) for s in range(6)] == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    expo = TrainConfig(partition="", data="", out="", steps=11, lr=1.0, lr_schedule="exponential", lr_floor=0.01)
    rates = [lr_at(expo, s) for s in range(11)]
    assert rates[0] == 1.0 and rates[-1] == pytest.approx(0.01) and rates[5] == pytest.approx(0.1)
    assert [b / a for a, b in zip(rates, rates[1:])] == pytest.approx([0.01**0.1] * 10)
    assert lr_at(expo, 20) == pytest.approx(0.01)  # past the last step: the floor
    warm_expo = TrainConfig(partition="", data="", out="", steps=13, lr=2.0, lr_schedule="exponential", warmup=3,
                            lr_floor=0.1)
    rates = [lr_at(warm_expo, s) for s in range(13)]
    assert rates[:3] == pytest.approx([2 / 3, 4 / 3, 2.0]) and rates[-1] == pytest.approx(0.2)
    assert rates[7] == pytest.approx(2.0 * 0.1**0.5)  # halfway from step 2 to step 12
    default = TrainConfig(partition="", data="", out="", steps=1000, lr=1.0)  # cosine after 20 steps of warm-up
    assert (default.lr_schedule, default.warmup) == ("cosine", -1)
    rates = [lr_at(default, s) for s in range(1000)]
    assert rates[:20] == pytest.approx([(s + 1) / 20 for s in range(20)], rel=1e-3) and rates[-1] == pytest.approx(0.01)
    assert rates[20] < rates[19] and all(a >= b for a, b in zip(rates[19:], rates[20:]))
    assert lr_at(TrainConfig(partition="", data="", out="", steps=49, lr=1.0), 0) == 1.0  # none under 50 steps
    long = TrainConfig(partition="", data="", out="", steps=10**6, lr=1.0)  # at most 100 steps of warm-up
    assert lr_at(long, 98) == pytest.approx(0.99) and lr_at(long, 99) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"^Expected --lr-schedule constant, cosine or exponential \(got 'step'\)$"):
        lr_at(TrainConfig(partition="", data="", out="", lr_schedule="step"), 0)
    with pytest.raises(ValueError, match=r"^Expected --lr-floor > 0 for --lr-schedule exponential \(got 0.0\)$"):
        lr_at(TrainConfig(partition="", data="", out="", lr_schedule="exponential", lr_floor=0.0), 0)


@pytest.mark.parametrize("schedule", ["cosine", "exponential"])
def test_a_scheduled_run_equals_one_process_and_resumes_exactly(setup: dict, schedule: str) -> None:  # noqa: F811
    from meshshard.run._schedule import lr_at

    sched = {"lr_schedule": schedule, "warmup": 2, "lr_floor": 0.05}
    whole = train(_one_process(setup, f"sched-whole-{schedule}", steps=STEPS, **sched))
    cfg = _one_process(setup, f"sched-ref-{schedule}", steps=STEPS, **sched)
    train_ids = open_dataset(cfg.data).train
    losses, _, _ = whole_mesh_training(
        cfg, STEPS, lambda step: [train_ids[sample_index(cfg.seed, step, 0, 1, len(train_ids))]],
        lr_of_step=lambda step: lr_at(cfg, step))
    assert whole == pytest.approx(losses, rel=1e-10)
    records = [json.loads(line)
               for line in (Path(setup["root"]) / f"sched-whole-{schedule}" / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records if "lr" in r] == [lr_at(cfg, s) for s in range(STEPS)]
    stopped = train(_one_process(setup, f"sched-{schedule}", steps=STEPS, max_time=1e-9, **sched))
    assert stopped == whole[:1]
    assert train(_one_process(setup, f"sched-{schedule}", steps=STEPS, resume=True, **sched)) == whole


def test_warmup_auto_on_the_command_line_and_a_run_from_before_schedules_resumes_at_a_constant_rate(
        setup: dict, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    """A run whose checkpoint predates ``lr_schedule`` trained at a constant rate: resumed, it keeps
    it, though a new run's default is now cosine."""
    from meshshard.cli import main
    from meshshard.run._checkpoint import save_checkpoint

    root = Path(setup["root"])
    args = ["train", str(root / "partition1"), "--data", str(root / "data"), "--out", str(root / "old"), "--steps",
            "2", "--latent", "8", "--mp-steps", "1", "--dtype", "float64", "--quiet"]
    assert main([*args, "--warmup", "auto"]) == 0
    saved = load_checkpoint(root / "old" / "checkpoint.pt")
    assert (saved["config"]["lr_schedule"], saved["config"]["warmup"]) == ("cosine", -1)
    for key in ("lr_schedule", "warmup", "lr_floor"):
        del saved["config"][key]  # as a version before the schedules wrote it
    save_checkpoint(root / "old" / "checkpoint.pt", saved)
    args[args.index("--steps") + 1] = "4"
    assert main([*args, "--resume"]) == 0
    config = load_checkpoint(root / "old" / "checkpoint.pt")["config"]
    assert (config["lr_schedule"], config["warmup"]) == ("constant", 0)
    records = [json.loads(line) for line in (root / "old" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r and "lr" not in r] == [2, 3]  # no schedule: no rate logged
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "--warmup", "soon"])
    assert "Expected auto or a number of steps (got 'soon')" in capsys.readouterr().err
