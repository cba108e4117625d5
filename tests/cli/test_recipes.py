"""Recipes as files (``meshshard train --config / --print-config``, ``RUN/config.toml``) and one
spelling per idea on every command (``--nproc``, ``-o``, ``--rollout-steps``, ``--graph knn:K``),
the old spellings still working, hidden from ``--help``, with a one-line note."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import main
from meshshard.run import RUN_FILES, TrainConfig, read_recipe
from meshshard.run._recipe_file import RECIPE_HEADER, toml_text
from tests.meshshard.run.test_folder import small_case  # noqa: F401 - a module fixture: pytest finds it by its name


def _printed(capsys, *argv: str) -> str:
    assert main(["train", *argv, "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(RECIPE_HEADER), out
    return out


def _config(path: Path) -> TrainConfig:
    return TrainConfig(**read_recipe(path, TrainConfig))


def test_print_config_reads_back_to_the_same_run(tmp_path: Path, capsys) -> None:
    given = ["parts", "--data", "data", "-o", "run", "--steps", "40", "--lr", "3e-3", "--max-time", "13m",
             "--warmup", "5", "--val-every", "10", "--batch", "2", "--seed", "3", "--quiet"]
    for model in ([], ["--latent", "32", "--mp-steps", "2", "--global-attention", "1", "--attention-slices", "16"],
                  ["--model", "transolver", "--model-args", '{"width": 16, "heads": 2, "checkpoint": true}']):
        text = _printed(capsys, *given, *model)
        recipe = tmp_path / "recipe.toml"
        recipe.write_text(text)
        assert _printed(capsys, "--config", str(recipe)) == text  # every field, read back as it was
        cfg = _config(recipe)
        assert (cfg.partition, cfg.out, cfg.steps, cfg.max_time, cfg.warmup, cfg.quiet) == ("parts", "run", 40, 780.0,
                                                                                           5, True)
        assert {f for f in TrainConfig.__dataclass_fields__} == {line.split(" = ")[0] for line in text.splitlines()
                                                                 if not line.startswith("#")}
    assert cfg.architecture == "transolver" and cfg.model == "" and cfg.model_args == {"width": 16, "heads": 2,
                                                                                      "checkpoint": True}


def test_flags_given_override_the_file(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('partition = "p"\ndata = "d"\nout = "r"\nsteps = 5\nlr = 1\nlatent_size = 16\n'
                      'max_time = "1h30m"\nwarmup = "auto"\nquiet = true\nval_every = 7\n')
    (tmp_path / "out.toml").write_text(_printed(capsys, "--config", str(recipe), "--steps", "9", "-o", "other",
                                                "--val-every", "0"))
    cfg = _config(tmp_path / "out.toml")
    assert (cfg.partition, cfg.data, cfg.out) == ("p", "d", "other")
    assert (cfg.steps, cfg.lr, cfg.latent_size, cfg.max_time, cfg.warmup, cfg.quiet, cfg.val_every) == (
        9, 1.0, 16, 5400.0, -1, True, 0)  # a flag given wins, 0 included; the rest is the file's


@pytest.mark.parametrize(("text", "message"), [
    ("latnet = 3\n", r"unknown key 'latnet' \(the keys are partition, data, out, steps,"),
    ("mp_steps = 3\n", r"unknown key 'mp_steps' \(did you mean 'message_passing_steps'\?\)"),
    ('batch = "3"\n', r"Expected 'batch' to be an integer \(got '3', a string\)"),
    ('steps = "many"\n', r"steps: Expected a number of steps or auto \(got 'many'\)"),
    ("seed = true\n", r"Expected 'seed' to be an integer \(got True, a boolean\)"),
    ("quiet = 1\n", r"Expected 'quiet' to be true or false \(got 1, an integer\)"),
    ('dtype = "float16"\n', r"Expected 'dtype' to be one of float32, float64 \(got 'float16'\)"),
    ('architecture = "resnet"\n', r"Expected 'architecture' to be one of meshgraphnet, transolver"),
    ("[train]\nsteps = 3\n", r"unknown key 'train'"),
    ("steps =\n", r"not TOML \(Invalid value"),
    ('max_time = "soon"\n', r"max_time: Expected --max-time as a duration"),
])
def test_a_recipe_that_is_wrong_is_refused_in_one_line(tmp_path: Path, capsys, text: str, message: str) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(text)
    assert main(["train", "p", "--data", "d", "-o", str(tmp_path / "run"), "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"meshshard train: error: {recipe}: "), err
    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_a_link_a_folder_a_fifo_and_a_missing_file_are_refused(tmp_path: Path, capsys) -> None:
    real = tmp_path / "real.toml"
    real.write_text("steps = 3\n")
    (tmp_path / "link.toml").symlink_to(real)
    os.mkfifo(tmp_path / "fifo.toml")  # never opened for a blocking read
    for name, message in (("link.toml", "is a link; give the recipe file itself"),
                          ("fifo.toml", "is not a regular file"), ("missing.toml", "missing"),
                          (".", "is a folder, expected a file")):
        assert main(["train", "p", "--data", "d", "-o", "r", "--config", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert main(["train", "--config", str(real)]) == 2  # the folders: on the command line or in the file
    assert ("the following arguments are required: PARTS, --data, --out (on the command line or in --config)"
            in capsys.readouterr().err)


def test_the_toml_writer_escapes_what_toml_needs() -> None:
    import tomllib

    values = {"a": 'quote " back \\ tab \t nl \n del \x7f bell \x07 é', "b": [1, 2.5, True, "x"], "c": float("inf"),
              "d": {"k-1": 1, "with space": [0.1]}, "e": 1e-05, "f": -0.0}
    assert tomllib.loads(toml_text(values, "two\nlines")) == values
    with pytest.raises(ValueError, match="TOML has no null"):
        toml_text({"a": None})


@pytest.mark.slow
def test_the_run_folder_keeps_its_recipe_and_train_reads_it_back(small_case: dict, tmp_path: Path,  # noqa: F811
                                                                  capsys) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'partition = "{small_case["parts1"]}"\ndata = "{small_case["data"]}"\nsteps = 2\n'
                      'latent_size = 8\nhidden_layers = 1\nmessage_passing_steps = 2\ndtype = "float64"\nquiet = true\n')
    run = tmp_path / "run"
    assert main(["train", "--config", str(recipe), "-o", str(run)]) == 0, capsys.readouterr().err
    assert "config.toml" in RUN_FILES
    kept = _config(run / "config.toml")
    assert (run / "config.toml").read_text().startswith(RECIPE_HEADER)
    assert (kept.steps, kept.latent_size, kept.dtype, kept.out, kept.task) == (2, 8, "float64", str(run), "steady")
    assert "resume = " not in (run / "config.toml").read_text()  # how RUN is treated is the command line's
    # the run's own recipe trains the same run again, elsewhere
    again = tmp_path / "again"
    assert main(["train", "--config", str(run / "config.toml"), "-o", str(again)]) == 0
    assert _config(again / "config.toml") == TrainConfig.from_dict(vars(kept) | {"out": str(again)})
    assert (again / "checkpoint.pt").read_bytes() != b""
    # --resume rewrites it with what the resumed run trains with; --force starts it over
    assert main(["train", "--config", str(recipe), "-o", str(run), "--resume", "--steps", "3"]) == 0
    assert _config(run / "config.toml").steps == 3
    assert main(["train", "--config", str(recipe), "-o", str(run), "--force"]) == 0
    assert _config(run / "config.toml").steps == 2
    capsys.readouterr()
    # a config.toml of the user's own in a folder holding a run is never written over
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "log.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    (mine / "config.toml").write_text("steps = 3\n")
    assert main(["train", "--config", str(recipe), "-o", str(mine), "--force"]) == 2
    assert "holds config.toml, which is not a recipe meshshard train wrote" in capsys.readouterr().err
    assert (mine / "config.toml").read_text() == "steps = 3\n"


def _parse(*argv: str) -> argparse.Namespace:
    from meshshard.cli import build_parser

    return build_parser(argv[0]).parse_args(list(argv))


def test_old_spellings_work_hidden_with_a_note(capsys) -> None:
    assert main(["selftest", "--ranks", "0"]) == 2  # selftest --ranks: --nproc
    out, err = capsys.readouterr()
    assert err == "meshshard selftest: --ranks is deprecated; use --nproc\n" and "Expected --nproc >= 1 (got 0)" in out
    args = _parse("predict", "run", "--data", "d", "-o", "pred", "--rollout", "--steps", "4")  # predict --steps
    assert args.rollout_steps == 4 and args.out == "pred"
    assert capsys.readouterr().err == "meshshard predict: --steps is deprecated; use --rollout-steps\n"
    args = _parse("demo", "--ranks", "3", "-o", "there")  # demo --ranks: --nproc
    assert (args.nproc, args.out) == (3, "there")
    assert capsys.readouterr().err == "meshshard demo: --ranks is deprecated; use --nproc\n"
    args = _parse("selftest", "--nproc", "3")  # the new spellings: no note
    assert args.nproc == 3 and _parse("predict", "r", "--data", "d", "--out", "p", "--rollout-steps", "2").rollout_steps == 2
    assert capsys.readouterr().err == ""
    for command, old, new in (("selftest", "--ranks", "--nproc"), ("demo", "--ranks", "--nproc"),
                              ("predict", "--steps", "--rollout-steps")):
        helped = subprocess.run([sys.executable, "-m", "meshshard", command, "--help"], capture_output=True,
                                text=True, timeout=120).stdout
        assert new in helped and f"{old} " not in helped and f"{old}\n" not in helped, helped


def test_demo_passes_nproc_and_out_on(monkeypatch) -> None:
    from meshshard.cli import _demo

    called = []
    monkeypatch.setattr(_demo.subprocess, "call", lambda words: called.append(words) or 0)
    assert main(["demo", "-o", "d", "--nproc", "3", "--steps", "1"]) == 0
    assert called[0][2:] == ["--out", "d", "--steps", "1", "--nodes", "20000", "--nproc", "3"]


def test_every_out_has_o() -> None:
    from meshshard.cli import COMMANDS, build_parser

    for name, _, _ in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]
        outs = [a for a in sub._actions if "--out" in a.option_strings]
        assert all("-o" in a.option_strings for a in outs), (name, outs)


@pytest.mark.parametrize(("given", "graph", "knn", "radius"), [
    (["--graph", "knn:8"], "knn", 8, None), (["--graph", "radius:0.5"], "radius", 6, 0.5),
    (["--graph", "knn", "--knn", "4"], "knn", 4, None), (["--graph", "radius", "--radius", "2"], "radius", 6, 2.0),
    (["--graph", "mesh"], "nodal", 6, None), (["--graph", "dual"], "dual", 6, None), ([], None, 6, None),
])
def test_partition_graph_takes_the_datasets_grammar_and_its_own_words(given, graph, knn, radius) -> None:
    args = _parse("partition", "mesh.vtu", "-k", "2", "-o", "parts", *given)
    assert (args.graph, args.knn, args.radius) == (graph, knn, radius)


@pytest.mark.parametrize("bad", ["knn:x", "knn:0", "radius:-1", "dual:3", "cells", "radius:inf"])
def test_partition_graph_refuses_what_it_cannot_read(bad: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _parse("partition", "mesh.vtu", "-k", "2", "-o", "parts", "--graph", bad)
    assert stopped.value.code == 2 and "argument --graph: Expected" in capsys.readouterr().err
