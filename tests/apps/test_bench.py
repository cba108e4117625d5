"""Smoke runs of the benchmark scripts at toy sizes: they run and their figures add up.

The figures themselves (time, memory) are never asserted on: benchmarks print them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._warm import warm_command

BENCH = Path(__file__).resolve().parents[2] / "bench"


def warm_env() -> dict[str, str]:
    """The environment of a bench script whose ``meshshard`` commands run warm (``meshshard.cli.command_argv``): what a command measures of itself is measured inside it either way."""
    return os.environ | {"MESHSHARD_COMMAND": warm_command()[0]}


def test_partition_bench_reports_every_step(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    subprocess.run([sys.executable, str(BENCH / "partition.py"), "--side", "6", "--parts", "4",
                    "--no-wave", "--no-load", "--cache", str(tmp_path), "--json", str(result)],
                   check=True, capture_output=True, timeout=300)
    (case,) = json.loads(result.read_text())["results"]
    assert case["nodes"] == 6**3 and case["parts"] == 4
    # a 6^3 Kuhn lattice: 3 axis, 3 face-diagonal and 1 body-diagonal edge per cube direction
    assert case["directed_edges"] == 2 * (3 * 6 * 6 * 5 + 3 * 6 * 5 * 5 + 5**3)
    steps = ("read", "graph", "metis", "plans", "write")
    for step in steps:
        assert case["seconds"][step] > 0  # timed: every step does some work
        assert case["peak_mb"][step] > 0
    # the steps run one after another inside the pipeline, so their times add up to at most its total
    assert sum(case["seconds"][step] for step in steps) <= case["seconds"]["total"], case["seconds"]
    assert case["peak_mb_max"] == max(case["peak_mb"].values())
    assert case["bare_metis_peak_mb"] > 0


@pytest.mark.slow
def test_train_memory_bench_reports_every_rank(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    side = 8
    subprocess.run([sys.executable, str(BENCH / "train_memory.py"), "--side", str(side), "--samples", "3",
                    "--ranks", "1,2", "--steps", "1", "--cache", str(tmp_path), "--json", str(result)],
                   check=True, capture_output=True, timeout=300, env=warm_env())
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


@pytest.mark.slow
def test_peers_bench_reports_each_run_and_its_ratios(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH / "meshgraphnet_peers.py"), "--side", "6", "--latent", "8",
                           "--mp-steps", "2", "--rounds", "1", "--iters", "1", "--only", "meshshard,meshshard-2ranks,meshshard-bf16",
                           "--json", str(result)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(result.read_text())
    assert out["device"] == "cpu" and out["nodes"] == 6**3
    rows = out["results"]
    assert all(rows[impl]["status"] == "ok" for impl in ("meshshard", "meshshard-2ranks", "meshshard-bf16")), rows
    assert rows["meshshard"]["parameters"] == rows["meshshard-2ranks"]["parameters"] > 0
    assert out["ratios"]["memory per rank, 2 ranks / meshshard 1 process"] == round(
        rows["meshshard-2ranks"]["peak_rss_mb"] / rows["meshshard"]["peak_rss_mb"], 3)
    errors = rows["meshshard-bf16"]["error_vs_fp32"]
    assert 0 < errors["output"] < 0.5 and 0 < errors["gradients"] < 1
    assert "peak GPU MB" not in done.stdout  # the GPU column only with --device cuda


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run bash bench/gpu.sh itself")
def test_gpu_checks_say_when_there_is_no_gpu(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(BENCH / "gpu.sh"), str(tmp_path / "w")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2
    assert done.stderr.strip() == "bench/gpu.sh: torch sees no CUDA device here; these checks need one"


@pytest.mark.slow
def test_pyg_multihop_bench_reports_halo_rows_and_what_they_cost(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    features = 3
    done = subprocess.run([sys.executable, str(BENCH / "pyg_multihop.py"), "--side", "5", "--ranks", "2",
                           "--features", str(features), "--repeats", "1", "--json", str(result)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(result.read_text())["results"]
    assert [(r["layer"], r["mechanism"]) for r in rows] == [
        ("GCNConv", "adapter gcn"), ("GCNConv", "multihop, hops=1"),
        ("ChebConv(K=3)", "adapter khop"), ("ChebConv(K=3)", "multihop, hops=3")]
    gcn, gcn_multihop, cheb, cheb_multihop = rows
    for adapter, multihop in ((gcn, gcn_multihop), (cheb, cheb_multihop)):
        assert all(m > a > 0 for a, m in zip(adapter["halo_rows_per_rank"], multihop["halo_rows_per_rank"]))
        assert multihop["exchanges"] == 2 and multihop["max_diff_vs_adapter"] < 1e-4
    assert all(c > g for c, g in zip(cheb_multihop["halo_rows_per_rank"], gcn_multihop["halo_rows_per_rank"]))
    # one exchange of every halo row each way: the numbers sent add up to the rows received, twice
    for r in (gcn, gcn_multihop, cheb_multihop):
        assert sum(r["numbers_sent_per_rank"]) == 2 * features * sum(r["halo_rows_per_rank"]), r


@pytest.mark.slow
def test_rollout_bench_reports_throughput_memory_writing_and_flatness(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    side, steps, flat_side, flat_steps = 12, 2, 8, 12
    done = subprocess.run([sys.executable, str(BENCH / "rollout.py"), "--side", str(side), "--steps", str(steps),
                           "--ranks", "1,2", "--flat-side", str(flat_side), "--flat-steps", str(flat_steps),
                           "--flat-ranks", "2", "--latent", "4", "--mp-steps", "1", "--cache", str(tmp_path),
                           "--repeat", "1", "--json", str(result)], capture_output=True, text=True, timeout=600,
                          env=warm_env())
    assert done.returncode == 0, done.stderr
    out = json.loads(result.read_text())
    assert [(r["ranks"], r["writer"]) for r in out["rows"]] == [(1, "before"), (1, "after"), (2, "before"), (2, "after")]
    assert [(r["compression"], r["background"]) for r in out["rows"][:2]] == [("zlib", False), ("none", True)]
    assert [f["writer"] for f in out["files"]] == ["meshio zlib (before)", "none", "lz4", "zlib"]
    assert all(f["seconds"] > 0 and f["bytes"] > 0 for f in out["files"]), out["files"]  # a toy file: < 0.1 MB
    sizes = {f["writer"]: f["bytes"] for f in out["files"]}
    assert sizes["zlib"] < sizes["none"] and sizes["lz4"] < sizes["none"]  # compressed: smaller
    for r in out["rows"]:
        p = r["ranks"]
        assert r["num_nodes"] == side**2 and r["steps"] == steps and r["files"] == "gathered .vtu"
        assert abs(r["node_steps_per_s"] - r["num_nodes"] * r["steps_per_s"]) <= r["num_nodes"] * 1e-4 + 1
        assert r["steps_per_s_without_writing"] > r["steps_per_s"] > 0  # writing takes some of the loop
        assert len(r["peak_rss_mb"]) == len(r["write_share"]) == len(r["write_s"]) == p
        assert all(0 < share < 1 for share in r["write_share"]) and all(m > 0 for m in r["peak_rss_mb"])
        for k in range(p):  # the rollout's parts, timed one after another, within its loop
            assert r["read_s"][k] + r["compute_s"][k] + r["write_s"][k] <= r["loop_s"] + 0.01
        assert [m["step"] for m in r["memory"]] == [0, 1, steps]
    flat = out["flat"]
    assert flat["ranks"] == 2 and flat["num_nodes"] == flat_side**2 and flat["steps"] == flat_steps
    for k in range(2):
        assert flat["peak_rss_mb_last"][k] >= flat["peak_rss_mb_early"][k] > 0  # a peak never falls
        assert flat["peak_ratio"][k] == round(flat["peak_rss_mb_last"][k] / flat["peak_rss_mb_early"][k], 3)
    assert "memory over 12 steps" in done.stdout


@pytest.mark.slow
def test_pointcloud_bench_reports_both_models_on_each_rank_count(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH / "pointcloud.py"), "--points", "3000", "--ranks", "1,2",
                           "--width", "8", "--blocks", "1", "--heads", "2", "--neighbors", "4", "--slices", "4",
                           "--attention", "chunked,dense", "--repeats", "1", "--json", str(result)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(result.read_text())
    rows = [r for r in out["rows"] if r.get("attention") != "dense"]
    assert [(r["model"], r["ranks"]) for r in rows] == [("ball-attention", 1), ("transolver", 1),
                                                        ("ball-attention", 2), ("transolver", 2)]
    dense = [r for r in out["rows"] if r.get("attention") == "dense"]
    assert [r["ranks"] for r in dense] == [1, 2] and all(r["step_s"] > 0 for r in dense)
    ratios = out["chunked_over_dense"]
    assert [q["ranks"] for q in ratios] == [1, 2] and all(q["peak_rss"] > 0 and q["step"] > 0 for q in ratios)
    for r in rows:
        assert sum(r["owned"]) == 3000 and len(r["peak_rss_mb"]) == r["ranks"]
        assert all(peak >= idle > 0 for peak, idle in zip(r["peak_rss_mb"], r["idle_rss_mb"]))
        assert r["points_per_s"] == pytest.approx(3000 / r["fwd_bwd_s"])
    one, two = rows[0], rows[2]
    assert one["halo_received"] == [0] and one["plan_build_s"] > 0
    # the plan sends every point a ball needs (the true geometric halo), and a bounded few more
    assert all(got >= true > 0 for got, true in zip(two["halo_received"], two["true_halo"])), two
    assert two["halo_over_true"] < 2
    assert "| ball-attention | 2 | chunked |" in done.stdout and "| ball-attention | 2 | dense |" in done.stdout


@pytest.mark.slow
def test_distributed_partition_bench_reports_every_process(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    subprocess.run([sys.executable, str(BENCH / "partition_distributed.py"), "--side", "6", "--parts", "3",
                    "--procs", "1", "2", "--json", str(result)], check=True, capture_output=True, timeout=300)
    report = json.loads(result.read_text())
    assert report["nodes"] == 6**3 and report["parts"] == 3
    runs = [(r["mode"], r["processes"], r["rank"]) for r in report["results"]]
    assert runs == [("metis", 1, 0), ("one", 1, 0), ("distributed", 1, 0), ("distributed", 2, 0),
                    ("distributed", 2, 1)]
    for r in report["results"]:
        assert r["peak_rss_mb"] >= r["rss_before_mb"] > 0 and r["numpy_peak_mb"] > 0
        assert r["vm_peak_mb"] >= r["peak_rss_mb"]  # the address space holds what is resident
        assert r["bytes_per_share_node"] == pytest.approx(r["bytes_per_node"] * r["processes"])
    metis, one, *distributed = report["runs"]
    assert metis["mode"] == "metis" and metis["cut_vs_metis"] == metis["imbalance_vs_metis"] == 1
    assert list(metis["stage_seconds"])[:3] == ["read", "graph", "metis"]
    for r in distributed:  # the geometric engine makes the one-process morton assignment
        assert (r["edge_cut"], r["imbalance"]) == (one["edge_cut"], one["imbalance"]) and r["edge_cut"] > 0
        assert r["cut_vs_metis"] == pytest.approx(r["edge_cut"] / metis["edge_cut"])
        assert list(r["stage_seconds"]) == ["read", "assign", "graph", "nodes", "shards", "metadata"]
    assert {r["directed_edges"] for r in report["runs"]} == {2 * (3 * 6 * 6 * 5 + 3 * 6 * 5 * 5 + 5**3)}


def test_capped_runs_say_how_they_ended(tmp_path: Path) -> None:
    """The --cap mode's runner: a command under the address-space cap that runs out of memory, and one
    killed by a signal, each reported as such (the demonstration itself is the next test)."""
    ends = {"out of memory": "bytearray(2 * 10**9)", "killed by SIGKILL": "import os; os.kill(os.getpid(), 9)",
            "ok": "print('fits')"}
    for outcome, code in ends.items():
        result = tmp_path / "r.json"
        subprocess.run([sys.executable, str(BENCH / "partition_distributed.py"), "--run-capped", "500000000",
                        str(result), "--", sys.executable, "-c", code], check=True, timeout=120)
        found = json.loads(result.read_text())
        assert found["outcome"] == outcome, found
        assert found["largest_peak_rss_mb"] > 0
    assert found["exit"] == 0 and found["message"] == "fits"


@pytest.mark.slow  # a torchrun of 2 processes and three meshshard commands: about 30 s on 2 loaded cores
def test_distributed_partition_bench_cap_mode_runs_and_verifies(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH / "partition_distributed.py"), "--side", "6", "--parts", "3",
                           "--cap", "4000000000", "--cap-procs", "2", "--json", str(result)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(result.read_text())
    assert report["cap_bytes"] == 4_000_000_000 and report["nodes"] == 6**3
    # a cap far above both runs' needs at this size: both partition, and verify passes
    assert [(name, r["outcome"]) for name, r in report["runs"].items()] == [
        ("one process (METIS)", "ok"), ("2 processes", "ok")], report
    assert report["verify"]["exit"] == 0, report["verify"]
    assert "capped at 4,000,000,000 bytes" in done.stdout


def test_halo_and_collectives_benches_print_before_and_after(tmp_path: Path) -> None:
    """bench/halo.py and bench/collectives.py (issue 37) at toy sizes: BEFORE and AFTER in one run,
    one exchange each way per with_halo(); the mesh and partition it wrote are gone when it ends."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(BENCH / "halo.py"), "--side", "6", "--ranks", "2", "--features", "4",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300, cwd=BENCH,
                          env=os.environ | {"TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr
    assert not [f.name for f in scratch.iterdir() if f.name.startswith("meshshard-bench-")]
    r = json.loads(done.stdout.splitlines()[0])
    assert r["collectives_fwd_bwd"] == [1, 1] and r["ghosts_rank0"] > 0, r
    for key in ("ratio_before", "ratio", "ratio_room", "consumer_ratio", "consumer_ratio_plain", "layer_halo_ratio_before",
                "layer_halo_ratio"):
        assert isinstance(r[key], float), (key, r)
    assert "BEFORE" in done.stdout and "AFTER" in done.stdout, done.stdout
    from meshshard.comm import free_port

    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), str(BENCH / "collectives.py"), "--rows", "50", "--features", "4",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.splitlines()[0])
    assert r["rows_per_peer"] == 50 and r["world_size"] == 2, r
    assert r["before_fwd_bwd_ms"] > 0 and r["after_fwd_bwd_ms"] > 0 and r["bare_2x_all_to_all_single_ms"] > 0, r
    assert r["local_passes_ms"] > 0 and r["floor_ratio"] > 1, r


def test_edge_mlp_bench_times_both_paths_and_checks_the_fused_one(tmp_path: Path) -> None:
    """On the CPU the fused kernel is not timed, and the output says why; with ``triton``
    installed, its interpreter stands in for the GPU so that the fused rows and their check against
    float64 are exercised too (their times are the interpreter's, meaningless)."""
    import importlib.util

    cases = {"plain": {}}
    if importlib.util.find_spec("triton") is not None:
        cases["interpreted"] = {"TRITON_INTERPRET": "1"}
    for name, extra in cases.items():
        result = tmp_path / f"{name}.json"
        subprocess.run([sys.executable, str(BENCH / "edge_mlp.py"), "--nodes", "40", "--degree", "3", "--latent", "16",
                        "--iters", "1", "--json", str(result)], check=True, capture_output=True, timeout=300,
                       env=os.environ | extra)
        out = json.loads(result.read_text())
        row = out["widths"]["16"]
        assert out["edges"] == 120
        unfused = {"unfused, recompute, fwd", "unfused, recompute, fwd+bwd", "unfused, saved, fwd+bwd"}
        if name == "plain":
            assert out["fused"] == "no CUDA device" and set(row["ms"]) == unfused
            continue
        assert out["fused"] == "ok" and set(row["ms"]) == unfused | {k.replace("unfused", "fused") for k in unfused}
        assert set(row["fused / unfused"]) == {"recompute, fwd", "recompute, fwd+bwd", "saved, fwd+bwd"}
        assert 0 < row["error vs float64"]["fused"] < 1e-5 and 0 < row["error vs float64"]["unfused"] < 1e-5


def test_mapping_bench_maps_alike_both_ways_and_builds_each_source_once(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(BENCH / "mapping.py"), "--sources", "3", "--targets", "2", "--nodes",
                           "400", "--json", str(result)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(result.read_text())
    assert (out["maps"], out["identical"]) == (6, True)
    assert out["built_cached"] == 2 * 3  # a triangulation and a k-d tree (nodes outside a hull) per source
    assert out["afresh_s"] > 0 and out["cached_s"] > 0
    assert out["speedup"] == pytest.approx(out["afresh_s"] / out["cached_s"], rel=0.05)  # of the times before rounding
    assert "| 6 (3 x 2) | 400 |" in done.stdout
