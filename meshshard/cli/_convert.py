"""``meshshard convert MESH --out MESH.vtkhdf``: a mesh as a one-piece VTKHDF file, which each process
of a distributed ``meshshard partition`` reads in part (:func:`meshshard.partition.convert_mesh`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register"]


def _cmd_convert(args: argparse.Namespace) -> int:
    from meshshard.partition import convert_mesh, read_slice

    out = args.out or args.output
    if out is None:
        out = str(Path(args.input).with_suffix(".vtkhdf"))
    if args.out and args.output and args.out != args.output:
        print(f"meshshard convert: error: two outputs given ({args.output} and --out {args.out})", file=sys.stderr)
        return 2
    if Path(out).exists() and not args.force:
        print(f"meshshard convert: error: {out}: exists; pass --force to replace it", file=sys.stderr)
        return 2
    try:
        written = convert_mesh(args.input, out)
        piece = read_slice(written)
    except (ValueError, OSError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = "" if message.startswith(str(args.input)) or message.startswith(str(out)) else f"{args.input}: "
        print(f"meshshard convert: error: {where}{message}", file=sys.stderr)
        return 2
    print(f"wrote {written} ({piece.num_nodes:,} points, {piece.num_cells:,} cells)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``convert`` sub-parser."""
    help = "write a mesh as a .vtkhdf file, which each process of a distributed partition reads in part"
    p = subparsers.add_parser("convert", help=help, description=help)
    p.set_defaults(func=_cmd_convert)
    p.add_argument("input", help="a mesh meshio reads (its numeric point fields are kept), or a .vtkhdf")
    p.add_argument("output", nargs="?", default=None, help="the .vtkhdf file to write (or --out)")
    p.add_argument("--out", "-o", default=None, help="the .vtkhdf file to write (default: INPUT with .vtkhdf)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
