from __future__ import annotations

import subprocess
import sys

from meshshard.cli import main


def test_help_lists_commands(capsys) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "selftest" in out and "demo" in out


def test_console_script_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "meshshard", "--help"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("usage: meshshard")


def test_selftest_rejects_zero_ranks(capsys) -> None:
    assert main(["selftest", "--ranks", "0"]) == 2
    assert "Expected --ranks >= 1 (got 0)" in capsys.readouterr().out
