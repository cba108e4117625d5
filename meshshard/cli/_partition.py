"""The ``meshshard partition / info / verify / plot`` subcommands.

``register(subparsers)`` is called by ``meshshard.cli``. Each command reports its own errors
(this layer may not import ``meshshard.cli``): bad input prints one line
``meshshard <command>: error: <file>: <problem>`` on stderr and returns 2; ``verify`` returns 1
when a check fails. Heavy modules are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _error(command: str, where: object, err: BaseException) -> int:
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    prefix = f"{where}: " if where is not None and not message.startswith(f"{where}") else ""
    print(f"meshshard {command}: error: {prefix}{message}", file=sys.stderr)
    return 2


def _weights(text: str) -> list[float]:
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers (got {text!r})") from None


class _GraphAction(argparse.Action):
    """``--graph``: ``nodal``, ``dual``, ``knn``, ``radius`` (with ``--knn`` / ``--radius``), or
    ``knn:K`` / ``radius:R`` as ``meshshard dataset --graph`` spells them (``mesh``: ``nodal``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        word, sep, value = str(values).partition(":")
        word = "nodal" if word == "mesh" else word
        kinds = {"nodal": None, "dual": None, "knn": int, "radius": float}
        if word not in kinds or sep and kinds[word] is None:
            parser.error(f"argument --graph: Expected nodal, dual, knn, knn:K, radius or radius:R (got {values!r})")
        if sep:
            try:
                number = kinds[word](value)
            except ValueError:
                number = None
            if number is None or not 0 < number < float("inf"):
                parser.error(f"argument --graph: Expected {word}:{'K' if word == 'knn' else 'R'} with a positive "
                             f"{'integer' if word == 'knn' else 'number'} (got {values!r})")
            setattr(namespace, word, number)
        setattr(namespace, self.dest, word)


def _cmd_partition(args: argparse.Namespace) -> int:
    from meshshard.partition import folder_lock

    from ._partition_dist import launched, mpi_launched, run_distributed

    if args.engine == "kaminpar":  # one process, threads: the one-process pipeline's method
        if launched() or mpi_launched() or args.method not in (None, "kaminpar"):
            return _error("partition", None, ValueError(
                "--engine kaminpar runs in one process (threads), without torchrun or mpirun and without --method"))
        args.engine, args.method = None, "kaminpar"
    if launched() or mpi_launched() or args.engine is not None:  # P processes, each reading 1/P of a .vtkhdf
        return run_distributed(args, _error)
    args.method = args.method or "metis"
    try:
        with folder_lock(args.out):  # one writer per output folder, before anything is read
            return _partition(args)
    except (ValueError, OSError) as err:
        return _error("partition", None, err)


def _partition(args: argparse.Namespace) -> int:
    from meshshard.data import is_dataset
    from meshshard.partition import (
        Steps,
        WriteError,
        check_output_dir,
        max_expansion,
        parse_max_expansion,
        partition_file,
        print_summary,
        read_metadata,
    )

    if args.tries is not None and args.tries < 1:  # for every input, --grid too
        return _error("partition", None, ValueError(f"Expected --tries >= 1 (got {args.tries})"))
    if args.input is not None and is_dataset(args.input):
        from ._dataset import run_partition_dataset

        return run_partition_dataset(args)
    if args.input is not None and Path(args.input).is_dir():
        return _error("partition", args.input, ValueError(
            "is a folder without dataset.json, not a mesh, graph or point-cloud file; for a folder of "
            f"case files, make a dataset of them first: meshshard dataset {shlex.quote(args.input)} --out DATA "
            f"--inputs NAMES --targets NAMES, then meshshard partition DATA --parts {args.parts} "
            f"--out {shlex.quote(args.out)}"))
    out = Path(args.out)
    try:
        # the flag, or else the environment variable, checked alike before anything is touched
        args.max_expansion = (max_expansion() if args.max_expansion is None
                              else parse_max_expansion(args.max_expansion, "--max-expansion"))
        notes = check_output_dir(out, args.force, inputs=[args.input] if args.input else [])
    except (ValueError, OSError) as err:
        return _error("partition", None, err)
    for note in notes:
        print(f"meshshard partition: note: {note}", file=sys.stderr)
    if args.grid is not None or args.input is None:
        from ._grid import grid_command
        return grid_command(args, _error)
    try:
        with Steps(enabled=not args.quiet, track_memory=True) as steps:
            folder = partition_file(
                args.input, out, args.parts, format=args.format, graph=args.graph, knn=args.knn,
                radius=args.radius, ncommon=args.ncommon, method=args.method,
                halo_hops=args.halo_hops, imbalance=args.imbalance, seed=args.seed,
                recursive=args.recursive, tries=args.tries, tpwgts=args.tpwgts, force=args.force,
                max_expansion=args.max_expansion, steps=steps)
    except (ValueError, OSError, MemoryError) as err:  # a failed write names its own file
        return _error("partition", None if isinstance(err, WriteError) else args.input, err)
    if not args.quiet:
        print_summary(read_metadata(folder), steps.seconds, steps.peak_mb)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from meshshard.data import PARTITIONS_FILE, is_dataset
    from meshshard.partition import dump_partition_metadata as dump_metadata
    from meshshard.partition import print_summary, read_metadata

    if is_dataset(args.dir) or (Path(args.dir) / PARTITIONS_FILE).is_file():
        from ._dataset import run_info

        return run_info(args.dir, args.json)
    try:
        meta = read_metadata(args.dir)
    except (ValueError, OSError) as err:
        return _error("info", args.dir, err)
    if args.json:
        sys.stdout.write(dump_metadata(meta))
    else:
        source = meta["input"]
        what = (f"a grid of {' x '.join(map(str, meta.get('parameters', {}).get('shape', [])))} points"
                if source.get("kind") == "grid" else f"{source.get('name')} ({source.get('kind')})")
        print(f"{args.dir}: {meta['format']} v{meta['format_version']}, input {what}")
        print_summary(meta)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from meshshard.data import PARTITIONS_FILE
    from meshshard.partition import plural, read_metadata, verify_partition

    if (Path(args.dir) / PARTITIONS_FILE).is_file():
        from ._dataset import run_verify

        return run_verify(args.dir, _cmd_verify)
    try:
        meta = read_metadata(args.dir)
        problems = verify_partition(args.dir)
    except (ValueError, OSError) as err:
        return _error("verify", args.dir, err)
    if problems:
        for problem in problems:
            print(f"FAIL {problem}")
        print(f"{args.dir}: {len(problems)} problem(s) found")
        return 1
    print(f"{args.dir}: OK ({plural(meta['num_parts'], 'part')}, {meta['num_nodes']:,} nodes, "
          f"{meta['num_edges']:,} directed edges, halo_hops={meta['halo_hops']}; ownership, "
          "edges, halo, plans, checksums checked)")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from meshshard.data import PARTITIONS_FILE, read_partitions_metadata
    from meshshard.partition import WriteError, plot_partition

    try:
        if (Path(args.dir) / PARTITIONS_FILE).is_file():  # a dataset's partitions, found as verify finds them
            folders = [str(m["folder"]) for m in read_partitions_metadata(args.dir)["meshes"]]
            shown = ", ".join(folders) if len(folders) <= 4 else f"{folders[0]}, {folders[1]}, ..., {folders[-1]}"
            first = shlex.quote(str(Path(args.dir) / folders[0])) if folders else "DIR/mesh-00000"
            raise ValueError(f"holds the partitions of {len(folders)} meshes ({shown}); plot one of them: "
                             f"meshshard plot {first} --out {shlex.quote(str(args.out))}")
        out = plot_partition(args.dir, args.out)
    except (ValueError, OSError, ImportError) as err:  # a failed write names the picture
        return _error("plot", None if isinstance(err, WriteError) else args.dir, err)
    print(f"wrote {out}")
    return 0


def _add(subparsers: argparse._SubParsersAction, name: str, help: str,
         func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(func=func)
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``partition``, ``info``, ``verify`` and ``plot`` sub-parsers."""
    p = _add(subparsers, "partition", "split a mesh, graph or point cloud into parts, with "
             "ghosts and halo plans, into a partition folder", _cmd_partition)
    p.add_argument("input", nargs="?", help="mesh (any meshio format), METIS graph (.graph[.bz2]) "
                   "or mesh, point cloud (.npy/.npz, N x 2 or N x 3), or a dataset folder "
                   "(meshshard dataset: its mesh, or one partition per distinct mesh); none with --grid")
    p.add_argument("--parts", "-k", type=int, required=True, help="number of parts (ranks)")
    p.add_argument("--out", "-o", required=True, help="partition folder to create")
    p.add_argument("--method", choices=("metis", "rcb", "morton", "kaminpar"), default=None,
                   help="the one-process partitioner (default metis; kaminpar when installed)")
    p.add_argument("--engine", choices=("geometric", "ptscotch", "kaminpar"), default=None,
                   help="geometric or ptscotch: a distributed partition of a .vtkhdf mesh, each process reading 1/P "
                   "of it (geometric, the Morton order of --method morton, is the default under torchrun or "
                   "mpirun; ptscotch runs under mpirun -n P); kaminpar: one process, threads")
    p.add_argument("--graph", action=_GraphAction, default=None, metavar="nodal|dual|knn:K|radius:R",
                   help="graph to partition (default: nodal for meshes, knn for point clouds, the file's own graph "
                   "for METIS graphs); knn:K and radius:R as meshshard dataset --graph spells them (mesh is nodal; "
                   "knn and radius alone take --knn and --radius)")
    p.add_argument("--knn", type=int, default=6, help="neighbours per point for --graph knn (default 6)")
    p.add_argument("--radius", type=float, default=None, help="radius for --graph radius")
    p.add_argument("--ncommon", type=int, default=None,
                   help="shared nodes joining two cells in the dual graph (default: a face)")
    p.add_argument("--halo-hops", type=int, default=1,
                   help="k: ghosts within k hops, edges for k layers with no exchange")
    p.add_argument("--imbalance", type=float, default=0.03,
                   help="allowed max/mean - 1 of the part loads (METIS ufactor / 1000)")
    p.add_argument("--seed", type=int, default=0, help="METIS random seed")
    variant = p.add_mutually_exclusive_group()
    variant.add_argument("--recursive", action="store_const", const=True, default=None,
                         help="METIS recursive bisection only (default: k-way and, for up to "
                         "16 parts, recursive bisection; the smaller cut within --imbalance)")
    variant.add_argument("--kway", dest="recursive", action="store_const", const=False,
                         help="METIS k-way only")
    p.add_argument("--tries", type=int, default=None,
                   help="METIS tries (ncuts) per variant, the best kept (default: "
                   "min(5, 20M / directed edges), at least 1; the cost grows linearly)")
    p.add_argument("--tpwgts", type=_weights, default=None,
                   help="target share of each part, comma-separated, summing to 1")
    p.add_argument("--format", default="auto",
                   choices=("auto", "meshio", "metis-graph", "metis-mesh", "points"),
                   help="input format (default: from the file name)")
    p.add_argument("--max-expansion", default=None, metavar="RATIO",
                   help="largest decompressed/compressed size ratio of a .bz2/.gz input "
                   "(default: MESHSHARD_MAX_EXPANSION or 100; 64 MiB is always allowed)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing partition folder (only one holding nothing but a "
                   "partition's files; never the current folder or its parents)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars, no summary")
    from ._grid import add_grid_arguments
    add_grid_arguments(p)

    p = _add(subparsers, "info", "print a partition or dataset folder's metadata", _cmd_info)
    p.add_argument("dir", help="partition folder or dataset folder")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")

    p = _add(subparsers, "verify", "check every invariant and checksum of a partition folder "
             "(exit 0 valid, 1 not)", _cmd_verify)
    p.add_argument("dir", help="partition folder")

    p = _add(subparsers, "plot", "draw a partition's nodes coloured by part, ghosts outlined",
             _cmd_plot)
    p.add_argument("dir", help="partition folder")
    p.add_argument("--out", "-o", required=True, help="image file to write (e.g. parts.png)")
