"""The one check of a command that must refuse: exit code 2, one line naming the problem, nothing left behind.

    from tests._refusals import assert_refused_in_one_line

    assert_refused_in_one_line(["dataset", ...], "Expected --targets for --mean-field", capsys, tmp_path / "out")
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshshard.cli import main

__all__ = ["assert_refused_in_one_line"]


def assert_refused_in_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture, out: Path) -> None:
    """``meshshard ARGS`` exits with 2, prints one line holding ``message`` and leaves no ``out``."""
    capsys.readouterr()
    assert main(args) == 2, args
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not Path(out).exists()
