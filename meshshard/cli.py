"""The ``meshshard`` command.

Each subcommand lives next to the code it drives and registers itself through a module-level
``register(subparsers)`` function, which adds an ``argparse`` sub-parser whose ``func`` takes the
parsed arguments and returns an exit code. Heavy imports (torch, pymetis) happen inside ``func``,
so ``meshshard --help`` and the partition commands start quickly.

Exit codes: 0 success, 1 a check failed (``verify``), 2 bad input or usage. A subcommand of a
lower layer (``meshshard.partition``) reports its own errors, since it may not import this module;
subcommands of this layer raise :class:`CommandError`, printed here as one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from meshshard import __version__

#: Modules that contribute subcommands, in the order ``--help`` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "meshshard.partition._cli",
    "meshshard.partition._dataset_cli",
    "meshshard._train",
    "meshshard._predict",
    "meshshard._demo",
    "meshshard._selftest",
)


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain-parallel GNN training on meshes and point clouds too large for one device.",
    )
    parser.add_argument("--version", action="version", version=f"meshshard {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # a real missing dependency, not a subcommand still to come
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        return int(func(args) or 0)
    except CommandError as err:
        print(f"meshshard {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"meshshard {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
