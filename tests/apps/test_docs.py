"""Every runnable code block of docs/*.md runs: blocks marked ```bash test or ```python test.
Blocks marked ```python torchrun (docs) and the README's ```python test blocks run under ``torchrun
--nproc-per-node 2`` on the ``data/`` and ``parts/`` of the README's four commands.

The blocks of one page run in order, in one temporary folder, so a page can make the files its
later commands use. A block marked ```python file=NAME.py is a file the page asks you to save: it is
written there under that name (not run), for the later blocks to use. ``python`` is this environment's,
``meshshard`` its command and a Python block started warm (:mod:`tests._warm`); bash blocks run with ``set -e``, so any
failing command fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._warm import warm_python

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```(bash|python) (test|file=[\w.-]+)\n(.*?)^```", re.S | re.M)


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    """``[(language or "file=NAME", code)]`` of a page's runnable blocks and files, in order."""
    return [(m.group(1) if m.group(2) == "test" else m.group(2), m.group(3)) for m in BLOCK.finditer(page.read_text())]


PAGES = sorted(p.name for p in DOCS.glob("*.md") if runnable_blocks(p))


def test_the_pages_with_runnable_blocks_are_the_user_guides() -> None:
    assert {"datasets.md", "training.md", "prediction.md"} <= set(PAGES)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a user guide runs every one of its blocks in turn: minutes on a loaded 2-core machine
@pytest.mark.parametrize("page", PAGES)
def test_docs_page_runs(page: str, tmp_path: Path, warm_bin: Path) -> None:
    """``meshshard`` is the warm one of :mod:`tests._warm` (the same entry point, without importing
    torch for each command), and so is the ``python`` of a Python block (``warm_python``); a
    ``python`` in a bash block is this environment's."""
    path = os.pathsep.join([str(warm_bin), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = os.environ | {"PATH": path, "MPLBACKEND": "Agg"}
    for n, (language, code) in enumerate(runnable_blocks(DOCS / page)):
        if language.startswith("file="):
            (tmp_path / language.removeprefix("file=")).write_text(code)
            continue
        if language == "python":
            script = tmp_path / f"block-{n}.py"
            script.write_text(code)
            cmd = [*warm_python(), str(script)]
        else:
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, f"{page}, block {n + 1} ({language}) failed:\n{code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


README = DOCS.parent / "README.md"
TORCHRUN = re.compile(r"^```python torchrun\n(.*?)^```", re.S | re.M)


@pytest.mark.slow
def test_readme_and_docs_torchrun_blocks_run_on_two_ranks(tmp_path: Path) -> None:
    """The README's Python blocks and the docs' ```python torchrun blocks, as written, under ``torchrun
    --nproc-per-node 2``, on the ``data/`` and ``parts/`` the README's four commands make (made here
    from a real mesh with fields k, f, wall and T: ../shared/data/sfepy/big.mesh, or its generated stand-in)."""
    import numpy as np

    from meshshard.data import partition_dataset, write_dataset
    from tests._meshes import mesh_input

    readme = [code for language, code in runnable_blocks(README) if language == "python"]
    assert len(readme) == 1, "the README's blocks marked ```python test changed: update this test"
    docs = [(page.name, m.group(1)) for page in sorted(DOCS.glob("*.md")) for m in TORCHRUN.finditer(page.read_text())]
    assert [name for name, _ in docs] == ["parallelism.md"], "the docs' ```python torchrun blocks changed: update it"
    mesh = mesh_input("sfepy/big.mesh")
    pos = np.asarray(mesh.pos, dtype=np.float64)
    inputs = np.stack([np.stack([np.cos(pos[:, 0] + s), np.sin(pos[:, 1]), pos[:, 0] > s], 1) for s in (0.0, 0.5, 1.0)])
    targets = inputs[:, :, :1] * inputs[:, :, 1:2]
    write_dataset(tmp_path / "data", inputs, targets, pos=pos, cells=list(mesh.cells), input_names=["k", "f", "wall"],
                  target_names=["T"])
    partition_dataset(tmp_path / "data", tmp_path / "parts", 2)
    env = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "60"}
    stdout = {}
    for n, (where, code) in enumerate([("README.md", readme[0]), *docs]):
        script = tmp_path / f"block-{n}.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"{where} block failed:\n{code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        stdout[where] = proc.stdout
    # the collectives block (parallelism.md) prints its log on each rank
    assert stdout["parallelism.md"].count("indexed_all_to_all_v/forward: 1") == 2, stdout["parallelism.md"]
