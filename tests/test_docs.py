"""Every runnable code block of docs/*.md runs: blocks marked ```bash test or ```python test.

The blocks of one page run in order, in one temporary folder, so a page can make the files its
later commands use. A block marked ```python file=NAME.py is a file the page asks you to save: it is
written there under that name (not run), for the later blocks to use. ``meshshard`` and ``python`` are this environment's; bash blocks run with
``set -e``, so any failing command fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```(bash|python) (test|file=[\w.-]+)\n(.*?)^```", re.S | re.M)


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    """``[(language or "file=NAME", code)]`` of a page's runnable blocks and files, in order."""
    return [(m.group(1) if m.group(2) == "test" else m.group(2), m.group(3)) for m in BLOCK.finditer(page.read_text())]


PAGES = sorted(p.name for p in DOCS.glob("*.md") if runnable_blocks(p))


def test_the_pages_with_runnable_blocks_are_the_user_guides() -> None:
    assert {"datasets.md", "training.md", "prediction.md"} <= set(PAGES)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_docs_page_runs(page: str, tmp_path: Path) -> None:
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                        "MPLBACKEND": "Agg"}
    for n, (language, code) in enumerate(runnable_blocks(DOCS / page)):
        if language.startswith("file="):
            (tmp_path / language.removeprefix("file=")).write_text(code)
            continue
        if language == "python":
            script = tmp_path / f"block-{n}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        else:
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, f"{page}, block {n + 1} ({language}) failed:\n{code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
