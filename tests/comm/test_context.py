"""Process-group set-up: torchrun and SLURM variables, a world of one, the 2-D device mesh."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from meshshard.comm import all_gather_v, first_slurm_host, init_device_mesh_2d, init_distributed
from meshshard.comm._context import _launch_from_env
from tests._dist import free_port, run_ranks


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node17", "node17"), ("gpu[07-09,12]", "gpu07"), ("gpu[3,5]", "gpu3"), ("a[001-004],b[1-2]", "a001"), ("x1,x2", "x1")],
)
def test_first_slurm_host(nodelist: str, host: str) -> None:
    assert first_slurm_host(nodelist) == host


def test_torchrun_variables_win_over_slurm() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert _launch_from_env(env) == ("torchrun", 3, 8, 1, 2)


def test_slurm_variables() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2(x3)"}
    assert _launch_from_env(env) == ("slurm", 5, 6, 1, 2)


def test_bad_variable_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"Expected the environment variable RANK to be an integer \(got 'x'\)"):
        _launch_from_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_world_of_one_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    ctx = init_distributed()
    assert (ctx.rank, ctx.world_size, ctx.launcher, ctx.backend) == (0, 1, "single", None)
    assert not dist.is_initialized()
    mesh = init_device_mesh_2d(1)
    assert (mesh.data_parallel_size, mesh.domain_parallel_size, mesh.data_group, mesh.domain_group) == (1, 1, None, None)


def test_mesh_size_must_divide_the_world() -> None:
    with pytest.raises(ValueError, match=r"positive divisor of the world size 4 \(got 3\)"):
        init_device_mesh_2d(3, world_size=4, rank=0)


def _mesh_groups(rank: int, world: int) -> tuple[int, int, list[float], list[float]]:
    mesh = init_device_mesh_2d(2)
    me = torch.tensor([[float(rank)]])
    domain = all_gather_v(me, [1, 1], group=mesh.domain_group)[:, 0].tolist()
    data = all_gather_v(me, [1, 1], group=mesh.data_group)[:, 0].tolist()
    return mesh.data_rank, mesh.domain_rank, domain, data


def test_device_mesh_2d_groups_on_four_ranks() -> None:
    got = run_ranks(_mesh_groups, 4)
    assert got == [
        (0, 0, [0.0, 1.0], [0.0, 2.0]),
        (0, 1, [0.0, 1.0], [1.0, 3.0]),
        (1, 0, [2.0, 3.0], [0.0, 2.0]),
        (1, 1, [2.0, 3.0], [1.0, 3.0]),
    ]


def test_selftest_under_torchrun_three_ranks() -> None:
    """The real launcher: torchrun's variables -> init_distributed -> exact checks on every rank."""
    port = str(free_port())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", port, "-m", "meshshard", "selftest"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "selftest passed: 3 ranks, backend gloo" in proc.stdout, proc.stdout


def test_selftest_starting_its_own_ranks() -> None:
    proc = subprocess.run([sys.executable, "-m", "meshshard", "selftest", "--ranks", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "selftest passed: 2 ranks" in proc.stdout
