"""``torchrun --nproc-per-node P -m meshshard dataset SAMPLE.vtkhdf ... --out DATA``: P processes, each
reading and writing its block of rows of every sample (:func:`meshshard.data.write_dataset_distributed`).

Every process runs this; their process group is gloo on the CPU (dataset building is CPU work), its
waits bounded by ``MESHSHARD_TIMEOUT``. Only the options a large steady sample needs are taken
(``--inputs``, ``--targets``, ``--params``, the split, ``--dtype``, ``--force``); any other is refused in
one line. An error every process agrees on is printed once, by process 0; any other (a process that
died) by each process that sees it. Every process exits 2 on an error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["run_dataset_distributed"]

#: Options of ``meshshard dataset`` a distributed run does not take, with their defaults.
_ONE_PROCESS_ONLY = {"state": None, "node_type": None, "interior_classes": None, "time_stride": None,
                     "target_scale": None, "cell_data_to_points": False, "collapse_2d": False,
                     "wall_distance": None, "wall_normal": None, "signed_distance": None,
                     "boundary_classes": False, "graph": None, "max_points": None, "same_mesh": False,
                     "mean_field": None, "mean_field_from": None, "shape_params": None, "map_along": None,
                     "position_prior_inputs": False,
                     "mirror": None, "mirror_params": None, "mirror_in_prior": False}


def _refusal(args: argparse.Namespace) -> str | None:
    for name, default in _ONE_PROCESS_ONLY.items():
        if getattr(args, name, default) not in (default, None):
            return (f"--{name.replace('_', '-')} is not taken by a distributed dataset (run meshshard dataset in "
                    "one process); under torchrun: --inputs, --targets, --params, --val-fraction, --val-samples, "
                    "--dtype, --force")
    return None


def run_dataset_distributed(args: argparse.Namespace, error: Callable[[str, BaseException], int],
                            describe: Callable[[str, dict[str, Any]], str]) -> int:
    """The distributed ``meshshard dataset`` (see the module docstring), ``describe`` printing the
    summary; returns the exit code."""
    first = os.environ.get("RANK", "0") == "0"
    refused = _refusal(args)
    if refused is not None:  # the same on every process: printed by the first only
        return error("dataset", ValueError(refused)) if first else 2
    from meshshard.comm import ArrayExchange, init_distributed
    from meshshard.data import read_dataset_metadata, write_dataset_distributed

    try:
        context = init_distributed("gloo")
    except (ValueError, RuntimeError) as err:
        return error("dataset", err)
    exchange = ArrayExchange()
    val_samples = None if args.val_samples is None else [t for v in args.val_samples for t in v.split(",") if t.strip()]
    try:
        out = write_dataset_distributed(args.sources, args.out, exchange, inputs=args.inputs or [],
                                        targets=args.targets, params=args.params, val_fraction=args.val_fraction,
                                        val_samples=val_samples, dtype=args.dtype, force=args.force)
    except ValueError as err:  # agreed by every process
        return error("dataset", err) if context.rank == 0 else 2
    except (OSError, RuntimeError, MemoryError) as err:  # this process's own, or a peer that died
        return error("dataset", RuntimeError(f"process {context.rank}: {err}"))
    if context.rank == 0 and not args.quiet:
        print(describe(str(out), read_dataset_metadata(out)))
        print(f"wrote {out} with {exchange.size} process(es)", file=sys.stdout)
    return 0
