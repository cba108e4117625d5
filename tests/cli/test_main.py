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
    assert main(["selftest", "--nproc", "0"]) == 2
    assert "Expected --nproc >= 1 (got 0)" in capsys.readouterr().out


def test_ctrl_c_while_the_commands_load_is_one_line(monkeypatch, capsys) -> None:
    import meshshard.cli as cli

    def interrupted(_chosen):
        raise KeyboardInterrupt  # as if Ctrl-C came while torch was importing

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["train", "parts", "--data", "d", "--out", "r"]) == 130
    assert capsys.readouterr().err == "meshshard: interrupted\n"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path) -> None:
    """``meshshard info X | head``: a closed pipe is exit 141 and no traceback."""
    import os

    import numpy as np

    from meshshard.data import write_dataset

    values = np.ones((1, 3, 1))
    write_dataset(tmp_path / "d", values, values, pos=np.array([[0.0, 0], [1, 0], [0, 1]]),
                  cells=[("triangle", np.array([[0, 1, 2]]))])
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "meshshard", "info", str(tmp_path / "d")], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_scripts_start_the_command_that_meshshard_command_names(monkeypatch) -> None:
    from meshshard.cli import command_argv

    monkeypatch.delenv("MESHSHARD_COMMAND", raising=False)
    assert command_argv() == [sys.executable, "-m", "meshshard"]
    monkeypatch.setenv("MESHSHARD_COMMAND", "  ")  # blank: as if unset
    assert command_argv() == [sys.executable, "-m", "meshshard"]
    monkeypatch.setenv("MESHSHARD_COMMAND", "'/tmp/a b/meshshard' --x")  # split as a shell would
    assert command_argv() == ["/tmp/a b/meshshard", "--x"]
