"""The transient example runs as its README says, at a reduced size, and prints its baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.apps.test_examples import readme_commands, run_example


@pytest.mark.slow
def test_transient_example_runs_as_its_readme_says(tmp_path: Path, warm_bin: Path) -> None:
    pytest.importorskip("gmsh", reason="the example's mesher (pip install gmsh, or meshshard[examples])")
    pytest.importorskip("skfem", reason="the example's solver (pip install scikit-fem, or meshshard[examples])")
    assert len(readme_commands("transient")) == 6
    sizes = {"--size": "0.2", "--trajectories": "4", "--steps": "12", "--val-every": "6", "--latent": "8"}
    outputs = run_example("transient", sizes, tmp_path, timeout=240, warm=warm_bin)
    pred = tmp_path / "tr" / "pred"
    metrics = json.loads((pred / "metrics.json").read_text())
    [sample] = metrics["samples"]  # 4 runs, a quarter held out
    assert sample["split"] == "val"
    rollout = sample["fields"]["c"]["rollout"]
    assert len(rollout["rmse"]) == 12 and all(v is not None and v >= 0 for v in rollout["rmse"])
    assert rollout["rmse_10"] == rollout["rmse"][9]
    assert (pred / f"{sample['name']}.pvd").is_file()
    assert len(list((pred / sample["name"]).glob("step-*.vtu"))) == 13
    table = outputs[-1]
    assert "RMSE-1..10" in table, table
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    for row in ("persistence", "training mean per step", "model"):
        assert len(lines[row].split()) - len(row.split()) == 4, table  # four numbers, RMSE-1 .. RMSE-all
    model_rmse_1 = float(lines["model"].split()[1])
    assert model_rmse_1 == pytest.approx(rollout["rmse_1"], rel=1e-3)
    assert "model beats both baselines over the first 10 steps" in table
