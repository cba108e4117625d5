"""Benchmark of ``meshshard predict --rollout``: throughput, peak memory per rank, the share of a step
spent writing the series, and whether memory stays flat over 100 steps.

Data (generated, cached under ``--cache``): a jittered 2-D triangle grid of ``side^2`` nodes
(default side 1000: 1,000,000 nodes, 2.0 M triangles) carrying one trajectory of a synthetic
state (``u``, a decaying travelling wave, a formula: this measures speed, not accuracy), a static
input ``c`` and a node class (1 on the walls ``x = 0`` and ``x = 1``, held; 0 inside), stored
with ``--steps + 1`` states so every step of the rollout has its truth. A second dataset of the
same fields on a ``--flat-side^2`` grid holds two trajectories of ``--flat-steps + 1`` states:
the run is trained on it (``meshshard train``, ``--train-steps`` steps on one process, MeshGraphNet
``--latent``, ``--mp-steps``; the weights do not matter for speed), and its validation trajectory
is rolled out ``--flat-steps`` steps for the memory-over-time check.

What it runs and reports (each figure from ``PRED/metrics.json``, the rollout's ``timing``
record; see docs/transient.md):

- for each rank count R of ``--ranks`` (default 1, 2, 4): ``meshshard predict RUN --data BIG
  --rollout --rollout-steps S --samples all`` (R > 1: ``--nproc R --partition PARTS-R``; the files as the
  command writes them by default: one gathered ``.vtu`` per step on one process, one piece per
  rank and a ``.pvtu`` on R ranks of a mesh over 200,000 nodes). Throughput: steps per second and
  node-steps per second over the whole rollout loop of the slowest rank (reading the truth,
  computing, writing; start-up, partition loading and the model's graph set-up excluded), and
  without writing (read + compute). Peak RSS per rank (``ru_maxrss``, MiB, as
  bench/train_memory.py and bench/predict.py: the whole command's peak). Writing share: seconds in
  writing the series over the loop's seconds, per rank (the largest shown).
- each rollout on the large grid with the writer of before issue 37 and of after it (``--writers``,
  :data:`WRITERS`): before, every step's files written at once with zlib; after, ``predict``'s default,
  a background thread writing step k while step k+1 computes, with its default compression. Each is
  run ``--repeat`` times (default 3, interleaved) and the run of median loop time is shown; the JSON
  also has every run's loop seconds, and the load average (the machine may be shared).
- one step's gathered ``.vtu`` of the large grid written with each ``--compression`` and with
  meshio's writer (before issue 37): median seconds of ``--repeat`` writes, and the file's size
  (``--no-file-costs`` leaves it out).
- the flatness check: ``--flat-steps`` (default 100) steps of the validation trajectory on
  ``--flat-ranks`` ranks (default 2) of the ``--flat-side`` mesh: each rank's peak RSS and current RSS after step 10 and after the
  last step, and their ratios (1.00: flat).

    python bench/rollout.py [--side 1000] [--steps 10] [--ranks 1,2,4] [--flat-side 300]
                            [--flat-steps 100] [--flat-ranks 2] [--latent 8] [--mp-steps 2]
                            [--writers before,after] [--repeat 3] [--cache DIR] [--json FILE]
    python bench/rollout.py --side 1000 --flat-side 1000     # the 100-step check on the 1M mesh too

Prints a table, then one JSON object. The rollouts' output folders are deleted after they are
read (1M nodes: over 100 MB per step). Run it under ``flock /tmp/meshshard-heavy.lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from _meshes import make_square_mesh
from _runner import emit, ensure_partition

from meshshard.cli import command_argv


def wave_states(points: np.ndarray, speed: float, times: np.ndarray):
    """The state ``u`` at each time: a wave travelling in x at ``speed``, decaying, ``(N, 1)`` each."""
    x, y = points[:, 0], points[:, 1]
    shape = np.cos(np.pi * y)
    for t in times:
        yield (np.sin(2 * np.pi * (x - speed * t)) * shape * np.exp(-0.5 * t))[:, None]


def ensure_wave_dataset(cache: Path, side: int, states: int, speeds: tuple[float, ...]) -> tuple[Path, float]:
    """The trajectory dataset of ``len(speeds)`` waves on the ``side^2`` grid, ``states`` steps each (the
    last trajectory for validation when there are two or more); built when missing. Returns it and the
    seconds spent."""
    from meshshard.data import Trajectory, write_trajectories

    out = cache / f"rollout-wave-{side}-{states}-{len(speeds)}"
    if (out / "dataset.json").is_file():
        return out, 0.0
    start = time.perf_counter()
    points, triangles = make_square_mesh(side)
    classes = ((points[:, 0] == 0.0) | (points[:, 0] == 1.0)).astype(np.int64)
    times = 0.02 * np.arange(states)
    names = [f"wave-{k}" for k in range(len(speeds))]
    write_trajectories(out, (Trajectory(name, points, [("triangle", triangles)], times, wave_states(points, c, times),
                                        np.full((len(points), 1), c), classes)
                             for name, c in zip(names, speeds, strict=True)),
                       names, state_fields=[{"name": "u", "components": 1}], input_fields=[{"name": "c", "components": 1}],
                       node_type_source="bench/rollout.py: the walls x = 0 and x = 1",
                       val_samples=names[-1:] if len(names) > 1 else None, val_fraction=None if len(names) > 1 else 0.0,
                       force=True)
    return out, time.perf_counter() - start


#: How each writer is asked for: "before" writes every step's files at once, compressed with zlib (what
#: predict did before issue 37); "after" is predict's default (a background thread, its default compression).
WRITERS = {"before": ["--no-background", "--compression", "zlib"], "after": []}


def roll(run: Path, data: Path, cache: Path, ranks: int, steps: int, work: Path, samples: str,
         writer: str = "after") -> dict[str, Any]:
    """``meshshard predict --rollout`` of one trajectory of ``data`` (``samples``: ``all`` of a dataset
    of one, or ``val``) on ``ranks`` ranks, its files written as ``writer`` says (:data:`WRITERS`);
    its figures from ``metrics.json``."""
    out = work / f"pred-{data.name}-{ranks}"
    cmd = [*command_argv(), "predict", str(run), "--data", str(data), "--out", str(out), "--rollout", "--rollout-steps", str(steps),
           "--samples", samples, "--no-plots", "--force", "--quiet", *WRITERS[writer]]
    partition_s = 0.0
    if ranks > 1:
        parts = cache / f"{data.name}-parts-{ranks}"
        partition_s = ensure_partition(data, parts, ranks)
        cmd += ["--nproc", str(ranks), "--partition", str(parts)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    command_s = time.perf_counter() - start
    metrics = json.loads((out / "metrics.json").read_text())
    (record,) = metrics["samples"]
    pieces = (out / record["folder"] / "step-00000.pvtu").is_file()
    shutil.rmtree(out, ignore_errors=True)
    timing = record["timing"]
    loop = max(timing["total_s"])  # the slowest rank's loop: the others wait for it at every step
    busy = max(r + c for r, c in zip(timing["read_s"], timing["compute_s"], strict=True))
    nodes = record["num_nodes"]
    return {
        "ranks": ranks, "writer": writer, "compression": metrics["compression"],
        "background": metrics["background_writing"], "num_nodes": nodes, "steps": steps,
        "files": "pieces + .pvtu" if pieces else "gathered .vtu",
        "steps_per_s": round(steps / loop, 4), "node_steps_per_s": round(nodes * steps / loop),
        "steps_per_s_without_writing": round(steps / busy, 4),
        "write_share": [round(w / t, 3) for w, t in zip(timing["write_s"], timing["total_s"], strict=True)],
        "loop_s": round(loop, 2), "read_s": timing["read_s"], "compute_s": timing["compute_s"],
        "write_s": timing["write_s"], "peak_rss_mb": metrics["peak_rss_mb"], "memory": timing["memory"],
        "command_s": round(command_s, 1), "partition_s": round(partition_s, 1),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median loop time of ``runs`` (the same rollout repeated; the machine is shared), with
    every run's loop seconds and largest writing share beside it."""
    ordered = sorted(runs, key=lambda r: r["loop_s"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["repeats"] = len(runs)
    row["loop_s_runs"] = [r["loop_s"] for r in runs]
    row["write_share_max_runs"] = [max(r["write_share"]) for r in runs]
    return row


def file_costs(cache: Path, side: int, repeat: int) -> list[dict[str, Any]]:
    """One step's ``.vtu`` of the ``side^2`` grid (the fields a rollout writes: ``u_pred``, ``u``,
    ``u_error``, ``c``, ``global_id``) written with each compression of ``predict --compression``
    and with meshio's own writer (zlib at its default level: what predict wrote before issue 37):
    the median seconds of ``repeat`` writes, on one thread, and the file's size."""
    import warnings

    import meshio

    from meshshard.run import COMPRESSIONS
    from meshshard.run._vtk import write_vtu

    points, triangles = make_square_mesh(side)
    u = next(wave_states(points, 1.0, np.array([0.1])))[:, 0]
    fields = {"u_pred": u + 1e-3 * points[:, 0], "u": u, "u_error": 1e-3 * points[:, 0], "c": np.ones(len(u)),
              "global_id": np.arange(len(u), dtype=np.int64)}
    cells = [("triangle", triangles)]

    def old(path: Path) -> None:
        grid = meshio.Mesh(np.column_stack([points, np.zeros(len(points))]), cells, point_data=fields)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meshio.write(path, grid, file_format="vtu", binary=True)

    writers = [("meshio zlib (before)", old)] + [(c, lambda path, c=c: write_vtu(path, points, cells, fields, c))
                                                  for c in COMPRESSIONS]
    rows = []
    for name, write in writers:
        path = cache / "file-cost.vtu"
        seconds = []
        for _ in range(repeat):
            start = time.perf_counter()
            write(path)
            seconds.append(time.perf_counter() - start)
        size = path.stat().st_size
        rows.append({"writer": name, "seconds": round(sorted(seconds)[(repeat - 1) // 2], 6),
                     "seconds_runs": [round(v, 6) for v in seconds], "bytes": size, "megabytes": round(size / 1e6, 1)})
        path.unlink()
    return rows


def flatness(row: dict[str, Any], early: int = 10) -> dict[str, Any]:
    """Each rank's peak and current RSS after step ``early`` and after the last step, and their ratios
    (``memory``: every step the rollout recorded, 0, 1, 10, 100, ... and the last)."""
    at = {m["step"]: m for m in row["memory"]}
    first, last = at[early], at[row["steps"]]
    def ratio(key: str) -> list[float | None]:
        return [round(b / a, 3) if a and b else None for a, b in zip(first[key], last[key], strict=True)]
    return {"ranks": row["ranks"], "num_nodes": row["num_nodes"], "steps": row["steps"], "early_step": early,
            "peak_rss_mb_early": first["peak_rss_mb"], "peak_rss_mb_last": last["peak_rss_mb"],
            "peak_ratio": ratio("peak_rss_mb"), "rss_mb_early": first["rss_mb"], "rss_mb_last": last["rss_mb"],
            "rss_ratio": ratio("rss_mb"), "steps_per_s": row["steps_per_s"], "write_share": row["write_share"],
            "memory": row["memory"]}


def print_tables(rows: list[dict[str, Any]], flat: dict[str, Any] | None, title: str,
                 files: list[dict[str, Any]] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    if files:
        table = Table(title=f"one step's gathered .vtu of the {rows[0]['num_nodes']:,}-node mesh, one thread")
        for col in ["writer", "seconds (median)", "MB"]:
            table.add_column(col, justify="right")
        for f in files:
            table.add_row(f["writer"], f"{f['seconds']:.2f}", f"{f['megabytes']:,.1f}")
        console.print(table)
    table = Table(title=title)
    for col in ["ranks", "writer", "files", "steps/s", "node-steps/s", "steps/s without writing", "writing share (max rank)",
                "peak RSS MB per rank", "peak RSS MB max", "loop s", "command s"]:
        table.add_column(col, justify="right")
    for r in rows:
        writer = f"{r['writer']}: {r['compression']}, {'background' if r['background'] else 'at once'}"
        table.add_row(str(r["ranks"]), writer, r["files"], f"{r['steps_per_s']:.3f}", f"{r['node_steps_per_s']:,}",
                      f"{r['steps_per_s_without_writing']:.3f}", f"{max(r['write_share']):.0%}",
                      ", ".join(f"{v:,.0f}" for v in r["peak_rss_mb"]), f"{max(r['peak_rss_mb']):,.0f}",
                      f"{r['loop_s']:.1f}", f"{r['command_s']:.1f}")
    console.print(table)
    if flat is None:
        return
    table = Table(title=f"memory over {flat['steps']} steps: {flat['num_nodes']:,} nodes, {flat['ranks']} rank(s)")
    for col in ["rank", f"peak RSS MB after step {flat['early_step']}", f"after step {flat['steps']}", "ratio",
                f"RSS MB now after step {flat['early_step']}", f"after step {flat['steps']} ", "ratio "]:
        table.add_column(col, justify="right")
    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"
    for k in range(flat["ranks"]):
        table.add_row(str(k), mb(flat["peak_rss_mb_early"][k]), mb(flat["peak_rss_mb_last"][k]),
                      "-" if flat["peak_ratio"][k] is None else f"{flat['peak_ratio'][k]:.3f}",
                      mb(flat["rss_mb_early"][k]), mb(flat["rss_mb_last"][k]),
                      "-" if flat["rss_ratio"][k] is None else f"{flat['rss_ratio'][k]:.3f}")
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=1000, help="the large grid's side: side^2 nodes")
    parser.add_argument("--steps", type=int, default=10, help="rollout steps on the large grid")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts for the large grid")
    parser.add_argument("--flat-side", type=int, default=300, help="the grid of the memory-over-time check (0: none)")
    parser.add_argument("--flat-steps", type=int, default=100, help="rollout steps of the memory-over-time check")
    parser.add_argument("--flat-ranks", type=int, default=2)
    parser.add_argument("--latent", type=int, default=8)
    parser.add_argument("--mp-steps", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=1)
    parser.add_argument("--writers", default="before,after",
                        help="before (each step's files written at once, zlib), after (predict's default: a background "
                        "thread, its default compression), or both, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each rollout on the large grid; the median shown")
    parser.add_argument("--no-file-costs", action="store_true",
                        help="leave out the seconds and size of one step's file with each compression")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/meshshard-bench"),
                        help="folder for the datasets, partitions and the run (reused)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON result to this file")
    args = parser.parse_args()
    try:
        ranks = sorted({int(r) for r in args.ranks.split(",")})
    except ValueError:
        parser.error(f"Expected --ranks as comma-separated numbers such as 1,2,4 (got {args.ranks!r})")
    flat_side = args.flat_side or min(args.side, 300)  # the run is trained on this grid even without the check
    writers = args.writers.split(",")
    if not writers or any(w not in WRITERS for w in writers):
        parser.error(f"Expected --writers before, after or before,after (got {args.writers!r})")
    if (args.side < 2 or flat_side < 2 or args.steps < 1 or args.flat_steps < 10 or args.flat_ranks < 1
            or args.train_steps < 1 or min(ranks) < 1 or args.repeat < 1):
        parser.error("Expected --side and --flat-side >= 2, --steps >= 1, --flat-steps >= 10 and positive "
                     "--ranks, --flat-ranks, --train-steps and --repeat")

    args.cache.mkdir(parents=True, exist_ok=True)
    big, big_s = ensure_wave_dataset(args.cache, args.side, args.steps + 1, (1.0,))
    small, small_s = ensure_wave_dataset(args.cache, flat_side, args.flat_steps + 1, (0.5, 1.0))
    work = args.cache / f"rollout-{args.side}-{flat_side}"
    run = work / "run"
    start = time.perf_counter()
    ensure_partition(small, args.cache / f"{small.name}-parts-1", 1)
    subprocess.run([*command_argv(), "train", str(args.cache / f"{small.name}-parts-1"), "--data", str(small), "--out", str(run),
                    "--steps", str(args.train_steps), "--latent", str(args.latent), "--mp-steps", str(args.mp_steps),
                    "--force", "--quiet"], check=True)
    train_s = time.perf_counter() - start
    rows = []
    for r in ranks:  # the repeats of before and after interleaved, so a change in the machine's load falls on both
        runs: dict[str, list[dict[str, Any]]] = {w: [] for w in writers}
        for _ in range(args.repeat):
            for w in writers:
                runs[w].append(roll(run, big, args.cache, r, args.steps, work, "all", w))
        rows += [median_of(runs[w]) for w in writers]
    flat = (flatness(roll(run, small, args.cache, args.flat_ranks, args.flat_steps, work, "val"))
            if args.flat_side else None)
    title = (f"meshshard predict --rollout: {rows[0]['num_nodes']:,}-node triangle mesh, {args.steps} steps, "
             f"MeshGraphNet latent {args.latent}, {args.mp_steps} message-passing steps, float32, "
             f"{os.cpu_count()} CPU cores")
    files = None if args.no_file_costs else file_costs(work, args.side, args.repeat)
    print_tables(rows, flat, title + f"; median of {args.repeat} run(s), load average {os.getloadavg()[0]:.1f}", files)
    result = {"benchmark": "rollout", "side": args.side, "steps": args.steps, "latent": args.latent,
              "mp_steps": args.mp_steps, "train_steps": args.train_steps, "cpu_count": os.cpu_count(),
              "load_average": [round(v, 2) for v in os.getloadavg()], "repeat": args.repeat,
              "datasets_built_s": round(big_s + small_s, 1), "train_s": round(train_s, 1), "rows": rows,
              "flat": flat, "files": files}
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
