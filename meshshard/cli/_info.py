"""``meshshard info FOLDER``: what a partition, dataset, run or prediction folder holds.

Partition and dataset folders are described by ``meshshard.cli._partition`` (no torch is imported
for them). A run folder of ``meshshard train`` (``checkpoint.pt``) is described from
:func:`meshshard.run.run_summary`: its checkpoint (read as tensors and plain values only, checksum
checked) and its ``log.jsonl``: the model and how to rebuild it for ``meshshard predict``, the
settings, the data and partition it trained on, the steps done and the loss. A prediction folder of
``meshshard predict`` (``metrics.json``) is described from that file alone
(:func:`meshshard.run.prediction_summary`): the run and data it came from, the step, the samples,
whether it finished, and the mean errors per target field; with ``--compare PRED_BASE``, its
errors beside another prediction folder's (:func:`meshshard.run.comparison_table`), such as a
``meshshard baseline``'s.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ._fields import field_list

__all__ = ["describe_prediction", "describe_run", "register"]


def describe_run(summary: dict[str, Any]) -> str:
    """The readable summary ``meshshard info RUN`` prints."""
    m = summary["model"]
    if m["kind"] == "your own":
        args = f" --model-args {shlex.quote(json.dumps(m['model_args']))}" if m["model_args"] else ""
        model = (f"your own, {m['spec']}{args}, {summary['parameters']:,} parameters "
                 f"(meshshard predict needs --model {shlex.quote(m['spec'])})")
    elif m["kind"] in ("Transolver", "BallAttentionNet"):
        from meshshard.run import BALL_ATTENTION_DEFAULTS, TRANSOLVER_DEFAULTS

        defaults = TRANSOLVER_DEFAULTS if m["kind"] == "Transolver" else BALL_ATTENTION_DEFAULTS
        settings = ", ".join(f"{k} {v}" for k, v in {**defaults, **m["model_args"]}.items())
        model = f"{m['kind']}, {settings}, {summary['parameters']:,} parameters"
    else:
        attention = (f", a physics-attention block every {m['global_attention']} steps"
                     if m.get("global_attention") else "")
        model = (f"MeshGraphNet, latent {m['latent_size']}, {m['hidden_layers']} hidden layers, "
                 f"{m['message_passing_steps']} message-passing steps, {m['activation']}{attention}, "
                 f"{summary['parameters']:,} parameters")
    s = summary["settings"]
    loss, val = summary["loss"], summary["val_loss"]
    fields = field_list(summary["targets"])
    lines = [
        f"{summary['run']}: meshshard run, {summary['step']} of {summary['steps']} steps done, "
        f"on {summary['world_size']} rank(s)",
        f"  model      {model}",
        f"  settings   lr {s['lr']:g}, {s['dtype']}, precision {s['precision']}, seed {s['seed']}, "
        f"data-parallel {s['data_parallel']}, checkpoint every {s['checkpoint_every']} steps",
        f"  data       {summary['data']} (inputs {', '.join(summary['inputs'])} -> targets {fields})",
        f"  partition  {summary['partition']}",
    ]
    task = summary.get("task") or {}
    if task.get("name") == "transient":  # what a transient run learnt: the one-step map, and how
        lines.append(f"  task       transient: the one-step map, training noise {task['noise_std']:g} (normalised), "
                     f"{task['rollout_train']} step(s) unrolled per sample (meshshard predict --rollout)")
    if task.get("loss_weight"):
        from meshshard.tasks import describe_weighted

        weighted = ", ".join(f"{describe_weighted(name)} x{w:g}" for name, w in task["loss_weight"].items())
        lines.append(f"  weights    the loss weighs the nodes of {weighted}, every other node x1 (--loss-weight)")
    if task.get("force_loss"):
        terms = ", ".join(f"{name} x{w:g}" for name, w in task["force_loss"].items())
        lines.append(f"  forces     the loss adds the squared error of the integral over {terms} (--force-loss)")
    if task.get("relative_loss"):
        lines.append("  relative   each sample's loss is divided by what predicting the training mean loses on it "
                     "(--relative-loss)")
    if loss["last"] is not None:
        lines.append(f"  loss       first {loss['first']:.5g}, last {loss['last']:.5g}, "
                     f"best {loss['best']:.5g} at step {loss['best_step']}")
    if val is not None:
        lines.append(f"  val loss   last {val['last']:.5g} at step {val['last_step']}, "
                     f"best {val['best']:.5g} at step {val['best_step']}")
    rolled = summary.get("val_rollout_rmse")
    if rolled is not None:
        lines.append(f"  val rollout RMSE ({rolled['steps']} steps, normalised) last {rolled['last']:.5g} at step "
                     f"{rolled['last_step']}, best {rolled['best']:.5g} at step {rolled['best_step']} (best.pt)")
    return "\n".join(lines)


def describe_prediction(summary: dict[str, Any]) -> str:
    """The readable summary ``meshshard info PRED`` prints."""
    from meshshard.partition import MAX_LISTED, listed, plural

    samples = summary["samples"]
    count = plural(len(samples), "sample")
    state = (f"complete, {count}" if summary["complete"] else
             f"stopped part-way: {count} finished (a rerun into this folder needs --force)")
    ranks = f" on {summary['world_size']} rank(s)" if summary["world_size"] is not None else ""
    shown = [f"{r['name']} ({r['num_nodes']:,} nodes)" if isinstance(r["num_nodes"], int) else str(r["name"])
             for r in samples[:MAX_LISTED]]
    lines = [
        f"{summary['prediction']}: meshshard prediction{ranks}, {state}",
        (f"  baseline   {summary['baseline'].get('method')} of {summary['baseline'].get('training_samples')} "
         "training samples (meshshard baseline)" if summary.get("baseline") else
         f"  run        {summary['run']}" + (f" (step {summary['step']})" if summary["step"] is not None else "")),
        f"  data       {summary['data']}",
        f"  samples    {listed(shown, len(samples)) or 'none yet'}",
    ]
    if not summary["targets_known"]:
        lines.append("  errors     none: the data has no targets (predictions only)")
    else:
        over = "all samples" if summary["complete"] else f"the {count} finished"
        for i, (name, e) in enumerate(summary["mean"].items()):
            rmse = "-" if e["rmse"] is None else format(e["rmse"], ".4g")
            rel = "-" if e["rel_l2"] is None else format(e["rel_l2"], ".3%")
            area = ("" if "rel_l2_area" not in e else
                    f", area-weighted rel L2 {'-' if e['rel_l2_area'] is None else format(e['rel_l2_area'], '.3%')}")
            lines.append(f"  {'mean' if i == 0 else '':<10} {name}: RMSE {rmse}, rel L2 {rel}{area}"
                         + (f" (over {over})" if i == 0 else ""))
    return "\n".join(lines)


def _either(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1]


def _not_described(path: Path) -> str | None:
    """Why ``meshshard info`` cannot describe ``path`` (a file, or a folder of none of its kinds);
    None when it may be one of them, or is missing (the partition layer's error says so)."""
    from meshshard.data import FOLDER_KINDS, kinds_of

    # the kinds info describes, in the table's order; a dataset's partitions (a folder with
    # partitions.json) an error need not name
    named = [kind for kind in FOLDER_KINDS.values() if kind.name != "partitions"]
    kinds = f"a {_either([kind.name for kind in named])} folder"
    if path.exists() and not path.is_dir():
        return f"{path}: is a file; meshshard info takes a folder ({kinds})"
    if path.is_dir() and not kinds_of(path):
        return f"{path}: not {kinds} (no {_either([kind.marker for kind in named])} in it)"
    return None


def _is_prediction(path: Path) -> bool:
    """A folder with metrics.json and none of a partition or dataset folder's own files."""
    from meshshard.data import kinds_of

    found = {kind.name for kind in kinds_of(path)}
    return "prediction" in found and not found & {"partition", "dataset", "partitions"}


def _fail(message: str) -> int:
    print(f"meshshard info: error: {message}", file=sys.stderr)
    return 2


def _cmd_info(args: argparse.Namespace) -> int:
    path = Path(args.dir)
    why = _not_described(path)
    if why is not None:
        return _fail(why)
    from meshshard.data import FOLDER_KINDS

    run = (path / FOLDER_KINDS["run"].marker).is_file()
    if not run and not _is_prediction(path):
        from ._partition import _cmd_info as partition_info

        return partition_info(args)
    from meshshard.run import comparison_table, prediction_summary, run_summary

    if args.compare is not None and run:
        return _fail(f"{path}: --compare takes a prediction folder (of meshshard predict or baseline), not a run")
    try:
        summary = run_summary(args.dir) if run else prediction_summary(args.dir)
        table = comparison_table(args.dir, args.compare) if args.compare is not None else None
    except (ValueError, OSError) as err:
        return _fail(str(err))
    if table is not None:
        print(table)
        return 0
    describe = describe_run if run else describe_prediction
    print(json.dumps(summary, indent=2) if args.json else describe(summary))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("info", help="print a partition, dataset, run or prediction folder's metadata",
                              description="Print what a partition folder, a dataset folder, a run folder of "
                              "meshshard train or a prediction folder of meshshard predict holds "
                              "(--json: as one JSON object).")
    p.add_argument("dir", help="partition, dataset, run or prediction folder")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p.add_argument("--compare", default=None, metavar="PRED_BASE",
                   help="with a prediction folder: a table of its errors beside those of another prediction folder "
                   "(a meshshard baseline's): per target, per boundary, the force coefficients' MAE, R² and Spearman")
    p.set_defaults(func=_cmd_info)
