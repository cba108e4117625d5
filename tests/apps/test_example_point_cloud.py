"""The point-cloud example (``examples/point_cloud/``): its solver agrees with the exact sphere
solution, and its README's commands run end to end at a reduced size (5 coarse bodies (mesh size 0.12), a small
Transolver, 2 steps), down to the table of the model against the baselines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests._examples import example_module
from tests.apps.test_examples import run_example

SIZES = {"--cases": "5", "--size": "0.12", "--steps": "2", "--val-every": "1",
         "--model-args": '{"width": 8, "layers": 1, "heads": 2, "slices": 4}'}


def _needs_solver() -> None:
    pytest.importorskip("gmsh", reason="the example's mesher (pip install gmsh, or meshshard[examples])")
    pytest.importorskip("skfem", reason="the example's solver (pip install scikit-fem, or meshshard[examples])")


def test_potential_flow_solver_converges_to_the_exact_sphere_pressure() -> None:
    _needs_solver()
    simulate = example_module("point_cloud", "simulate")
    coarse, fine = simulate.sphere_check(0.15), simulate.sphere_check(0.1)
    assert fine < 0.08, fine  # relative L2 of Cp against 1 - 9/4 sin^2(theta)
    assert fine < 0.75 * coarse, (coarse, fine)  # and it converges under refinement


def test_inclined_body_feels_a_pitching_moment_and_no_force() -> None:
    _needs_solver()
    simulate = example_module("point_cloud", "simulate")
    points, tri, cp = simulate.solve_surface_cp(*simulate.mesh_body(2.0, 0.8, 15.0, 0.15))
    assert cp.max() <= 1.05 and cp.min() > -3  # Cp = 1 at a stagnation point, at most
    area = np.cross(points[tri[:, 1]] - points[tri[:, 0]], points[tri[:, 2]] - points[tri[:, 0]]) / 2
    assert np.allclose(area.sum(0), 0, atol=1e-9)  # a closed surface
    assert (area * (points[tri].mean(1))).sum() > 0  # triangles wound outward
    f = cp[tri].mean(1)[:, None] * area  # Cp times the outward area vector, per triangle
    force, moment = -f.sum(0), np.cross(points[tri].mean(1), -f).sum(0)
    assert np.abs(force).max() < 0.03  # d'Alembert: no net force, up to discretisation
    assert abs(moment[1]) > 0.1 and abs(moment[1]) > 10 * max(abs(moment[0]), abs(moment[2]))  # the Munk moment
    # an ellipsoid's potential flow is symmetric under x -> -x through its centre
    from scipy.spatial import cKDTree

    _, mirror = cKDTree(points).query(-points)
    assert np.abs(cp - cp[mirror]).mean() < 0.1


@pytest.mark.slow
def test_point_cloud_example_runs_as_its_readme_says(tmp_path: Path, warm_bin: Path) -> None:
    _needs_solver()
    pytest.importorskip("vtk", reason="reading .vtp (pip install vtk, or meshshard[examples])")
    outputs = run_example("point_cloud", SIZES, tmp_path, timeout=240, warm=warm_bin)
    assert len(outputs) == 6
    assert "sphere check: Cp relative L2 error" in outputs[0]
    assert "params.csv" not in outputs[1] or "skipped" in outputs[1]
    assert "inputs   pos (3), normal (3), area, aspect, thickness, angle" in outputs[1], outputs[1]
    pred = tmp_path / "pc" / "pred"
    [sample] = json.loads((pred / "metrics.json").read_text())["samples"]  # 5 cases, one held out
    table = outputs[5]
    for method in ("mean field", "nearest case", "model"):
        assert f"\n{method} " in table, table
    result = json.loads((tmp_path / "pc" / "baselines.json").read_text())
    [case] = result["cases"]
    assert case["case"] == sample["name"]
    assert case["model"]["recorded_rel_l2"] == pytest.approx(case["model"]["rel_l2"], rel=1e-4)
    for key in ("mean_field", "nearest_case_errors", "model"):
        assert 0 < case[key]["rel_l2"] < 10 and 0 < case[key]["area_rel_l2"] < 10
