"""``meshshard baseline``: the command writes what predict writes, refuses in one line, replaces only
its own folder with --force; ``meshshard info PRED --compare BASE`` and ``meshshard predict
--baseline BASE`` print the model beside the baseline."""

from __future__ import annotations

import json
from pathlib import Path

import meshio
import pytest

from meshshard.cli import main
from meshshard.run import TrainConfig, train
from tests.meshshard.run._sweeps import write_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    return write_sweep(tmp_path_factory.mktemp("cli-sweep") / "data")


def test_the_command_writes_predicts_files_and_guards_its_folder(sweep: dict, tmp_path: Path, capsys) -> None:
    out = tmp_path / "base"
    command = ["baseline", sweep["data"], "-o", str(out), "--method", "knn:2", "--boundary", "bottom",
               "--force-reference", "b**2", "--direction", "1,0", "--lift-direction", "0,1"]
    assert main(command) == 0
    printed = capsys.readouterr()
    assert "meshshard baseline: knn:2 of 8 training samples" in printed.out
    assert "bottom over 3 samples: drag MAE" in printed.out and "Spearman" in printed.out
    assert sorted(p.name for p in out.iterdir()) == ["forces.png", "metrics.json", "v0.png", "v0.vtu",
                                                     "v0_boundaries.png", "v1.png", "v1.vtu", "v1_boundaries.png",
                                                     "v2.png", "v2.vtu", "v2_boundaries.png"]
    mesh = meshio.read(out / "v0.vtu")
    assert {"p_pred", "p", "p_error", "U_pred", "U", "U_error", "global_id"} <= set(mesh.point_data)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["format"] == "meshshard-predictions" and metrics["complete"] and metrics["baseline"]["method"] == "knn:2"
    assert set(metrics["boundaries"]["bottom"]["coefficients"]["lift"]) >= {"mae", "r2", "spearman"}
    assert main(command) == 2  # an existing folder, without --force
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not empty (pass --force" in err
    assert main(command + ["--force", "--samples", "v1", "--no-plots"]) == 0  # the pictures went with the rest
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "v1.vtu"]
    assert main(["info", str(out)]) == 0
    assert "  baseline   knn:2 of 8 training samples (meshshard baseline)" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["--method", "knn:x"], "Expected --method knn:K with K a whole number >= 1 (got 'knn:x')"),
    (["--method", "interp:speed"], "Expected --method interp:PARAM to name a parameter of"),
    (["--boundary", "top"], "Expected --boundary to name boundaries of the meshes (got top"),
    (["--direction", "0,0"], "Expected --direction X,Y,Z, a non-zero vector"),
])
def test_refusals_are_one_line_and_leave_nothing(sweep: dict, tmp_path: Path, capsys, extra: list[str],
                                                 message: str) -> None:
    assert main(["baseline", sweep["data"], "-o", str(tmp_path / "base")] + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshshard baseline: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "base").exists()


def test_a_model_beside_its_baseline(sweep: dict, tmp_path: Path, capsys) -> None:
    from meshshard.data import partition_dataset

    partition_dataset(sweep["data"], tmp_path / "parts", 1)
    train(TrainConfig(partition=str(tmp_path / "parts"), data=sweep["data"], out=str(tmp_path / "run"), steps=2,
                      latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64"))
    base = str(tmp_path / "base")
    assert main(["baseline", sweep["data"], "--out", base, "--method", "nearest", "--no-plots", "-q"]) == 0
    assert main(["predict", str(tmp_path / "run"), "--data", sweep["data"], "--out", str(tmp_path / "pred"),
                 "--no-plots", "-q", "--baseline", base]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("pred (model)"):]
    assert "base (baseline nearest)" in table and "baseline / model" in table
    assert any(line.startswith("p rel L2") for line in table.splitlines())
    assert main(["info", str(tmp_path / "pred"), "--compare", base]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
    assert main(["predict", str(tmp_path / "run"), "--data", sweep["data"], "--out", str(tmp_path / "p2"),
                 "--baseline", str(tmp_path / "nothing")]) == 2  # refused before predicting
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "p2").exists()
    assert main(["info", str(tmp_path / "pred"), "--compare", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"meshshard info: error: {tmp_path / 'run' / 'metrics.json'}: missing\n"
