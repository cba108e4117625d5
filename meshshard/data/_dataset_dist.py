"""``meshshard dataset`` of ``.vtkhdf`` samples run by ``P`` processes, none of which holds a sample whole.

Every process calls :func:`write_dataset_distributed` with the same arguments and its ``Exchange``
(``meshshard.comm.ArrayExchange`` under torchrun). The folder it writes is today's dataset format,
version 2 (:mod:`meshshard.data._dataset`), unchanged: a sample's ``inputs.npy`` is still one
``(N, F)`` array of the global node order, which training reads one rank's rows at a time
(``inputs[owned_ids]``, a memory map). "A process's share" is a block of rows of each such file:
process ``r`` reads the points ``[block_start(N, r, P), block_start(N, r + 1, P))`` of a sample and
those rows of its point fields (hyperslabs, :func:`meshshard.partition.read_point_data`), and writes
them in place into the ``.npy`` files that process 0 has made at their full size (the header, then
the rows: the same bytes as one process writes). The cells likewise, by blocks of cells. So nothing of
the format changes and training, ``partition`` and ``predict`` read it as before; the output folder
must be on a file system every process sees (one machine, or a shared file system).

The steps, for each sample in turn:

1. read: the block of points and of cells (:func:`meshshard.partition.read_slice`), the block's rows of
   the named fields; ``pos`` from the points, ``--params`` as constant channels;
2. mesh: the sample's mesh is a mesh seen before when every process's block hashes alike (one small
   all-gather); a new one is written by blocks (``points.npy``, ``cells-<type>.npy``, each type's
   cells in the order of the file), its edges' statistics taken over the block's rows of the nodal
   graph (:func:`meshshard.partition.block_graph`, the far ends' coordinates asked of their block
   owners), and process 0 streams the stored files through :func:`mesh_checksum`;
3. fields: the block's rows, checked finite and within ``dtype``, written in place; a training
   sample's rows added to the process's running statistics.

Then one small all-gather merges the statistics (Chan's pairwise update, in process order: equal to
one process's to round-off, not bit for bit), and process 0 writes ``dataset.json``. Beyond the
one-process metadata it records ``"distributed": {"processes": P}`` and, per mesh,
``"source_sha256"``: the SHA-256 of every ``.vtkhdf`` file whose mesh it is, so that a partition made
from such a file by the processes (``torchrun ... meshshard partition MESH.vtkhdf``, whose
``input.sha256`` is that file's) is accepted for this dataset (:func:`check_partition_matches`): both
number the nodes as the file does.

Faults: every process checks its own work and :func:`~meshshard.partition.agree` raises the first
error on every process before the next step, so no process waits on one that gave up; process 0
holds the folder's lock and writes into a staging folder beside ``out``, renamed to ``out`` only once
every process has written (nothing half-written is ever at ``out``); a process that dies fails the
others' next collective within ``MESHSHARD_TIMEOUT``.

Taken so far: inputs and targets from point fields (a vector whole or one component ``u[1]``),
``pos``, ``--params``, the split, ``dtype``, ``force``. What else ``meshshard dataset`` does is done by
one process.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import (
    VTKHDF_SUFFIX,
    Exchange,
    LocalExchange,
    agree,
    block_graph,
    folder_lock,
    lookup,
    plural,
    read_point_data,
    read_slice,
)
from meshshard.partition.files import hash_regular, write_text_file

from ._clouds import _SOLID
from ._dataset import (
    FORMAT_NAME,
    FORMAT_VERSION,
    KINDS,
    METADATA_FILE,
    channel_names,
    dump_metadata,
    edge_channel_names,
    mesh_checksum,
)
from ._folder_guard import atomic_folder, check_dataset_output
from ._parameters import read_parameters
from ._sources import sample_names
from ._split import split_samples
from ._statistics import NORMALISATION_RULE, Running

__all__ = ["write_dataset_distributed"]

_COMPONENT = re.compile(r"^(.+)\[(\d+)\]$")


def _names(given: str | Sequence[str] | None) -> list[str]:
    items = [given] if isinstance(given, str) else list(given or [])
    return [t.strip() for item in items for t in item.split(",") if t.strip()]


def _check_arguments(files: list[Path], in_names: list[str], out_names: list[str], dtype: str) -> None:
    if not files:
        raise ValueError("Expected at least one .vtkhdf sample (got none)")
    for path in files:
        if path.suffix.lower() != VTKHDF_SUFFIX:
            raise ValueError(f"{path}: Expected a {VTKHDF_SUFFIX} file, which each process reads in part "
                             f"(make one with: meshshard convert {path} --out {path.with_suffix(VTKHDF_SUFFIX)})")
    if not in_names:
        raise ValueError("Expected --inputs (the point fields the model reads)")
    for what, names in (("--inputs", in_names), ("--targets", out_names)):
        if len(set(names)) != len(names):
            raise ValueError(f"Expected each field once in {what} (got {', '.join(names)})")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"Expected dtype float32 or float64 (got {dtype!r})")


def _columns(path: Path, names: list[str], pos: np.ndarray, start: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The block's rows of the named fields as float64 channels, and their field records."""
    wanted = sorted({_COMPONENT.match(n).group(1) if _COMPONENT.match(n) and n != "pos" else n  # type: ignore[union-attr]
                     for n in names} - {"pos"})
    fields = read_point_data(path, wanted, start, start + len(pos)) if wanted else {}
    fields["pos"] = pos
    out, records = [], []
    for name in names:
        match = _COMPONENT.match(name)
        base = match.group(1) if match and name not in fields else name
        values = np.asarray(fields[base], dtype=np.float64).reshape(len(pos), -1)
        if base != name:
            k = int(match.group(2))  # type: ignore[union-attr]
            if k >= values.shape[1]:
                raise ValueError(f"Expected {name} within the {values.shape[1]} components of {base!r}")
            values = values[:, k:k + 1]
        out.append(values)
        records.append({"name": name, "components": values.shape[1]})
    return (np.concatenate(out, axis=1) if out else np.zeros((len(pos), 0))), records


def _check_values(values: np.ndarray, dtype: np.dtype, channels: list[str], start: int, name: str) -> np.ndarray:
    """``values`` cast to ``dtype``; a non-finite value or one beyond ``dtype`` refused with its global node."""
    with np.errstate(over="ignore"):
        stored = values.astype(dtype)
    bad = ~np.isfinite(stored)
    if bad.any():
        node, ch = (int(v[0]) for v in np.nonzero(bad))
        why = "finite values" if not np.isfinite(values[node, ch]) else f"values that fit {dtype}"
        raise ValueError(f"Expected {why} in field {channels[ch]!r} of sample {name!r} (got {values[node, ch]:g} "
                         f"at node {start + node}; {plural(int(bad.sum()), 'such value')} in this process's rows)")
    return stored


def _write_rows(ex: Exchange, path: Path, shape: tuple[int, ...], dtype: np.dtype, start: int,
                rows: np.ndarray) -> None:
    """Write ``rows`` at row ``start`` of the ``.npy`` file ``path`` of ``shape``: process 0 makes the
    file at its full size (the header as ``np.save`` writes it), then every process writes its rows in
    place; a failure anywhere is raised on every process (:func:`agree`)."""
    error: BaseException | None = None
    if ex.rank == 0:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if int(np.prod(shape)) == 0:
                np.save(path, np.zeros(shape, dtype=dtype), allow_pickle=False)
            else:
                made = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
                made.flush()
                del made
        except (ValueError, OSError) as err:
            error = ValueError(f"{path}: {err}")
    agree(ex, error)
    if len(rows) and rows.size:
        try:
            target = np.load(path, mmap_mode="r+", allow_pickle=False)
            target[start:start + len(rows)] = rows
            target.flush()
            del target
        except (ValueError, OSError) as err:
            error = ValueError(f"{path}: {err}")
    agree(ex, error)


def _fingerprint(ex: Exchange, pos: np.ndarray, cells: Sequence[tuple[str, np.ndarray]]) -> tuple[str, ...]:
    """Every process's hash of its block of the mesh: equal for two samples exactly when their meshes are."""
    digest = hashlib.sha256(np.ascontiguousarray(pos).tobytes())
    for cell_type, conn in cells:
        digest.update(cell_type.encode() + np.asarray(conn.shape, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(conn, dtype=np.int64).tobytes())
    return tuple(ex.all_gather(digest.hexdigest()))


def _write_cells(ex: Exchange, folder: Path, cells: Sequence[tuple[str, np.ndarray]]) -> dict[str, int]:
    """Each type's cells of every process's block, in file order: ``cells-<type>.npy``."""
    mine: dict[str, list[np.ndarray]] = {}
    for cell_type, conn in cells:
        mine.setdefault(cell_type, []).append(np.asarray(conn, dtype=np.int64))
    merged = {t: np.concatenate(c) if len(c) > 1 else c[0] for t, c in mine.items()}
    every = ex.all_gather([(t, len(c), c.shape[1]) for t, c in merged.items()])
    order: dict[str, list[int]] = {}  # type -> width, count, in order of first appearance
    for listing in every:
        for t, count, width in listing:
            seen = order.setdefault(t, [width, 0])
            if seen[0] != width:
                raise ValueError(f"Expected {t} cells of one node count (got {seen[0]} and {width})")
            seen[1] += count
    for t, (width, total) in order.items():
        start = sum(count for listing in every[:ex.rank] for name, count, _ in listing if name == t)
        rows = merged.get(t, np.zeros((0, width), dtype=np.int64))
        _write_rows(ex, folder / f"cells-{t}.npy", (total, width), np.dtype(np.int64), start, rows)
    return {t: total for t, (_, total) in order.items()}


def _edge_moments(ex: Exchange, cells: Any, pos: np.ndarray, num_nodes: int, first: int) -> tuple[int, Running]:
    """Directed edge count of the nodal graph, and this process's moments of its block's edge channels."""
    graph = block_graph(ex, cells, num_nodes, first)
    src = np.asarray(graph.src, dtype=np.int64)
    ends, back = np.unique(src, return_inverse=True)
    far = lookup(ex, ends, pos, num_nodes)[back]  # the coordinates of each edge's src, from its block owner
    rel = far - pos[np.asarray(graph.dst, dtype=np.int64) - first]
    run = Running(pos.shape[1] + 1)
    run.add(np.concatenate([rel, np.linalg.norm(rel, axis=1, keepdims=True)], axis=1))
    return graph.num_edges, run


def _merged(ex: Exchange, run: Running) -> Running:
    """Every process's moments merged in process order (one small all-gather)."""
    out = Running(len(run.mean))
    for n, mean, m2 in ex.all_gather((run.n, run.mean.tolist(), run.m2.tolist())):
        out.merge(n, np.asarray(mean), np.asarray(m2))
    return out


class _Writer:
    """The state of one distributed write: the meshes seen, the running statistics, the entries."""

    def __init__(self, ex: Exchange, folder: Path, dtype: np.dtype, in_names: list[str], out_names: list[str],
                 table: dict[str, Any] | None) -> None:
        self.ex, self.folder, self.dtype = ex, folder, dtype
        self.in_names, self.out_names, self.table = in_names, out_names, table
        self.meshes: list[dict[str, Any]] = []
        self.fingerprints: list[tuple[str, ...]] = []
        self.edge_runs: list[Running] = []
        self.train_uses: list[int] = []
        self.fields: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        self.run_in = self.run_out = None  # type: Running | None
        self.samples: list[dict[str, Any]] = []

    def _read(self, path: Path, i: int, name: str) -> tuple[Any, np.ndarray, np.ndarray]:
        piece = read_slice(path, self.ex.rank, self.ex.size)
        inputs, in_fields = _columns(path, self.in_names, piece.pos, piece.first_node)
        targets, out_fields = _columns(path, self.out_names, piece.pos, piece.first_node)
        if self.table is not None:
            values = np.asarray(self.table["values"][i], dtype=np.float64)
            inputs = np.concatenate([inputs, np.broadcast_to(values, (len(inputs), len(values)))], axis=1)
            in_fields += [{"name": p, "components": 1, "parameter": True} for p in self.table["names"]]
        if self.fields is None:
            self.fields = (in_fields, out_fields)
        elif (in_fields, out_fields) != self.fields:
            first, got = (channel_names(self.fields[0]), channel_names(self.fields[1])), (
                channel_names(in_fields), channel_names(out_fields))
            raise ValueError(f"Expected the fields of the first sample, {first[0]} and {first[1]} "
                             f"(got {got[0]}, {got[1]})")
        return piece, inputs, targets

    def sample(self, path: Path, i: int, name: str, train: bool) -> None:
        ex = self.ex
        error: BaseException | None = None
        try:
            piece, inputs, targets = self._read(path, i, name)
            assert self.fields is not None
            stored_in = _check_values(inputs, self.dtype, channel_names(self.fields[0]), piece.first_node, name)
            stored_out = _check_values(targets, self.dtype, channel_names(self.fields[1]), piece.first_node, name)
        except (ValueError, OSError, MemoryError) as err:
            error = ValueError(f"{path}: {err}")
        agree(ex, error)
        n, first = piece.num_nodes, piece.first_node
        prints = _fingerprint(ex, piece.pos, piece.cells)
        source = hash_regular(path)[0] if ex.rank == 0 else None
        if prints not in self.fingerprints:
            self._mesh(path, piece, prints)
        m = self.fingerprints.index(prints)
        if ex.rank == 0 and source not in self.meshes[m]["source_sha256"]:
            self.meshes[m]["source_sha256"].append(source)
        folder = self.folder / "samples" / f"{i:05d}"
        _write_rows(ex, folder / "inputs.npy", (n, stored_in.shape[1]), self.dtype, first, stored_in)
        _write_rows(ex, folder / "targets.npy", (n, stored_out.shape[1]), self.dtype, first, stored_out)
        if self.run_in is None:
            self.run_in, self.run_out = Running(inputs.shape[1]), Running(targets.shape[1])
        if train:
            assert self.run_out is not None
            self.run_in.add(inputs)
            self.run_out.add(targets)
            self.train_uses[m] += 1
        self.samples.append({"name": name, "mesh": m, "folder": f"samples/{i:05d}", "source": str(path)})

    def _mesh(self, path: Path, piece: Any, prints: tuple[str, ...]) -> None:
        ex, m = self.ex, len(self.meshes)
        types = {t for listing in ex.all_gather(sorted({t for t, _ in piece.cells})) for t in listing}
        if not types & _SOLID and types & {"triangle", "quad", "polygon"}:  # one process would store its areas
            agree(ex, ValueError(f"{path}: Expected 3-D cells (got a surface of {', '.join(sorted(types))}); a "
                                 "surface's area vectors are made by one process: run meshshard dataset without "
                                 "torchrun"))
        folder = self.folder / "meshes" / f"{m:05d}"
        n, first, pos = piece.num_nodes, piece.first_node, piece.pos
        _write_rows(ex, folder / "points.npy", (n, 3), np.dtype(np.float64), first, pos)
        counts = _write_cells(ex, folder, piece.cells)
        num_edges, run = _edge_moments(ex, piece.cells, pos, n, first)
        if num_edges == 0:
            agree(ex, ValueError(f"{path}: Expected a mesh with edges (got {plural(n, 'node')} and no edge); "
                                 "a graph network cannot learn on a mesh without edges"))
        ex.barrier()  # every block written before process 0 reads the files back
        digest = None
        if ex.rank == 0:
            stored = [(t, np.load(folder / f"cells-{t}.npy", mmap_mode="r")) for t in counts]
            digest = mesh_checksum(np.load(folder / "points.npy", mmap_mode="r"), stored)
        self.meshes.append({"folder": f"meshes/{m:05d}", "num_nodes": n, "pos_dim": 3, "num_edges": num_edges,
                            "cells": counts, "sha256": digest, "source_sha256": []})
        self.fingerprints.append(prints)
        self.edge_runs.append(_merged(ex, run))
        self.train_uses.append(0)

    def normalisation(self) -> dict[str, Any]:
        assert self.fields is not None and self.run_in is not None and self.run_out is not None
        in_ch, out_ch = channel_names(self.fields[0]), channel_names(self.fields[1])
        edge_ch = edge_channel_names(3)
        edges = Running(len(edge_ch))
        for run, uses in zip(self.edge_runs, self.train_uses):
            if uses:
                edges.merge(run.n * uses, run.mean, run.m2 * uses)
        return {"rule": NORMALISATION_RULE, "inputs": _merged(self.ex, self.run_in).stats(in_ch).to_dict(),
                "targets": _merged(self.ex, self.run_out).stats(out_ch).to_dict(),
                "edges": edges.stats(edge_ch).to_dict()}


def write_dataset_distributed(
    sources: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    exchange: Exchange | None = None,
    *,
    inputs: str | Sequence[str],
    targets: str | Sequence[str] | None = None,
    params: str | os.PathLike[str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
) -> Path:
    """Write the dataset folder ``out`` from ``.vtkhdf`` samples with the processes of ``exchange``
    (every process calls this with the same arguments; see the module docstring).

    Args:
        sources: The sample files, one sample each (named after the file, as ``meshshard dataset`` names them).
        out: The dataset folder to create (replaced with ``force`` when it holds a dataset).
        exchange: The processes (default: this one alone).
        inputs, targets: Point field names, comma-separated or a list (``pos``: the coordinates;
            ``u[1]``: one component); no targets: new cases to predict on.
        params: A CSV table of per-sample parameters (``--params``): constant input channels.
        val_fraction, val_samples: The validation split (:func:`meshshard.data.split_samples`).
        dtype: ``"float32"`` or ``"float64"``, the stored fields.
        force: Replace an existing dataset folder.

    Returns:
        The dataset folder, on every process.

    Raises:
        ValueError: on every process alike (one line, naming the file), for any process's bad argument,
            input or write.
    """
    ex = LocalExchange() if exchange is None else exchange
    out = Path(out)
    files = [Path(s) for s in sources]
    in_names, out_names = _names(inputs), _names(targets)
    error: BaseException | None = None
    names: list[str] = []
    with ExitStack() as stack:
        try:
            _check_arguments(files, in_names, out_names, dtype)
            names = sample_names(files)[0]
            if val_fraction is None and val_samples is None and not out_names:
                val_fraction = 0.0
            train, val = split_samples(names, val_fraction, val_samples)
            table = read_parameters(params, names) if params is not None else None
            if ex.rank == 0:
                stack.enter_context(folder_lock(out))
                check_dataset_output(out, force, files)
        except (ValueError, OSError) as err:
            error = err
        agree(ex, error)
        try:
            staging = stack.enter_context(atomic_folder(out)) if ex.rank == 0 else None
        except (ValueError, OSError) as err:
            error, staging = err, None
        agree(ex, error)
        folder = Path(ex.all_gather(None if staging is None else str(staging))[0])
        writer = _Writer(ex, folder, np.dtype(dtype), in_names, out_names, table)
        for i, (path, name) in enumerate(zip(files, names)):
            writer.sample(path, i, name, i in set(train))
        norm = writer.normalisation()
        if ex.rank == 0:
            try:
                _write_metadata(folder, writer, names, train, val, norm, dtype, table, ex.size)
            except (ValueError, OSError) as err:
                error = err
        agree(ex, error)
        try:
            stack.close()  # process 0: the staging folder renamed to out, then the lock let go
        except (ValueError, OSError) as err:
            error = err
    agree(ex, error)
    return out


def _write_metadata(folder: Path, writer: _Writer, names: list[str], train: list[int], val: list[int],
                    norm: dict[str, Any], dtype: str, table: dict[str, Any] | None, processes: int) -> None:
    assert writer.fields is not None
    in_fields, out_fields = writer.fields
    meta: dict[str, Any] = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
        "kind": KINDS[0] if len(writer.meshes) == 1 else KINDS[1], "num_samples": len(names), "dtype": dtype,
        "inputs": in_fields, "targets": out_fields, "input_channels": channel_names(in_fields),
        "target_channels": channel_names(out_fields), "edge_channels": edge_channel_names(3),
        "split": {"train": train, "val": val}, "normalisation": norm, "meshes": writer.meshes,
        "samples": writer.samples}
    if table is not None:
        meta["parameters"] = {"names": list(table["names"]),
                              "values": [[float(v) for v in row] for row in table["values"]]}
    meta["distributed"] = {"processes": processes}
    write_text_file(folder / METADATA_FILE, dump_metadata(meta))
