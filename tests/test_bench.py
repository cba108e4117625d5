"""Smoke runs of the benchmark scripts at toy sizes: they run and their figures add up.

The figures themselves (time, memory) are never asserted on: benchmarks print them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_partition_bench_reports_every_step(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    subprocess.run([sys.executable, str(BENCH / "partition.py"), "--side", "6", "--parts", "4",
                    "--no-wave", "--no-load", "--cache", str(tmp_path), "--json", str(result)],
                   check=True, capture_output=True, timeout=300)
    (case,) = json.loads(result.read_text())["results"]
    assert case["nodes"] == 6**3 and case["parts"] == 4
    # a 6^3 Kuhn lattice: 3 axis, 3 face-diagonal and 1 body-diagonal edge per cube direction
    assert case["directed_edges"] == 2 * (3 * 6 * 6 * 5 + 3 * 6 * 5 * 5 + 5**3)
    for step in ("read", "graph", "metis", "plans", "write"):
        assert case["seconds"][step] >= 0
        assert case["peak_mb"][step] > 0
    assert case["peak_mb_max"] == max(case["peak_mb"].values())
    assert case["bare_metis_peak_mb"] > 0
