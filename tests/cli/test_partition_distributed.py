"""``meshshard convert`` and ``meshshard partition`` under torchrun: the same folder as one process, one error
line, and a process that dies failing the job in seconds with no output folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshshard.cli import main
from meshshard.partition import verify_partition
from tests.partition._mixed_mesh import mixed_mesh, write_mixed_vtkhdf
from tests.partition.test_distributed import same_folders

pytest.importorskip("h5py")
HERE = Path(__file__).resolve().parent
ENV = os.environ | {"OMP_NUM_THREADS": "1", "MESHSHARD_TIMEOUT": "30", "PYTHONPATH": str(HERE.parents[1])}


def _torchrun(nproc: int, *args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_convert_then_torchrun_writes_the_one_process_folder(tmp_path: Path, capsys) -> None:
    import meshio

    pos, cells = mixed_mesh()
    meshio.write(tmp_path / "mesh.vtu", meshio.Mesh(pos, cells, point_data={"T": pos[:, 1]}))
    assert main(["convert", str(tmp_path / "mesh.vtu"), "--out", str(tmp_path / "mesh.vtkhdf")]) == 0
    assert f"wrote {tmp_path / 'mesh.vtkhdf'} ({len(pos):,} points" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "mesh.vtu"), "--out", str(tmp_path / "mesh.vtkhdf")]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["partition", str(tmp_path / "mesh.vtkhdf"), "--parts", "5", "--method", "morton",
                 "--out", str(tmp_path / "one"), "--quiet"]) == 0
    proc = _torchrun(3, "-m", "meshshard", "partition", "mesh.vtkhdf", "--parts", "5", "--out", "parts", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("with 3 process(es)") == 1  # printed by process 0 alone
    same_folders(tmp_path / "one", tmp_path / "parts")
    assert verify_partition(tmp_path / "parts") == []


def test_srun_tasks_partition_as_torchrun_processes_do(tmp_path: Path) -> None:
    """Two processes started with the variables srun sets (no torchrun, no MPI) make one distributed
    partition, the same folder as one process's Morton partition."""
    import socket

    write_mixed_vtkhdf(tmp_path)
    assert main(["partition", str(tmp_path / "mixed.vtkhdf"), "--parts", "3", "--method", "morton",
                 "--out", str(tmp_path / "one"), "--quiet"]) == 0
    with socket.socket() as sock:  # a free port for the rendezvous (srun derives one from the job id)
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-m", "meshshard", "partition", "mixed.vtkhdf", "--parts", "3",
                               "--out", "parts"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True,
                              env=ENV | {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                                         "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost",
                                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[0][0].count("with 2 process(es)") == 1 and "process(es)" not in outs[1][0]
    same_folders(tmp_path / "one", tmp_path / "parts")
    assert verify_partition(tmp_path / "parts") == []


def test_an_agreed_error_is_one_line_from_process_0(tmp_path: Path) -> None:
    write_mixed_vtkhdf(tmp_path)
    proc = _torchrun(2, "-m", "meshshard", "partition", "mixed.vtkhdf", "--parts", "3", "--out", "parts",
                     "--halo-hops", "2", cwd=tmp_path)
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if line.startswith("meshshard partition: error:")]
    assert said == ["meshshard partition: error: Expected --halo-hops 1 in a distributed partition (got 2); "
                    "k-hop halos are built by one process (run without torchrun)"], proc.stderr[-3000:]
    assert not (tmp_path / "parts").exists()


def test_one_process_options_are_refused(tmp_path: Path, capsys) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    assert main(["partition", str(mesh), "--parts", "3", "--out", str(tmp_path / "p"), "--engine", "geometric",
                 "--method", "metis"]) == 2
    assert "--method metis runs in one process" in capsys.readouterr().err
    assert main(["partition", str(mesh), "--parts", "3", "--out", str(tmp_path / "p"), "--engine", "geometric",
                 "--tpwgts", "0.5,0.25,0.25"]) == 2
    assert "--tpwgts is not taken by a distributed partition" in capsys.readouterr().err
    assert main(["partition", str(mesh), "--parts", "3", "--out", str(tmp_path / "p"), "--engine", "geometric",
                 "--quiet"]) == 0
    assert verify_partition(tmp_path / "p") == []


DYING = """
import os, sys
import meshshard.partition._distributed as top
from meshshard.cli import entry

if os.environ["RANK"] == "1":  # dies while writing its parts, after process 0 made the staging folder
    def die(*args, **kwargs):
        os._exit(7)
    top.write_shards = die
sys.argv = ["meshshard", *sys.argv[1:]]
entry()
"""


def test_a_dying_process_fails_the_job_in_seconds_and_leaves_no_folder(tmp_path: Path) -> None:
    write_mixed_vtkhdf(tmp_path)
    (tmp_path / "dying.py").write_text(DYING)
    start = time.monotonic()
    proc = _torchrun(2, "dying.py", "partition", "mixed.vtkhdf", "--parts", "3", "--out", "parts", cwd=tmp_path)
    assert proc.returncode != 0
    assert time.monotonic() - start < 60, "waited on the dead process"
    assert not (tmp_path / "parts").exists()
    assert main(["partition", str(tmp_path / "mixed.vtkhdf"), "--parts", "3", "--out", str(tmp_path / "parts"),
                 "--engine", "geometric", "--quiet"]) == 0  # what the killed job left is tidied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dying.py", "mixed.vtkhdf", "parts"]
