"""``meshshard baseline``: the command line of :func:`meshshard.run.baseline`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._launch import writing_command

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:  # one writer per PRED, before anything is read
    return writing_command("baseline", args.out, lambda: _baseline(args))


def _baseline(args: argparse.Namespace) -> int:
    from meshshard.run import BaselineConfig, baseline, parse_direction, parse_view

    try:
        view = parse_view(args.view) if args.view else None
        direction = parse_direction(args.direction, "--direction") if args.direction else None
        lift = parse_direction(args.lift_direction, "--lift-direction") if args.lift_direction else None
    except ValueError as err:
        print(f"meshshard baseline: error: {err}", file=sys.stderr)
        return 2
    baseline(BaselineConfig(data=args.data, out=args.out, method=args.method, samples=args.samples,
                            boundary=args.boundary, pressure=args.pressure, shear=args.shear,
                            force_reference=args.force_reference, reference_area=args.reference_area,
                            direction=direction, lift_direction=lift, view=view, near=args.near,
                            source=args.source, map_along=args.map_along, force=args.force,
                            plots=not args.no_plots, quiet=args.quiet))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "baseline", help="what a model must beat: the training mean, nearest cases or interpolation, written as "
        "predict writes",
        description="Predict each chosen sample of a dataset from its training samples alone (the mean, the nearest "
        "in parameter space, the K nearest inverse-distance weighted, or linear interpolation along one parameter), "
        "their fields mapped onto the sample's mesh, and write the same files and metrics.json as meshshard predict "
        "(docs/prediction.md, Baselines).",
    )
    p.add_argument("data", help="dataset folder (meshshard dataset), with targets; without them (new designs) "
                   "with --from")
    p.add_argument("--from", dest="source", default=None, metavar="TRAINING_DATA",
                   help="make the baseline of the training samples of this dataset instead of DATA's own (the same "
                   "inputs, targets and mesh dimension): DATA may then hold new designs without targets, whose "
                   "predicted fields are written without errors")
    p.add_argument("--out", "-o", required=True, help="folder for the baseline's predictions")
    p.add_argument("--method", default="mean", metavar="METHOD",
                   help="mean (default): the training samples' mean; nearest: the training sample nearest in "
                   "parameter space (--params, each divided by its training std); knn:K: the K nearest, weighted by "
                   "1/distance; linear: per node, the affine least-squares fit in the parameters (linear:K: over the K "
                   "nearest; ,bound=B: an extrapolation damped until the weights sum to B in absolute value); "
                   "interp:PARAM: linear along PARAM between the two training samples that bracket the "
                   "sample's value among those nearest in the other parameters")
    p.add_argument("--samples", default=None,
                   help="val (default when the dataset has a validation split), train, all, or names/indices, "
                   "comma-separated")
    p.add_argument("--boundary", default=None, metavar="NAMES",
                   help="named boundaries: errors and forces on them, as meshshard predict --boundary")
    p.add_argument("--force-field", "--pressure", dest="pressure", default=None, metavar="FIELD",
                   help="the pressure target field of the force (default: p, when it is a scalar target)")
    p.add_argument("--shear-field", "--shear", dest="shear", default=None, metavar="FIELD",
                   help="a wall shear stress target field, added to the force")
    p.add_argument("--force-reference", default=None, metavar="EXPR",
                   help="the reference dynamic pressure q of the coefficients force / (q A), arithmetic of the "
                   "parameters (default 1)")
    p.add_argument("--reference-area", default=None, type=float, metavar="A", help="the reference area A (default 1)")
    p.add_argument("--direction", default=None, metavar="X,Y,Z", help="the drag direction: the drag coefficient")
    p.add_argument("--lift-direction", default=None, metavar="X,Y,Z", help="the lift direction (with --direction)")
    p.add_argument("--near", default=None, metavar="PATCHES:DISTANCE",
                   help="each target's errors over the nodes within DISTANCE of these boundaries, as meshshard "
                   "predict --near")
    p.add_argument("--map-along", default=None, metavar="PATCHES[:FIELDS][,peak=FIELD]",
                   help="2-D meshes of one family of bodies: map the training fields onto each sample's mesh along "
                   "this wall (named boundaries making one closed curve), body to body, instead of by position alone "
                   "(as meshshard dataset --map-along; :FIELDS, these target fields alone; ,peak=FIELD, the place of "
                   "FIELD's greatest value on the wall a landmark too)")
    p.add_argument("--view", default=None, metavar="XMIN,XMAX,YMIN,YMAX", help="frame the pictures on this region")
    p.add_argument("--no-plots", action="store_true", help="no PNG pictures")
    p.add_argument("--force", action="store_true",
                   help="replace earlier predictions in --out (only the files its metrics.json lists)")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-sample lines, no table")
    p.set_defaults(func=_run)
