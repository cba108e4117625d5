"""The porting_pyg example runs, and its sharded training equals one process (its --check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._meshes import data_file

ROOT = Path(__file__).resolve().parents[1]


def test_porting_pyg_example_trains_on_shards_like_one_process(tmp_path: Path) -> None:
    pytest.importorskip("torch_geometric")
    mesh = data_file("sfepy/big.mesh")
    parts = tmp_path / "parts"
    subprocess.run([sys.executable, "-m", "meshshard", "partition", str(mesh), "--parts", "2", "--out", str(parts)], check=True, capture_output=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/porting_pyg/train.py"), str(parts), "--nproc", "2", "--steps", "3", "--check", str(mesh)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sharded on 2 ranks" in done.stdout and "largest relative difference" in done.stdout, done.stdout
