"""Process-group set-up from torchrun or SLURM, and the 2-D (data x domain) device mesh.

``init_distributed()`` reads, in order:

1. torchrun (``torchrun`` / ``torch.distributed.run``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
2. SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE``
   and the first host of ``SLURM_JOB_NODELIST`` as the rendezvous address (``MASTER_ADDR`` /
   ``MASTER_PORT`` override it; the default port is derived from ``SLURM_JOB_ID``; the host list
   is expanded by ``scontrol`` or by :func:`meshshard.comm.expand_hostlist`);
3. neither: a world of one, with no process group (every collective then runs locally).

The backend is NCCL when CUDA is available, else gloo; ``backend=`` or ``MESHSHARD_BACKEND``
override it. gloo runs on the CPU, NCCL on the GPU: ``MESHSHARD_BACKEND=gloo`` keeps a world of one
on the CPU too. With NCCL each rank takes the GPU of its local rank, or the one GPU it sees when a
launcher binds one to each rank (SLURM ``--gpus-per-task=1``); more local ranks than GPUs is refused
before the group is made, and ranks that share one GPU when the group is
made, on every rank alike. Ranks that meshshard starts itself (``--nproc R``) use NCCL when there is
a GPU for each, else gloo on the CPU, with a note (:func:`local_ranks_backend`).

``MESHSHARD_TIMEOUT`` (seconds, default 300) bounds how long a collective waits for a rank that died
or stopped, in the default group and in every group ``init_device_mesh_2d`` makes.

Every variable is checked before any network set-up: a value that is not an integer, or a rank
outside ``[0, world size)``, is a one-line ``ValueError`` at once (not a rendezvous timeout).
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ._slurm import first_slurm_host

__all__ = ["DistributedContext", "init_distributed", "local_ranks_backend", "DeviceMesh2D", "init_device_mesh_2d",
           "is_peer_failure", "torch_device_mesh"]

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: its rank, the world, its device and how it got there."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None
    launcher: str  # "torchrun", "slurm", "existing" (a group was already initialised) or "single"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1 or self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        return (
            f"DistributedContext(rank={self.rank}/{self.world_size}, local_rank={self.local_rank}, "
            f"device={self.device}, backend={self.backend}, launcher={self.launcher})"
        )


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"Expected the environment variable {name} to be an integer (got {env[name]!r})") from None


def _in_range(name: str, value: int, bound_name: str, bound: int) -> int:
    if not 0 <= value < bound:
        raise ValueError(
            f"Expected the environment variable {name} in [0, {bound}), {bound_name} = {bound} (got {value})"
        )
    return value


def _world(env: Mapping[str, str], name: str) -> int:
    value = _int(env, name)
    if value < 1:
        raise ValueError(f"Expected the environment variable {name} to be at least 1 (got {value})")
    return value


def _slurm_tasks_per_node(env: Mapping[str, str]) -> tuple[str, list[int]]:
    """``"2(x3),1"`` -> the tasks on each kind of node, ``[2, 1]`` (and the variable's name)."""
    name = "SLURM_NTASKS_PER_NODE" if env.get("SLURM_NTASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    value = env.get(name) or "1"
    entry = r"(\d+)(?:\(x\d+\))?"
    counts = [int(c) for c in re.findall(entry, value)] if re.fullmatch(f"{entry}(?:,{entry})*", value.strip()) else []
    if not counts or min(counts) < 1:
        raise ValueError(
            f"Expected the environment variable {name} to be a task count such as '2(x3),1' (got {value!r})"
        )
    return name, counts


def _launch_from_env(env: Mapping[str, str]) -> tuple[str, int, int, int, int]:
    """(launcher, rank, world_size, local_rank, local_world_size), every value checked: a rank
    outside its world is refused here, at once, not after a rendezvous timeout."""
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _world(env, "WORLD_SIZE")
        rank = _in_range("RANK", _int(env, "RANK"), "WORLD_SIZE", world)
        local_world = _world(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        _in_range("LOCAL_RANK", local, "LOCAL_WORLD_SIZE", local_world)
        return "torchrun", rank, world, local, local_world
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = _world(env, "SLURM_NTASKS")
        rank = _in_range("SLURM_PROCID", _int(env, "SLURM_PROCID"), "SLURM_NTASKS", world)
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        if env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"):
            name, per_node = _slurm_tasks_per_node(env)
        else:  # srun always sets it; without it, all tasks may be on one node
            name, per_node = "SLURM_NTASKS", [world]
        _in_range("SLURM_LOCALID", local, name, max(per_node))  # nodes may run different task counts
        return "slurm", rank, world, local, per_node[0]
    return "single", 0, 1, 0, 1


def _timeout_s(env: Mapping[str, str]) -> float:
    value = env.get("MESHSHARD_TIMEOUT", "")
    try:
        seconds = float(value) if value else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"Expected the environment variable MESHSHARD_TIMEOUT to be a positive number of seconds (got {value!r})"
        )
    return seconds


def _slurm_port(env: Mapping[str, str]) -> str:
    job = env.get("SLURM_JOB_ID", "0")
    if not job.isdigit():
        raise ValueError(f"Expected the environment variable SLURM_JOB_ID to be an integer (got {job!r})")
    return str(20000 + int(job) % 20000)


def _choose_backend(backend: str | None) -> str:
    backend = backend or os.environ.get("MESHSHARD_BACKEND") or None
    if backend is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"Expected 'backend' to be 'gloo' or 'nccl' (got {backend!r})")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("Expected CUDA for backend 'nccl' (torch.cuda.is_available() is False); use 'gloo'")
    return backend


def _check_cuda_devices(local_world_size: int, backend: str | None = None, *, bound_per_rank: bool = True) -> None:
    """Refuse, before any rank starts talking, ``local_world_size`` NCCL ranks on a node whose
    CUDA devices cannot give each its own GPU.

    Each local rank takes the GPU of its local rank. One visible GPU is also accepted for several
    local ranks: a launcher that binds one GPU to each rank (SLURM ``--gpus-per-task=1``, or
    ``CUDA_VISIBLE_DEVICES`` set per rank) shows each rank exactly one; ranks that in fact share it
    are refused by ``init_distributed`` once the group exists. ``bound_per_rank=False`` is for a
    launcher that starts the ranks itself with this process's devices (``--nproc``): then one GPU is
    one GPU. The backend is ``backend``, else ``MESHSHARD_BACKEND``, else NCCL when CUDA is
    available; gloo needs no GPU and passes.

    Raises:
        ValueError: with NCCL, when fewer GPUs are visible than ``local_world_size``, and more than
        one (or any number, with ``bound_per_rank=False``).
    """
    if _choose_backend(backend) != "nccl":
        return
    count = torch.cuda.device_count()
    if count < local_world_size and (count > 1 or not bound_per_rank):
        raise ValueError(_one_gpu_per_rank(local_world_size, count))


def local_ranks_backend(nprocs: int) -> tuple[str, str | None]:
    """The backend for ``nprocs`` ranks that a launcher starts itself on this machine (``--nproc``),
    and a note to show when it is not the usual one.

    ``MESHSHARD_BACKEND`` decides when set (NCCL with fewer GPUs than ranks is refused). Else NCCL
    when there is a GPU for each rank, and gloo (the ranks on the CPU) otherwise: on a machine with
    one GPU, ``--nproc 2`` runs, on the CPU, with a note saying so.

    Raises:
        ValueError: ``MESHSHARD_BACKEND=nccl`` with fewer visible GPUs than ``nprocs``.
    """
    if os.environ.get("MESHSHARD_BACKEND"):
        _check_cuda_devices(nprocs, bound_per_rank=False)
        return _choose_backend(None), None
    if not torch.cuda.is_available():
        return "gloo", None
    count = torch.cuda.device_count()
    if count >= nprocs:
        return "nccl", None
    return "gloo", (f"{nprocs} ranks and {count} GPU{'s' if count != 1 else ''} here: the ranks run on the CPU "
                    f"(gloo), since NCCL needs a GPU for each rank (MESHSHARD_BACKEND=nccl refuses instead)")


def _one_gpu_per_rank(ranks: int, gpus: int) -> str:
    return (f"Expected a GPU for each of the {ranks} ranks on this node with NCCL (got {gpus} visible CUDA "
            f"device{'s' if gpus != 1 else ''}): start at most {gpus} rank{'s' if gpus != 1 else ''} per node "
            f"(--nproc, torchrun --nproc-per-node, srun --ntasks-per-node), or set MESHSHARD_BACKEND=gloo to run "
            f"every rank on the CPU")


def _device_for(backend: str | None, local_rank: int) -> torch.device:
    if backend == "nccl":
        index = local_rank if torch.cuda.device_count() > 1 else 0  # one visible GPU: bound to this rank
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _check_gpus_apart(local_world: int) -> None:
    """With NCCL and one visible GPU per rank: refuse, on every rank alike, local ranks that share it.

    Run just after the group is made, as its first collective. NCCL refuses two ranks on one GPU
    in its own words ("Duplicate GPU detected") when it first connects them; this says what to do.
    """
    if local_world < 2 or torch.cuda.device_count() > 1:
        return
    me = (socket.gethostname(), str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid))
    everyone: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(everyone, me)
    except RuntimeError as err:  # dist.DistBackendError is one
        text = str(err).lower()
        if "duplicate gpu" in text or "invalid usage" in text:  # NCCL names the duplicate only in its "last error"
            raise ValueError(_one_gpu_per_rank(local_world, 1)) from None
        raise
    if len(set(everyone)) < len(everyone):
        raise ValueError(_one_gpu_per_rank(local_world, 1))


def init_distributed(backend: str | None = None, *, timeout_s: float | None = None) -> DistributedContext:
    """Initialise the default process group from torchrun's or SLURM's variables, if any.

    Safe to call more than once: an existing default group is reused. Outside any launcher it
    returns a world of one without creating a process group.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default NCCL when CUDA is available, else gloo.
        timeout_s: how long a collective may wait; default ``MESHSHARD_TIMEOUT`` or 300 s.
    """
    env = os.environ
    launcher, rank, world, local, local_world = _launch_from_env(env)
    seconds = timeout_s if timeout_s is not None else _timeout_s(env)
    if dist.is_available() and dist.is_initialized():
        existing = dist.get_backend()
        return DistributedContext(
            dist.get_rank(), dist.get_world_size(), local, local_world,
            _device_for(existing, local), existing, "existing",
        )
    if launcher == "single":
        # no group, but the backend still says where to run: gloo (asked for) means the CPU
        chosen = _choose_backend(backend) if backend or env.get("MESHSHARD_BACKEND") else None
        device = torch.device("cuda", 0) if torch.cuda.is_available() and chosen != "gloo" else torch.device("cpu")
        return DistributedContext(0, 1, 0, 1, device, None, "single")
    chosen = _choose_backend(backend)
    if launcher == "slurm":
        os.environ.setdefault("MASTER_ADDR", first_slurm_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")))
        os.environ.setdefault("MASTER_PORT", _slurm_port(env))
    port = os.environ.get("MASTER_PORT", "")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(
            f"Expected the environment variable MASTER_PORT to be a port number in [1, 65535] (got {port!r})"
        )
    _check_cuda_devices(local_world, chosen)
    device = _device_for(chosen, local)
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    note = threading.Timer(_WAIT_NOTE_S, lambda: print(
        f"meshshard: rank {rank} is waiting for the other {world - 1} rank(s) at {where} (a rank that failed to start? "
        f"it gives up after {seconds:g} s, MESHSHARD_TIMEOUT)", file=sys.stderr, flush=True))
    note.daemon = True
    note.start()
    try:
        dist.init_process_group(
            chosen, init_method="env://", rank=rank, world_size=world, timeout=timedelta(seconds=seconds)
        )
    finally:
        note.cancel()
    atexit.register(_destroy_at_exit)
    if chosen == "nccl":
        _check_gpus_apart(local_world)
    return DistributedContext(rank, world, local, local_world, device, chosen, launcher)


#: Seconds a rank waits for the others to join before it says so (once) on stderr.
_WAIT_NOTE_S = 20.0


def _destroy_at_exit() -> None:
    """At a script's normal end, shut down the group :func:`init_distributed` made. Left to the
    interpreter's teardown, gloo's threads could abort the process ("terminate called without an
    active exception", seen in 2 to 3 runs in 8 of a 2-rank script that predicts on shards), and
    torchrun then reports the rank failed. Not after an uncaught exception: a peer may still be
    waiting in a collective, and the process ends as it did."""
    if hasattr(sys, "last_value") or not (dist.is_available() and dist.is_initialized()):
        return
    dist.destroy_process_group()


@dataclass(frozen=True)
class DeviceMesh2D:
    """Ranks laid out as ``data_parallel_size x domain_parallel_size``.

    Global rank ``g = data_rank * domain_parallel_size + domain_rank``: the ranks sharing one sample
    (a domain group) are consecutive, so with as many ranks per node as the domain size they share a
    node and the halo exchanges stay on it; gradients are averaged across the data group.

    ``None`` means one thing everywhere in meshshard: the default (world) group. So a group is
    ``None`` only when it is the whole world (no process group, or a world of one); a group of
    one rank inside a larger world is a real single-rank process group, on which every collective
    returns at once without communicating.
    """

    data_parallel_size: int
    domain_parallel_size: int
    data_rank: int
    domain_rank: int
    data_group: Any
    domain_group: Any

    def __repr__(self) -> str:
        return (
            f"DeviceMesh2D(data {self.data_rank}/{self.data_parallel_size}, "
            f"domain {self.domain_rank}/{self.domain_parallel_size})"
        )


def _default_group_timeout() -> timedelta:
    """The default group's timeout (as ``init_distributed`` or the caller set it); else ``MESHSHARD_TIMEOUT``."""
    try:
        device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
        timeout = dist.distributed_c10d._get_default_group()._get_backend(device).options._timeout
        if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
            return timeout
    except (AttributeError, RuntimeError, ValueError):  # private API: fall back to the configured value
        pass
    return timedelta(seconds=_timeout_s(os.environ))


def init_device_mesh_2d(
    domain_parallel_size: int, *, world_size: int | None = None, rank: int | None = None, timeout_s: float | None = None
) -> DeviceMesh2D:
    """Split the default group into data-parallel and domain-parallel groups.

    Every rank must call this (``new_group`` is collective). Returns this rank's groups. Every group
    gets ``timeout_s``, by default the default group's timeout (``MESHSHARD_TIMEOUT``), not gloo's
    30-minute default for new groups: a stopped rank fails its peers within the configured time.

    Raises:
        ValueError: if the world size is not a multiple of ``domain_parallel_size``.
    """
    initialised = dist.is_available() and dist.is_initialized()
    world = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
    me = rank if rank is not None else (dist.get_rank() if initialised else 0)
    if not isinstance(domain_parallel_size, int) or domain_parallel_size < 1 or world % domain_parallel_size:
        raise ValueError(
            f"Expected 'domain_parallel_size' to be a positive divisor of the world size {world} "
            f"(got {domain_parallel_size!r})"
        )
    data_size = world // domain_parallel_size
    data_rank, domain_rank = divmod(me, domain_parallel_size)
    domain_group = data_group = None
    if initialised and world > 1:
        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else _default_group_timeout()
        # new_group is collective over the default group: every rank creates every group, in order.
        # A group of one is a real group too: None would mean the whole world (see the class docstring).
        for d in range(data_size):
            group = dist.new_group(
                list(range(d * domain_parallel_size, (d + 1) * domain_parallel_size)), timeout=timeout
            )
            if d == data_rank:
                domain_group = group
        for k in range(domain_parallel_size):
            group = dist.new_group(list(range(k, world, domain_parallel_size)), timeout=timeout)
            if k == domain_rank:
                data_group = group
    return DeviceMesh2D(data_size, domain_parallel_size, data_rank, domain_rank, data_group, domain_group)


def torch_device_mesh(mesh: DeviceMesh2D | None, device_type: str = "cpu") -> Any:
    """A torch ``DeviceMesh`` over the world with dims ``("domain", "data")``: row ``k`` holds the data
    group of domain rank ``k``, so the last dim runs over a data group and the first over a domain
    group (``meshshard.nn.fsdp_device_mesh`` hands it to FSDP2). ``mesh=None``: the whole world is
    one domain group, ``(R, 1)``. ``mesh`` must cover the world.

    Every rank must call it: the ``DeviceMesh`` creates a process group per row and per column
    (``new_group``, collective over the default group).
    """
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    dp, domain = (1, world) if mesh is None else (mesh.data_parallel_size, mesh.domain_parallel_size)
    # global rank g = data_rank * domain + domain_rank; row k = the data group of domain rank k
    layout = torch.arange(world).reshape(dp, domain).T.contiguous()
    return DeviceMesh(device_type, layout, mesh_dim_names=("domain", "data"))


def is_peer_failure(err: BaseException) -> bool:
    """Whether an error raised during a step came from a collective (a dead or stopped peer), not
    from the computation itself (a shape error in your own model, running out of memory)."""
    if isinstance(err, dist.DistError | OSError):
        return True
    text = str(err).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket"))
