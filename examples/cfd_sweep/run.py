"""Step 2 of the CFD-sweep example: the four meshshard commands on the sweep, then the model against baselines.

On the sweep that ``sweep.py`` wrote (``SWEEP/cases/<case>/VTK``, as foamToVTK writes it,
``SWEEP/params.csv``, ``SWEEP/sweep.json``), it runs, as a user would type them (each printed
before it runs)::

    meshshard dataset SWEEP/cases/<case> ... --out TAG/data --inputs 'pos[0],pos[1]' --targets p,U \\
        --params SWEEP/params.csv --target-scale 'p=speed**2,U=speed' --val-samples <the held-out cases> \\
        --same-mesh --collapse-2d --mean-field
    meshshard partition TAG/data --parts 2 --out TAG/parts
    meshshard train TAG/parts --data TAG/data --out TAG/run --nproc 2 --config recipe.toml [train options]
    meshshard predict TAG/run --data TAG/data --out TAG/pred --nproc 2 --samples val --checkpoint last \\
        --boundary lowerWall,upperWall

(``--checkpoint last``: the validation cases are the held-out cases of the table, so the checkpoint
of the lowest validation loss, predict's default, would be chosen by the very cases it is scored on)
where ``TAG`` is ``SWEEP/<--tag>`` (one folder per recipe, so recipes can be compared side by
side). The model's recipe is a file, ``recipe.toml`` beside this script (``--config`` another one);
any ``meshshard train`` option given to this script after its own (``--seed 1``, ``--steps 100``)
overrides it, and the run keeps what it trained with in ``TAG/run/config.toml``. Then, on the held-out cases and in physical units, it computes the relative L2 error per
field (``p``; ``U`` as a vector: all its components together) of

- **meshshard**: the ``p_pred`` and ``U_pred`` that ``predict`` wrote (``TAG/pred/<case>.vtu``);
- **training mean**: the node-wise mean of the training cases' fields;
- **nearest case**: the training case nearest in parameter space (each parameter divided by its
  range over the sweep; a tie goes to the first in ``params.csv``);
- **interpolation in <parameter>**: linear interpolation, node by node, between the two
  neighbouring training cases along that parameter (the nearest below and above it with every
  other parameter equal); one row per parameter that varies;
- the same two, **rescaled**: made on ``p / speed^2`` and ``U / speed`` and multiplied back, which is
  what ``--target-scale`` gives the model; a baseline a CFD engineer would use.

Every case of the sweep is on one mesh (``--same-mesh`` checks it), so the baselines are
arithmetic on the fields the dataset stores (in physical units: the stored targets times their
``--target-scale`` factor). The force on each wall (``lowerWall``, ``upperWall``: the pressure
force per unit depth and density, ``sum_i p_i a_i`` over the wall's nodes with the area vectors the
dataset keeps) is scored the same way, ``|F - F_true| / |F_true|``, for the model (predict's
``metrics.json``) and every baseline. It prints the tables and writes ``TAG/results.json``
(every error per case, the commands, the wall time of each stage).

    python examples/cfd_sweep/run.py cfd-sweep --tag base --config examples/cfd_sweep/recipe.toml
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import meshio
import numpy as np

from meshshard.data import boundary_force, open_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from foam_sweeps import add_run_arguments, command, dataset_to_run, read_params, rel_l2, write_results  # noqa: E402

RECIPE = Path(__file__).resolve().parent / "recipe.toml"
FIELDS = ("p", "U")
WALLS = ("lowerWall", "upperWall")


def rescale(params: dict[str, float]) -> dict[str, float]:
    """The non-dimensionalisation of the rescaled baselines: ``p / speed^2``, ``U / speed``."""
    return {"p": params["speed"] ** 2, "U": params["speed"]}


def read_fields(data: object, sample: int) -> dict[str, np.ndarray]:
    """``p`` (N,) and ``U`` (N, 3) of one sample of the dataset, float64, physical units."""
    n = data.num_nodes(sample)
    _, y = data.rows(sample, np.arange(n))
    y = y * data.target_factors(sample)
    return {"p": y[:, 0], "U": y[:, 1:]}


def wall_forces(data: object, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The pressure force on each wall, (2,) or (3,), from a node-wise pressure ``fields['p']``."""
    out = {}
    for wall in WALLS:
        ids, area = data.boundary(0, wall)
        out[wall] = boundary_force(fields["p"][ids], area)
    return out


def baselines(names: list[str], params: list[str], values: np.ndarray, fields: dict[str, dict[str, np.ndarray]],
              train: list[int], case: int) -> dict[str, tuple[dict[str, np.ndarray], str]]:
    """Each baseline's prediction of ``case`` from the ``train`` cases, with what it was made of."""
    out: dict[str, tuple[dict[str, np.ndarray], str]] = {}
    out["training mean"] = ({f: np.mean([fields[names[i]][f] for i in train], axis=0) for f in FIELDS},
                            f"mean of {len(train)} cases")
    prm = dict(zip(params, values[case]))
    out["training mean, rescaled"] = (
        {f: np.mean([fields[names[i]][f] / rescale(dict(zip(params, values[i])))[f] for i in train], axis=0)
         * rescale(prm)[f] for f in FIELDS}, f"mean of {len(train)} cases (rescaled)")
    span = values.max(0) - values.min(0)
    span[span == 0] = 1.0
    dist = [float(np.linalg.norm((values[i] - values[case]) / span)) for i in train]
    near = train[int(np.argmin(dist))]
    near_prm = dict(zip(params, values[near]))
    out["nearest case"] = (fields[names[near]], names[near])
    out["nearest case, rescaled"] = ({f: fields[names[near]][f] * rescale(prm)[f] / rescale(near_prm)[f]
                                      for f in FIELDS}, names[near])
    for k, param in enumerate(params):
        if values[:, k].min() == values[:, k].max():
            continue  # not varied in this sweep
        others = [j for j in range(len(params)) if j != k]
        line = [i for i in train if np.allclose(values[i, others], values[case, others], rtol=1e-9, atol=0)]
        below = [i for i in line if values[i, k] < values[case, k]]
        above = [i for i in line if values[i, k] > values[case, k]]
        if not below or not above:
            continue  # at the edge of the sweep along this parameter: no interpolation
        lo = max(below, key=lambda i: values[i, k])
        hi = min(above, key=lambda i: values[i, k])
        t = (values[case, k] - values[lo, k]) / (values[hi, k] - values[lo, k])
        made = f"{names[lo]} x {1 - t:.3g} + {names[hi]} x {t:.3g}"
        out[f"interpolation in {param}"] = ({f: (1 - t) * fields[names[lo]][f] + t * fields[names[hi]][f]
                                             for f in FIELDS}, made)
        f_lo, f_hi = rescale(dict(zip(params, values[lo]))), rescale(dict(zip(params, values[hi])))
        out[f"interpolation in {param}, rescaled"] = (
            {f: ((1 - t) * fields[names[lo]][f] / f_lo[f] + t * fields[names[hi]][f] / f_hi[f]) * rescale(prm)[f]
             for f in FIELDS}, made + " (rescaled)")
    return out


def meshshard_prediction(pred: Path, metrics: dict, name: str, num_nodes: int) -> tuple[dict[str, np.ndarray], dict]:
    """``p_pred`` and ``U_pred`` of one case from predict's ``.vtu``, in the dataset's node order."""
    [record] = [r for r in metrics["samples"] if r["name"] == name]
    data = meshio.read(pred / record["file"]).point_data
    order = np.asarray(data["global_id"], np.int64)
    out = {}
    for f in FIELDS:
        values = np.asarray(data[f"{f}_pred"], np.float64)
        full = np.zeros((num_nodes,) + values.shape[1:])
        full[order] = values
        out[f] = full
    return out, record


def table(rows: dict[str, dict[str, list[float]]], cases: list[str]) -> str:
    """Mean [worst] per field, then every case."""
    head = f"{'':36} {'p mean':>8} {'p worst':>8} {'U mean':>8} {'U worst':>8}   per case: p / U"
    lines = [head, "-" * len(head)]
    for method, err in rows.items():
        per = "  ".join(f"{a:.2%}/{b:.2%}" for a, b in zip(err["p"], err["U"]))
        lines.append(f"{method:36} {np.mean(err['p']):8.2%} {np.max(err['p']):8.2%} "
                     f"{np.mean(err['U']):8.2%} {np.max(err['U']):8.2%}   {per}")
    lines.append(f"held-out cases, in the order of 'per case': {', '.join(cases)}")
    return "\n".join(lines)


def force_table(rows: dict[str, dict[str, list[float]]], cases: list[str]) -> str:
    """Mean [worst] force error per wall, then every case."""
    head = (f"{'':36} " + " ".join(f"{w + ' mean':>15} {'worst':>7}" for w in WALLS)
            + "   per case: " + " / ".join(WALLS))
    lines = [head, "-" * len(head)]
    for method, err in rows.items():
        per = "  ".join("/".join(f"{err[w][i]:.2%}" for w in WALLS) for i in range(len(cases)))
        lines.append(f"{method:36} " + " ".join(f"{np.mean(err[w]):15.2%} {np.max(err[w]):7.2%}" for w in WALLS)
                     + f"   {per}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Any other option is meshshard train's (--seed 1, --steps 100), given to it after "
                                       "--config: it overrides the recipe.")
    add_run_arguments(p, "the sweep folder sweep.py wrote",
                      "meshshard dataset --inputs (default 'pos[0],pos[1]': the 2-D case's plane; the parameters "
                      "speed and nu are added by --params)", recipe=RECIPE)
    p.add_argument("--no-mean-field", action="store_true",
                   help="train on the fields themselves instead of their difference from the training cases' mean "
                        "field (dataset --mean-field)")
    p.add_argument("--no-collapse-2d", action="store_true",
                   help="train on the one-cell-thick 3-D mesh as foamToVTK writes it (both z-planes) instead of "
                        "its 2-D plane (dataset --collapse-2d)")
    args, train_options = p.parse_known_args(argv)

    sweep: Path = args.sweep
    info = json.loads((sweep / "sweep.json").read_text())
    names, params, values = read_params(sweep / "params.csv")
    held = list(info["held_out"])
    if not held:
        sys.exit(f"run.py: {sweep} has no held-out cases (a grid needs 3 values of a parameter for one)")
    tag = sweep / args.tag
    force = ["--force"] if args.force else []
    log: list[dict] = []
    started = time.perf_counter()

    collapse = [] if args.no_collapse_2d else ["--collapse-2d"]
    mean_field = [] if args.no_mean_field else ["--mean-field"]
    dataset_to_run(args, names, held, ["--same-mesh", *collapse, *mean_field], train_options, log)
    command(["predict", str(tag / "run"), "--data", str(tag / "data"), "--out", str(tag / "pred"),
             "--nproc", str(args.nproc), "--samples", "val", "--checkpoint", "last", "--boundary", ",".join(WALLS),
             *force], log, "predict")

    # the errors, in physical units, on the held-out cases
    data = open_dataset(tag / "data")
    stored = [e["name"] for e in data.meta["samples"]]
    fields = {name: read_fields(data, stored.index(name)) for name in names}
    num_nodes = len(fields[names[0]]["p"])
    forces: dict[str, dict[str, list[float]]] = {}
    metrics = json.loads((tag / "pred" / "metrics.json").read_text())
    train_ids = [i for i, n in enumerate(names) if n not in held]
    rows: dict[str, dict[str, list[float]]] = {}
    per_case = {}
    for name in held:
        case = names.index(name)
        truth = fields[name]
        pred, record = meshshard_prediction(tag / "pred", metrics, name, num_nodes)
        made = {"meshshard": (pred, f"{args.tag}/pred/{record['file']}")}
        made |= baselines(names, params, values, fields, train_ids, case)
        per_case[name] = {"params": dict(zip(params, values[case].tolist())), "errors": {}, "from": {},
                          "force_errors": {}, "metrics.json": {f: record["fields"][f]["rel_l2"] for f in FIELDS},
                          "metrics.json force": {w: record["boundaries"][w]["force"] for w in WALLS}}
        true_force = wall_forces(data, truth)
        per_case[name]["force"] = {w: f.tolist() for w, f in true_force.items()}
        for method, (guess, source) in made.items():
            err = {f: rel_l2(guess[f], truth[f]) for f in FIELDS}
            per_case[name]["errors"][method] = err
            per_case[name]["from"][method] = source
            for f in FIELDS:
                rows.setdefault(method, {g: [] for g in FIELDS})[f].append(err[f])
            guessed = wall_forces(data, guess)
            f_err = {w: float(np.linalg.norm(guessed[w] - true_force[w]) / np.linalg.norm(true_force[w]))
                     for w in WALLS}
            per_case[name]["force_errors"][method] = f_err
            for w in WALLS:
                forces.setdefault(method, {v: [] for v in WALLS})[w].append(f_err[w])
    rows = {m: e for m, e in rows.items() if len(e["p"]) == len(held)}  # a baseline every case has
    forces = {m: forces[m] for m in rows}
    text = table(rows, held)
    print("\nrelative L2 error on the held-out cases, physical units (p; U as a vector)\n" + text)
    force_text = force_table(forces, held)
    print("\nerror of the pressure force on each wall, |F - F_true| / |F_true|, on the held-out cases\n" + force_text)

    # the two targets: better than the mean on every case; within 2x of the best interpolation
    ours = rows["meshshard"]
    interp = [m for m in rows if m.startswith("interpolation")]
    verdict = {"better than the training mean on every case": all(
        ours[f][i] < rows[m][f][i] for m in ("training mean", "training mean, rescaled") for f in FIELDS
        for i in range(len(held)))}
    for f in FIELDS:
        best = min((np.mean(rows[m][f]), m) for m in interp) if interp else (math.nan, None)
        verdict[f"{f}: meshshard / best interpolation ({best[1]})"] = float(np.mean(ours[f]) / best[0])
    for key, value in verdict.items():
        print(f"  {key}: {value if isinstance(value, bool) else format(value, '.2f') + 'x'}")

    write_results(tag, args, train_options, log, started, held_out=held,
                  checkpoint={"name": metrics.get("checkpoint"), "step": metrics.get("step")},
                  summary={m: {f: {"mean": float(np.mean(e[f])), "worst": float(np.max(e[f]))} for f in FIELDS}
                           for m, e in rows.items()},
                  force_summary={m: {w: {"mean": float(np.mean(e[w])), "worst": float(np.max(e[w]))}
                                     for w in WALLS} for m, e in forces.items()},
                  verdict=verdict, cases=per_case, table=text, force_table=force_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
