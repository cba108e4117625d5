"""The ``meshshard`` command.

Subcommands are listed in :data:`COMMANDS`, a static table of ``(name, module, help)``. A
module is imported only when one of its commands runs: then its module-level
``register(subparsers)`` adds its ``argparse`` sub-parser(s), whose ``func`` takes the parsed
arguments and returns an exit code. ``meshshard --help`` lists every command from the table
without importing any, so it and the partition commands never import torch. Adding a command
is one line in the table (and a ``register`` in its module).

Exit codes: 0 success, 1 a check failed (``verify``), 2 bad input or usage. Each command is a thin
call into a public library function (:mod:`meshshard.partition`, :mod:`meshshard.run`), and
reports its errors as one line; :class:`CommandError` is printed here as one line.

This package is the commands' room: argument parsing, printing, launching ranks
(:mod:`._launch`). The library (everything else in ``meshshard``) never imports it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from collections.abc import Sequence

from meshshard import __version__

#: ``(command, module whose register() adds it, one-line help)``, in the order ``--help``
#: lists them. A module may register several commands (each gets its own row).
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("partition", "meshshard.cli._partition", "split a mesh, graph or point cloud into a "
     "partition folder"),
    ("info", "meshshard.cli._info", "print a partition, dataset, run or prediction folder's metadata"),
    ("verify", "meshshard.cli._partition", "check a partition folder (exit 0 valid, 1 not)"),
    ("plot", "meshshard.cli._partition", "draw a partition's nodes coloured by part"),
    ("convert", "meshshard.cli._convert", "write a mesh as a .vtkhdf file, which each process of a distributed "
     "partition reads in part"),
    ("dataset", "meshshard.cli._dataset", "make a dataset folder from mesh files with "
     "point_data fields"),
    ("train", "meshshard.cli._train", "train a sharded MeshGraphNet, or your own model, on a partition"),
    ("predict", "meshshard.cli._predict", "predict with a trained run: ParaView files, metrics, pictures"),
    ("baseline", "meshshard.cli._baseline", "what a model must beat (mean, nearest cases, interpolation), "
     "written as predict writes"),
    ("demo", "meshshard.cli._demo", "run the heat-diffusion example (examples/heat_diffusion) of a clone"),
    ("selftest", "meshshard.cli._selftest", "check the collectives on R local ranks"),
)


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (the first word that is not an option), if any."""
    for word in argv:
        if word in ("-h", "--help", "--version"):
            return None
        if not word.startswith("-"):
            return word
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported and registered, every other command
    is a placeholder carrying its help line."""
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain-parallel GNN training on meshes and point clouds too large for one device.",
    )
    parser.add_argument("--version", action="version", version=f"meshshard {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for name, module, _ in COMMANDS:
        if name == command:
            importlib.import_module(module).register(subparsers)
    for name, _, help in COMMANDS:
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = "meshshard"
    try:  # Ctrl-C while the command's modules (torch) are still importing: one line too
        parser = build_parser(_chosen(argv))
        args = parser.parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 0
        command = f"meshshard {args.command}"
        return int(func(args) or 0)
    except CommandError as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130


def command_argv() -> list[str]:
    """How a script starts the ``meshshard`` command: ``$MESHSHARD_COMMAND`` when set (split as a
    shell would; the test suite sets it to its warm command), else this Python's ``-m meshshard``.
    The sweep examples and the bench scripts start their commands with it."""
    given = os.environ.get("MESHSHARD_COMMAND", "").strip()
    return shlex.split(given) if given else [sys.executable, "-m", "meshshard"]


def _process_group_up() -> bool:
    """Whether this rank has a process group up; asked only once torch is loaded, so that a command
    that never needed torch does not import it just to ask."""
    from meshshard.comm import is_distributed

    return is_distributed()


def entry() -> None:
    """The ``meshshard`` command and ``python -m meshshard``: :func:`main`, then exit with its code.

    A rank that fails under torchrun or SLURM still has its process group up. The interpreter's
    teardown would destroy it while gloo's threads wait on a peer, and abort the process
    ("terminate called without an active exception"), turning exit code 1 into SIGABRT. Such a
    rank leaves without that teardown, its output flushed."""
    try:
        code = main()
    except BrokenPipeError:  # ``meshshard info X | head``: the reader has gone, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        code = 141
    if "torch.distributed" in sys.modules and _process_group_up():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
