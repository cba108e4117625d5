"""Process-group set-up: torchrun and SLURM variables, a world of one, the 2-D device mesh."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from meshshard.comm import (
    all_gather_v,
    first_slurm_host,
    init_device_mesh_2d,
    init_distributed,
    local_ranks_backend,
)
from meshshard.comm._context import _check_cuda_devices, _launch_from_env
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


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.delenv("MESHSHARD_BACKEND", raising=False)


@pytest.mark.parametrize(("gpus", "ranks", "bound", "refused"), [
    (4, 4, True, False), (8, 4, True, False), (2, 4, True, True), (3, 4, False, True),
    # one visible GPU: a launcher may have bound one to each rank (SLURM --gpus-per-task=1) ...
    (1, 4, True, False),
    # ... but --nproc starts the ranks with this process's devices: one GPU is one GPU
    (1, 2, False, True), (1, 1, False, False),
])
def test_nccl_needs_a_gpu_per_local_rank(monkeypatch: pytest.MonkeyPatch, gpus: int, ranks: int, bound: bool, refused: bool) -> None:
    _gpus(monkeypatch, gpus)
    if refused:
        plural = "s" if gpus > 1 else ""
        with pytest.raises(ValueError, match=rf"Expected a GPU for each of the {ranks} ranks on this node with NCCL "
                                             rf"\(got {gpus} visible CUDA device{plural}\): start at most {gpus} rank{plural} per node "
                                             r".*or set MESHSHARD_BACKEND=gloo to run every rank on the CPU"):
            _check_cuda_devices(ranks, bound_per_rank=bound)
    else:
        _check_cuda_devices(ranks, bound_per_rank=bound)
    _check_cuda_devices(ranks, "gloo", bound_per_rank=bound)  # gloo runs on the CPU: any number of ranks
    monkeypatch.setenv("MESHSHARD_BACKEND", "gloo")
    _check_cuda_devices(ranks, bound_per_rank=bound)


@pytest.mark.parametrize(("gpus", "local_rank", "index"), [(4, 3, 3), (2, 0, 0), (1, 3, 0)])
def test_each_nccl_rank_takes_the_gpu_of_its_local_rank_or_the_one_it_sees(
        monkeypatch: pytest.MonkeyPatch, gpus: int, local_rank: int, index: int) -> None:
    from meshshard.comm._context import _device_for

    _gpus(monkeypatch, gpus)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert _device_for("nccl", local_rank) == torch.device("cuda", index)
    assert chosen == [index]
    assert _device_for("gloo", local_rank) == torch.device("cpu")


def test_local_ranks_sharing_one_gpu_are_refused_after_the_group_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL refuses two ranks on one GPU at its first collective; every rank then gets the same line."""
    from types import SimpleNamespace

    from meshshard.comm._context import _check_gpus_apart

    _gpus(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="GPU-1"))
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)

    def nccl_refuses(out, obj, group=None):
        raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp, invalid usage (run with NCCL_DEBUG=WARN for details)\n"
                                    "Last error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 60")

    monkeypatch.setattr(dist, "all_gather_object", nccl_refuses)
    refusal = r"Expected a GPU for each of the 2 ranks on this node with NCCL \(got 1 visible CUDA device\)"
    with pytest.raises(ValueError, match=refusal):
        _check_gpus_apart(2)

    def same_gpu(out, obj, group=None):  # a backend that lets them share: the GPUs' ids tell
        out[:] = [obj, obj]

    monkeypatch.setattr(dist, "all_gather_object", same_gpu)
    with pytest.raises(ValueError, match=refusal):
        _check_gpus_apart(2)

    def own_gpus(out, obj, group=None):  # one GPU bound to each rank (SLURM --gpus-per-task=1)
        out[:] = [obj, (obj[0], "GPU-2")]

    monkeypatch.setattr(dist, "all_gather_object", own_gpus)
    _check_gpus_apart(2)


def test_gloo_means_the_cpu_for_one_process_too(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    _gpus(monkeypatch, 1)
    assert init_distributed().device == torch.device("cuda", 0)
    monkeypatch.setenv("MESHSHARD_BACKEND", "gloo")
    assert init_distributed().device == torch.device("cpu")
    assert init_distributed("gloo").device == torch.device("cpu")


def test_local_ranks_without_a_gpu_each_run_on_the_cpu_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    assert local_ranks_backend(2) == ("gloo", None)
    _gpus(monkeypatch, 2)
    assert local_ranks_backend(2) == ("nccl", None)
    _gpus(monkeypatch, 1)
    backend, note = local_ranks_backend(2)
    assert backend == "gloo"
    assert note == ("2 ranks and 1 GPU here: the ranks run on the CPU (gloo), since NCCL needs a GPU for each rank "
                    "(MESHSHARD_BACKEND=nccl refuses instead)")
    monkeypatch.setenv("MESHSHARD_BACKEND", "gloo")
    assert local_ranks_backend(2) == ("gloo", None)


def test_nccl_asked_for_more_local_ranks_than_gpus_is_refused_before_any_rank_starts(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from meshshard.cli._launch import run_command

    _gpus(monkeypatch, 1)
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MESHSHARD_BACKEND", "nccl")
    started = []
    assert run_command("train", started.append, 2, {}) == 2
    assert started == []
    assert "meshshard train: error: Expected a GPU for each of the 2 ranks on this node with NCCL (got 1" in capsys.readouterr().err
    # under torchrun too, every rank refuses before the group is made (rank 0 does not wait for the others)
    _gpus(monkeypatch, 2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("the group was made"))
    with pytest.raises(ValueError, match=r"Expected a GPU for each of the 4 ranks on this node with NCCL \(got 2"):
        init_distributed()


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
    proc = subprocess.run([sys.executable, "-m", "meshshard", "selftest", "--nproc", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "selftest passed: 2 ranks" in proc.stdout


_AT_EXIT = """
import atexit, sys
import torch, torch.distributed as dist
atexit.register(lambda: print(f"rank {dist.get_rank() if dist.is_initialized() else '-'}: group up at exit: "
                              f"{dist.is_initialized()}", flush=True))  # runs after init_distributed's own
from meshshard.comm import init_distributed
ctx = init_distributed()
t = torch.ones(2)
dist.all_reduce(t)
if sys.argv[1] == "fail":
    raise ValueError("a script that fails")
"""


@pytest.mark.parametrize("how", ["ends", "fail"])
def test_the_group_init_distributed_made_is_shut_down_when_a_script_ends(tmp_path, how: str) -> None:
    """Left to the interpreter's teardown, gloo could abort a finished rank ("terminate called
    without an active exception"); after an uncaught exception the group is left alone (a peer
    may still wait in a collective)."""
    script = tmp_path / "script.py"
    script.write_text(_AT_EXIT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(script), how]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if how == "ends":
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("rank -: group up at exit: False") == 2, proc.stdout
    else:
        assert proc.returncode != 0 and "a script that fails" in proc.stderr
        assert "group up at exit: True" in proc.stdout, proc.stdout


def test_a_rank_waiting_for_one_that_never_comes_says_so_then_gives_up() -> None:
    code = ("import meshshard.comm._context as c\nc._WAIT_NOTE_S = 0.5\n"
            "try:\n    c.init_distributed()\nexcept Exception as err:\n    print('gave up:', type(err).__name__)\n")
    env = {**__import__("os").environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "MESHSHARD_TIMEOUT": "3", "MESHSHARD_BACKEND": "gloo"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stderr.count("meshshard: rank 0 is waiting for the other 1 rank(s) at 127.0.0.1:") == 1, done.stderr
    assert "it gives up after 3 s, MESHSHARD_TIMEOUT" in done.stderr and "gave up:" in done.stdout, done.stdout


def test_slurm_without_tasks_per_node_takes_one_node() -> None:
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}
    assert _launch_from_env(env) == ("slurm", 1, 2, 1, 2)
