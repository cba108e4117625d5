"""``bench/partition_distributed.py --engines`` at a toy size: every engine's edge cut and imbalance against
one-process METIS on the same graph (PT-Scotch and KaMinPar where installed)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow  # a torchrun and an mpirun launch, each loading torch: about 15 s on 2 idle cores
@pytest.mark.timeout(400)
def test_engine_quality_is_reported_against_metis(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH / "partition_distributed.py"), "--engines", "--side", "6",
                           "--parts", "3", "--procs", "1", "--json", str(result)], capture_output=True, text=True,
                          timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(result.read_text())["engines"]
    engines = [r["engine"] for r in rows]
    expected = ["metis", "morton (one process)"]
    expected += ["kaminpar"] if importlib.util.find_spec("kaminpar") else []
    expected += ["geometric"]
    expected += ["ptscotch"] if shutil.which("mpirun") and importlib.util.find_spec("pyscotch") else []
    assert engines == expected
    assert rows[0]["cut_vs_metis"] == 1.0
    for r in rows:
        assert r["cut_vs_metis"] == pytest.approx(r["edge_cut"] / rows[0]["edge_cut"]) and r["load_imbalance"] >= 1.0
    geometric = next(r for r in rows if r["engine"] == "geometric")
    assert geometric["edge_cut"] == rows[1]["edge_cut"]  # the Morton cut, one process or P
    assert "vs METIS" in done.stdout
