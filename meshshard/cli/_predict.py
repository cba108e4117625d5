
"""``meshshard predict``: the command line of :func:`meshshard.run.predict`."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import asdict
from typing import Any

from meshshard.run import (
    BUILTIN_MODELS,
    COMPRESSIONS,
    GATHER_MAX_NODES,
    PredictConfig,
    check_prediction_request,
    comparison_table,
    normalise_spec,
    parse_direction,
    parse_ensemble,
    parse_model_args,
    parse_view,
    predict,
    prediction_summary,
)

from ._launch import as_rank, run_command, writing_command
from ._spelling import add_deprecated

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:  # one writer per PRED, before anything is read or any rank starts
    return writing_command("predict", args.out, lambda: _predict(args))


def _predict(args: argparse.Namespace) -> int:
    try:
        if args.model_args and not args.model:
            raise ValueError("Expected --model-args only with --model")
        if args.model in BUILTIN_MODELS:  # a built-in model is rebuilt from the run: nothing to import
            args.model = None
        model = normalise_spec(args.model) if args.model else None
        model_args = parse_model_args(args.model_args) if args.model_args else None
        view = parse_view(args.view) if args.view else None
        direction = parse_direction(args.direction, "--direction") if args.direction else None
        lift = parse_direction(args.lift_direction, "--lift-direction") if args.lift_direction else None
        ensemble = parse_ensemble(args.ensemble) if args.ensemble is not None else None
    except ValueError as err:
        print(f"meshshard predict: error: {err}", file=sys.stderr)
        return 2
    cfg = PredictConfig(run=args.run, data=args.data, out=args.out, samples=args.samples, partition=args.partition,
                        gather=True if args.gather else (False if args.pieces else None), dtype=args.dtype,
                        force=args.force, plots=not args.no_plots, quiet=args.quiet, model=model, model_args=model_args,
                        checkpoint=args.checkpoint, boundary=args.boundary, pressure=args.pressure, shear=args.shear,
                        force_reference=args.force_reference, reference_area=args.reference_area,
                        direction=direction, lift_direction=lift, view=view, near=args.near, rollout=args.rollout,
                        steps=args.rollout_steps, compression=args.compression,
                        background=not args.no_background, ensemble=ensemble, mirror_average=args.mirror_average)
    def check() -> None:  # one line before any rank starts
        check_prediction_request(cfg)
        if args.baseline is not None:
            prediction_summary(args.baseline)  # a folder with the metrics.json of predict or baseline

    worker = functools.partial(as_rank, predict, PredictConfig.from_dict)
    code = run_command("predict", worker, args.nproc, asdict(cfg), check)
    if code == 0 and args.baseline is not None and os.environ.get("RANK", "0") == "0":
        try:
            print(comparison_table(args.out, args.baseline), flush=True)
        except (ValueError, OSError) as err:
            print(f"meshshard predict: error: {err}", file=sys.stderr)
            return 2
    return code


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "predict", help="predict with a trained run and write ParaView files (.vtu / .pvtu), metrics and pictures",
        description="Run a trained model (RUN/checkpoint.pt) on samples of a dataset and write, per sample, the mesh "
        "with <target>_pred, <target> and <target>_error fields (.vtu, or .pvtu plus one piece per rank), "
        "PRED/metrics.json (RMSE, relative L2) and PRED/<sample>.png. One process runs on whole meshes; "
        "under torchrun or with --nproc R, on a partition into R parts.",
    )
    p.add_argument("run", help="run folder of meshshard train (checkpoint.pt)")
    p.add_argument("--data", required=True, help="dataset folder (meshshard dataset)")
    p.add_argument("--out", "-o", required=True, help="folder for the predictions")
    p.add_argument("--samples", default=None,
                   help="val (default when the dataset has a validation split), train, all, or names/indices, "
                   "comma-separated")
    p.add_argument("--partition", default=None, help="partition folder for R ranks (default: the run's own)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--gather", action="store_true", help="write one .vtu per sample, whatever its size")
    group.add_argument("--pieces", action="store_true",
                       help=f"write one piece per rank plus a .pvtu even below {GATHER_MAX_NODES:,} nodes")
    p.add_argument("--model", default=None, metavar="FILE.py:NAME",
                   help="the run's own model, when it trained one with train --model (never read from the checkpoint)")
    p.add_argument("--model-args", default=None, metavar="JSON",
                   help="keyword arguments of --model (default: the run's)")
    p.add_argument("--ensemble", default=None, metavar="RUN2[,RUN3...]",
                   help="average the predictions of these runs with RUN's (runs trained alike on one dataset, other "
                   "seeds; each with the same --checkpoint)")
    p.add_argument("--mirror-average", action="store_true",
                   help="for a run trained on a dataset made with meshshard dataset --mirror: predict each sample and "
                   "its mirror, and average the first with the mirror of the second (exactly symmetric; two forward "
                   "passes per sample)")
    p.add_argument("--checkpoint", default="best", choices=["best", "last"],
                   help="best (default): RUN/best.pt, the lowest validation loss (RUN/checkpoint.pt for a run "
                   "trained without --val-every); last: RUN/checkpoint.pt, the latest step")
    p.add_argument("--boundary", default=None, metavar="NAMES",
                   help="named boundaries of the dataset (patches, node sets, gmsh groups; meshshard info DATA lists "
                   "them), comma-separated: the errors on their nodes and the force on them, predicted against "
                   "true, in metrics.json; the pictures are framed on them")
    p.add_argument("--force-field", "--pressure", dest="pressure", default=None, metavar="FIELD",
                   help="the pressure target field the force integrates, (-p n + tau) dA (default: p, when it is a "
                   "scalar target); on a dataset of surfaces it takes --boundary surface unless --boundary is given")
    p.add_argument("--shear-field", "--shear", dest="shear", default=None, metavar="FIELD",
                   help="a wall shear stress target field (the traction on the wall), added to the force")
    p.add_argument("--force-reference", default=None, metavar="EXPR",
                   help="the reference dynamic pressure q of the coefficients force / (q A), a number or arithmetic "
                   "of the sample's parameters (e.g. '0.5*speed**2'; default 1)")
    p.add_argument("--reference-area", default=None, type=float, metavar="A",
                   help="the reference area A of the coefficients force / (q A) (default 1)")
    p.add_argument("--direction", default=None, metavar="X,Y,Z",
                   help="the drag direction: the drag coefficient F . d / (q A), predicted and true, its MAE and R² "
                   "over the samples")
    p.add_argument("--lift-direction", default=None, metavar="X,Y,Z",
                   help="the lift direction (with --direction): the lift coefficient likewise")
    p.add_argument("--near", default=None, metavar="PATCHES:DISTANCE",
                   help="each target's RMSE and relative L2 over the nodes within DISTANCE of these boundaries "
                   "(comma-separated names, e.g. walls:0.05), in metrics.json and the table")
    p.add_argument("--view", default=None, metavar="XMIN,XMAX,YMIN,YMAX",
                   help="frame the pictures on this region (default: the --boundary nodes with a margin, else all)")
    p.add_argument("--rollout", action="store_true",
                   help="a run trained on trajectories: from each trajectory's first state, apply the model step "
                   "after step; PRED/<trajectory>.pvd, one .vtu per step, rollout.rmse in metrics.json "
                   "(docs/transient.md)")
    p.add_argument("--rollout-steps", type=int, default=None, metavar="N",
                   help="with --rollout: model applications (default: as many strides as the trajectory holds)")
    add_deprecated(p, "--steps", "--rollout-steps", "predict", dest="rollout_steps", type=int, metavar="N")
    p.add_argument("--compression", default=COMPRESSIONS[0], choices=list(COMPRESSIONS),
                   help=f"of the ParaView files: {COMPRESSIONS[0]} (default), " + ", ".join(COMPRESSIONS[1:])
                   + " (lz4 needs the lz4 package); docs/prediction.md has their speed and size")
    p.add_argument("--no-background", action="store_true",
                   help="with --rollout: write each step's files before computing the next (default: a background "
                   "thread writes step k while step k+1 computes)")
    p.add_argument("--baseline", default=None, metavar="PRED_BASE",
                   help="a prediction folder of meshshard baseline (or predict): print the model's errors beside its "
                   "(meshshard info PRED --compare PRED_BASE prints the same)")
    p.add_argument("--dtype", default=None, choices=["float32", "float64"], help="default: the run's")
    p.add_argument("--no-plots", action="store_true", help="no PNG pictures")
    p.add_argument("--force", action="store_true",
                   help="replace earlier predictions in --out (only the files its metrics.json lists)")
    p.add_argument("--nproc", type=int, default=0, help="start this many local ranks (when not under torchrun)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no per-sample lines, no table (errors and notes still print)")
    p.set_defaults(func=_run)
