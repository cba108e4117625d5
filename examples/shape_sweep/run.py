"""Step 2 of the shape-sweep example: the meshshard commands on the sweep, then the model against baselines.

On the sweep that ``sweep.py`` wrote (``SWEEP/cases/<case>/VTK``, as foamToVTK writes it, every case
its own mesh; ``SWEEP/params.csv``; ``SWEEP/sweep.json``), it runs, as a user would type them (each
printed before it runs)::

    meshshard dataset SWEEP/cases/<case> ... --out TAG/data --inputs 'pos[0],pos[1]' --targets p,U \\
        --params SWEEP/params.csv --target-scale 'p=speed**2,U=speed' --val-samples <the held-out cases> \\
        --collapse-2d --wall-distance body
    meshshard partition TAG/data --parts 2 --out TAG/parts
    meshshard train TAG/parts --data TAG/data --out TAG/run --nproc 2 --config recipe.toml [train options]
    meshshard predict TAG/run --data TAG/data --out TAG/pred --nproc 2 --samples val --checkpoint last \\
        --boundary body --force-reference '0.5*speed**2' --direction 1,0 --lift-direction 0,1
    meshshard baseline TAG/data --out TAG/baseline-<method> --method mean|nearest|knn:4 <predict's --boundary ...>

where ``TAG`` is ``SWEEP/<--tag>``; a case that ``sweep.json`` records as not converged (its
residuals still above ``--residual`` after ``--iterations``, its fields still moving by 1% or more)
is left out, and said so. The validation samples are the held-out shapes' cases (every
angle of each), hence ``--checkpoint last``: the checkpoint of the lowest validation loss would
be chosen by the very cases it is scored on. ``--params`` makes the shape parameters (thickness,
camber, nose) and the operating point (aoa, speed) input channels; ``--wall-distance body`` adds
each node's distance to the body. The baselines (``meshshard baseline``) map training cases onto
each held-out case's mesh (piecewise-linear interpolation):

- **training mean**: every training case, equally weighted;
- **nearest shape**: the training case nearest in parameter space (shape parameters and angle,
  each divided by its spread over the training cases): the nearest solved shape at the same angle;
- **knn:4**: the 4 nearest, weighted by inverse distance;
- **free stream** (computed here, no command): ``p = 0``, ``U = (speed, 0)`` everywhere, no force.

Then, on the held-out cases and in physical units, it prints one row per baseline and the model:

- ``p near`` / ``U near``: the relative L2 error, ``||pred - true|| / ||true||``, over the nodes
  within ``--near`` chords of the body (the ``wall_distance`` of the written files), mean over
  the held-out cases (``U`` as a vector). This is computed here from the written predictions
  (``TAG/pred/<case>.vtu``, ``TAG/baseline-*/<case>.vtu``); when ``meshshard predict --near
  PATCHES:DISTANCE`` exists, it can give the same figure in ``metrics.json``;
- ``p body``: the relative L2 error of ``p`` over the body's nodes (predict's ``metrics.json``,
  ``--boundary body``), mean over the cases;
- ``CL MAE`` / ``CL rho``, ``CD MAE`` / ``CD rho``: the lift and pressure-drag coefficients
  ``F . d / (0.5 speed^2 c)`` per unit span (chord ``c = 1``), their mean absolute error and
  Spearman's rank correlation over the held-out cases (``metrics.json``'s summary): whether the
  model ranks the designs as the solver does. The drag is the pressure's part alone (the files
  carry no wall shear stress).

It writes ``TAG/results.json`` (every figure per case, the commands, the wall time of each stage).

    python examples/shape_sweep/run.py shape-sweep --tag base --config examples/shape_sweep/recipe.toml

Any ``meshshard train`` option given after the script's own (``--seed 1``, ``--steps 100``) goes to
train and overrides the recipe; ``--dataset-options '...'`` adds options to ``meshshard dataset``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path

import meshio
import numpy as np

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "recipe.toml"
BASELINES = {"training mean": "mean", "nearest shape": "nearest", "knn:4 (inverse distance)": "knn:4"}
FORCES = ["--boundary", "body", "--force-reference", "0.5*speed**2", "--direction", "1,0", "--lift-direction", "0,1"]
SETTLED = 0.01  # a case whose p and U moved less than this over its last written iterations is settled
COLUMNS = ("p near", "U near", "p body", "CL MAE", "CL rho", "CD MAE", "CD rho")


def _cfd_run() -> object:
    """``examples/cfd_sweep/run.py`` as a module (its ``command`` runs and logs one meshshard command)."""
    spec = importlib.util.spec_from_file_location("cfd_sweep_run", HERE.parent / "cfd_sweep" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cfd = _cfd_run()


def settled(record: dict) -> bool:
    """Whether a case of ``sweep.json`` is a solution: its residuals below ``--residual``, or its
    fields moving less than :data:`SETTLED` over the last tenth of its iterations (a residual that
    stalls just above the limit on a steady flow)."""
    moved = record.get("settle")
    return bool(record["converged"] or moved and max(moved.values()) < SETTLED)


def rel_l2(pred: np.ndarray, true: np.ndarray) -> float:
    norm = float(np.linalg.norm(true))
    return float(np.linalg.norm(pred - true) / norm) if norm > 0 else float("nan")


def near_errors(path: Path, near: float, free_stream: float | None = None) -> dict[str, float]:
    """The relative L2 errors of ``p`` and ``U`` over the nodes of a written file within ``near`` of
    the body; with ``free_stream`` (a speed), those of the free stream instead of the file's prediction."""
    data = meshio.read(path).point_data
    mask = np.asarray(data["wall_distance"]).reshape(-1) <= near
    out = {}
    for f in ("p", "U"):
        true = np.asarray(data[f], np.float64)[mask]
        if free_stream is None:
            pred = np.asarray(data[f"{f}_pred"], np.float64)[mask]
        else:
            pred = np.zeros_like(true)
            if f == "U":
                pred[:, 0] = free_stream
        out[f] = rel_l2(pred, true)
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (ties share their mean rank); None where either does not vary."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a), rankdata(b)
    if len(a) < 3 or np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def scores(folder: Path, held: list[str], near: float) -> tuple[dict[str, float | None], dict[str, dict]]:
    """(the table's row, per case) of a prediction folder that predict or baseline wrote."""
    metrics = json.loads((folder / "metrics.json").read_text())
    records = {r["name"]: r for r in metrics["samples"]}
    missing = [n for n in held if n not in records]
    if missing:
        sys.exit(f"run.py: {folder}/metrics.json has no {', '.join(missing)}")
    per_case = {}
    for name in held:
        r = records[name]
        body = r["boundaries"]["body"]
        per_case[name] = {"near": near_errors(folder / r["file"], near), "p body": body["fields"]["p"]["rel_l2"],
                          "CL": body["coefficients"]["lift"], "CD": body["coefficients"]["drag"]}
    summary = metrics["boundaries"]["body"]["coefficients"]
    row = {"p near": float(np.mean([c["near"]["p"] for c in per_case.values()])),
           "U near": float(np.mean([c["near"]["U"] for c in per_case.values()])),
           "p body": float(np.mean([c["p body"] for c in per_case.values()])),
           "CL MAE": summary["lift"]["mae"], "CL rho": summary["lift"]["spearman"],
           "CD MAE": summary["drag"]["mae"], "CD rho": summary["drag"]["spearman"]}
    return row, per_case


def free_stream_scores(folder: Path, held: list[str], near: float, speed: dict[str, float],
                       truth: dict[str, dict]) -> tuple[dict[str, float | None], dict[str, dict]]:
    """The free stream's row, on the files of ``folder`` (their true fields) and the true coefficients."""
    metrics = json.loads((folder / "metrics.json").read_text())
    records = {r["name"]: r for r in metrics["samples"]}
    per_case = {name: {"near": near_errors(folder / records[name]["file"], near, free_stream=speed[name]),
                       "p body": 1.0} for name in held}  # p = 0 on the body: an error of 100%
    row = {"p near": float(np.mean([c["near"]["p"] for c in per_case.values()])),
           "U near": float(np.mean([c["near"]["U"] for c in per_case.values()])), "p body": 1.0,
           "CL MAE": float(np.mean([abs(truth[n]["CL"]["true"]) for n in held])), "CL rho": None,
           "CD MAE": float(np.mean([abs(truth[n]["CD"]["true"]) for n in held])), "CD rho": None}
    return row, per_case


def table(rows: dict[str, dict[str, float | None]]) -> str:
    head = f"{'':28}" + "".join(f"{c:>9}" for c in COLUMNS)
    lines = [head, "-" * len(head)]
    for method, row in rows.items():
        cells = []
        for c in COLUMNS:
            v = row[c]
            cells.append(f"{'-':>9}" if v is None else f"{v:9.3f}" if "rho" in c or "MAE" in c else f"{v:9.2%}")
        lines.append(f"{method:28}" + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Any other option is meshshard train's (--seed 1, --steps 100), given to it after "
                                       "--config: it overrides the recipe.")
    p.add_argument("sweep", type=Path, help="the sweep folder sweep.py wrote (cases it did not converge on are left out)")
    p.add_argument("--tag", default="base", help="this recipe's folder, SWEEP/TAG (default base)")
    p.add_argument("--config", type=Path, default=RECIPE,
                   help="meshshard train's recipe (default recipe.toml beside this script)")
    p.add_argument("--inputs", default="pos[0],pos[1]",
                   help="meshshard dataset --inputs (default 'pos[0],pos[1]'; the parameters are added by --params, "
                        "the wall distance by --wall-distance body)")
    p.add_argument("--target-scale", default="p=speed**2,U=speed",
                   help="meshshard dataset --target-scale, or 'none' (default 'p=speed**2,U=speed')")
    p.add_argument("--dataset-options", default="",
                   help="more meshshard dataset options, one string (e.g. '--boundary-classes')")
    p.add_argument("--near", type=float, default=0.1,
                   help="'near the body': within this distance of it, in chords (default 0.1)")
    p.add_argument("--nproc", type=int, default=2, help="ranks for train and predict, and parts (default 2)")
    p.add_argument("--force", action="store_true", help="make SWEEP/TAG over (its data, parts, run, predictions)")
    args, train_options = p.parse_known_args(argv)

    sweep: Path = args.sweep
    info = json.loads((sweep / "sweep.json").read_text())
    names, params, values = cfd.read_params(sweep / "params.csv")
    unsettled = sorted(r["sample"] for r in info["cases"] if not settled(r))
    if unsettled:  # a case simpleFoam did not converge on is no truth to train on or score against
        print(f"run.py: leaving out {len(unsettled)} case(s) simpleFoam did not converge on (sweep.json: residuals "
              f"above --residual and p or U still moving {SETTLED:.0%} or more): {', '.join(unsettled)}", flush=True)
    names = [n for n in names if n not in unsettled]
    held = [n for n in info["held_out"] if n not in unsettled]
    if not held:
        sys.exit(f"run.py: {sweep} has no held-out cases")
    tag = sweep / args.tag
    force = ["--force"] if args.force else []
    log: list[dict] = []
    started = time.perf_counter()

    scale = [] if args.target_scale == "none" else ["--target-scale", args.target_scale]
    cfd.command(["dataset", *(str(sweep / "cases" / name) for name in names), "--out", str(tag / "data"),
                 "--inputs", args.inputs, "--targets", "p,U", "--params", str(sweep / "params.csv"), *scale,
                 "--val-samples", ",".join(held), "--collapse-2d", "--wall-distance", "body",
                 *shlex.split(args.dataset_options), *force], log, "dataset")
    cfd.command(["partition", str(tag / "data"), "--parts", str(args.nproc), "--out", str(tag / "parts"), *force],
                log, "partition")
    cfd.command(["train", str(tag / "parts"), "--data", str(tag / "data"), "--out", str(tag / "run"),
                 "--nproc", str(args.nproc), "--config", str(args.config), *train_options, *force], log, "train")
    cfd.command(["predict", str(tag / "run"), "--data", str(tag / "data"), "--out", str(tag / "pred"),
                 "--nproc", str(args.nproc), "--samples", "val", "--checkpoint", "last", *FORCES, *force],
                log, "predict")
    for method in BASELINES.values():
        folder = tag / f"baseline-{method.replace(':', '')}"
        cfd.command(["baseline", str(tag / "data"), "--out", str(folder), "--method", method, "--samples", "val",
                     *FORCES, *force], log, f"baseline {method}")

    rows: dict[str, dict[str, float | None]] = {}
    per_case: dict[str, dict] = {}
    model_row, model_cases = scores(tag / "pred", held, args.near)
    speed = {n: float(dict(zip(params, values[names.index(n)]))["speed"]) for n in held}
    rows["free stream"], per_case["free stream"] = free_stream_scores(tag / "pred", held, args.near, speed,
                                                                      model_cases)
    for label, method in BASELINES.items():
        rows[label], per_case[label] = scores(tag / f"baseline-{method.replace(':', '')}", held, args.near)
    rows["meshshard"], per_case["meshshard"] = model_row, model_cases
    text = table(rows)
    print(f"\non the {len(held)} held-out cases ({len(info['held_out_shapes'])} shapes x {len(info['aoa'])} angles): "
          f"relative L2 of p and U within {args.near:g} chords of the body and of p on it; lift and pressure-drag "
          f"coefficients, mean absolute error and Spearman's rho over the cases\n" + text)

    train_log = [json.loads(line) for line in (tag / "run" / "log.jsonl").read_text().splitlines() if line.strip()]
    steps_done = max((r["step"] for r in train_log if "loss" in r), default=-1) + 1
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | {"train_options": train_options}
    results = {"sweep": str(sweep), "tag": args.tag, "held_out": held, "held_out_shapes": info["held_out_shapes"],
               "settings": settings, "recipe": (tag / "run" / "config.toml").read_text(), "steps_done": steps_done,
               "near": args.near, "summary": rows, "cases": per_case, "stages": log,
               "seconds": round(time.perf_counter() - started, 1), "table": text}
    (tag / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    stages = ", ".join(f"{s['stage']} {s['seconds']:.0f} s" for s in log)
    print(f"wrote {tag}/results.json; {steps_done} training steps; {stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
