"""``meshshard partition`` run by ``P`` processes, none of which holds the whole mesh.

Every process calls :func:`partition_distributed` with the same arguments and its :class:`Exchange`
(``meshshard.comm.ArrayExchange`` under torchrun); the steps:

1. checks: the arguments on every process, the output folder on process 0 (which takes the
   folder's lock); any failure is raised on every process (:func:`agree`) before any array moves;
2. read: process ``r`` reads its block of points and of cells of the ``.vtkhdf`` by hyperslabs
   (:func:`meshshard.partition._vtkhdf.read_slice`); process 0 also hashes the file;
3. graph: the nodal graph's rows of the block, by a rendezvous of the cell edges on the owner of
   ``dst`` (:mod:`meshshard.partition._dist_graph`);
4. assign: the engine gives the part of each node of the block (``geometric``: the Morton order
   by a sample sort, :mod:`meshshard.partition._dist_assign`, worked out before the graph, which it
   does not need; ``ptscotch``: PT-Scotch on the graph's rows, :mod:`meshshard.partition._dist_scotch`,
   on an exchange that carries an MPI communicator);
5. shards: the builders learn their parts' nodes, and so every part's size (the load balance is
   checked before anything is written); then each process builds the parts of its run, one round at
   a time, and writes their files into process 0's staging folder as it builds them
   (:mod:`meshshard.partition._dist_plan`); one small all-gather brings their entries to process 0,
   which writes ``partition.json`` and, once every process has written,
   renames the staging folder to the output folder (``staged_folder``: nothing half-written is
   ever at ``out``; a failure anywhere removes the staging folder on every path).

What is written equals what one process writes for the same assignment: ``meshshard partition
MESH.vtkhdf --method morton`` gives the same part files, byte for byte, and the same
``partition.json`` but for its ``distributed`` entry (engine and process count) and checksum. For
PT-Scotch, which is not deterministic, the assignment is the one the part files store
(:func:`meshshard.partition.read_assignment`), and one process given it writes the same part files.
Only ``--halo-hops 1`` and the nodal graph are built this way so far. The output folder must be on
a file system every process sees (one machine, or a shared file system).
"""

from __future__ import annotations

import os
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from ._assign import check_num_parts, target_weights
from ._dist_assign import ENGINES, morton_assign
from ._dist_graph import block_graph
from ._dist_plan import gather_nodes, write_shards
from ._dist_scotch import check_ptscotch, ptscotch_assign
from ._exchange import Exchange, LocalExchange, agree
from ._format import METADATA_FILE, check_output_dir, dump_metadata, make_metadata
from ._json_io import write_text_file
from ._progress import Steps
from ._readers import hash_regular
from ._safe_io import folder_lock, staged_folder
from ._vtkhdf import VTKHDF_SUFFIX, VtkHdfSlice, read_slice

__all__ = ["partition_distributed"]


def _check_arguments(path: Path, num_parts: int, engine: str, halo_hops: int, imbalance: float) -> None:
    if engine not in ENGINES:
        raise ValueError(f"Expected --engine in {', '.join(ENGINES)} (got {engine!r})")
    if num_parts < 1:
        raise ValueError(f"Expected --parts >= 1 (got {num_parts})")
    if halo_hops != 1:
        raise ValueError(f"Expected --halo-hops 1 in a distributed partition (got {halo_hops}); k-hop halos "
                         "are built by one process (run without torchrun)")
    if not imbalance >= 0:
        raise ValueError(f"Expected --imbalance >= 0 (got {imbalance})")
    if path.suffix.lower() != VTKHDF_SUFFIX:
        raise ValueError(f"{path}: Expected a {VTKHDF_SUFFIX} file, which each process reads in part "
                         f"(make one with: meshshard convert {path} --out {path.with_suffix(VTKHDF_SUFFIX)})")


def _read(path: Path, ex: Exchange, num_parts: int) -> tuple[VtkHdfSlice, str | None]:
    piece = read_slice(path, ex.rank, ex.size)
    check_num_parts(num_parts, piece.num_nodes)
    return piece, hash_regular(path)[0] if ex.rank == 0 else None


def _load_imbalance(counts: np.ndarray, num_parts: int, num_nodes: int, imbalance: float, engine: str,
                    rank: int) -> float:
    """The load imbalance one process records for these part sizes (unit weights). Over ``imbalance``,
    where one process would refine the assignment (``refine_balance``, which the processes do not do):
    the Morton cut is refused; a graph engine's parts, balanced by the engine itself to within a node or
    so per part, are kept with a warning (on process 0), and the figure is recorded."""
    load = counts.astype(np.float64)
    found = float((load / (target_weights(num_parts, None) * num_nodes)).max()) if num_nodes else 1.0
    if found > 1.0 + imbalance + 1e-12:
        if engine == "geometric":
            raise ValueError(f"the Morton cut into {num_parts} parts has a load imbalance of {found:.4f}, over "
                             f"--imbalance {imbalance}; with so few nodes per part, partition in one process "
                             "(which refines the balance) or allow a larger --imbalance")
        if rank == 0:
            warnings.warn(f"--engine {engine}'s {num_parts} parts have a load imbalance of {found:.4f}, over "
                          f"--imbalance {imbalance} (kept, and recorded as load_imbalance)", stacklevel=3)
    return found


def _metadata(ex: Exchange, entries: list[dict[str, Any]], digest: str, *, name: str, num_nodes: int,
              num_edges: int, cut: int, counts: np.ndarray, load_imbalance: float, engine: str,
              seed: int, imbalance: float) -> dict[str, Any]:
    method = "morton" if engine == "geometric" else engine
    attrs = {"method": method, "graph": "nodal", "input": {"kind": "mesh", "name": name, "sha256": digest},
             "parameters": {"seed": seed, "imbalance": imbalance, "tpwgts": None},
             "load_imbalance": load_imbalance, "refinement": None,
             "distributed": {"engine": engine, "processes": ex.size}}
    summary = [{k: v for k, v in e.items() if k not in ("file", "sha256")} for e in entries]
    meta = make_metadata(num_nodes=num_nodes, num_edges=num_edges, edge_cut=cut,
                         imbalance=float(counts.max() / counts.mean()), halo_hops=1, pos_dim=3,
                         attrs=attrs, parts=summary)
    meta["parts"] = entries
    return meta


def _graph_engine(ex: Exchange, engine: str, graph: Any, n_block: int, num_parts: int, imbalance: float,
                  seed: int) -> tuple[np.ndarray, BaseException | None]:
    """The part of each node of the block by a graph engine, and the error to agree on (a graph too
    large for the library's integers; the library's own failure)."""
    try:
        return ptscotch_assign(ex, graph, n_block, num_parts, imbalance=imbalance, seed=seed), None
    except (ValueError, RuntimeError, MemoryError) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return np.zeros(0, dtype=np.int64), ValueError(text if text.startswith("--engine") else
                                                       f"--engine {engine}: {text}")


def partition_distributed(
    input: str | os.PathLike[str],
    out: str | os.PathLike[str],
    num_parts: int,
    exchange: Exchange | None = None,
    *,
    engine: str = "geometric",
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    force: bool = False,
    steps: Steps | None = None,
) -> Path:
    """Partition the ``.vtkhdf`` mesh ``input`` into ``num_parts`` parts with the processes of
    ``exchange`` (every process calls this; see the module docstring), writing the folder ``out``.

    Args:
        input: A one-piece VTKHDF unstructured grid (``meshshard convert`` makes one).
        out: The partition folder to create (replaced with ``force`` when it holds a partition).
        num_parts: ``K``, any number from 1 to the node count (more or fewer than the processes).
        exchange: The processes (default: this one alone, :class:`LocalExchange`).
        engine: ``"geometric"``: Morton order (``--method morton`` of one process); ``"ptscotch"``:
            PT-Scotch, on an ``exchange`` with an MPI communicator (``meshshard.comm.MPIExchange``).
        halo_hops: 1 (k-hop halos are built by one process).
        imbalance: Allowed load imbalance; a Morton cut over it is refused (one process would refine it),
            a graph engine's parts over it are kept with a warning.
        seed: Recorded, as one process records it; PT-Scotch's random seed.
        force: Replace an existing partition folder.
        steps: Records this process's wall time (and, with ``track_memory``, peak memory) of each stage:
            ``read``, ``assign``, ``graph``, ``nodes`` (each part's nodes to its builder), ``shards``
            (build and write the parts), ``metadata`` (gather the entries, write ``partition.json``).

    Returns:
        The partition folder, on every process.

    Raises:
        ValueError: on every process alike (one line), for any process's bad argument, input or write.
    """
    ex = LocalExchange() if exchange is None else exchange
    steps = Steps() if steps is None else steps
    path, out = Path(input), Path(out)
    error: BaseException | None = None
    with ExitStack() as stack:
        try:
            _check_arguments(path, num_parts, engine, halo_hops, imbalance)
            if engine == "ptscotch":  # MPI, pyscotch and the library, before any work
                check_ptscotch(ex)
            if ex.rank == 0:
                stack.enter_context(folder_lock(out))
                for note in check_output_dir(out, force, inputs=[input]):
                    warnings.warn(note, stacklevel=2)
        except (ValueError, OSError) as err:
            error = err
        agree(ex, error)
        try:
            with steps.step("read"):
                piece, digest = _read(path, ex, num_parts)
        except (ValueError, OSError, MemoryError) as err:
            error = ValueError(f"{path}: {err}" if not str(err).startswith(str(path)) else str(err))
        agree(ex, error)
        n, first, pos, cells = piece.num_nodes, piece.first_node, piece.pos, piece.cells
        del piece
        with steps.step("assign"):
            parts_block = morton_assign(ex, pos, first, n, num_parts) if engine == "geometric" else None
        with steps.step("graph"):
            graph = block_graph(ex, cells, n, first)
            del cells  # the graph's rows are all that is needed of the cells from here on
        num_edges = graph.num_edges
        if parts_block is None:
            with steps.step("assign"):  # a graph engine assigns from the graph's rows
                parts_block, error = _graph_engine(ex, engine, graph, len(pos), num_parts, imbalance, seed)
                agree(ex, error)
        with steps.step("nodes"):
            nodes = gather_nodes(ex, first, parts_block, pos, num_parts)
        counts = nodes.owned_counts
        found = _load_imbalance(counts, num_parts, n, imbalance, engine, ex.rank)  # the same on every process
        staging = None
        try:
            staging = stack.enter_context(staged_folder(out)) if ex.rank == 0 else None
        except (ValueError, OSError) as err:
            error = err
        agree(ex, error)
        folder = Path(ex.all_gather(None if staging is None else str(staging))[0])
        with steps.step("shards"):
            entries, cut, error = write_shards(ex, graph, parts_block, pos, nodes, num_parts, folder)
            del parts_block, pos, graph, nodes
            agree(ex, error)
        with steps.step("metadata"):
            entries = [e for chunk in ex.all_gather(entries) for e in chunk]
            cut = sum(ex.all_gather(cut)) // 2
            if ex.rank == 0:
                try:
                    meta = _metadata(ex, entries, digest or "", name=path.name, num_nodes=n,
                                     num_edges=num_edges, cut=cut, counts=counts, load_imbalance=found,
                                     engine=engine, seed=seed, imbalance=imbalance)
                    write_text_file(folder / METADATA_FILE, dump_metadata(meta))
                except (ValueError, OSError) as err:
                    error = err
            agree(ex, error)  # every file written, on every process
        try:
            stack.close()  # process 0: the staging folder renamed to out, then the lock let go
        except (ValueError, OSError) as err:
            error = err
    agree(ex, error)
    return out
