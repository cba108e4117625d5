"""The CFD-sweep example (``examples/cfd_sweep/``) runs as its README says, at a tiny size: a real
OpenFOAM sweep of 3 pitzDaily cases of 20 solver iterations, two training steps of a small model
(the example's ``recipe.toml`` with its sizes shrunk), and the table of meshshard against every
baseline. Where OpenFOAM is not installed it skips, saying so.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from meshshard.cli._train import parse_duration
from meshshard.run import TrainConfig, read_recipe
from meshshard.run._recipe_file import toml_text
from tests.apps.test_examples import REPO, run_example

TUTORIAL = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")

SIZES = {"--cases": "3", "--iterations": "20"}
#: The recipe's sizes, shrunk (its other settings, global attention included, are the example's).
RECIPE_SIZES = {"steps": 2, "batch": 1, "latent_size": 8, "message_passing_steps": 1, "warmup": 0, "val_every": 1,
                "max_time": 300.0, "attention_slices": 4}


def test_the_recipe_is_a_recipe_train_reads() -> None:
    recipe = read_recipe(REPO / "examples" / "cfd_sweep" / "recipe.toml", TrainConfig, convert={"max_time": parse_duration})
    assert (recipe["latent_size"], recipe["message_passing_steps"], recipe["global_attention"],
            recipe["attention_slices"], recipe["steps"], recipe["max_time"]) == (32, 2, 1, 16, 4000, 780.0)


@pytest.mark.slow
def test_cfd_sweep_example_runs_as_its_readme_says(tmp_path: Path, warm_bin: Path) -> None:
    if shutil.which("simpleFoam") is None:
        pytest.skip("OpenFOAM is not installed (no simpleFoam on PATH; Debian: apt-get install openfoam "
                    "openfoam-examples)")
    if not TUTORIAL.is_dir():
        pytest.skip(f"OpenFOAM's pitzDaily tutorial is not at {TUTORIAL} (Debian: apt-get install openfoam-examples)")
    recipe = read_recipe(REPO / "examples" / "cfd_sweep" / "recipe.toml", TrainConfig, convert={"max_time": parse_duration})
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(toml_text(recipe | RECIPE_SIZES))
    outputs = run_example("cfd_sweep", SIZES | {"--config": str(tiny)}, tmp_path, timeout=120, warm=warm_bin)
    assert len(outputs) == 2
    sweep = tmp_path / "cfd-sweep"
    info = json.loads((sweep / "sweep.json").read_text())
    # 3 speeds: the middle one held out, named so that its decimal point survives
    assert info["held_out"] == ["U10.0_nu1.00e-05"], info["held_out"]
    assert (sweep / "params.csv").read_text().splitlines()[0] == "sample,speed,nu"
    for name in ("U05.0_nu1.00e-05", "U10.0_nu1.00e-05", "U15.0_nu1.00e-05"):  # foamToVTK's layout, as it comes
        assert [p.name for p in (sweep / "cases" / name / "VTK").glob("*.vtm")] == [f"{name}_20.vtm"]
    [results_file] = sweep.glob("*/results.json")
    results = json.loads(results_file.read_text())
    methods = {"meshshard", "training mean", "training mean, rescaled", "nearest case", "nearest case, rescaled",
               "interpolation in speed", "interpolation in speed, rescaled"}
    assert set(results["summary"]) == methods, results["summary"].keys()  # nu is not varied: no row for it
    for method, fields in results["summary"].items():
        for field in ("p", "U"):
            assert math.isfinite(fields[field]["mean"]) and fields[field]["mean"] > 0, (method, field, fields)
    case = results["cases"]["U10.0_nu1.00e-05"]
    for field in ("p", "U"):  # our figure from the written .vtu agrees with predict's metrics.json
        assert case["errors"]["meshshard"][field] == pytest.approx(case["metrics.json"][field], rel=1e-3)
    for wall in ("lowerWall", "upperWall"):  # the force from the written .vtu agrees with predict's metrics.json
        assert case["force_errors"]["meshshard"][wall] == pytest.approx(
            case["metrics.json force"][wall]["rel_error"], rel=1e-3)
        assert set(results["force_summary"]) == methods
    assert results["steps_done"] == 2
    assert "global_attention = 1" in results["recipe"] and "steps = 2" in results["recipe"]  # RUN/config.toml
    for method in methods:
        assert method in outputs[1], outputs[1][-3000:]
