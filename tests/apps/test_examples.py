"""Every example runs, as its README says, at a reduced size: one test per example.

The commands are read from the first ```bash block of ``examples/<name>/README.md`` and run one
after another in a temporary folder; only the size flags listed per example are substituted, so a
README command that stops working fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import meshio
import pytest

from tests._examples import EXAMPLES

REPO = EXAMPLES.parent


def readme_commands(example: str) -> list[str]:
    """The commands of the first ```bash block of the example's README (comments dropped)."""
    text = (EXAMPLES / example / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, f"examples/{example}/README.md has no ```bash block"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def shrink(command: str, sizes: dict[str, str], warm: Path | None = None) -> list[str]:
    """``command`` split into words, each size flag's value replaced, ``python`` / ``meshshard`` made
    ours (``meshshard`` the warm one in folder ``warm`` when given: :mod:`tests._warm`)."""
    words = shlex.split(command)
    for i, word in enumerate(words[:-1]):
        if word in sizes:
            words[i + 1] = sizes[word]
    if words[0] == "python":
        words[0] = sys.executable
    elif words[0] == "meshshard":
        words[:1] = [str(warm / "meshshard")] if warm is not None else [sys.executable, "-m", "meshshard"]
    return words


def run_example(example: str, sizes: dict[str, str], cwd: Path, timeout: float, warm: Path | None = None) -> list[str]:
    """The README's commands run one after another in ``cwd``, size flags replaced and the shell's
    globs (``tr/runs/traj-*``) expanded as bash would (sorted); their outputs. ``meshshard`` runs warm
    when ``warm`` (the ``warm_bin`` fixture) is given."""
    outputs = []
    env = os.environ | {"MPLBACKEND": "Agg"}
    if warm is not None:  # the examples' own scripts start meshshard warm too (meshshard.cli.command_argv)
        env["MESHSHARD_COMMAND"] = shlex.quote(str(warm / "meshshard"))
    for command in readme_commands(example):
        words = []
        for word in shrink(command, sizes, warm):
            if word.startswith("examples/"):
                words.append(str(REPO / word))
            elif "*" in word and not word.startswith("-") and "=" not in word:  # a shell glob: runs/traj-*
                found = sorted(str(p.relative_to(cwd)) for p in cwd.glob(word))
                assert found, f"`{command}`: {word} matches nothing"
                words.extend(found)
            else:
                words.append(word)
        proc = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"`{command}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout + proc.stderr)
    return outputs


@pytest.mark.slow
def test_heat_diffusion_example_runs_as_its_readme_says(tmp_path: Path) -> None:
    outputs = run_example("heat_diffusion", {"--nodes": "1500", "--steps": "3"}, tmp_path, timeout=240)
    assert "first step verified" in outputs[-1], outputs[-1]
    assert (tmp_path / "meshshard-demo" / "run" / "checkpoint.pt").is_file()


def run_heat_sink_example(example: str, tmp_path: Path, warm: Path) -> list[str]:
    """An example built on the gmsh heat-sink mesh and its scikit-fem cases, at a reduced size."""
    pytest.importorskip("gmsh", reason="the example's mesher (pip install gmsh, or meshshard[examples])")
    pytest.importorskip("skfem", reason="the example's solver (pip install scikit-fem, or meshshard[examples])")
    sizes = {"--size": "0.2", "--samples": "4", "--steps": "2", "--val-every": "1"}
    return run_example(example, sizes, tmp_path, timeout=300, warm=warm)


@pytest.mark.slow
def test_bring_your_own_mesh_example_runs_as_its_readme_says(tmp_path: Path, warm_bin: Path) -> None:
    outputs = run_heat_sink_example("bring_your_own_mesh", tmp_path, warm_bin)
    assert len(outputs) == 9
    pred = tmp_path / "byo" / "pred"
    metrics = json.loads((pred / "metrics.json").read_text())
    [sample] = metrics["samples"]  # 4 cases, a quarter held out for validation
    assert sample["split"] == "val" and sample["fields"]["T"]["rmse"] > 0
    assert (pred / sample["file"]).is_file() and (pred / sample["picture"]).is_file()
    assert "T_pred" in meshio.read(pred / sample["file"]).point_data
    assert "T rel L2" in outputs[5]
    # new cases, inputs only: predictions without truth
    assert "T" not in meshio.read(tmp_path / "byo" / "new-fields" / "case-000.vtu").point_data
    assert "targets  none: inputs only" in outputs[7], outputs[7]
    new = json.loads((tmp_path / "byo" / "new-pred" / "metrics.json").read_text())
    assert new["targets_known"] is False and len(new["samples"]) == 4
    for sample in new["samples"]:
        point_data = meshio.read(tmp_path / "byo" / "new-pred" / sample["file"]).point_data
        assert "T_pred" in point_data and "T" not in point_data and "T_error" not in point_data
        assert sample["fields"]["T"] == {"rmse": None, "rel_l2": None} and sample["picture"]
    assert "has no targets: predictions only" in outputs[8], outputs[8]
    assert "  [1/4] case-000: " in outputs[8] and "  [4/4] case-003: " in outputs[8]  # a line per sample
    assert "rel L2" not in outputs[8]  # no table of errors without truth


@pytest.mark.slow
def test_own_model_example_runs_as_its_readme_says(tmp_path: Path, warm_bin: Path) -> None:
    outputs = run_heat_sink_example("own_model", tmp_path, warm_bin)
    assert len(outputs) == 6
    assert f"model: AttentionGNN from {REPO / 'examples' / 'own_model' / 'model.py'}:build" in outputs[4], outputs[4]
    pred = tmp_path / "own" / "pred"
    [sample] = json.loads((pred / "metrics.json").read_text())["samples"]
    point_data = meshio.read(pred / sample["file"]).point_data
    assert {"T_pred", "T", "T_error", "k"} <= set(point_data)
    assert abs(point_data["T_pred"]).max() > 0
