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


def test_train_memory_bench_reports_every_rank(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    side = 8
    subprocess.run([sys.executable, str(BENCH / "train_memory.py"), "--side", str(side), "--samples", "3",
                    "--ranks", "1,2", "--steps", "1", "--cache", str(tmp_path), "--json", str(result)],
                   check=True, capture_output=True, timeout=300)
    rows = json.loads(result.read_text())["rows"]
    assert [r["ranks"] for r in rows] == [1, 2]
    edges = 2 * (3 * side * side * (side - 1) + 3 * side * (side - 1) ** 2 + (side - 1) ** 3)
    for r in rows:
        p = r["ranks"]
        assert r["num_nodes"] == side**3 and sum(r["owned"]) == side**3
        assert sum(r["local_edges"]) == edges  # each directed edge on the rank that owns its destination
        assert (max(r["ghost"]) > 0) == (p > 1)
        assert len(r["peak_rss_mb"]) == len(r["idle_rss_mb"]) == len(r["bytes_per_local_node"]) == p
        assert all(peak > idle > 0 for peak, idle in zip(r["peak_rss_mb"], r["idle_rss_mb"]))
        assert r["max_peak_mb"] == max(r["peak_rss_mb"])
