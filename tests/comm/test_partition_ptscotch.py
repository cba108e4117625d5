"""``--engine ptscotch``: PT-Scotch on 1 to 4 MPI processes (``mpirun``) writes a valid partition whose stored
assignment, given to one process, gives the same part files byte for byte; ``MPIExchange`` moves any dtype in
rounds; the documented command runs. Skipped, saying why, where mpirun, mpi4py, pyscotch or Debian's
libptscotch is missing (``.ci/run`` installs them where it can)."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.partition import partition_file, read_assignment, read_metadata, verify_partition
from tests.partition._mixed_mesh import write_mixed_vtkhdf
from tests.partition.test_distributed import same_folders

pytest.importorskip("h5py")
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_ptscotch_worker.py")


def _missing() -> str | None:
    """Why PT-Scotch cannot run here, or ``None`` (looked up without starting MPI in this process)."""
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (apt-get install openmpi-bin)"
    for name in ("mpi4py", "pyscotch"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed (pip install mpi4py pyscotch)"
    for lib in filter(None, [ctypes.util.find_library("ptscotch"), "libptscotch-7.0.so"]):
        try:
            ctypes.CDLL(lib)
            return None
        except OSError:
            continue
    return "Debian's libptscotch is not installed (apt-get install libptscotch-7.0)"


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"PT-Scotch: {MISSING}")
#: Open MPI's settings for a test: root allowed (CI runs as root), more processes than cores.
ENV = os.environ | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
#: Entries of partition.json that say how the assignment was made: PT-Scotch's against "given".
HOW = ("distributed", "metadata_sha256", "method", "parameters")


def _same_as_one_process(mesh: Path, folder: Path, one: Path, num_parts: int) -> None:
    """The assignment ``folder`` stores, given to one process: the same part files, byte for byte."""
    import tests.partition.test_distributed as geometric

    partition_file(mesh, one, num_parts, parts=read_assignment(folder))
    assert read_metadata(one)["method"] == "given"
    saved = geometric.HOW
    geometric.HOW = HOW  # the helper of the geometric tests, with the engine's entries left out
    try:
        same_folders(folder, one)
    finally:
        geometric.HOW = saved


@pytest.mark.slow  # one mpirun of 4 processes, each loading torch and PT-Scotch: about 10 s on 2 idle cores
@pytest.mark.timeout(240)
def test_ptscotch_on_1_to_4_processes_stores_an_assignment_one_process_rebuilds(tmp_path: Path) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    cmd = ["mpirun", "-n", "4", sys.executable, str(WORKER), str(mesh), str(tmp_path), "5"]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for p in range(1, 5):
        folder = tmp_path / f"p{p}"
        assert verify_partition(folder) == []
        meta = read_metadata(folder)
        assert meta["method"] == "ptscotch" and meta["distributed"] == {"engine": "ptscotch", "processes": p}
        assert meta["load_imbalance"] < 1.3  # PT-Scotch's own balance, not a geometric cut's accident
        _same_as_one_process(mesh, folder, tmp_path / f"one{p}", 5)
    every = json.loads((tmp_path / "exchange.json").read_text())
    for rank, found in enumerate(every):  # rows of 16 bytes, sent 3 bytes per source and round
        assert found["got"] == [[[q * 10 + rank] * 2] * (rank + q) for q in range(4)]
        assert found["dtypes"] == ["uint64"] * 4 and found["min"] == [0, -3] and found["sum"] == [3.0]
        assert found["gathered"] == [{"r": q} for q in range(4)]


def _documented(page: str, word: str) -> str:
    """The docs' ```bash block (not run by tests/apps/test_docs.py, which cannot skip) holding ``word``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "docs" / page).read_text(), re.S | re.M)
    found = [b for b in blocks if word in b]
    assert len(found) == 1, f"docs/{page}: expected one ```bash block with {word!r}"
    return found[0]


@pytest.mark.slow  # mpirun of 2 processes of the meshshard command (torch, PT-Scotch): about 6 s on 2 idle cores
@pytest.mark.timeout(240)
def test_the_documented_ptscotch_command_runs(tmp_path: Path) -> None:
    write_mixed_vtkhdf(tmp_path).rename(tmp_path / "cube.vtkhdf")
    code = _documented("partition.md", "--engine ptscotch")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=200)
    assert proc.returncode == 0, f"{code}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.count("with 2 process(es)") <= 1  # printed by process 0 alone (--quiet: not at all)
    assert read_metadata(tmp_path / "cube-scotch")["distributed"] == {"engine": "ptscotch", "processes": 2}
