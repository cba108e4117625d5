"""The PT-Scotch engine of a distributed partition (``--engine ptscotch``): graph-quality parts on MPI.

Each process hands PT-Scotch its rows of the nodal graph (:class:`meshshard.partition._dist_graph.BlockGraph`:
the neighbours of the nodes of its block, as global ids) as the local part of a distributed graph
(``SCOTCH_dgraphBuild``, through the ``pyscotch`` package). PT-Scotch numbers the vertices of a
distributed graph by process, in rank order: the blocks of global ids hold consecutive ranges in rank
order, so its global numbering is the mesh's own and nothing is renumbered. ``SCOTCH_dgraphPart``
returns the part of each vertex of the block, which is this engine's contract (as
:func:`meshshard.partition._dist_assign.morton_assign`'s). Memory per process: the block's rows (already
held) and PT-Scotch's own coarsening, ``O(N / P)``.

PT-Scotch needs an MPI communicator: the exchange handed to the partition must carry one as ``comm``
(``meshshard.comm.MPIExchange``, which ``mpirun ... meshshard partition --engine ptscotch`` uses). It
is not deterministic from one run or process count to the next (the seed is set, but the parallel
matching is not ordered): the assignment it gave is what the part files store (each part's
``owned_ids``), and :func:`meshshard.partition.read_assignment` reads it back.

The library: Debian's ``libptscotch-7.0`` (32-bit ``SCOTCH_Num``, found by its soname) or any that
``pyscotch``'s variables name (``PYSCOTCH_LIB_DIR``, ``PYSCOTCH_INT_SIZE``); its integer width bounds the
graph (``N`` and the directed edges below ``2**31`` with 32 bits), checked before PT-Scotch is called.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import os
from typing import Any

import numpy as np

from ._dist_graph import BlockGraph
from ._exchange import Exchange

__all__ = ["INSTALL_PTSCOTCH", "check_ptscotch", "ptscotch_assign"]

INSTALL_PTSCOTCH = ("install it with: apt-get install libptscotch-7.0 openmpi-bin && pip install mpi4py pyscotch, "
                    "then run: mpirun -n P meshshard partition MESH.vtkhdf --parts K --out PARTS --engine ptscotch")

_LOADED: dict[str, Any] = {}


def _system_num_bytes() -> int | None:
    """``sizeof(SCOTCH_Num)`` of the Scotch library the loader finds (``None`` when there is none)."""
    for name in filter(None, [ctypes.util.find_library("scotch"), "libscotch-7.0.so", "libscotch.so.7"]):
        try:
            return int(ctypes.CDLL(name).SCOTCH_numSizeof())
        except (OSError, AttributeError):
            continue
    return None


def _pyscotch() -> Any:
    """The ``pyscotch`` module, loaded with PT-Scotch (its variables set before its import, which reads
    them, and its loading notes kept off stderr), or a one-line ``ValueError`` saying how to install it."""
    if "module" in _LOADED:
        return _LOADED["module"]
    os.environ.setdefault("PYSCOTCH_PARALLEL", "1")
    if "PYSCOTCH_LIB_DIR" not in os.environ:
        os.environ.setdefault("PYSCOTCH_SYSTEM", "1")
        if "PYSCOTCH_INT_SIZE" not in os.environ:
            width = _system_num_bytes()
            if width is None:
                raise ValueError(f"--engine ptscotch: no PT-Scotch library was found; {INSTALL_PTSCOTCH}")
            os.environ["PYSCOTCH_INT_SIZE"] = str(8 * width)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import pyscotch
            from pyscotch import dgraph, libscotch, strategy
    except ImportError as err:
        raise ValueError(f"--engine ptscotch needs the pyscotch package ({err}); {INSTALL_PTSCOTCH}") from None
    except (OSError, RuntimeError) as err:  # pyscotch found no PT-Scotch, or one of another width
        raise ValueError(f"--engine ptscotch: PT-Scotch could not be loaded ({str(err).splitlines()[0]}); "
                         f"{INSTALL_PTSCOTCH}") from None
    if not libscotch.is_parallel():
        raise ValueError("--engine ptscotch: pyscotch was loaded without PT-Scotch (set PYSCOTCH_PARALLEL=1 "
                         f"before anything imports pyscotch); {INSTALL_PTSCOTCH}")
    _LOADED["module"] = pyscotch
    _LOADED["parts"] = (dgraph.Dgraph, strategy.Strategy, libscotch.get_scotch_dtype())
    return pyscotch


def check_ptscotch(ex: Exchange) -> None:
    """Raise a one-line ``ValueError`` unless this process can run PT-Scotch on ``ex`` (an MPI
    communicator as ``ex.comm``, mpi4py, pyscotch and the library): before any work."""
    comm = getattr(ex, "comm", None)
    if comm is None or type(comm).__module__.split(".", 1)[0] != "mpi4py":
        raise ValueError("--engine ptscotch runs on MPI processes (mpirun -n P meshshard partition ... "
                         "--engine ptscotch; from Python, hand it a meshshard.comm.MPIExchange)")
    _pyscotch()


def _check_width(graph: BlockGraph, dtype: Any) -> None:
    top = int(np.iinfo(dtype).max)
    if graph.num_nodes > top or graph.num_edges > top:
        raise ValueError(f"--engine ptscotch: the graph has {graph.num_nodes:,} nodes and {graph.num_edges:,} "
                         f"directed edges, more than this PT-Scotch's {8 * np.dtype(dtype).itemsize}-bit SCOTCH_Num "
                         "holds; use one built with 64-bit integers (PYSCOTCH_INT_SIZE=64, "
                         "PYSCOTCH_LIB_DIR=its folder)")


def ptscotch_assign(ex: Exchange, graph: BlockGraph, n_block: int, num_parts: int, *, imbalance: float = 0.03,
                    seed: int = 0) -> np.ndarray:
    """The part of each node of this process's block by PT-Scotch (see the module docstring). Every process
    calls it; :func:`check_ptscotch` has passed on every process.

    Shapes:
        graph: the rows of the block's ``n_block`` nodes (ids from ``graph.first``). Returns ``(n_block,)`` int64 in
        ``[0, num_parts)``.
    """
    pyscotch = _pyscotch()
    dgraph_type, strategy_type, dtype = _LOADED["parts"]
    _check_width(graph, dtype)
    degree = np.bincount(np.asarray(graph.dst, dtype=np.int64) - graph.first, minlength=n_block)
    vertloctab = np.zeros(n_block + 1, dtype=dtype)
    np.cumsum(degree, out=vertloctab[1:])
    edgeloctab = np.ascontiguousarray(graph.src, dtype=dtype)
    del degree
    pyscotch.random_seed(int(seed))
    strategy = strategy_type()
    strategy.build_dgraph_mapping(0, ex.size, num_parts, float(imbalance))
    with dgraph_type(ex.comm) as dist_graph:  # type: ignore[attr-defined]
        dist_graph.build(vertloctab, edgeloctab)
        parts = dist_graph.part(num_parts, strategy)
    return np.asarray(parts, dtype=np.int64)

