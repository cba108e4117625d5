"""The grid_conv example runs at reduced size and reports equality with one device."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_grid_conv_example_equals_one_device():
    cmd = [sys.executable, str(ROOT / "examples" / "grid_conv" / "grid_conv.py"), "--nproc", "3",
           "--height", "20", "--width", "12", "--kernel", "5", "--padding-mode", "reflect"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rows per rank [7, 7, 6]" in done.stdout
    assert "1 forward, 1 backward" in done.stdout
    assert "equal to one device" in done.stdout
