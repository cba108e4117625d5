"""What the two OpenFOAM sweep examples (``cfd_sweep``, ``shape_sweep``) share: running OpenFOAM's
commands over the cases of a sweep, and running the meshshard commands on it and writing the table.

Step 1, the sweep (``sweep.py`` of each example):

- :func:`openfoam_env`: OpenFOAM's environment, from the shell or from sourcing its ``etc/bashrc``;
- :func:`substitute`: set a value in an OpenFOAM dictionary (a tutorial without it stops the script);
- :func:`fresh_folder`: the sweep folder, replaced only with ``--force`` and only if a sweep wrote it;
- :func:`run`: one OpenFOAM command in a case folder, its output in ``log.<name>``;
- :func:`settle`: how far ``p`` and ``U`` still moved between the last two written iterations;
- :func:`solve_all`: the job loop, ``--jobs`` cases at a time.

Step 2, the commands and the table (``run.py`` of each example):

- :func:`add_run_arguments`: the options both ``run.py`` take (the sweep, ``--tag``, ``--config``,
  ``--inputs``, ``--target-scale``, ``--nproc``, ``--force``); any other is meshshard train's;
- :func:`read_params`: ``params.csv``;
- :func:`command`: run ``meshshard WORDS`` as a user would, printed first, timed
  (``MESHSHARD_COMMAND``, when set, is the ``meshshard`` to start: ``meshshard.cli.command_argv``);
- :func:`dataset_to_run`: ``meshshard dataset``, ``partition`` and ``train`` on the sweep (or
  several trainings side by side, :func:`commands`, for ``predict --ensemble``);
- :func:`rel_l2`: ``||pred - true|| / ||true||``;
- :func:`write_results`: ``TAG/results.json`` with what train did (its steps, its recipe).

Both examples import it from the folder above them (``sys.path``), as a script beside them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import meshio
import numpy as np

from meshshard.cli import command_argv

BASHRC = Path("/usr/share/openfoam/etc/bashrc")


def openfoam_env(bashrc: Path) -> dict[str, str]:
    """The environment OpenFOAM's commands need: this one if it is set, else ``bashrc``'s."""
    if os.environ.get("WM_PROJECT_DIR"):
        return dict(os.environ)
    if not bashrc.is_file():
        sys.exit(f"sweep.py: OpenFOAM's environment is not set and {bashrc} is missing: "
                 "source OpenFOAM's etc/bashrc first, or pass --openfoam-bashrc")
    done = subprocess.run(["bash", "-c", f'source "{bashrc}" >/dev/null 2>&1; env -0'],
                          capture_output=True, check=True)
    env = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    if not env.get("WM_PROJECT_DIR"):
        sys.exit(f"sweep.py: sourcing {bashrc} did not set WM_PROJECT_DIR")
    return env


def substitute(path: Path, pattern: str, value: str, count: int = 0) -> None:
    """Replace ``pattern`` (a regex) in an OpenFOAM dictionary; a tutorial without it stops here."""
    text = path.read_text()
    new, n = re.subn(pattern, value, text, count=count, flags=re.M)
    if n == 0:
        sys.exit(f"sweep.py: {path}: found no {pattern!r} to set (another tutorial version?)")
    path.write_text(new)


def fresh_folder(out: Path, force: bool) -> None:
    """Make way for the sweep folder ``out``: refused if it exists, unless ``force`` and it is a
    sweep folder (its ``sweep.json``) or empty."""
    if out.exists():
        if not force or not (out / "sweep.json").is_file() and any(out.iterdir()):
            sys.exit(f"sweep.py: {out} exists (--force replaces a sweep folder this script wrote)")
        shutil.rmtree(out)


def run(command: list[str], case: Path, env: dict[str, str], log: str) -> None:
    """One OpenFOAM command in ``case``, its output in ``case/log.<log>``; its last lines if it fails."""
    with open(case / f"log.{log}", "w") as out:
        done = subprocess.run(command, cwd=case, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (case / f"log.{log}").read_text().splitlines()[-15:]
        raise RuntimeError(f"{case.name}: {' '.join(command)} failed ({done.returncode}):\n" + "\n".join(tail))


def written_times(case: Path) -> list[int]:
    """The iterations a case has written (its numbered folders but ``0``), ascending."""
    return sorted(int(d.name) for d in case.iterdir() if d.name.isdigit() and d.name != "0")


def settle(case: Path, times: list[int], internal: Path, env: dict[str, str]) -> dict[str, float] | None:
    """How far ``p`` and ``U`` moved between the last two written iterations (relative L2), from
    the one before written to the side (``VTK-before``, so ``VTK/`` stays foamToVTK's usual
    layout); None with one written iteration."""
    if len(times) < 2:
        return None
    run(["foamToVTK", "-time", str(times[-2]), "-name", "VTK-before", "-no-boundary"], case, env, "foamToVTK-before")
    [before] = (case / "VTK-before").glob(f"{case.name}_{times[-2]}/internal.vtu")
    last, prev = meshio.read(internal).point_data, meshio.read(before).point_data
    return {f: float(np.linalg.norm(last[f] - prev[f]) / np.linalg.norm(last[f])) for f in ("p", "U")}


def solve_all(jobs: Iterable[Any], one: Callable[[Any], dict], workers: int) -> list[dict]:
    """``one(job)`` for every job, ``workers`` at a time (OpenFOAM runs in processes of its own), in
    the jobs' order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def add_run_arguments(p: argparse.ArgumentParser, sweep_help: str, inputs_help: str, *, tag: str | None = "base",
                      recipe: Path | None = None, recipe_help: str = "") -> None:
    """The options of both ``run.py``: the sweep folder, ``--tag`` (default ``tag``), ``--config``
    (default ``recipe``, or None with what ``recipe_help`` says), ``--inputs``, ``--target-scale``,
    ``--nproc``, ``--force``."""
    p.add_argument("sweep", type=Path, help=sweep_help)
    p.add_argument("--tag", default=tag, help=f"this recipe's folder, SWEEP/TAG (default {tag})" if tag else
                   "this recipe's folder, SWEEP/TAG")
    p.add_argument("--config", type=Path, default=recipe,
                   help=f"meshshard train's recipe (default {recipe.name} beside this script)" if recipe else
                   f"meshshard train's recipe ({recipe_help})")
    p.add_argument("--inputs", default="pos[0],pos[1]", help=inputs_help)
    p.add_argument("--target-scale", default="p=speed**2,U=speed",
                   help="meshshard dataset --target-scale, or 'none' (default 'p=speed**2,U=speed')")
    p.add_argument("--nproc", type=int, default=2, help="ranks for train and predict, and parts (default 2)")
    p.add_argument("--force", action="store_true", help="make SWEEP/TAG over (its data, parts, run, predictions)")


def read_params(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(sample names, parameter names, values (cases, parameters)) of ``params.csv``."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], [r for r in rows[1:] if r]
    if header[0] != "sample":
        sys.exit(f"run.py: {path}: the first column must be 'sample' (got {header[0]!r})")
    return [r[0] for r in body], header[1:], np.array([[float(v) for v in r[1:]] for r in body])


def command(words: list[str], log: list[dict], stage: str) -> float:
    """Run ``meshshard WORDS`` as a user would, printed first; its wall time, logged in ``log``."""
    print(f"\n$ meshshard {shlex.join(words)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run([*command_argv(), *words])
    seconds = time.perf_counter() - started
    log.append({"stage": stage, "command": "meshshard " + shlex.join(words), "seconds": round(seconds, 1)})
    if done.returncode != 0:
        sys.exit(f"run.py: meshshard {stage} failed ({done.returncode})")
    return seconds


def dataset_to_run(args: argparse.Namespace, names: list[str], held: list[str], dataset_options: list[str],
                   train_options: list[str], log: list[dict], members: int = 1) -> list[Path]:
    """``meshshard dataset`` of the cases ``names`` (``held`` for validation; ``--inputs``,
    ``--target-scale`` and ``dataset_options`` given), ``partition`` into ``--nproc`` parts and
    ``train`` with ``--config`` and ``train_options``, in ``SWEEP/TAG`` (``--force`` to each).

    ``members`` > 1: that many runs side by side, each on ``--nproc / members`` ranks (the
    partition's parts), with seeds ``S, S + 1, ...`` (``S``: ``--seed`` of ``train_options``, else
    0), in ``TAG/run``, ``TAG/run-2``, ...: an ensemble for ``predict --ensemble``. Returns the
    run folders."""
    sweep, tag = args.sweep, args.sweep / args.tag
    force = ["--force"] if args.force else []
    scale = [] if args.target_scale == "none" else ["--target-scale", args.target_scale]
    if members < 1 or args.nproc % members:
        sys.exit(f"run.py: Expected --nproc to be a multiple of --members (got {args.nproc} and {members})")
    ranks = args.nproc // members
    command(["dataset", *(str(sweep / "cases" / name) for name in names), "--out", str(tag / "data"),
             "--inputs", args.inputs, "--targets", "p,U", "--params", str(sweep / "params.csv"), *scale,
             "--val-samples", ",".join(held), *dataset_options, *force], log, "dataset")
    command(["partition", str(tag / "data"), "--parts", str(ranks), "--out", str(tag / "parts"), *force],
            log, "partition")
    runs = [tag / ("run" if i == 0 else f"run-{i + 1}") for i in range(members)]
    options = list(train_options)
    seed = 0
    if members > 1 and "--seed" in options[:-1]:  # each member its own seed, S, S + 1, ..., the flag given once
        at = options.index("--seed")
        seed = int(options[at + 1])
        del options[at:at + 2]
    words = [["train", str(tag / "parts"), "--data", str(tag / "data"), "--out", str(run), "--nproc", str(ranks),
              "--config", str(args.config), *options, *force] for run in runs]
    if members > 1:
        words = [w + ["--seed", str(seed + i)] for i, w in enumerate(words)]
    commands(words, log, "train", threads=max(1, (os.cpu_count() or 1) // args.nproc))
    return runs


def commands(words: list[list[str]], log: list[dict], stage: str, threads: int) -> float:
    """Run several ``meshshard`` commands side by side (one: :func:`command`), each printed first,
    each rank with ``threads`` threads (``OMP_NUM_THREADS``: together they use the cores once);
    their wall time, logged once in ``log``. A failed one stops the script once all have ended."""
    if len(words) == 1:
        return command(words[0], log, stage)
    for w in words:
        print(f"\n$ OMP_NUM_THREADS={threads} meshshard {shlex.join(w)} &", flush=True)
    started = time.perf_counter()
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    procs = [subprocess.Popen([*command_argv(), *w], env=env) for w in words]
    codes = [p.wait() for p in procs]
    seconds = time.perf_counter() - started
    log.append({"stage": stage, "command": " & ".join("meshshard " + shlex.join(w) for w in words),
                "seconds": round(seconds, 1)})
    failed = [c for c in codes if c != 0]
    if failed:
        sys.exit(f"run.py: meshshard {stage} failed ({failed[0]})")
    return seconds


def rel_l2(pred: np.ndarray, true: np.ndarray) -> float:
    """``||pred - true|| / ||true||`` over every node (and component); NaN where ``true`` is 0."""
    norm = float(np.linalg.norm(true))
    return float(np.linalg.norm(pred - true) / norm) if norm > 0 else float("nan")


def write_results(tag: Path, args: argparse.Namespace, train_options: list[str], log: list[dict], started: float,
                  **results: Any) -> None:
    """``TAG/results.json``: ``results`` and the settings, what train resolved (``TAG/run/config.toml``),
    the steps it took, its best validation loss, every stage's command and time; then a line saying so."""
    train_log = [json.loads(line) for line in (tag / "run" / "log.jsonl").read_text().splitlines() if line.strip()]
    steps_done = max((r["step"] for r in train_log if "loss" in r), default=-1) + 1
    val = [r["val_loss"] for r in train_log if "val_loss" in r]
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | {"train_options": train_options}
    out = {"sweep": str(args.sweep), "tag": args.tag, **results, "settings": settings,
           "recipe": (tag / "run" / "config.toml").read_text(), "steps_done": steps_done,
           "best_val_loss": min(val) if val else None, "stages": log,
           "seconds": round(time.perf_counter() - started, 1)}
    (tag / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    stages = ", ".join(f"{s['stage']} {s['seconds']:.0f} s" for s in log)
    print(f"wrote {tag}/results.json; {steps_done} training steps; {stages}")
