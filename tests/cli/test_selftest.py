"""``meshshard selftest --model FILE.py:NAME``: the exactness check as a user runs it.

A table of every tensor's error and a one-line verdict; exit 0 for an exact model, 1 for one that
is wrong on shards (naming the worst tensor), 2 with one line on stderr for bad arguments, before
any rank starts. ``meshshard selftest`` without ``--model`` (the collectives) is tested in
``tests/comm/test_context.py``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from tests._warm import warm_command

pytest.importorskip("torch_geometric")

MODELS = Path(__file__).resolve().parents[1] / "meshshard" / "run" / "_exactness_models.py"


def _selftest(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*warm_command(), "selftest", *argv], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow  # starts 3 ranks and imports torch in 4 processes: 10 s or more on two cores
def test_an_exact_model_passes_with_a_table_and_a_verdict() -> None:
    proc = _selftest("--model", f"{MODELS}:exact", "--model-args", '{"hidden": 6}')
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"meshshard selftest: --model {MODELS}:exact on 3 local ranks and one process")
    assert re.match(r"tensor +shape +relative error", lines[1])
    assert re.match(r"output +\[210, 2\] +\d\.\de-\d\d$", lines[2])
    assert any(re.match(r"grad of mgn\.decoder\.\S+ +\[", line) for line in lines)
    assert lines[-1].startswith(f"meshshard selftest --model {MODELS}:exact: exact on 3 ranks")
    assert "> tolerance" not in proc.stdout and proc.stderr == ""


@pytest.mark.slow
def test_a_layer_declared_local_by_mistake_fails_naming_the_worst_tensor() -> None:
    proc = _selftest("--model", f"{MODELS}:DeclaredLocal", "--nproc", "2", "--dtype", "float32")
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^output +\[210, 2\] +\S+  > tolerance$", proc.stdout, re.M)
    verdict = proc.stdout.splitlines()[-1]
    assert re.match(r"meshshard selftest --model \S+:DeclaredLocal: NOT exact on 2 ranks .* float32: "
                    r"(output|grad of \S+) differs from one process by \S+ \(tolerance 1e-05", verdict), verdict


def _tiny_mesh(folder: Path) -> Path:
    path = folder / "tiny.vtu"
    meshio.write(path, meshio.Mesh(np.eye(4, 3), [("tetra", np.array([[0, 1, 2, 3]]))]))
    return path


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "model.py"], r"Expected --model FILE\.py:NAME or MODULE:NAME"),
    (["--model", "missing.py:build"], r"missing\.py: no such file"),
    (["--model", f"{MODELS}:nothing"], r"defines no 'nothing'"),
    (["--model", f"{MODELS}:exact", "--model-args", "{hidden: 6}"], r"Expected --model-args to be a JSON object"),
    (["--model", f"{MODELS}:exact", "--model-args", "[6]"], r"a JSON object of keyword arguments"),
    (["--model", f"{MODELS}:exact", "--nproc", "0"], r"Expected --nproc to be 1 or more \(got 0\)"),
    (["--model", f"{MODELS}:exact", "--node-out", "0"], r"Expected --node-out to be a positive integer"),
    (["--model", f"{MODELS}:exact", "--mesh", "TINY", "--nproc", "3"],
     r"--mesh \S+tiny\.vtu: 4 nodes and 12 edges, too small for 3 parts"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_any_rank_starts(argv, message, tmp_path, monkeypatch,
                                                                      capsys) -> None:
    import meshshard.comm

    def no_ranks(*args, **kw):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(meshshard.comm, "launch_local", no_ranks)
    argv = [str(_tiny_mesh(tmp_path)) if a == "TINY" else a for a in argv]
    assert main(["selftest", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert re.fullmatch(rf"meshshard selftest: error: .*{message}.*\n", out.err), out.err


def test_with_model_it_refuses_to_run_under_torchrun(monkeypatch, capsys) -> None:
    monkeypatch.setenv("RANK", "0")
    assert main(["selftest", "--model", f"{MODELS}:exact"]) == 2
    assert capsys.readouterr().err == ("meshshard selftest: error: --model starts its own --nproc local ranks: "
                                       "run it without torchrun or srun\n")
