"""Step 2 of the shape-sweep example: the meshshard commands on the sweep, then the model against baselines.

On the sweep that ``sweep.py`` wrote (``SWEEP/cases/<case>/VTK``, as foamToVTK writes it, every case
its own mesh; ``SWEEP/params.csv``; ``SWEEP/sweep.json``), it runs, as a user would type them (each
printed before it runs)::

    meshshard dataset SWEEP/cases/<case> ... --out TAG/data --inputs 'pos[0],pos[1]' --targets p,U \\
        --params SWEEP/params.csv --target-scale 'p=speed**2,U=speed' --val-samples <the held-out cases> \\
        --collapse-2d --wall-distance body \\
        --mean-field linear:12 --wall-normal body --map-along body --position-prior-inputs
    meshshard partition TAG/data --parts 1 --out TAG/parts
    meshshard train TAG/parts --data TAG/data --out TAG/run --nproc 1 --config recipe.toml [train options] --seed 0 &
    meshshard train TAG/parts --data TAG/data --out TAG/run-2 --nproc 1 --config recipe.toml [train options] --seed 1
    meshshard predict TAG/run --data TAG/data --out TAG/pred --nproc 1 --samples val --checkpoint last \\
        --ensemble TAG/run-2 --boundary body --force-reference '0.5*speed**2' --direction 1,0 \\
        --lift-direction 0,1 --near body:0.1
    meshshard baseline TAG/data --out TAG/baseline-<method> --method mean|nearest|knn:4|linear:12 <predict's --boundary ...>
    meshshard baseline TAG/data --out TAG/baseline-<method>-along --method nearest|knn:4|linear:12 --map-along body ...

where ``TAG`` is ``SWEEP/<--tag>``; a case that ``sweep.json`` records as not converged (its
residuals still above ``--residual`` after ``--iterations``, its fields still moving by 1% or more)
is left out, and said so. The validation samples are the held-out shapes' cases (every
angle of each), hence ``--checkpoint last``: the checkpoint of the lowest validation loss would
be chosen by the very cases it is scored on. ``--params`` makes the shape parameters (thickness,
camber, nose) and the operating point (aoa, speed) input channels; ``--wall-distance body`` adds
each node's distance to the body.

The recipe is the best measured (README.md's "the recipe now"): the dataset's ``--mean-field
linear:12 --wall-normal body --map-along body --position-prior-inputs`` (``--dataset-options``: a
prior fitted, affine in the parameters, over the 12 nearest training cases, a training case's own
case left out of its fit, each mapped body to body, and the same prior mapped by position as more
inputs; the wall's offset and normal) and ``recipe.toml`` (4,500 steps, the
body weighted ten times in the loss), trained twice side by side, one rank each, with seeds 0 and
1 (``--members 2``: ``--nproc`` split between the runs, the partition into ``--nproc / members``
parts), and predicted as the mean of the two (``predict --ensemble``; with ``--mirror`` among the
dataset options, ``predict --mirror-average`` too: each case and its mirror). ``--before`` runs the first
recipe instead, the table's "before" row: ``recipe-before.toml`` (1,500 steps, no weight), one
run on ``--nproc`` ranks, and no dataset options beyond the ones above. The baselines (``meshshard baseline``;
none with ``--no-baselines``) map training cases onto each held-out case's
mesh (piecewise-linear interpolation):

- **training mean**: every training case, equally weighted;
- **nearest shape**: the training case nearest in parameter space (shape parameters and angle,
  each divided by its spread over the training cases): the nearest solved shape at the same angle;
- **knn:4**: the 4 nearest, weighted by inverse distance;
- **linear:12**: a least-squares fit, linear in the parameters, over the 12 nearest training cases;
- **nearest, knn:4, linear:12 along the body**: the same, each training case mapped body to body
  (``--map-along body``: a node near the wall reads the source's field as far from the source's
  wall, at the same place along it), which carries the boundary layer and the pressure peak where
  position alone does not;
- **free stream** (computed here, no command): ``p = 0``, ``U = (speed, 0)`` everywhere, no force.

Then, on the held-out cases and in physical units, it prints one row per baseline and the model:

- ``p near`` / ``U near``: the relative L2 error, ``||pred - true|| / ||true||``, over the nodes
  within ``--near`` chords of the body (``--near body:DISTANCE`` of predict and baseline: their
  ``metrics.json``), mean over the held-out cases (``U`` as a vector). The free stream's, which
  no command writes, over the same nodes of the written files (their ``wall_distance``);
- ``p body``: the relative L2 error of ``p`` over the body's nodes (predict's ``metrics.json``,
  ``--boundary body``), mean over the cases;
- ``CL MAE`` / ``CL rho``, ``CD MAE`` / ``CD rho``: the lift and pressure-drag coefficients
  ``F . d / (0.5 speed^2 c)`` per unit span (chord ``c = 1``), their mean absolute error and
  Spearman's rank correlation over the held-out cases (``metrics.json``'s summary): whether the
  model ranks the designs as the solver does. The drag is the pressure's part alone (the files
  carry no wall shear stress).

It writes ``TAG/results.json`` (every figure per case, the commands, the wall time of each stage).

    python examples/shape_sweep/run.py shape-sweep              # the recipe: SWEEP/after
    python examples/shape_sweep/run.py shape-sweep --before     # the first recipe: SWEEP/before

Any ``meshshard train`` option given after the script's own (``--seed 1``, ``--steps 100``) goes to
train and overrides the recipe; ``--dataset-options '...'`` replaces the dataset options above.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import meshio
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # shapes.py: the family, for --held-out
import foam_sweeps as common  # noqa: E402  (examples/foam_sweeps.py: the commands, params.csv, results.json)

RECIPE, RECIPE_BEFORE = HERE / "recipe.toml", HERE / "recipe-before.toml"
#: The dataset options of the recipe (README.md's "the recipe now"); ``--before`` leaves them out.
DATASET_OPTIONS = "--mean-field linear:12 --wall-normal body --map-along body --position-prior-inputs"
#: label -> (meshshard baseline --method, mapped along the body: --map-along body)
BASELINES = {
    "training mean": ("mean", False),
    "nearest shape": ("nearest", False),
    "knn:4 (inverse distance)": ("knn:4", False),
    "linear:12 (local least squares)": ("linear:12", False),
    "nearest, along the body": ("nearest", True),
    "knn:4, along the body": ("knn:4", True),
    "linear:12, along the body": ("linear:12", True),
}


def baseline_folder(tag: Path, method: str, along: bool) -> Path:
    return tag / (f"baseline-{method.replace(':', '')}" + ("-along" if along else ""))
FORCES = ["--boundary", "body", "--force-reference", "0.5*speed**2", "--direction", "1,0", "--lift-direction", "0,1"]
SETTLED = 0.01  # a case whose p and U moved less than this over its last written iterations is settled
MEMBERS = 2  # the recipe's runs side by side (one rank each on 2 cores), predicted as their mean
COLUMNS = ("p near", "U near", "p body", "CL MAE", "CL rho", "CD MAE", "CD rho")


def settled(record: dict) -> bool:
    """Whether a case of ``sweep.json`` is a solution: its residuals below ``--residual``, or its
    fields moving less than :data:`SETTLED` over the last tenth of its iterations (a residual that
    stalls just above the limit on a steady flow)."""
    moved = record.get("settle")
    return bool(record["converged"] or moved and max(moved.values()) < SETTLED)


def free_stream_near(path: Path, near: float, speed: float, count: int) -> dict[str, float]:
    """The free stream's relative L2 errors of ``p`` and ``U`` (``p = 0``, ``U = (speed, 0)``) over
    the nodes of a written file within ``near`` of the body (its ``wall_distance``): the nodes of
    ``--near body:NEAR``, whose ``count`` (``metrics.json``) is checked."""
    data = meshio.read(path).point_data
    mask = np.asarray(data["wall_distance"]).reshape(-1) <= near
    if int(mask.sum()) != count:
        sys.exit(f"run.py: {path}: {int(mask.sum())} nodes within {near:g} of the body, metrics.json's near has {count}")
    out = {}
    for f in ("p", "U"):
        true = np.asarray(data[f], np.float64)[mask]
        pred = np.zeros_like(true)
        if f == "U":
            pred[:, 0] = speed
        out[f] = common.rel_l2(pred, true)
    return out


def scores(folder: Path, held: list[str]) -> tuple[dict[str, float | None], dict[str, dict]]:
    """(the table's row, per case) of a prediction folder that predict or baseline wrote (with
    ``--boundary body`` and ``--near``): all from its ``metrics.json``."""
    metrics = json.loads((folder / "metrics.json").read_text())
    records = {r["name"]: r for r in metrics["samples"]}
    missing = [n for n in held if n not in records]
    if missing:
        sys.exit(f"run.py: {folder}/metrics.json has no {', '.join(missing)}")
    per_case = {}
    for name in held:
        r = records[name]
        body = r["boundaries"]["body"]
        near = {f: r["near"]["fields"][f]["rel_l2"] for f in ("p", "U")}
        per_case[name] = {"near": near, "near_nodes": r["near"]["num_nodes"], "p body": body["fields"]["p"]["rel_l2"],
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
    per_case = {name: {"near": free_stream_near(folder / records[name]["file"], near, speed[name],
                                                truth[name]["near_nodes"]),
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


def arguments(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """(run.py's options resolved: the recipe and the dataset options of ``--before`` or not, the tag;
    meshshard train's options)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Any other option is meshshard train's (--seed 1, --steps 100), given to it after "
                                       "--config: it overrides the recipe.")
    common.add_run_arguments(p, "the sweep folder sweep.py wrote (cases it did not converge on are left out)",
                             "meshshard dataset --inputs (default 'pos[0],pos[1]'; the parameters are added by "
                             "--params, the wall distance by --wall-distance body)", tag=None,
                             recipe_help="default recipe.toml beside this script; recipe-before.toml with --before")
    p.add_argument("--before", action="store_true",
                   help="the first recipe, the table's 'before' row: recipe-before.toml and no --dataset-options, "
                        "tag before (without it: recipe.toml and the dataset options, tag after)")
    p.add_argument("--dataset-options", default=None,
                   help=f"more meshshard dataset options, one string (default '{DATASET_OPTIONS}'; none with --before)")
    p.add_argument("--members", type=int, default=None,
                   help="runs trained side by side, each on --nproc / MEMBERS ranks with its own seed, and predicted "
                        "as their mean (predict --ensemble); default 2, 1 with --before")
    p.add_argument("--held-out", type=int, default=None, metavar="N",
                   help="hold out N shapes instead of those sweep.py held out: the ones sweep.py --held-out N picks "
                        "(the inner shapes nearest the family's centre, each inside the hull of the rest), from the "
                        "same cases, no solver run; tag after-heldN")
    p.add_argument("--near", type=float, default=0.1,
                   help="'near the body': within this distance of it, in chords (default 0.1): --near body:NEAR")
    p.add_argument("--no-baselines", action="store_true",
                   help="leave out the baselines (they depend on the dataset alone: a run of the same dataset "
                        "options, with another seed or train option, has them already): the free stream and the "
                        "model only")
    args, train_options = p.parse_known_args(argv)
    args.tag = args.tag or ("before" if args.before else "after") + (f"-held{args.held_out}" if args.held_out else "")
    args.config = args.config or (RECIPE_BEFORE if args.before else RECIPE)
    if args.dataset_options is None:
        args.dataset_options = "" if args.before else DATASET_OPTIONS
    if args.members is None:
        args.members = 1 if args.before else MEMBERS
    return args, train_options


def held_out_shapes(info: dict, count: int) -> list[str]:
    """The shapes ``sweep.py --held-out COUNT`` holds out of the sweep ``info`` (sweep.json) describes
    (``shapes.design``); refused when the sweep's family is not ``shapes.design``'s, or has fewer
    inner shapes inside the hull of the rest."""
    import shapes

    family, held = shapes.design(len(info["shapes"]), {k: tuple(v) for k, v in info["ranges"].items()}, held=count)
    if [s.name for s in family] != list(info["shapes"]):
        sys.exit(f"run.py: --held-out {count}: the sweep's shapes are not the family sweep.py makes of its "
                 f"--shapes {len(info['shapes'])} and ranges")
    if len(held) < count:
        sys.exit(f"run.py: --held-out {count}: only {len(held)} of the sweep's shapes can be held out inside the hull "
                 "of the others")
    return [s.name for s in held]


def held_out_cases(info: dict, count: int | None, unsettled: list[str]) -> tuple[list[str], list[str]]:
    """The held-out shapes and their cases, those simpleFoam settled on: sweep.py's (sweep.json), or
    with ``count`` (``--held-out``) the ones ``sweep.py --held-out COUNT`` would hold out."""
    shapes_out = info["held_out_shapes"] if count is None else held_out_shapes(info, count)
    held_out = (info["held_out"] if count is None else
                sorted(r["sample"] for r in info["cases"] if any(r["sample"].startswith(f"{s}_a") for s in shapes_out)))
    return shapes_out, [n for n in held_out if n not in unsettled]


def main(argv: list[str] | None = None) -> int:
    args, train_options = arguments(argv)
    sweep: Path = args.sweep
    info = json.loads((sweep / "sweep.json").read_text())
    names, params, values = common.read_params(sweep / "params.csv")
    unsettled = sorted(r["sample"] for r in info["cases"] if not settled(r))
    if unsettled:  # a case simpleFoam did not converge on is no truth to train on or score against
        print(f"run.py: leaving out {len(unsettled)} case(s) simpleFoam did not converge on (sweep.json: residuals "
              f"above --residual and p or U still moving {SETTLED:.0%} or more): {', '.join(unsettled)}", flush=True)
    names = [n for n in names if n not in unsettled]
    shapes_out, held = held_out_cases(info, args.held_out, unsettled)
    if not held:
        sys.exit(f"run.py: {sweep} has no held-out cases")
    tag = sweep / args.tag
    force = ["--force"] if args.force else []
    log: list[dict] = []
    started = time.perf_counter()

    runs = common.dataset_to_run(args, names, held, ["--collapse-2d", "--wall-distance", "body",
                                                     *shlex.split(args.dataset_options)], train_options, log,
                                 members=args.members)
    near = ["--near", f"body:{args.near:g}"]
    ensemble = ["--ensemble", ",".join(str(r) for r in runs[1:])] if len(runs) > 1 else []
    # a run trained with mirrored cases predicts each case and its mirror, and averages them (exactly symmetric)
    mirrored = ["--mirror-average"] if "--mirror" in shlex.split(args.dataset_options) else []
    common.command(["predict", str(runs[0]), "--data", str(tag / "data"), "--out", str(tag / "pred"),
                    "--nproc", str(args.nproc // args.members), "--samples", "val", "--checkpoint", "last", *ensemble,
                    *mirrored, *FORCES, *near, *force], log, "predict")
    baselines = {} if args.no_baselines else BASELINES
    for method, along in baselines.values():
        common.command(["baseline", str(tag / "data"), "--out", str(baseline_folder(tag, method, along)), "--method",
                        method, "--samples", "val", *(["--map-along", "body"] if along else []), *FORCES, *near,
                        *force], log, f"baseline {method}" + (" along" if along else ""))

    rows: dict[str, dict[str, float | None]] = {}
    per_case: dict[str, dict] = {}
    model_row, model_cases = scores(tag / "pred", held)
    speed = {n: float(dict(zip(params, values[names.index(n)]))["speed"]) for n in held}
    rows["free stream"], per_case["free stream"] = free_stream_scores(tag / "pred", held, args.near, speed,
                                                                      model_cases)
    for label, (method, along) in baselines.items():
        rows[label], per_case[label] = scores(baseline_folder(tag, method, along), held)
    rows["meshshard"], per_case["meshshard"] = model_row, model_cases
    text = table(rows)
    print(f"\non the {len(held)} held-out cases ({len(shapes_out)} shapes x {len(info['aoa'])} angles): "
          f"relative L2 of p and U within {args.near:g} chords of the body and of p on it; lift and pressure-drag "
          f"coefficients, mean absolute error and Spearman's rho over the cases\n" + text)
    common.write_results(tag, args, train_options, log, started, held_out=held,
                         held_out_shapes=shapes_out, near=args.near, summary=rows, cases=per_case,
                         table=text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
