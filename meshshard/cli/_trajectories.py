"""``meshshard dataset SOURCES --state NAMES``: trajectories to a dataset folder, and what
``meshshard info DATA`` prints of one (format: :mod:`meshshard.data._trajectories`).

Called from :mod:`meshshard.cli._dataset`, which parses the arguments: errors are one line
``meshshard dataset: error: ...`` and exit 2, with nothing left behind.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from ._fields import field_list, stats_lines

__all__ = ["TRAJECTORY_ONLY", "add_arguments", "check_steady", "describe_trajectories", "run_trajectories"]

#: The options of trajectories alone, with the value that means "not given".
TRAJECTORY_ONLY = {"--node-type": ("node_type", None), "--time-stride": ("time_stride", None),
                   "--interior-classes": ("interior_classes", None)}
#: The options of steady samples alone.
_STEADY_ONLY = {"--targets": "targets", "--params": "params", "--target-scale": "target_scale",
                "--cell-data-to-points": "cell_data_to_points", "--collapse-2d": "collapse_2d",
                "--wall-distance": "wall_distance", "--wall-normal": "wall_normal",
                "--signed-distance": "signed_distance", "--same-mesh": "same_mesh",
                "--boundary-classes": "boundary_classes", "--graph": "graph", "--max-points": "max_points",
                "--mean-field": "mean_field", "--mean-field-from": "mean_field_from", "--map-along": "map_along",
                "--position-prior-inputs": "position_prior_inputs",
                "--mirror": "mirror",
                "--mirror-params": "mirror_params", "--mirror-in-prior": "mirror_in_prior"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``meshshard dataset`` for trajectories."""
    p.add_argument("--state", default=None, action="append", metavar="NAMES",
                   help="trajectories: comma-separated dynamic fields, the input at step t and the target at step "
                   "t+S; each SOURCE is then one trajectory (a .pvd, an .xdmf time series, or a folder of numbered "
                   "files such as foamToVTK's), and --inputs (optional) names static fields")
    p.add_argument("--node-type", default=None, metavar="FIELD",
                   help="trajectories: a point field of integer node classes (0 interior; default: the boundary "
                   "tags the files carry, such as gmsh physical groups, cell sets or a .vtm's patches)")
    p.add_argument("--interior-classes", default=None, metavar="IDS",
                   help="trajectories: comma-separated classes (ids or names) whose state is predicted and in the "
                   "loss (default 0); every other class is boundary: prescribed in a rollout, out of the loss")
    p.add_argument("--time-stride", type=int, default=None, metavar="S",
                   help="trajectories: steps from an input state to its target (default 1)")


def run_trajectories(args: argparse.Namespace, note: Callable[[str], None],
                     error: Callable[[str, BaseException], int]) -> int:
    """``meshshard dataset SOURCES --out DATA --state NAMES ...``."""
    from meshshard.data import build_trajectories, read_dataset_metadata
    from meshshard.partition import Steps

    given = [flag for flag, attr in _STEADY_ONLY.items() if getattr(args, attr, None) not in (None, False)]
    if given:
        return error("dataset", ValueError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to "
                                           "trajectories (--state); leave it out, or make a dataset of steady "
                                           "samples with --targets instead of --state"))
    val_samples = None if args.val_samples is None else [t for v in args.val_samples for t in v.split(",") if t.strip()]
    try:
        with Steps(enabled=not args.quiet) as steps, steps.step("trajectories", total=len(args.sources)) as advance:
            out = build_trajectories(args.sources, args.out, state=args.state, inputs=args.inputs,
                                     node_type=args.node_type, interior_classes=args.interior_classes,
                                     time_stride=1 if args.time_stride is None else args.time_stride,
                                     val_fraction=args.val_fraction, val_samples=val_samples, dtype=args.dtype,
                                     force=args.force, progress=advance, notes=note)
    except (ValueError, OSError, MemoryError) as err:
        return error("dataset", err)
    if not args.quiet:
        print(describe_trajectories(out, read_dataset_metadata(out)))
        print(f"wrote {out} in {steps.seconds['trajectories']:.1f} s")
    return 0


def _times(times: list[float]) -> str:
    """``t 0 .. 0.3, dt 0.1``: a trajectory's times (its step when uniform)."""
    import numpy as np

    t = np.asarray(times, dtype=np.float64)
    dt = np.diff(t)
    uniform = len(dt) and np.allclose(dt, dt[0], rtol=1e-6, atol=0)
    return f"t {t[0]:.6g} .. {t[-1]:.6g}" + (f", dt {dt[0]:.6g}" if uniform else ", uneven dt")


def describe_trajectories(folder: Any, meta: Mapping[str, Any], limit: int = 8) -> str:
    """The readable summary ``meshshard info DATA`` prints of a trajectory dataset."""
    from meshshard.partition import plural

    nodes = [m["num_nodes"] for m in meta["meshes"]]
    split = meta["split"]
    mesh = (f"one mesh, {nodes[0]:,} nodes" if len(nodes) == 1 else
            f"{len(nodes)} distinct meshes, {min(nodes):,} to {max(nodes):,} nodes")
    val = set(split["val"])
    stride = meta["time_stride"]
    lines = [f"{folder}: {meta['format']} v{meta['format_version']}, trajectories (task {meta['task']}), kind "
             f"{meta['kind']} ({mesh})",
             f"  trajectories {meta['num_samples']} (train {len(split['train'])}, val {len(split['val'])}; split by "
             "trajectory)"]
    for i, s in enumerate(meta["samples"][:limit]):
        lines.append(f"    {s['name']:<16} {plural(s['num_steps'], 'step')}, {_times(s['times'])}, mesh {s['mesh']} "
                     f"({nodes[s['mesh']]:,} nodes){', val' if i in val else ''}")
    if len(meta["samples"]) > limit:
        lines.append(f"    ... and {len(meta['samples']) - limit} more")
    lines += [f"  state    {field_list(meta['state'])}: the input at step t, the target its change to step t+{stride}",
              f"  inputs   {field_list(meta['inputs']) or 'none'}" + (" (static)" if meta["inputs"] else "")]
    types = meta["node_types"]
    source = types["source"] or "none: every node interior (--node-type FIELD, or boundary tags in the files)"
    lines.append(f"  classes  from {source}; boundary classes are prescribed in a rollout and out of the loss "
                 "(by default all but 0; --interior-classes chooses)")
    for c in types["classes"]:
        name = f" {c['name']}" if c["name"] else ""
        lines.append(f"    {c['id']:>3}{name:<16} {c['count']:>10,} nodes  "
                     f"{'boundary' if c['boundary'] else 'interior'}")
    norm = meta["normalisation"]
    lines += [f"  normalisation over the training trajectories: {norm['rule']}",
              *(stats_lines("inputs", meta["input_channels"], norm["inputs"]) if meta["input_channels"] else []),
              *stats_lines("state", meta["state_channels"], norm["state"]),
              *stats_lines("change", meta["target_channels"], norm["targets"]),
              *stats_lines("edges", meta["edge_channels"], norm["edges"])]
    return "\n".join(lines)


def _unused(args: argparse.Namespace) -> list[str]:
    """The trajectory options given without ``--state``."""
    return [flag for flag, (attr, default) in TRAJECTORY_ONLY.items() if getattr(args, attr, default) != default]


def check_steady(args: argparse.Namespace) -> str | None:
    """Why a steady ``meshshard dataset`` (no ``--state``) cannot run with these options, or None."""
    unused = _unused(args)
    if unused:
        return f"{', '.join(unused)} {'applies' if len(unused) == 1 else 'apply'} to trajectories only (with --state)"
    if not args.inputs:
        return "Expected --inputs NAMES (or --state NAMES for trajectories)"
    return None

