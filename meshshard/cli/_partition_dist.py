"""``meshshard partition MESH.vtkhdf --parts K --out PARTS`` run by P processes (under torchrun, or
with ``--engine``): each reads 1/P of the mesh (:func:`meshshard.partition.partition_distributed`).

Under torchrun (``RANK`` and ``WORLD_SIZE`` set) every process runs this; their process group is
gloo on the CPU whatever the machine has (partitioning is CPU work), its waits bounded by
``MESHSHARD_TIMEOUT``. With ``--engine ptscotch``, or under mpirun (``OMPI_COMM_WORLD_SIZE``,
``PMI_SIZE`` or ``PMIX_RANK`` set), the processes talk through MPI instead
(``meshshard.comm.MPIExchange``: PT-Scotch needs an MPI communicator, and one launcher's rendezvous
is enough); mpirun ends every process when one fails. An error every process agrees on (bad
arguments, a bad input, a refused output folder) is printed once, by process 0; any other (a process
that died) by each process that sees it. Every process exits 2 on an error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["launched", "mpi_launched", "run_distributed"]

#: Options of the one-process partition that the distributed one does not take, with their defaults.
_ONE_PROCESS_ONLY = {"graph": None, "tpwgts": None, "recursive": None, "tries": None, "grid": None,
                     "format": "auto", "max_expansion": None, "proc_grid": None}


def launched() -> bool:
    """Whether this process is one of several that torchrun, or srun (SLURM, more than one task),
    started: ``meshshard.comm.init_distributed`` reads either's variables. A batch script's single
    task (``SLURM_NTASKS=1``) is one process, as without SLURM."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return True
    tasks = os.environ.get("SLURM_NTASKS", "")
    return "SLURM_PROCID" in os.environ and tasks.isdigit() and int(tasks) > 1


#: Variables an MPI launcher sets in each process: Open MPI's mpirun, MPICH's (Hydra) and PMIx's.
_MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def _launcher_rank() -> str:
    """This process's rank as its launcher set it (``"0"`` without one): who prints an agreed error."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "0"


def mpi_launched() -> bool:
    """Whether this process was started by mpirun (or srun with MPI), and not by torchrun."""
    return not launched() and any(name in os.environ for name in _MPI_VARIABLES)


def _refusal(args: argparse.Namespace) -> str | None:
    if args.method not in (None, "morton") or args.method == "morton" and args.engine == "ptscotch":
        return (f"--method {args.method} runs in one process; a distributed partition takes --engine geometric "
                "(the Morton order of --method morton) or --engine ptscotch")
    for name, default in _ONE_PROCESS_ONLY.items():
        if getattr(args, name, default) != default:
            return f"--{name.replace('_', '-')} is not taken by a distributed partition (run it in one process)"
    if args.input is None:
        return "Expected a .vtkhdf mesh to partition"
    return None


def _exchange(args: argparse.Namespace) -> Any:
    """The processes: MPI (mpi4py) for PT-Scotch or under mpirun, else torch.distributed (gloo) under
    torchrun, else this process alone."""
    if args.engine == "ptscotch" or mpi_launched():
        from meshshard.comm import MPIExchange

        return MPIExchange()
    from meshshard.comm import ArrayExchange, init_distributed

    if launched():
        init_distributed("gloo")
    return ArrayExchange()


def run_distributed(args: argparse.Namespace, error: Callable[[str, object, BaseException], int]) -> int:
    """The distributed ``meshshard partition`` (see the module docstring); returns the exit code."""
    refused = _refusal(args)
    if refused is not None:  # the same on every process: printed by the first only
        return error("partition", None, ValueError(refused)) if _launcher_rank() == "0" else 2
    from meshshard.partition import partition_distributed, print_summary, read_metadata

    try:
        exchange = _exchange(args)
    except (ValueError, RuntimeError) as err:  # alike on every process (MPI missing): printed by the first
        return error("partition", None, err) if _launcher_rank() == "0" else 2
    rank = exchange.rank
    try:
        folder = partition_distributed(args.input, args.out, args.parts, exchange, engine=args.engine or "geometric",
                                       halo_hops=args.halo_hops, imbalance=args.imbalance, seed=args.seed,
                                       force=args.force)
    except ValueError as err:  # agreed by every process
        return error("partition", None, err) if rank == 0 else 2
    except (OSError, RuntimeError, MemoryError) as err:  # this process's own, or a peer that died
        return error("partition", f"process {rank}", err)
    if rank == 0 and not args.quiet:
        print_summary(read_metadata(folder))
        print(f"wrote {folder} with {exchange.size} process(es)", file=sys.stdout)
    return 0
