"""``meshshard partition --grid H,W[,D] --parts K [--proc-grid P0,P1[,P2]] --out DIR``.

A structured grid partitioned as a mesh (see :mod:`meshshard.partition._grid`): nodes are the
grid points in row-major global id order, edges the box stencil (``3^d - 1`` neighbours, wrapped
with ``--periodic``), ghosts the band of width ``--halo-hops`` around each box (a halo width of
``r`` points is ``--halo-hops r``; a ``(2r + 1)``-wide kernel needs ``r``). The folder is the usual
partition format, ``method`` ``"grid"``. No numpy at import, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_grid_arguments", "grid_command"]


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (got {text!r})") from None
    if not 1 <= len(sizes) <= 3:
        raise argparse.ArgumentTypeError(f"expected 1 to 3 sizes (got {text!r})")
    return sizes


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The grid options of ``meshshard partition``."""
    parser.add_argument("--grid", type=_sizes, default=None, metavar="H,W[,D]",
                        help="partition a structured grid of this shape instead of an input file "
                        "(halo width = --halo-hops)")
    parser.add_argument("--proc-grid", type=_sizes, default=None, metavar="P0,P1[,P2]",
                        help="ranks per grid axis for --grid (default: K slabs along the first axis)")
    parser.add_argument("--periodic", action="store_true",
                        help="with --grid: the stencil wraps around every axis")


def grid_command(args: argparse.Namespace, error: Callable[[str, object, BaseException], int]) -> int:
    """Run ``meshshard partition --grid``; ``error`` prints one line and returns 2."""
    from meshshard.partition import partition_grid, print_summary, read_metadata, save_partition

    if args.grid is None:
        return error("partition", None, ValueError("Expected an INPUT file or --grid H,W[,D]"))
    if args.input is not None:
        return error("partition", None, ValueError(f"Expected either INPUT or --grid, not both (got {args.input!r})"))
    try:
        parts = partition_grid(args.grid, args.parts, proc_grid=args.proc_grid,
                               halo_width=args.halo_hops, periodic=args.periodic)
        folder = save_partition(parts, Path(args.out), force=args.force)
    except (ValueError, OSError, MemoryError) as err:
        return error("partition", "--grid", err)
    if not args.quiet:
        print_summary(read_metadata(folder), {})
    return 0
