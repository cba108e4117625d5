"""The ``meshshard dataset`` subcommand, and what ``meshshard info`` / ``meshshard partition`` do
with a dataset folder (called from :mod:`meshshard.partition._cli`).

Errors print one line ``meshshard <command>: error: <file>: <problem>`` and return 2; nothing is
left behind (the dataset is written to a temporary folder and renamed at the end). Notes print
``meshshard dataset: note: ...`` on stderr, even with ``--quiet``. Heavy modules (meshio) are
imported inside the commands; nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ._fields import field_list, stats_lines
from ._trajectories import add_arguments, check_steady, describe_trajectories, run_trajectories

__all__ = ["register", "describe_dataset", "mesh_usage", "odd_meshes_note", "run_partition_dataset", "run_info",
           "run_verify"]


def _error(command: str, err: BaseException) -> int:
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"meshshard {command}: error: {message}", file=sys.stderr)
    return 2


def mesh_usage(meta: Mapping[str, Any], limit: int = 8) -> list[str]:
    """Which samples are on which mesh, one line per mesh (the first ``limit`` meshes, the most
    used first): ``mesh 1: 1,234 nodes, 1 sample: case-3``."""
    import numpy as np

    from meshshard.partition import listed, plural

    sample_mesh = np.array([s["mesh"] for s in meta["samples"]], dtype=np.int64)
    uses = np.bincount(sample_mesh, minlength=len(meta["meshes"]))
    order = np.argsort(-uses, kind="stable")
    lines = []
    for m in order[:limit].tolist():
        names = [meta["samples"][i]["name"] for i in np.flatnonzero(sample_mesh == m)[:6].tolist()]
        lines.append(f"mesh {m}: {meta['meshes'][m]['num_nodes']:,} nodes, {plural(int(uses[m]), 'sample')}: "
                     f"{listed(names, int(uses[m]))}")
    if len(order) > limit:
        lines.append(f"... and {plural(len(order) - limit, 'more mesh', 'more meshes')}")
    return lines


def odd_meshes_note(meta: Mapping[str, Any]) -> str | None:
    """A note when most samples share one mesh and a few are on others (a case whose mesh was
    changed by mistake turns the dataset into a many-meshes one): which samples, on which meshes."""
    import numpy as np

    from meshshard.data import mirror_originals
    from meshshard.partition import listed, plural

    if len(meta["meshes"]) < 2:
        return None
    mirrors = mirror_originals(meta)  # on the mirror of their original's mesh
    sample_mesh = np.array([s["mesh"] for i, s in enumerate(meta["samples"]) if i not in mirrors], dtype=np.int64)
    uses = np.bincount(sample_mesh, minlength=len(meta["meshes"]))
    main = int(uses.argmax())
    if uses[main] < 2 or 2 * uses[main] < len(sample_mesh):
        return None  # no mesh most samples share: a many-meshes dataset by design
    others = np.flatnonzero(sample_mesh != main).tolist()  # the originals come first: an index is a sample's
    if not others:
        return None
    odd = [f"{meta['samples'][i]['name']} (mesh {sample_mesh[i]}, "
           f"{meta['meshes'][sample_mesh[i]]['num_nodes']:,} nodes)"
           for i in others[:6]]
    return (f"{len(meta['meshes'])} distinct meshes: {uses[main]} of {len(sample_mesh)} samples are on mesh {main} "
            f"({meta['meshes'][main]['num_nodes']:,} nodes), {plural(len(others), 'sample')} on "
            f"{'another' if len(meta['meshes']) == 2 else 'others'}: "
            f"{listed(odd, len(others))}; expected one mesh? --same-mesh refuses a sample "
            "whose mesh differs and says how")


def describe_dataset(folder: str | Path, meta: Mapping[str, Any]) -> str:
    """The readable summary ``meshshard info DATA`` prints."""
    import numpy as np

    from meshshard.data import held_note
    from meshshard.partition import plural

    if meta.get("task") == "transient":
        return describe_trajectories(folder, meta)
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
    usage = mesh_usage(meta) if meta["kind"] != "one-mesh" else []
    lines = [
        f"{folder}: {meta['format']} v{meta['format_version']}, kind {meta['kind']} ({mesh})",
        *(f"  {'meshes' if i == 0 else '':<8} {line}" for i, line in enumerate(usage)),
        f"  samples  {meta['num_samples']} ({val})",
        f"  inputs   {field_list(meta['inputs'])}",
        f"  targets  "
        f"{field_list(meta['targets']) or 'none: inputs only, cases for meshshard predict (train needs targets)'}",
        f"  cells    {', '.join(f'{t} {c:,}' for t, c in cells.items()) or 'none (edge_index)'}; "
        f"stored {meta['dtype']}",
        f"  normalisation over the training split: {norm['rule']}",
        *stats_lines("inputs", meta["input_channels"], norm["inputs"]),
        *(stats_lines("targets", meta["target_channels"], norm["targets"]) if meta["target_channels"] else []),
        *stats_lines("edges", meta["edge_channels"], norm["edges"]),
    ]
    params = meta.get("parameters")
    if params:
        values = np.asarray(params["values"], dtype=np.float64).reshape(len(params["values"]), -1)
        ranges = ", ".join(f"{name} {values[:, i].min():.4g}..{values[:, i].max():.4g}"
                           for i, name in enumerate(params["names"]))
        lines.append(f"  params   {ranges} (input channels, the same at every node of a sample)")
    if meta.get("target_scales"):
        lines.append("  scaled   " + ", ".join(f"{k} / ({v})" for k, v in meta["target_scales"].items())
                     + " (targets stored non-dimensional; predictions written in physical units)")
    mean_field = meta.get("mean_field")
    if mean_field:
        lines.append(_prior_line(meta, mean_field, "target_offset" in norm))
    walls = {"wall_offset": "x - x_wall to the nearest node of {}", "wall_normal": "the unit normal into the fluid "
             "at the nearest node of {}", "signed_distance": "the distance to the nearest node of {}, negative inside"}
    for f in meta["inputs"]:
        if f.get("patches"):
            what = walls.get(f["name"], "the distance to the nearest node of {}")
            lines.append(f"  wall     {f['name']}: {what.format(', '.join(f['patches']))}")
    named: dict[str, list[int]] = {}
    for m in meta["meshes"]:
        for b in m.get("boundaries", []):
            named.setdefault(str(b["name"]), []).append(int(b["num_nodes"]))
    if named:
        listed_named = ", ".join(f"{name} ({min(n):,} nodes" + (f" on {len(n)} meshes)" if len(n) > 1 else ")")
                                 for name, n in named.items())
        lines.append(f"  boundary {listed_named} (meshshard predict --boundary NAMES: errors and forces on them)")
    if meta.get("graph"):
        built = sum(1 for m in meta["meshes"] if m.get("graph"))
        how = "symmetrised" if meta["graph"].startswith("knn") else ""
        if built < len(meta["meshes"]):
            how = ", ".join(filter(None, [how, f"{built} of {plural(len(meta['meshes']), 'mesh', 'meshes')}; the "
                                          "others their cells' edges"]))
        lines.append(f"  graph    {meta['graph']} from the points" + (f" ({how})" if how else ""))
    surfaces = [m["surface_area"] for m in meta["meshes"] if "surface_area" in m]
    if surfaces:
        lines.append(f"  surface  {plural(len(surfaces), 'surface')}, area {min(surfaces):.4g} to {max(surfaces):.4g} "
                     "(normal and area available as inputs; area vectors stored for forces)")
    if meta.get("max_points"):
        lines.append(f"  points   about {meta['max_points']:,} per sample and epoch in training (--max-points; "
                     "point models: train --model ball-attention or transolver)")
    if meta.get("collapsed_2d"):
        lines.append("  2-D      each mesh the lower z-plane of a one-cell-thick 3-D mesh (--collapse-2d)")
    mirror = meta.get("mirror")
    if mirror:
        negated = ", ".join([f"{v}'s {mirror['axis']}" for v in mirror["vectors"]] + list(mirror["parameters"]))
        count = len(mirror["samples"])
        are = "is a mirror" if count == 1 else "are mirrors"
        lines.append(f"  mirror   {plural(count, 'training sample')} {are} in {mirror['axis']} of others (--mirror: "
                     f"{negated or 'no field or parameter'} negated), named <name>~mirror-{mirror['axis']}")
    held = held_note(meta)
    if held:
        lines.append(f"  held     {held}")
    return "\n".join(lines)


def _largest(record: Mapping[str, Any]) -> str:
    """How far a linear prior's fits extrapolate: the largest sums of their weights in absolute value."""
    largest = record.get("largest_weights") or {}
    said = [f"{side} {largest[side][0]:g} ({largest[side][1]})" for side in ("training", "other") if side in largest]
    return f" (its weights sum in absolute value to at most: {', '.join(said)})" if said else ""


def _prior_line(meta: Mapping[str, Any], record: Mapping[str, Any], offset: bool) -> str:
    """``meshshard info``'s line on a dataset's prior (``--mean-field``): what it is made of, and
    which cases a training sample's leaves out."""
    means = ", ".join(f["name"] for f in meta["inputs"] if "mean_of" in f)
    then = ("; the model learns each target's difference from it" if offset
            else " (new cases for runs trained on that field)")
    method, left_out = str(record.get("method", "mean")), str(record.get("left_out", "none"))
    if method == "mean" and meta["kind"] == "one-mesh" and left_out == "none":
        return f"  mean     {means}: the node-wise mean of the targets over the {record['of']}, as input channels{then}"
    from meshshard.data import parse_prior

    parsed = parse_prior(method)  # recorded as the flag spells it: kind, K and bound read back, not cut from the text
    cases = "every case" if parsed.k is None else f"the {parsed.k} nearest cases in parameter space"
    damped = ("" if parsed.bound is None else
              f", damped where its weights would sum to more than {parsed.bound:g} in absolute value")
    what = ("the mean of the targets" if parsed.kind == "mean" else
            f"at every node the affine least-squares fit in the parameters of the targets of {cases}, at the "
            "sample's parameters" + damped + _largest(record)
            if parsed.kind == "linear" else
            f"the inverse-distance-weighted mean of the targets of {cases}")
    rule = {"mesh": "; a training sample's leaves out every case on its own mesh (leave-one-mesh-out)",
            "sample": "; a training sample's leaves itself out",
            "shape": "; a training sample's leaves out every case of its own shape ("
                     + ", ".join(record.get("shape", [])) + ")"}.get(left_out, "")
    source = ("the training samples" if record.get("of") == "training samples"
              else "another dataset's training samples (--mean-field-from)")
    if record.get("mirrors") and not (meta.get("mirror") or {}).get("in_prior"):
        source += " that are not mirrors (a mirror's prior is its original's, mirrored)"
    elif record.get("mirrors"):
        source += " and their mirrors (--mirror-in-prior)"
    mapped = ("each mapped onto the sample's mesh along " + ",".join(record["along"]) + " (--map-along"
              + (f", {','.join(record['along_fields'])} alone" if record.get("along_fields") else "")
              + (f"; the peaks of {record['along_peak']} on it made to meet" if record.get("along_peak") else "")
              + ("; by position too, as the inputs <target>_mean_by_position" if record.get("position_inputs") else "")
              + ")" if record.get("along") else "each mapped onto the sample's mesh")
    return f"  prior    {means} ({method}): {what} over {source}, {mapped}, as input channels{rule}{then}"


def run_info(folder: str, as_json: bool) -> int:
    """``meshshard info DATA`` (a dataset folder) or ``meshshard info PARTS`` (a dataset's partitions)."""
    from meshshard.data import PARTITIONS_FILE, read_dataset_metadata, read_partitions_metadata
    from meshshard.data import dump_dataset_metadata as dump_metadata
    from meshshard.partition import plural

    try:
        if (Path(folder) / PARTITIONS_FILE).is_file():
            meta = read_partitions_metadata(folder)
            if as_json:
                sys.stdout.write(json.dumps(meta, indent=2) + "\n")
            else:
                nodes = [m["num_nodes"] for m in meta["meshes"]]
                print(f"{folder}: {meta['format']} v{meta['format_version']}: {len(nodes)} partitions into "
                      f"{plural(meta['num_parts'], 'part')} (meshes of {min(nodes):,} to {max(nodes):,} nodes), one "
                      f"partition folder per mesh: mesh-00000 ... "
                      f"(meshshard info {shlex.quote(str(Path(folder) / 'mesh-00000'))})"
                      + (f"; made for a ball radius up to {meta['halo_radius']:g} (--radius)"
                         if meta.get("halo_radius") else ""))
            return 0
        meta = read_dataset_metadata(folder)
    except ValueError as err:
        return _error("info", err)
    sys.stdout.write(dump_metadata(meta) if as_json else describe_dataset(folder, meta) + "\n")
    return 0


def run_verify(folder: str, verify_one: Callable[[argparse.Namespace], int]) -> int:
    """``meshshard verify PARTS`` for a dataset's partitions: every mesh's partition folder, and
    that each was made from the mesh ``partitions.json`` names (exit 1 when anything fails)."""
    from meshshard.data import PARTITIONS_FILE, read_partitions_metadata
    from meshshard.partition import read_metadata

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
    from meshshard.data import open_dataset, partition_dataset
    from meshshard.partition import Steps, plural

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
                                    tries=args.tries, force=args.force, progress=advance, radius=args.radius)
    except (ValueError, OSError, MemoryError) as err:
        return _error("partition", err)
    if not args.quiet:
        what = plural(dataset.num_meshes, "mesh", "meshes")
        print(f"wrote {out}: {what} of {args.input} in {plural(args.parts, 'part')} ({steps.seconds['meshes']:.1f} s)")
    return 0


def _cmd_dataset(args: argparse.Namespace) -> int:
    from meshshard.partition import folder_lock

    from ._partition_dist import launched

    if launched():  # under torchrun: P processes, each its block of every sample (process 0 takes the lock)
        from ._dataset_dist import run_dataset_distributed

        return run_dataset_distributed(args, _error, describe_dataset)
    try:
        with folder_lock(args.out):  # one writer per DATA, before any source is read
            return _dataset(args)
    except (ValueError, OSError) as err:
        return _error("dataset", err)


def _dataset(args: argparse.Namespace) -> int:
    from meshshard.data import build_dataset, list_sources, read_dataset_metadata
    from meshshard.partition import Steps

    val_samples = None if args.val_samples is None else [t for v in args.val_samples for t in v.split(",") if t.strip()]

    def note(text: str) -> None:
        print(f"meshshard dataset: note: {text}", file=sys.stderr, flush=True)

    if args.state is not None:
        return run_trajectories(args, note, _error)
    why = check_steady(args)
    if why is not None:
        return _error("dataset", ValueError(why))

    try:
        files = list_sources(args.sources)
        prior = args.mean_field is not None or args.mean_field_from is not None
        total = None if args.mirror else len(files)  # mirrors: as many more as training files, less their own mirrors
        with Steps(enabled=not args.quiet) as steps, steps.step("samples", total=total) as advance, \
                (steps.step("prior", total=total) if prior else nullcontext(None)) as advance_prior:
            out = build_dataset(args.sources, args.out, inputs=args.inputs, targets=args.targets,
                                val_fraction=args.val_fraction, val_samples=val_samples, dtype=args.dtype,
                                same_mesh=args.same_mesh, force=args.force, progress=advance, notes=note,
                                params=args.params, target_scale=args.target_scale,
                                cell_data_to_points=args.cell_data_to_points, collapse_2d=args.collapse_2d,
                                wall_distance=args.wall_distance, wall_normal=args.wall_normal,
                                signed_distance=args.signed_distance, node_types=args.boundary_classes,
                                graph=args.graph, max_points=args.max_points, mean_field=args.mean_field,
                                mean_field_from=args.mean_field_from, shape_params=args.shape_params,
                                map_along=args.map_along, position_prior_inputs=args.position_prior_inputs,
                                prior_progress=advance_prior, mirror=args.mirror,
                                mirror_params=args.mirror_params, mirror_in_prior=args.mirror_in_prior)
    except (ValueError, OSError, MemoryError) as err:
        return _error("dataset", err)
    meta = read_dataset_metadata(out)
    odd = odd_meshes_note(meta)
    if odd is not None:
        note(odd)
    if not args.quiet:
        print(describe_dataset(out, meta))
        print(f"wrote {out} in {steps.seconds['samples']:.1f} s")
    return 0


#: The options that each name boundaries (a list of patches, repeatable) for a geometric input.
_WALL_INPUTS = {
    "--wall-distance": "an input channel wall_distance: at every node, the distance to the nearest node of the named "
    "boundaries (the patches of a foamToVTK .vtm; repeat the flag to add more)",
    "--wall-normal": "input fields wall_offset and wall_normal: at every node, the offset x - x_wall to the nearest "
    "node of the named boundaries and the wall's unit normal there, into the fluid (D channels each)",
    "--signed-distance": "an input channel signed_distance: the distance to the nearest node of the named boundaries, "
    "negative inside the body they close around (refused when they do not close)",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``dataset`` sub-parser."""
    help = "make a dataset folder from mesh files with point_data fields (one sample per file)"
    p = subparsers.add_parser("dataset", help=help, description=help + ". Inputs and targets are "
                              "point_data field names; a vector field counts as its components (u is "
                              "u[0], u[1], ...; u[1] alone is one channel); pos is the node coordinates.")
    p.set_defaults(func=_cmd_dataset)
    p.add_argument("sources", nargs="*", metavar="SOURCES",
                   help="mesh files (any format meshio reads, and .vtp, .vtm, .pvtu, .vtkhdf with the vtk package) "
                   "or folders of them; an OpenFOAM case folder, or its VTK/ folder, is the last iteration foamToVTK "
                   "wrote")
    p.add_argument("--out", "-o", required=True, help="dataset folder to create")
    p.add_argument("--inputs", default=None, action="append",
                   help="comma-separated input fields, e.g. T_in,pos (repeat the flag to add more); required "
                   "unless --state")
    p.add_argument("--targets", default=None, action="append",
                   help="comma-separated target fields, e.g. T_out (repeat the flag to add more); leave out "
                   "for new cases to predict on (inputs only: for meshshard predict, not train)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=None,
                       help="fraction of samples for validation, drawn by a fixed permutation "
                       "(default 0.2; 0 without --targets)")
    split.add_argument("--val-samples", default=None, action="append",
                       help="comma-separated validation samples: indices or names (file names without extension; "
                       "FOLDER/NAME where files of one name are in several folders; repeat the flag to add more)")
    p.add_argument("--params", default=None, metavar="FILE.csv",
                   help="per-sample parameters (angle, speed, ...): a CSV table with a 'sample' column of sample "
                   "names and one numeric column per parameter; each becomes an input channel, the same at every "
                   "node of its sample")
    p.add_argument("--target-scale", default=None, metavar="FIELD=EXPR,...",
                   help="non-dimensional targets: each named target field divided by an expression of the "
                   "--params (e.g. 'p=0.5*speed**2,U=speed'); predictions are multiplied back when written")
    p.add_argument("--cell-data-to-points", action="store_true",
                   help="a named field found only in cell data (a finite-volume solver's cell-centred values) "
                   "is averaged onto the nodes: at each node, the mean over the cells that use it")
    p.add_argument("--collapse-2d", action="store_true",
                   help="every mesh is one cell thick in z (OpenFOAM's 2-D cases): keep its lower plane as a 2-D "
                   "mesh (hexahedra become quads, wedges triangles, half the nodes, no z-edges)")
    for flag, what in _WALL_INPUTS.items():
        p.add_argument(flag, default=None, action="append", metavar="PATCH[,PATCH]", help=what)
    p.add_argument("--boundary-classes", action="store_true",
                   help="the named boundaries (a .vtm's patches, node sets, gmsh physical groups) as one-hot input "
                   "channels node_type[k]: 0 interior, then one per boundary of the first file")
    p.add_argument("--graph", default=None, metavar="mesh|knn:K|radius:R",
                   help="a sample's graph: its cells' edges (mesh), each point joined to its K nearest (knn:K, "
                   "symmetrised) or to the points within R (radius:R); default: the cells' edges, and knn:8 for point "
                   "clouds (.npz with pos, vertex cells, no cells)")
    p.add_argument("--max-points", type=int, default=None, metavar="N",
                   help="recorded for training: point models (train --model ball-attention, transolver) train "
                   "each sample on a random subset of about N points, another each epoch (train --max-points "
                   "overrides it)")
    p.add_argument("--same-mesh", action="store_true",
                   help="refuse a file whose mesh is not exactly the first file's, saying how it differs "
                   "(without it, such files make a many-meshes dataset)")
    mean = p.add_mutually_exclusive_group()
    mean.add_argument("--mean-field", nargs="?", const="mean", default=None, metavar="mean|knn:K|linear[:K][,bound=B]",
                      help="a prior as input fields <target>_mean, and the model learns each case's difference from "
                      "it (predict adds it back): the training cases' node-wise mean of the targets (mean, the bare "
                      "flag), the inverse-distance-weighted mean of the K nearest in --params space (knn:K) or the "
                      "node-wise affine least-squares fit in --params (linear; linear:K: of the K nearest; "
                      ",bound=B: damped where its weights would sum to more than B in absolute value); on "
                      "many meshes each case is mapped onto the sample's mesh and a training sample's prior leaves "
                      "out every case on its own mesh")
    mean.add_argument("--mean-field-from", default=None, metavar="DATA",
                      help="new cases (on any meshes, targets not needed) for runs trained on DATA, a dataset made "
                      "with --mean-field: their prior made of DATA's training cases, as DATA made its own")
    p.add_argument("--shape-params", default=None, metavar="NAME[,NAME]",
                   help="with --mean-field on a shape sweep: the --params columns that make a shape (e.g. "
                   "thickness,camber); a training sample's prior leaves out every case of its own shape, as a new "
                   "shape's prior has none (at a sweep's corners an extrapolation: without it, the case alone is "
                   "left out, which paid better on the shape sweep example)")
    p.add_argument("--map-along", default=None, metavar="PATCHES[:FIELDS][,peak=FIELD]",
                   help="with --mean-field on a 2-D shape sweep: map the training cases onto each sample's mesh along "
                   "this wall (named boundaries making one closed curve), body to body, instead of by position alone: "
                   "a node near the wall reads the source's field as far from the source's wall, at the same place "
                   "along it; :FIELDS (body:U) maps only these target fields so, the others by position; "
                   ",peak=FIELD (body,peak=p) makes the place of FIELD's greatest value on the wall (a stagnation "
                   "point) a landmark too, so that a blend of cases keeps the peak sharp (docs/datasets.md)")
    p.add_argument("--position-prior-inputs", action="store_true",
                   help="with --map-along: the prior mapped by position alone too, as more input channels "
                   "<target>_mean_by_position beside the prior along the wall (which stays the offset the model "
                   "learns the difference from)")
    p.add_argument("--mirror", default=None, metavar="AXIS[:VECTOR,...]",
                   help="each training sample's mirror added to the training samples, for a sweep closed under that "
                   "mirror: the coordinate AXIS (x, y or z) negated, and the component along it of each named vector "
                   "field (e.g. y:U; a field of several components not named is refused)")
    p.add_argument("--mirror-params", default=None, metavar="NAME[,NAME]",
                   help="with --mirror: the --params columns that change sign in the mirror (e.g. camber,aoa); a "
                   "sample they are all 0 for is its own mirror and is not added")
    p.add_argument("--mirror-in-prior", action="store_true",
                   help="with --mirror and --mean-field: the mirrors are cases of the prior too (default: the prior is "
                   "made of the solved cases alone, and a mirror's is its original's, mirrored)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="stored precision")
    p.add_argument("--force", action="store_true", help="replace an existing dataset folder (only one)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, no summary")
    add_arguments(p)
