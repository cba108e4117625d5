"""``meshshard info FOLDER``: what a partition, dataset or run folder holds.

Partition and dataset folders are described by :mod:`meshshard.partition` (no torch is imported
for them). A run folder of ``meshshard train`` (``checkpoint.pt``) is described here from its
checkpoint (read as tensors and plain values only, checksum checked) and its ``log.jsonl``: the
model and how to rebuild it for ``meshshard predict``, the settings, the data and partition it
trained on, the steps done and the loss.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ["describe_run", "run_summary", "register"]


def run_summary(run: str | Path) -> dict[str, Any]:
    """The facts ``meshshard info RUN`` prints, as plain values (``--json``)."""
    from meshshard._predict import read_run, run_target_fields
    from meshshard._runlog import read_log

    ckpt = read_run(run)
    cfg = dict(ckpt.get("config") or {})
    norm = cfg.pop("normalisation", None) or {}
    records = read_log(Path(run) / "log.jsonl")
    losses = [float(v) for v in ckpt.get("losses", [])]
    val = [(int(r["step"]), float(r["val_loss"])) for r in records if "val_loss" in r]
    finite = [(i, v) for i, v in enumerate(losses) if math.isfinite(v)]
    best = min(finite, key=lambda iv: iv[1]) if finite else None
    model = cfg.get("model") or ""
    return {
        "run": str(run),
        "step": int(ckpt.get("step", 0)),
        "steps": cfg.get("steps"),
        "world_size": ckpt.get("world_size"),
        # the weights trained, as the banner counts them (a checkpoint from before it was recorded: the
        # state dict, buffers included)
        "parameters": int(cfg.get("num_parameters") or sum(v.numel() for v in (ckpt.get("model") or {}).values())),
        "model": ({"kind": "your own", "spec": model, "model_args": cfg.get("model_args") or {}} if model else
                  {"kind": "MeshGraphNet", **{k: cfg.get(k) for k in ("latent_size", "hidden_layers",
                                                                      "message_passing_steps", "activation")}}),
        "settings": {k: cfg.get(k) for k in ("lr", "dtype", "precision", "seed", "data_parallel", "checkpoint_every")},
        "data": cfg.get("data"),
        "partition": cfg.get("partition"),
        "inputs": list(norm.get("input_channels", [])),
        "targets": run_target_fields(ckpt),
        "loss": {"first": losses[0] if losses else None, "last": losses[-1] if losses else None,
                 "best": best[1] if best else None, "best_step": best[0] if best else None},
        "val_loss": {"last": val[-1][1], "last_step": val[-1][0],
                     "best": min(v for _, v in val), "best_step": min(val, key=lambda sv: sv[1])[0]} if val else None,
    }


def describe_run(summary: dict[str, Any]) -> str:
    """The readable summary ``meshshard info RUN`` prints."""
    from meshshard.partition._dataset_cli import field_list

    m = summary["model"]
    if m["kind"] == "your own":
        args = f" --model-args {shlex.quote(json.dumps(m['model_args']))}" if m["model_args"] else ""
        model = (f"your own, {m['spec']}{args}, {summary['parameters']:,} parameters "
                 f"(meshshard predict needs --model {shlex.quote(m['spec'])})")
    else:
        model = (f"MeshGraphNet, latent {m['latent_size']}, {m['hidden_layers']} hidden layers, "
                 f"{m['message_passing_steps']} message-passing steps, {m['activation']}, {summary['parameters']:,} parameters")
    s = summary["settings"]
    loss, val = summary["loss"], summary["val_loss"]
    fields = field_list(summary["targets"])
    lines = [
        f"{summary['run']}: meshshard run, {summary['step']} of {summary['steps']} steps done, on {summary['world_size']} rank(s)",
        f"  model      {model}",
        f"  settings   lr {s['lr']:g}, {s['dtype']}, precision {s['precision']}, seed {s['seed']}, "
        f"data-parallel {s['data_parallel']}, checkpoint every {s['checkpoint_every']} steps",
        f"  data       {summary['data']} (inputs {', '.join(summary['inputs'])} -> targets {fields})",
        f"  partition  {summary['partition']}",
    ]
    if loss["last"] is not None:
        lines.append(f"  loss       first {loss['first']:.5g}, last {loss['last']:.5g}, "
                     f"best {loss['best']:.5g} at step {loss['best_step']}")
    if val is not None:
        lines.append(f"  val loss   last {val['last']:.5g} at step {val['last_step']}, best {val['best']:.5g} at step {val['best_step']}")
    return "\n".join(lines)


#: The file that marks each kind of folder info describes, in the order its messages name them
#: (a dataset's partitions are a folder with partitions.json, which an error need not name).
_MARKERS = {"partition": "partition.json", "dataset": "dataset.json", "run": "checkpoint.pt"}


def _either(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1]


def _not_described(path: Path) -> str | None:
    """Why ``meshshard info`` cannot describe ``path`` (a file, or a folder of none of its kinds);
    None when it may be one of them, or is missing (the partition layer's error says so)."""
    kinds = f"a {_either(list(_MARKERS))} folder"
    if path.exists() and not path.is_dir():
        return f"{path}: is a file; meshshard info takes a folder ({kinds})"
    if path.is_dir() and not any((path / name).exists() for name in (*_MARKERS.values(), "partitions.json")):
        return f"{path}: not {kinds} (no {_either(list(_MARKERS.values()))} in it)"
    return None


def _fail(message: str) -> int:
    print(f"meshshard info: error: {message}", file=sys.stderr)
    return 2


def _cmd_info(args: argparse.Namespace) -> int:
    path = Path(args.dir)
    why = _not_described(path)
    if why is not None:
        return _fail(why)
    if not (path / "checkpoint.pt").is_file():
        from meshshard.partition._cli import _cmd_info as partition_info

        return partition_info(args)
    try:
        summary = run_summary(args.dir)
    except (ValueError, OSError) as err:
        return _fail(str(err))
    print(json.dumps(summary, indent=2) if args.json else describe_run(summary))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("info", help="print a partition, dataset or run folder's metadata",
                              description="Print what a partition folder, a dataset folder or a run folder of "
                              "meshshard train holds (--json: as one JSON object).")
    p.add_argument("dir", help="partition, dataset or run folder")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p.set_defaults(func=_cmd_info)
