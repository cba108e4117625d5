"""The porting_pyg example runs, and its sharded training equals one process (its --check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._meshes import data_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sfepy/big.mesh", "sfepy/cube_cylinder.mesh"])  # 2-D triangles, 3-D tets
def test_porting_pyg_example_trains_on_shards_like_one_process(tmp_path: Path, name: str) -> None:
    pytest.importorskip("torch_geometric")
    mesh = data_file(name)
    parts = tmp_path / "parts"
    subprocess.run([sys.executable, "-m", "meshshard", "partition", str(mesh), "--parts", "2", "--out", str(parts)], check=True, capture_output=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/porting_pyg/train.py"), str(parts), "--nproc", "2", "--steps", "3", "--check", str(mesh)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sharded on 2 ranks" in done.stdout and "largest relative difference" in done.stdout, done.stdout
