"""The shape-sweep example (``examples/shape_sweep/``): its family of bodies and their meshes without
OpenFOAM, and, where OpenFOAM is installed, the example as its README says at a tiny size, with
its recipe (the linear:12 prior leaving out each training case's shape, the wall normal, the body
weighted): 6 shapes x 1 angle on coarse meshes (one held out, so a training case's prior has
exactly the 4 other training shapes), two training steps of a small model, the table against
every baseline.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshshard.cli._train import parse_duration
from meshshard.run import TrainConfig, read_recipe
from meshshard.run._recipe_file import toml_text
from tests._examples import example_module
from tests.apps.test_examples import REPO, run_example

TUTORIAL = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/airFoil2D")
SIZES = {"--shapes": "6", "--aoa": "4", "--mesh-scale": "3", "--iterations": "300"}
RECIPE_SIZES = {"steps": 2, "batch": 1, "latent_size": 8, "message_passing_steps": 1, "warmup": 0, "val_every": 1,
                "max_time": 300.0, "attention_slices": 4}


@pytest.fixture(scope="module")
def shapes():  # noqa: ANN201
    return example_module("shape_sweep", "shapes")


def corners(shapes) -> list:  # noqa: ANN001
    (t0, t1), (m0, m1), (n0, n1) = (shapes.RANGES[k] for k in ("thickness", "camber", "nose"))
    return [shapes.Shape(t, m, n) for t in (t0, t1) for m in (m0, m1) for n in (n0, n1)]


def test_every_shape_of_the_family_is_a_closed_simple_outline_of_its_thickness(shapes) -> None:  # noqa: ANN001
    family, _ = shapes.design(16)
    assert len(family) == 16 and len({s.name for s in family}) == 16
    for shape in family + corners(shapes):
        outline = shapes.Shape(shape.thickness, shape.camber, shape.nose).outline()
        assert not shapes.self_intersects(outline), shape
        assert shapes.signed_area(outline) > 0, shape  # trailing edge, upper surface, nose, lower: anticlockwise
        x = np.linspace(0.0, 1.0, 4001)
        yt = shape.half_thickness(x)
        assert yt[0] == 0 and abs(yt[-1]) < 1e-12, shape  # closed at the nose and the trailing edge
        assert np.all(yt[1:-1] > 0), shape
        assert 2 * yt.max() == pytest.approx(shape.thickness, rel=1e-3)
        upper, lower = shape.surfaces(x)
        assert np.all(upper[1:-1, 1] > lower[1:-1, 1]), shape
    # a blunter nose is a larger leading-edge radius, at any thickness
    for t in (0.08, 0.2):
        radii = [shapes.Shape(t, 0.02, n).leading_edge_radius() for n in (0.6, 1.0, 1.4)]
        assert radii[0] < radii[1] < radii[2]


def test_the_self_intersection_check_sees_a_crossing(shapes) -> None:  # noqa: ANN001
    bow_tie = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert shapes.self_intersects(bow_tie)
    assert not shapes.self_intersects(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]))


def test_held_out_shapes_are_inside_the_family(shapes) -> None:  # noqa: ANN001
    family, held = shapes.design(16)
    assert len(held) == 4
    keys = ("thickness", "camber", "nose")
    lo = np.array([shapes.RANGES[k][0] for k in keys])
    hi = np.array([shapes.RANGES[k][1] for k in keys])

    def unit(s):  # noqa: ANN001, ANN202
        return (np.array([s.thickness, s.camber, s.nose]) - lo) / (hi - lo)

    trained = np.array([unit(s) for s in family if s not in held])
    for s in held:
        assert np.all((unit(s) > 0.05) & (unit(s) < 0.95)), s  # inside every range, off its ends
        assert shapes.inside_hull(unit(s), trained), s  # an interpolation within the shapes trained on
    assert not shapes.inside_hull(np.array([1.2, 0.5, 0.5]), trained)


def test_the_c_grid_of_a_body_turned_to_its_angle(shapes) -> None:  # noqa: ANN001
    shape = shapes.Shape(0.14, 0.03, 1.0)
    text, cells = shapes.block_mesh_dict(shape, 6.0)
    hexes = re.findall(r"hex \(([\d ]+)\) \((\d+) (\d+) 1\)", text)
    assert len(hexes) == 6 and cells == sum(int(a) * int(b) for _, a, b in hexes)
    vertices = re.search(r"vertices\s*\((.*?)\n\);", text, re.S).group(1)
    points = np.array([[float(v) for v in p.split()] for p in re.findall(r"\(([^()]+)\)", vertices)])
    assert points.shape == (24, 3)
    nose, tail = points[0, :2], points[1, :2]
    # nose up by 6 degrees about the quarter chord: the chord line falls towards the trailing edge
    assert math.degrees(math.atan2(nose[1] - tail[1], tail[0] - nose[0])) == pytest.approx(6.0, abs=1e-6)
    assert np.linalg.norm(tail - nose) == pytest.approx(1.0)
    for patch in ("body", "inlet", "outlet", "frontAndBack"):
        assert re.search(rf"^\s+{patch} {{ type \w+; faces", text, re.M), patch
    assert "body { type wall;" in text
    coarse = shapes.block_mesh_dict(shape, 6.0, shapes.MeshSizes(scale=2.0))[1]
    assert coarse < cells / 2  # coarser cells, fewer of them


def test_the_recipes_are_recipes_train_reads() -> None:
    folder = REPO / "examples" / "shape_sweep"
    recipe = read_recipe(folder / "recipe.toml", TrainConfig, convert={"max_time": parse_duration})
    assert (recipe["latent_size"], recipe["global_attention"], recipe["steps"], recipe["max_time"],
            recipe["loss_weight"]) == (32, 1, 4500, 690.0, {"body": 10.0})
    before = read_recipe(folder / "recipe-before.toml", TrainConfig, convert={"max_time": parse_duration})
    assert (before["steps"], before["max_time"], "loss_weight" in before) == (1500, 600.0, False)
    assert set(recipe) - set(before) == {"loss_weight"}


def test_run_py_runs_the_recipe_and_before_the_first_one() -> None:
    run = example_module("shape_sweep", "run")
    folder = REPO / "examples" / "shape_sweep"
    args, train = run.arguments(["sweep", "--seed", "1"])
    assert (args.tag, args.config, args.dataset_options, train) == ("after", folder / "recipe.toml",
                                                                    run.DATASET_OPTIONS, ["--seed", "1"])
    assert "--mean-field linear:12" in run.DATASET_OPTIONS and "--wall-normal body" in run.DATASET_OPTIONS
    assert "--map-along body --position-prior-inputs" in run.DATASET_OPTIONS  # both maps of the prior
    assert args.members == 2  # two runs side by side, predicted as their mean
    args, _ = run.arguments(["sweep", "--before"])  # README.md's `run.py shape-sweep --before`
    assert (args.tag, args.config, args.dataset_options, args.members) == ("before", folder / "recipe-before.toml",
                                                                           "", 1)
    args, _ = run.arguments(["sweep", "--before", "--tag", "b1", "--dataset-options", "--wall-normal body"])
    assert (args.tag, args.config, args.dataset_options) == ("b1", folder / "recipe-before.toml", "--wall-normal body")


def test_run_py_holds_out_what_sweep_py_would_from_the_same_cases(shapes) -> None:  # noqa: ANN001
    """``run.py --held-out 6``: the shapes ``sweep.py --held-out 6`` picks, from a sweep of 16 made
    with the default; refused in one line for another family or more than fit inside the hull."""
    run = example_module("shape_sweep", "run")
    family, default = shapes.design(16)
    info = {"shapes": [s.name for s in family], "ranges": {k: list(v) for k, v in shapes.RANGES.items()},
            "held_out_shapes": [s.name for s in default]}
    six = run.held_out_shapes(info, 6)
    assert six == [s.name for s in shapes.design(16, held=6)[1]] and len(six) == 6
    assert set(info["held_out_shapes"]) < set(six)  # the nearest the centre first: the default 4 among them
    assert run.arguments(["sweep", "--held-out", "6"])[0].tag == "after-held6"
    with pytest.raises(SystemExit, match="only 8 of the sweep's shapes can be held out"):
        run.held_out_shapes(info, 9)
    with pytest.raises(SystemExit, match="the sweep's shapes are not the family sweep.py makes"):
        run.held_out_shapes({**info, "shapes": info["shapes"][::-1]}, 6)


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 60 s of CPU time; the guard is for a loaded machine
def test_shape_sweep_example_runs_as_its_readme_says(tmp_path: Path, warm_bin: Path) -> None:
    if shutil.which("simpleFoam") is None and not Path("/usr/share/openfoam/etc/bashrc").is_file():
        pytest.skip("OpenFOAM is not installed (Debian: apt-get install openfoam openfoam-examples)")
    if not TUTORIAL.is_dir():
        pytest.skip(f"OpenFOAM's airFoil2D tutorial is not at {TUTORIAL} (Debian: apt-get install openfoam-examples)")
    recipe = read_recipe(REPO / "examples" / "shape_sweep" / "recipe.toml", TrainConfig,
                         convert={"max_time": parse_duration})
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(toml_text(recipe | RECIPE_SIZES))
    outputs = run_example("shape_sweep", SIZES | {"--config": str(tiny)}, tmp_path, timeout=600, warm=warm_bin)
    assert len(outputs) == 2
    sweep = tmp_path / "shape-sweep"
    info = json.loads((sweep / "sweep.json").read_text())
    assert len(info["shapes"]) == 6 and len(info["held_out_shapes"]) == 1
    assert info["held_out"] == [f"{info['held_out_shapes'][0]}_a04.0"]
    assert (sweep / "params.csv").read_text().splitlines()[0] == "sample,thickness,camber,nose,aoa,speed"
    meshes = {r["sample"]: r["cells"] for r in info["cases"]}
    assert len(meshes) == 6
    for name in meshes:  # foamToVTK's layout, the body's patch in every file
        [vtm] = (sweep / "cases" / name / "VTK").glob("*.vtm")
        assert (vtm.parent / vtm.stem / "boundary" / "body.vtp").is_file(), list(vtm.parent.rglob("*"))
    results = json.loads((sweep / "after" / "results.json").read_text())
    # the defaults are the recipe: the dataset's prior (both maps) and wall normal, the body weighted in the loss
    assert results["settings"]["dataset_options"] == ("--mean-field linear:12 --wall-normal body --map-along body "
                                                      "--position-prior-inputs")
    assert "loss_weight = {body = 10.0}" in results["recipe"] and results["steps_done"] == 2
    data = json.loads((sweep / "after" / "data" / "dataset.json").read_text())
    assert (data["mean_field"]["method"], data["mean_field"]["left_out"]) == ("linear:12", "mesh"), data["mean_field"]
    assert "wall_normal" in [i["name"] for i in data["inputs"]], data["inputs"]
    assert data["mean_field"]["along"] == ["body"] and data["mean_field"]["position_inputs"] is True
    assert [i["name"] for i in data["inputs"] if "position_prior_of" in i] == ["p_mean_by_position", "U_mean_by_position"]
    rows = results["summary"]
    assert list(rows) == ["free stream", "training mean", "nearest shape", "knn:4 (inverse distance)",
                          "linear:12 (local least squares)", "nearest, along the body", "knn:4, along the body",
                          "linear:12, along the body", "meshshard"]
    along = json.loads((sweep / "after" / "baseline-linear12-along" / "metrics.json").read_text())
    assert along["baseline"]["along"] == ["body"] and rows["linear:12, along the body"] != rows[
        "linear:12 (local least squares)"]
    for method, row in rows.items():
        for column in ("p near", "U near", "p body", "CL MAE", "CD MAE"):
            assert math.isfinite(row[column]) and row[column] > 0, (method, column, row)
    metrics = json.loads((sweep / "after" / "pred" / "metrics.json").read_text())
    # two runs side by side, one rank each, other seeds, predicted as their mean
    assert [Path(m).parts[-2:] for m in metrics["ensemble"]] == [("after", "run-2")] and metrics["world_size"] == 1
    seeds = [read_recipe(sweep / "after" / run / "config.toml", TrainConfig)["seed"] for run in ("run", "run-2")]
    assert seeds == [0, 1]
    assert [s["stage"] for s in results["stages"]].count("train") == 1 and " & " in results["stages"][2]["command"]
    for record in metrics["samples"]:  # the table's figures are predict's, near the body too
        case = results["cases"]["meshshard"][record["name"]]
        assert case["p body"] == record["boundaries"]["body"]["fields"]["p"]["rel_l2"]
        assert case["near"]["U"] == record["near"]["fields"]["U"]["rel_l2"] and record["near"]["num_nodes"] > 0
    # the free stream over the same near nodes of the written files: p = 0 is 100% off
    assert rows["free stream"]["p body"] == 1.0 and rows["free stream"]["p near"] == pytest.approx(1.0, rel=1e-12)
    assert "meshshard" in outputs[1] and "nearest shape" in outputs[1]
    # run.py --held-out N (README.md's "six held out"): what sweep.py --held-out N holds out, from the same cases
    run = example_module("shape_sweep", "run")
    assert run.held_out_cases(info, 1, []) == (info["held_out_shapes"], info["held_out"])
    assert run.held_out_cases(info, None, info["held_out"]) == (info["held_out_shapes"], [])
    # and README.md's run for few shapes, end to end: mirrored cases in the prior, the fit bounded, --relative-loss
    options = (run.DATASET_OPTIONS.replace("linear:12", "linear:12,bound=2.5")
               + " --mirror y:U --mirror-params camber,aoa --mirror-in-prior")
    done = subprocess.run([sys.executable, str(REPO / "examples" / "shape_sweep" / "run.py"), str(sweep),
                           "--held-out", "1", "--members", "1", "--nproc", "1", "--config", str(tiny),
                           "--relative-loss", "--no-baselines", "--dataset-options", options],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"MESHSHARD_COMMAND": str(warm_bin / "meshshard"), "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    held = json.loads((sweep / "after-held1" / "results.json").read_text())
    assert held["held_out_shapes"] == info["held_out_shapes"] and held["held_out"] == info["held_out"]
    mirrored = json.loads((sweep / "after-held1" / "data" / "dataset.json").read_text())
    assert len(mirrored["mirror"]["samples"]) == 5 and mirrored["mirror"]["in_prior"]  # 5 trained on, at 4 degrees
    assert mirrored["mean_field"]["samples"] == 10 and "relative_loss = true" in held["recipe"]
    assert mirrored["mean_field"]["method"] == "linear:12,bound=2.5"
    assert {"training", "other"} <= set(mirrored["mean_field"]["largest_weights"])
    assert mirrored["mean_field"]["largest_weights"]["training"][0] <= 2.5 + 1e-3  # damped to the bound at most
    predicted = json.loads((sweep / "after-held1" / "pred" / "metrics.json").read_text())
    assert predicted["mirror_average"] is True  # each held-out case and its mirror, averaged
    assert "--mirror-average" in done.stdout
    assert list(held["summary"]) == ["free stream", "meshshard"] and "meshshard baseline" not in done.stdout
