"""Is the learned rollout worth anything? Two baselines on the held-out trajectories.

- **persistence**: the state stays at its initial value (step 0), forever;
- **training mean per step**: at step t, the mean over the training trajectories of their state
  at step t (what one would guess knowing the training runs but not this one's start).

Their errors are measured as ``meshshard predict --rollout`` measures the model's (see
docs/transient.md): per trajectory and state field, after n applications of the stride, the
root mean square error over the interior nodes (the classes that are not boundary) and the
field's components, in physical units. ``RMSE-1``, ``RMSE-10``: after 1 and 10 applications;
``RMSE-1..10``: over the first 10 applications together; ``RMSE-all``: over every application;
each the mean over the held-out trajectories (as ``metrics.json``'s ``mean``).

The dataset is read through the public API (:func:`meshshard.partition.open_trajectories`); the
model's figures come from ``PRED/metrics.json``.

    python examples/transient/baselines.py tr/data tr/pred
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from meshshard.data import open_trajectories

FIRST = 10  # "the first 10 steps": the applications the verdict compares


def summary(mse: np.ndarray) -> dict[str, float]:
    """RMSE-1, RMSE-10, RMSE-1..10 and RMSE-all of per-application mean squares ``mse`` (n,)."""
    out = {"rmse_1": float(np.sqrt(mse[0]))}
    if len(mse) >= FIRST:
        out["rmse_10"] = float(np.sqrt(mse[FIRST - 1]))
    out["rmse_1_10"] = float(np.sqrt(mse[:FIRST].mean()))
    out["rmse_all"] = float(np.sqrt(mse.mean()))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="the trajectory dataset (meshshard dataset --state)")
    p.add_argument("pred", type=Path, help="the rollouts of the validation trajectories (meshshard predict --rollout)")
    args = p.parse_args()
    try:
        trajectories = open_trajectories(args.data)
        metrics = json.loads((args.pred / "metrics.json").read_text())
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    data = trajectories.dataset
    stride = trajectories.time_stride
    train, val = [int(k) for k in data.train], [int(k) for k in data.val]
    nodes = {data.num_nodes(k) for k in train + val}
    if len(nodes) != 1:
        print(f"error: {args.data}: the training-mean baseline needs one mesh for every trajectory (got node counts "
              f"{sorted(nodes)})", file=sys.stderr)
        return 2
    ids = np.arange(nodes.pop())
    # the training mean at every step: the trajectories may differ in length, so count per step
    longest = max(trajectories.num_steps(k) for k in train)
    total = np.zeros((longest, len(ids), len(trajectories.state_channels)))
    count = np.zeros(longest)
    for k in train:
        states = np.asarray(trajectories.state_array(k), dtype=np.float64)
        total[: len(states)] += states
        count[: len(states)] += 1
    model_of = {s["name"]: s for s in metrics["samples"]}
    rows: dict[str, list[dict[str, float]]] = {"persistence": [], "training mean per step": [], "model": []}
    for k in val:
        name = trajectories.names[k]
        if name not in model_of:
            print(f"error: {args.pred}/metrics.json: no rollout of the validation trajectory {name!r} (run predict "
                  "--rollout with --samples val)", file=sys.stderr)
            return 2
        interior = ~trajectories.boundary[trajectories.class_index(trajectories.node_type(k, ids))]
        states = np.asarray(trajectories.state_array(k), dtype=np.float64)[:, interior]
        steps = np.arange(stride, len(states), stride)  # the truth after 1, 2, ... applications
        steps = steps[steps < longest]
        known = count[steps] > 0
        steps = steps[known]
        mean = total[steps][:, interior] / count[steps, None, None]
        persist = ((states[steps] - states[0]) ** 2).mean(axis=(1, 2))
        rows["persistence"].append(summary(persist))
        rows["training mean per step"].append(summary(((states[steps] - mean) ** 2).mean(axis=(1, 2))))
        # the model: predict's per-application RMSE (every state field together, as the baselines)
        fields = model_of[name]["fields"]
        widths = [len([c for c in trajectories.state_channels if c.split("[")[0] == f]) or 1 for f in fields]
        per_field = [np.array([np.nan if v is None else v for v in fields[f]["rollout"]["rmse"]]) ** 2 for f in fields]
        model = sum(w * e[: len(steps)] for w, e in zip(widths, per_field, strict=True)) / sum(widths)
        rows["model"].append(summary(model))
    keys = ["rmse_1", "rmse_10", "rmse_1_10", "rmse_all"]
    heads = ["RMSE-1", "RMSE-10", "RMSE-1..10", "RMSE-all"]
    print(f"held-out trajectories: {', '.join(trajectories.names[k] for k in val)}; state "
          f"{', '.join(trajectories.state_channels)}; RMSE over interior nodes, physical units, mean over trajectories")
    print(f"{'':<24}" + "".join(f"{h:>12}" for h in heads))
    table = {}
    for label, found in rows.items():
        table[label] = {key: float(np.mean([r[key] for r in found])) if all(key in r for r in found) else None
                        for key in keys}
        print(f"{label:<24}" + "".join(f"{'-' if v is None else f'{v:.4g}':>12}" for v in table[label].values()))
    beats = [table["model"][key] < min(table["persistence"][key], table["training mean per step"][key])
             for key in ("rmse_1", "rmse_10", "rmse_1_10") if table["model"][key] is not None]
    verdict = "yes" if all(beats) else "no"
    print(f"model beats both baselines over the first {FIRST} steps (RMSE-1, RMSE-10 and RMSE-1..10): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
