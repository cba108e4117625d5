"""The ``meshshard dataset`` subcommand, and what ``meshshard info`` / ``meshshard partition`` do
with a dataset folder (called from :mod:`meshshard.partition._cli`).

Errors print one line ``meshshard <command>: error: <file>: <problem>`` and return 2; nothing is
left behind (the dataset is written to a temporary folder and renamed at the end). Heavy modules
(meshio) are imported inside the commands; nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["register", "describe_dataset", "run_partition_dataset", "run_info", "run_verify"]


def _error(command: str, err: BaseException) -> int:
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"meshshard {command}: error: {message}", file=sys.stderr)
    return 2


def _stats_line(name: str, channels: list[str], stats: Mapping[str, Any]) -> list[str]:
    lines = [f"  {name:<8} {'channel':<12} {'mean':>12} {'std':>12} {'scale':>12}   ({stats['count']:,} rows)"]
    for ch, mean, std, scale in zip(channels, stats["mean"], stats["std"], stats["scale"]):
        lines.append(f"  {'':<8} {ch:<12} {mean:>12.5g} {std:>12.5g} {scale:>12.5g}")
    return lines


def field_list(fields: Sequence[Mapping[str, Any]]) -> str:
    """``T, u (3)``: field names, with the component count of vector fields."""
    return ", ".join(f["name"] if f["components"] == 1 else f"{f['name']} ({f['components']})" for f in fields)


def describe_dataset(folder: str | Path, meta: Mapping[str, Any]) -> str:
    """The readable summary ``meshshard info DATA`` prints."""
    nodes = [m["num_nodes"] for m in meta["meshes"]]
    split = meta["split"]
    cells = {}
    for m in meta["meshes"]:
        for t, c in m["cells"].items():
            cells[t] = cells.get(t, 0) + c
    mesh = (f"one mesh, {nodes[0]:,} nodes, {meta['meshes'][0]['num_edges']:,} directed edges"
            if meta["kind"] == "one-mesh" else
            f"{len(nodes)} distinct meshes, {min(nodes):,} to {max(nodes):,} nodes")
    norm = meta["normalisation"]
    val = (f"train {len(split['train'])}, val {len(split['val'])}: "
           f"{', '.join(meta['samples'][i]['name'] for i in split['val'][:8])}{' ...' if len(split['val']) > 8 else ''}"
           if split["val"] else "no validation split")
    lines = [
        f"{folder}: {meta['format']} v{meta['format_version']}, kind {meta['kind']} ({mesh})",
        f"  samples  {meta['num_samples']} ({val})",
        f"  inputs   {field_list(meta['inputs'])}",
        f"  targets  {field_list(meta['targets']) or 'none: inputs only, cases for meshshard predict (train needs targets)'}",
        f"  cells    {', '.join(f'{t} {c:,}' for t, c in cells.items()) or 'none (edge_index)'}; stored {meta['dtype']}",
        f"  normalisation over the training split: {norm['rule']}",
        *_stats_line("inputs", meta["input_channels"], norm["inputs"]),
        *(_stats_line("targets", meta["target_channels"], norm["targets"]) if meta["target_channels"] else []),
        *_stats_line("edges", meta["edge_channels"], norm["edges"]),
    ]
    return "\n".join(lines)


def run_info(folder: str, as_json: bool) -> int:
    """``meshshard info DATA`` (a dataset folder) or ``meshshard info PARTS`` (a dataset's partitions)."""
    from meshshard.partition._dataset import (PARTITIONS_FILE, dump_metadata, read_dataset_metadata,
                                              read_partitions_metadata)

    try:
        if (Path(folder) / PARTITIONS_FILE).is_file():
            meta = read_partitions_metadata(folder)
            if as_json:
                sys.stdout.write(json.dumps(meta, indent=2) + "\n")
            else:
                nodes = [m["num_nodes"] for m in meta["meshes"]]
                print(f"{folder}: {meta['format']} v{meta['format_version']}: {len(nodes)} partitions into "
                      f"{meta['num_parts']} parts (meshes of {min(nodes):,} to {max(nodes):,} nodes), one "
                      f"partition folder per mesh: mesh-00000 ... (meshshard info {folder}/mesh-00000)")
            return 0
        meta = read_dataset_metadata(folder)
    except ValueError as err:
        return _error("info", err)
    sys.stdout.write(dump_metadata(meta) if as_json else describe_dataset(folder, meta) + "\n")
    return 0


def run_verify(folder: str, verify_one: Callable[[argparse.Namespace], int]) -> int:
    """``meshshard verify PARTS`` for a dataset's partitions: every mesh's partition folder, and
    that each was made from the mesh ``partitions.json`` names (exit 1 when anything fails)."""
    from meshshard.partition._dataset import PARTITIONS_FILE, read_partitions_metadata
    from meshshard.partition._format import read_metadata

    try:
        meta = read_partitions_metadata(folder)
    except ValueError as err:
        return _error("verify", err)
    code = 0
    for entry in meta["meshes"]:
        sub = Path(folder) / entry["folder"]
        code = max(code, verify_one(argparse.Namespace(dir=str(sub))))
        try:
            recorded = read_metadata(sub).get("input", {}).get("sha256")
        except ValueError:
            continue  # already reported by verify_one
        if recorded != entry["sha256"]:
            print(f"FAIL {sub}: made from another mesh than {PARTITIONS_FILE} says (checksum "
                  f"{str(recorded)[:12]} vs {entry['sha256'][:12]})")
            code = 1
    return code


def run_partition_dataset(args: argparse.Namespace) -> int:
    """``meshshard partition DATA --parts K --out PARTS``."""
    from meshshard.partition._dataset import open_dataset
    from meshshard.partition._dataset_build import partition_dataset
    from meshshard.partition._progress import Steps

    ignored = [flag for flag, value in (("--graph", args.graph), ("--tpwgts", args.tpwgts),
                                        ("--grid", getattr(args, "grid", None))) if value is not None]
    ignored += [flag for flag, on in (("--recursive", args.recursive),) if on]
    if ignored or args.format != "auto":
        return _error("partition", ValueError(
            f"{args.input}: {', '.join(ignored) or '--format'} does not apply to a dataset folder "
            "(its meshes' nodal graphs, or stored edges, are partitioned)"))
    try:
        dataset = open_dataset(args.input)
        with Steps(enabled=not args.quiet) as steps, steps.step("meshes", total=dataset.num_meshes) as advance:
            out = partition_dataset(args.input, args.out, args.parts, method=args.method,
                                    halo_hops=args.halo_hops, imbalance=args.imbalance, seed=args.seed,
                                    force=args.force, progress=advance)
    except (ValueError, OSError, MemoryError) as err:
        return _error("partition", err)
    if not args.quiet:
        what = "1 mesh" if dataset.kind == "one-mesh" else f"{dataset.num_meshes} meshes"
        print(f"wrote {out}: {what} of {args.input} in {args.parts} parts ({steps.seconds['meshes']:.1f} s)")
    return 0


def _cmd_dataset(args: argparse.Namespace) -> int:
    from meshshard.partition._dataset import read_dataset_metadata
    from meshshard.partition._dataset_build import build_dataset, list_sources
    from meshshard.partition._progress import Steps

    val_samples = None if args.val_samples is None else [t for t in args.val_samples.split(",") if t.strip()]
    try:
        files = list_sources(args.sources)
        with Steps(enabled=not args.quiet) as steps, steps.step("samples", total=len(files)) as advance:
            out = build_dataset(args.sources, args.out, inputs=args.inputs, targets=args.targets,
                                val_fraction=args.val_fraction, val_samples=val_samples, dtype=args.dtype,
                                force=args.force, progress=advance)
    except (ValueError, OSError, MemoryError) as err:
        return _error("dataset", err)
    if not args.quiet:
        print(describe_dataset(out, read_dataset_metadata(out)))
        print(f"wrote {out} in {steps.seconds['samples']:.1f} s")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``dataset`` sub-parser."""
    help = "make a dataset folder from mesh files with point_data fields (one sample per file)"
    p = subparsers.add_parser("dataset", help=help, description=help + ". Inputs and targets are "
                              "point_data field names; a vector field counts as its components (u is "
                              "u[0], u[1], ...; u[1] alone is one channel); pos is the node coordinates.")
    p.set_defaults(func=_cmd_dataset)
    p.add_argument("sources", nargs="*", metavar="SOURCES",
                   help="mesh files (any format meshio reads) or folders of them")
    p.add_argument("--out", "-o", required=True, help="dataset folder to create")
    p.add_argument("--inputs", required=True, help="comma-separated input fields, e.g. T_in,pos")
    p.add_argument("--targets", default=None,
                   help="comma-separated target fields, e.g. T_out; leave out for new cases to predict on "
                   "(inputs only: for meshshard predict, not train)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=None,
                       help="fraction of samples for validation, drawn by a fixed permutation (default 0.2; 0 without --targets)")
    split.add_argument("--val-samples", default=None,
                       help="comma-separated validation samples: indices or names (file names without extension)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="stored precision")
    p.add_argument("--force", action="store_true", help="replace an existing dataset folder (only one)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, no summary")
