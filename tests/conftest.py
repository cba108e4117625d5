"""Shared fixtures.

Real test data: ``../shared/data`` beside the repository (see its README). The suite runs without
it: tests that only need *a* mesh generate one (``tests/_meshes.py``: ``mesh_case`` and
``mesh_input`` fall back to ``synthetic_mesh``), and only the tests that need an exact file (the
``shared_data`` fixture below, or ``tests._meshes.data_file``) skip, saying which file and why.

To check that, run the suite as if the data were missing, with the data left where it is::

    MESHSHARD_TEST_NO_SHARED=1 .venv/bin/python -m pytest -rs

and compare the skips (``-rs`` lists them with their reasons) with a run without the variable.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._meshes import DATA, NO_SHARED_ENV, shared_data_dir
from tests._warm import warm_command

# The suite runs on the CPU, as CI does, also on a machine with GPUs: every rank and every command it
# starts uses gloo (its multi-rank tests start more ranks than a workstation has GPUs). The GPU
# checks are bench/gpu.sh's.
os.environ.setdefault("MESHSHARD_BACKEND", "gloo")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = DATA


@pytest.fixture(scope="session", autouse=True)
def _temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The temporary folder of this test process and of every process it starts: one of pytest's own
    (it keeps the last three runs' and removes older ones). What is written to the system's and never
    removed stays out of /tmp: torch-geometric writes a module per MessagePassing class and process
    there (``torch_geometric.template``), and a test that kills a command's launcher leaves that
    launcher's folder (this machine's /tmp held 37,344 of torch-geometric's after a day of runs)."""
    folder = tmp_path_factory.mktemp("tmp")
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    yield
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real meshes and graphs in ../shared/data (see its README); skips when absent or hidden."""
    root = shared_data_dir()
    if root is None:
        why = f"hidden by {NO_SHARED_ENV}=1" if SHARED_DATA.is_dir() else "not found"
        pytest.skip(f"needs the real test data at {SHARED_DATA} ({why}; expected ../shared/data beside the repo)")
    return root


@pytest.fixture(scope="session")
def warm_bin() -> Path:
    """A folder with a warm ``meshshard`` (:mod:`tests._warm`) to put first on PATH: the documented
    commands run without importing torch anew (one server per test process, for the session)."""
    return Path(warm_command()[0]).parent

