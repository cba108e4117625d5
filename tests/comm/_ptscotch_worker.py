"""Run by ``tests/comm/test_partition_ptscotch.py`` under ``mpirun -n 4``: the PT-Scotch partition of MESH
on 1, 2, 3 and 4 of the processes in turn (sub-communicators of the world, one launch), into OUT/p1 ..
OUT/p4; then :class:`meshshard.comm.MPIExchange` on all four, with rounds of a few bytes. Process 0
writes what the exchange returned to OUT/exchange.json.

    mpirun -n 4 python tests/comm/_ptscotch_worker.py MESH OUT PARTS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import meshshard.comm._mpi_exchange as mpi_exchange
from meshshard.comm import MPIExchange
from meshshard.partition import partition_distributed


def main(mesh: str, out: str, num_parts: int) -> None:
    world = MPI.COMM_WORLD
    for p in range(1, world.size + 1):
        sub = world.Split(0 if world.rank < p else MPI.UNDEFINED, world.rank)
        if sub != MPI.COMM_NULL:
            partition_distributed(mesh, Path(out) / f"p{p}", num_parts, MPIExchange(sub), engine="ptscotch",
                                  imbalance=0.1)
            sub.Free()
        world.Barrier()
    mpi_exchange.MAX_ROUND_BYTES = 12  # 3 bytes per source and round: many rounds, rows split across them
    ex = MPIExchange()
    chunks = [np.full((q + ex.rank, 2), ex.rank * 10 + q, dtype=np.uint64) for q in range(ex.size)]
    got = ex.all_to_all(chunks)
    found = {"got": [g.tolist() for g in got], "dtypes": [str(g.dtype) for g in got],
             "min": ex.all_reduce(np.array([ex.rank, -ex.rank], dtype=np.int64), "min").tolist(),
             "sum": ex.all_reduce(np.array([0.5 * ex.rank]), "sum").tolist(), "gathered": ex.all_gather({"r": ex.rank})}
    every = ex.all_gather(found)
    ex.barrier()
    if ex.rank == 0:
        (Path(out) / "exchange.json").write_text(json.dumps(every))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
