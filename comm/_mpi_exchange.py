"""numpy arrays between MPI processes for offline work: :class:`MPIExchange`, the ``Exchange`` a distributed
``meshshard partition`` takes under ``mpirun`` (or ``srun`` with MPI), over mpi4py.

PT-Scotch needs an MPI communicator, so ``--engine ptscotch`` runs every step of the partition over MPI:
the same ``Exchange`` calls as :class:`meshshard.comm.ArrayExchange` makes on torch.distributed (the
read, the rendezvous, the shards and the writes do not know which one they are handed), and the MPI
communicator itself (:attr:`MPIExchange.comm`) for the engine. No torch.distributed group is made, so
there is no second rendezvous (address, port) to set up beside MPI's.

``all_to_all`` sends each array's bytes with one ``Alltoallv``; MPI's counts and displacements are C
``int``, so an exchange with more than about 2 GiB to receive is sent in several rounds
(:data:`MAX_ROUND_BYTES` per source and round). MPI calls have no time limit: a process that dies is
ended by the launcher (``mpirun`` stops every process when one exits with an error), not by
``MESHSHARD_TIMEOUT``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MPIExchange", "mpi_comm_world"]

#: The most bytes one process receives from one source in one ``Alltoallv`` round (MPI counts are C int,
#: and so are the displacements: ``size`` sources times this stays below ``2**31``).
MAX_ROUND_BYTES = (1 << 31) - 1


def checked_chunks(chunks: Sequence[np.ndarray], size: int, member: str) -> list[np.ndarray]:
    """``chunks`` as contiguous arrays, after checking there is one per ``member`` (``size`` of them) and
    that all have one dtype and one shape past the first axis (a one-line ``ValueError`` otherwise)."""
    if len(chunks) != size:
        raise ValueError(f"Expected one chunk per {member}, {size} (got {len(chunks)})")
    arrays = [np.ascontiguousarray(c) for c in chunks]
    dtype, tail = arrays[0].dtype, arrays[0].shape[1:]
    for c in arrays:
        if c.dtype != dtype or c.shape[1:] != tail:
            raise ValueError(f"Expected chunks of one dtype and row shape "
                             f"(got {dtype}{tail} and {c.dtype}{c.shape[1:]})")
    return arrays


def mpi_comm_world() -> Any:
    """``mpi4py.MPI.COMM_WORLD`` (importing mpi4py starts MPI), or a one-line ``ValueError`` with the
    install commands when mpi4py or an MPI library is missing."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ValueError(f"MPI is not available here ({err}); install it with: apt-get install openmpi-bin "
                         "libopenmpi-dev && pip install mpi4py") from None
    except RuntimeError as err:  # mpi4py's wheel found no MPI library to load
        raise ValueError(f"mpi4py found no MPI library ({str(err).splitlines()[0]}); install one with: "
                         "apt-get install openmpi-bin") from None
    return MPI.COMM_WORLD


class MPIExchange:
    """Collectives on numpy arrays among the processes of an mpi4py communicator.

    Args:
        comm: An ``mpi4py.MPI.Comm`` (default: ``COMM_WORLD``, which starts MPI).
    """

    def __init__(self, comm: Any = None) -> None:
        self.comm = mpi_comm_world() if comm is None else comm
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())

    def __repr__(self) -> str:
        return f"MPIExchange(rank={self.rank}, size={self.size})"

    def all_to_all(self, chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send ``chunks[q]`` to process ``q``; return what each process sent this one, by source.

        Every chunk of a call has one dtype and one shape past the first axis, on every process.
        """
        arrays = checked_chunks(chunks, self.size, "process")
        dtype, tail = arrays[0].dtype, arrays[0].shape[1:]
        if self.size == 1:
            return [arrays[0]]
        send = np.array([c.nbytes for c in arrays], dtype=np.int64)
        recv = np.empty(self.size, dtype=np.int64)
        self.comm.Alltoall(send, recv)
        data = [c.reshape(-1).view(np.uint8) for c in arrays]
        got = [np.empty(int(n), dtype=np.uint8) for n in recv]
        step = max(1, MAX_ROUND_BYTES // self.size)
        most = np.array([max(int(send.max()), int(recv.max()))], dtype=np.int64)
        self.comm.Allreduce(most.copy(), most, op=self._op("max"))
        for at in range(0, int(most[0]), step):  # rounds, the same count on every process
            self._round([d[at:at + step] for d in data], [g[at:at + step] for g in got])
        return [g.view(dtype).reshape(-1, *tail) for g in got]

    def _round(self, parts: list[np.ndarray], into: list[np.ndarray]) -> None:
        from mpi4py import MPI

        send_counts = [len(p) for p in parts]
        recv_counts = [len(g) for g in into]
        send = np.concatenate(parts) if sum(send_counts) else np.zeros(0, dtype=np.uint8)
        recv = np.empty(sum(recv_counts), dtype=np.uint8)
        send_at = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).tolist()
        recv_at = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).tolist()
        self.comm.Alltoallv([send, send_counts, send_at, MPI.BYTE], [recv, recv_counts, recv_at, MPI.BYTE])
        for g, at, n in zip(into, recv_at, recv_counts):
            g[:] = recv[at:at + n]

    @staticmethod
    def _op(op: str) -> Any:
        from mpi4py import MPI

        ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        if op not in ops:
            raise ValueError(f"Expected op 'sum', 'min' or 'max' (got {op!r})")
        return ops[op]

    def all_reduce(self, values: np.ndarray, op: str) -> np.ndarray:
        """The element-wise ``"sum"``, ``"min"`` or ``"max"`` of ``values`` (float64 or int64) over the processes."""
        mpi_op = self._op(op)
        values = np.ascontiguousarray(values)
        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=mpi_op)
        return out

    def all_gather(self, value: Any) -> list[Any]:
        """Every process's small ``value`` (picklable; lists, numbers, strings), by rank."""
        return list(self.comm.allgather(value))

    def barrier(self) -> None:
        """Return when every process has called it."""
        self.comm.Barrier()
