"""One spelling per idea on every command, and the old spellings kept working.

:func:`add_deprecated` adds an option's old name (``selftest --ranks``, ``predict --steps``) as a
hidden spelling of the new one: the same destination, left out of ``--help``, and a one-line note on
standard error when it is used (``meshshard selftest: --ranks is deprecated; use --nproc``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["add_deprecated"]


class _Deprecated(argparse.Action):
    """Store the value as the new option would, after a note on standard error."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, command: str, **kwargs: Any) -> None:
        self.new, self.command = new, command
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"meshshard {self.command}: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated(parser: argparse.ArgumentParser, old: str, new: str, command: str, *, dest: str,
                   **kwargs: Any) -> None:
    """Add ``old`` to ``parser`` as a hidden spelling of the option ``new``, added before it (whose
    value goes to ``dest``, and whose default stands); ``kwargs`` are ``add_argument``'s (``type``,
    ``metavar``)."""
    parser.add_argument(old, dest=dest, action=_Deprecated, new=new, command=command, help=argparse.SUPPRESS,
                        **kwargs)
