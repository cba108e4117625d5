"""Writing a dataset folder (the format: :mod:`meshshard.data._dataset`): from numpy arrays
(:func:`write_dataset`), PyG ``Data`` (:func:`write_dataset_from_pyg`) or any iterable of
:class:`Sample` (:func:`write_samples`, what ``meshshard dataset`` uses), one sample at a time, the
statistics of the training split taken as they stream past (:mod:`meshshard.data._statistics`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshshard.partition import plural
from meshshard.partition.files import write_text_file

from ._dataset import (
    CELL_TYPE,
    FORMAT_NAME,
    FORMAT_VERSION,
    KINDS,
    METADATA_FILE,
    channel_names,
    dump_metadata,
    edge_channel_names,
    mesh_checksum,
    save_npy,
)
from ._folder_guard import atomic_folder, check_dataset_output
from ._split import split_samples
from ._statistics import NORMALISATION_RULE, Running, edge_moments

if TYPE_CHECKING:
    from meshshard.partition import Cells

__all__ = ["Sample", "write_samples", "write_dataset", "write_dataset_from_pyg", "stored_as"]


@dataclass(frozen=True, eq=False)
class Sample:
    """One sample to write: its mesh and its fields (unnormalised).

    Shapes:
        pos: ``(N, D)``. cells: blocks ``(C_b, k_b)``. edge_index: ``(2, E)``.
        inputs: ``(N, F_in)``. targets: ``(N, F_out)``.
    """

    name: str
    pos: np.ndarray
    inputs: np.ndarray
    targets: np.ndarray
    cells: Cells = ()
    edge_index: np.ndarray | None = None
    source: str | None = None
    boundaries: Mapping[str, np.ndarray] | None = None
    graph: Mapping[str, Any] | None = None  # how edge_index was made from the points (--graph), if it was


def _fields(names: Sequence[Any] | None, width: int, default: str, what: str) -> list[dict[str, Any]]:
    """Field records from names (``"T"`` one channel, ``("u", 3)`` three) for ``width`` channels."""
    if names is None:
        return [{"name": default, "components": width}]
    fields = []
    for item in names:
        name, k = (item, 1) if isinstance(item, str) else (str(item[0]), int(item[1]))
        if not name or k < 1:
            raise ValueError(f"Expected '{what}' entries of a name or (name, components >= 1) (got {item!r})")
        fields.append({"name": name, "components": k})
    total = sum(f["components"] for f in fields)
    if total != width:
        raise ValueError(f"Expected '{what}' to name {plural(width, 'channel')} (got {total}: {channel_names(fields)})")
    return fields


def _check_sample(sample: Sample, index: int, in_width: int | None,
                  out_width: int | None) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """Shapes, ids and finiteness of one sample; returns its float64 points and merged cells."""
    where = sample.source or f"sample {index} ({sample.name!r})"
    pos = np.asarray(sample.pos, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] not in (1, 2, 3) or len(pos) == 0:
        raise ValueError(f"{where}: Expected points of shape (N, 2) or (N, 3), N >= 1 (got {pos.shape})")
    n = len(pos)
    bad = ~np.isfinite(pos).all(axis=1)
    if bad.any():
        raise ValueError(f"{where}: Expected finite coordinates (got NaN or inf at node {int(np.flatnonzero(bad)[0])})")
    for what, array, width in (("inputs", sample.inputs, in_width), ("targets", sample.targets, out_width)):
        a = np.asarray(array)
        if a.ndim != 2 or a.shape[0] != n or (width is not None and a.shape[1] != width):
            want = f"({n}, {width if width is not None else 'F'})"
            raise ValueError(f"{where}: Expected {what} of shape {want}, one row per node (got {a.shape})")
    merged: dict[str, list[np.ndarray]] = {}
    for cell_type, conn in sample.cells:
        conn = np.asarray(conn)
        if not CELL_TYPE.match(str(cell_type)):
            raise ValueError(f"{where}: Expected a cell type of letters, digits and '_' (got {cell_type!r})")
        if conn.ndim != 2 or not np.issubdtype(conn.dtype, np.integer) or (
                conn.size and (conn.min() < 0 or conn.max() >= n)):
            raise ValueError(f"{where}: Expected {cell_type} cells of shape (C, k) with node ids in [0, {n}) "
                             f"(got shape {conn.shape}, dtype {conn.dtype})")
        merged.setdefault(str(cell_type), []).append(conn.astype(np.int64))
    cells = [(t, np.concatenate(c) if len(c) > 1 else c[0]) for t, c in merged.items()]
    if not cells and sample.edge_index is None:
        raise ValueError(f"{where}: Expected cells or an edge_index (got neither; a point cloud's: "
                         "meshshard.partition.point_graph(pos, parse_graph_rule('knn:8')))")
    return pos, cells


def stored_as(array: np.ndarray, dtype: np.dtype, channels: Sequence[str], where: str, name: str) -> np.ndarray:
    """``array`` (finite float64) cast to the stored ``dtype``; a value beyond its range (1e300
    in float32), which the cast turns into an infinity, is refused naming the sample and field."""
    with np.errstate(over="ignore"):  # refused below, naming the value
        stored = array.astype(dtype)
    bad = ~np.isfinite(stored)
    if bad.any():
        node, ch = (int(v[0]) for v in np.nonzero(bad))
        raise ValueError(f"{where}: Expected the values of field {channels[ch]!r} of sample {name!r} to fit {dtype} "
                         f"(got {array[node, ch]:g} at node {node}, beyond {dtype}'s largest magnitude "
                         f"{float(np.finfo(dtype).max):.2g}; {plural(int(bad.sum()), 'such value')} in all)")
    return stored


def _check_finite(array: np.ndarray, channels: Sequence[str], where: str, name: str) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        node, ch = (int(v[0]) for v in np.nonzero(bad))
        value = array[node, ch]
        raise ValueError(f"{where}: Expected finite values in field {channels[ch]!r} of sample {name!r} "
                         f"(got {value} at node {node}; {plural(int(bad.sum()), 'non-finite value')} in all)")


def write_samples(
    out: str | os.PathLike[str],
    samples: Iterable[Sample],
    names: Sequence[str],
    *,
    input_fields: Sequence[Mapping[str, Any]],
    target_fields: Sequence[Mapping[str, Any]],
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    sources: Sequence[str | os.PathLike[str]] = (),
    progress: Callable[[int], None] | None = None,
    parameters: Mapping[str, Any] | None = None,
    target_scales: Mapping[str, str] | None = None,
    collapsed_2d: bool = False,
    max_points: int | None = None,
    mean_field: Any = False,
    prior_progress: Callable[[int], None] | None = None,
    mirror: Mapping[str, Any] | None = None,
) -> Path:
    """Write a dataset folder from ``samples``, consumed one at a time (never all in memory).

    Args:
        out: The folder to create (written to a temporary folder beside it, renamed at the end;
            nothing is left behind on error).
        samples: The samples, in order; ``names[i]`` must be ``samples[i].name``.
        names: Every sample's name, known up front (the split is drawn from them).
        input_fields, target_fields: ``[{"name", "components"}]`` in channel order.
        val_fraction, val_samples: The validation split, see :func:`split_samples`.
        dtype: ``"float32"`` or ``"float64"`` for the stored fields.
        force: Replace an existing dataset folder (only one, see :func:`check_dataset_output`).
        sources: Input paths ``out`` must not contain.
        progress: Called with 1 after each sample.
        parameters: Per-sample parameters, ``{"names": [...], "values": [[...] per sample]}``,
            recorded in ``dataset.json``; the samples carry them as input channels already (the
            input fields marked ``"parameter": true``).
        target_scales: ``{field: expression of the parameters}``: the samples' targets are
            divided by it already (non-dimensional); recorded so that predictions are multiplied
            back (:meth:`Dataset.target_factors`).
        collapsed_2d: The meshes are the lower planes of one-cell-thick 3-D meshes
            (``--collapse-2d``): recorded as ``"collapsed_2d": true``.
        max_points: Training's points per sample and epoch (``--max-points``): recorded as
            ``"max_points"``.
        mean_field: ``True`` or ``"mean"``: the training samples' mean field as input channels, and
            the targets' offset (``--mean-field``, :mod:`meshshard.data._mean_field`); ``"knn:K"``
            the nearest cases' (many meshes: each mapped onto the sample's mesh,
            :mod:`meshshard.data._prior`); or another dataset's, its
            :func:`~meshshard.data._prior.prior_cases_of` or the tuple of
            :func:`~meshshard.data._mean_field.mean_field_of` (``--mean-field-from``).
        prior_progress: Called with 1 after each sample's prior is written.
        mirror: The mirrored training samples, recorded as ``"mirror"``
            (:mod:`meshshard.data._mirror`).

    Returns:
        The dataset folder.
    """
    out = check_dataset_output(out, force, sources)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"Expected dtype float32 or float64 (got {dtype!r})")
    if not names:
        raise ValueError("Expected at least one sample (got none)")
    if len(set(names)) != len(names):
        raise ValueError("Expected distinct sample names")
    train, val = split_samples(names, val_fraction, val_samples)
    train_set = set(train)
    in_ch, out_ch = channel_names(input_fields), channel_names(target_fields)
    with atomic_folder(out) as tmp:
        meta = _write_all(tmp, samples, names, train_set, in_ch, out_ch, np.dtype(dtype), progress)
        meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": meta.pop("kind"),
                "num_samples": len(names), "dtype": dtype,
                "inputs": [dict(f) for f in input_fields], "targets": [dict(f) for f in target_fields],
                "input_channels": in_ch, "target_channels": out_ch,
                "edge_channels": meta.pop("edge_channels"),
                "split": {"train": train, "val": val}, **meta}
        if parameters is not None:
            meta["parameters"] = {"names": list(parameters["names"]),
                                  "values": [[float(v) for v in row] for row in parameters["values"]]}
        if target_scales:
            meta["target_scales"] = dict(target_scales)
        if collapsed_2d:
            meta["collapsed_2d"] = True
        rules = [m["graph"] for m in meta["meshes"] if "graph" in m]
        if rules:
            from meshshard.partition import GraphRule

            meta["graph"] = str(GraphRule(rules[0]["rule"], rules[0].get("k"), rules[0].get("radius")))
        if max_points is not None:
            meta["max_points"] = int(max_points)
        if mirror is not None:
            meta["mirror"] = dict(mirror)
        if mean_field is not False and mean_field is not None:
            from ._prior import add_prior

            add_prior(tmp, meta, train, np.dtype(dtype), mean_field, prior_progress)
        write_text_file(tmp / METADATA_FILE, dump_metadata(meta))
    return out


def _write_all(tmp: Path, samples: Iterable[Sample], names: Sequence[str], train: set[int],
               in_ch: list[str], out_ch: list[str], dtype: np.dtype,
               progress: Callable[[int], None] | None) -> dict[str, Any]:
    """Stream the samples into ``tmp``; return the metadata entries that depend on them."""
    meshes: list[dict[str, Any]] = []
    mesh_of: dict[str, int] = {}
    edge_runs: list[Running] = []
    train_uses: list[int] = []
    run_in, run_out = Running(len(in_ch)), Running(len(out_ch))
    entries = []
    count = 0
    for i, sample in enumerate(samples):
        if i >= len(names) or sample.name != names[i]:
            raise ValueError(f"Expected sample {i} to be named {names[i] if i < len(names) else None!r} "
                             f"(got {sample.name!r})")
        pos, cells = _check_sample(sample, i, len(in_ch), len(out_ch))
        where = sample.source or f"sample {i}"
        inputs = np.asarray(sample.inputs, dtype=np.float64)
        targets = np.asarray(sample.targets, dtype=np.float64)
        _check_finite(inputs, in_ch, where, sample.name)
        _check_finite(targets, out_ch, where, sample.name)
        ei = None if sample.edge_index is None else np.asarray(sample.edge_index, dtype=np.int64)
        if cells and sample.graph is None:
            ei = None  # the cells' edges are the graph
        digest = mesh_checksum(pos, cells, ei)
        if digest not in mesh_of:
            if meshes and meshes[0]["pos_dim"] != pos.shape[1]:
                raise ValueError(f"{where}: Expected {meshes[0]['pos_dim']}-D points like the first sample "
                                 f"(got {pos.shape[1]}-D)")
            mesh_of[digest] = len(meshes)
            from meshshard.partition import Graph, nodal_graph

            graph = Graph.from_edge_index(ei, len(pos)) if ei is not None else nodal_graph(cells, len(pos))
            folder = tmp / "meshes" / f"{len(meshes):05d}"
            save_npy(folder / "points.npy", pos)
            for cell_type, conn in cells:
                save_npy(folder / f"cells-{cell_type}.npy", conn)
            if ei is not None:
                save_npy(folder / "edge_index.npy", ei)
            meshes.append({"folder": f"meshes/{len(meshes):05d}", "num_nodes": len(pos),
                           "pos_dim": pos.shape[1], "num_edges": graph.num_edges,
                           "cells": {t: len(c) for t, c in cells}, "sha256": digest}
                          | ({"graph": dict(sample.graph)} if sample.graph is not None and ei is not None else {})
                          | _write_boundaries(folder, sample.boundaries, pos, cells, where)
                          | _write_surface_area(folder, pos, cells))
            edge_runs.append(edge_moments(graph, pos))
            train_uses.append(0)
        m = mesh_of[digest]
        if meshes[m]["num_edges"] == 0:
            who = sample.source or f"sample {i} ({sample.name!r})"
            raise ValueError(f"{who}: Expected a mesh with edges (got {plural(len(pos), 'node')} and no edge); "
                             "a graph network cannot learn on a mesh without edges")
        folder = tmp / "samples" / f"{i:05d}"
        save_npy(folder / "inputs.npy", stored_as(inputs, dtype, in_ch, where, sample.name))
        save_npy(folder / "targets.npy", stored_as(targets, dtype, out_ch, where, sample.name))
        if i in train:
            run_in.add(inputs)
            run_out.add(targets)
            train_uses[m] += 1
        entries.append({"name": sample.name, "mesh": m, "folder": f"samples/{i:05d}", "source": sample.source})
        count += 1
        if progress is not None:
            progress(1)
    if count != len(names):
        raise ValueError(f"Expected {len(names)} samples (got {count})")
    edge_ch = edge_channel_names(meshes[0]["pos_dim"])
    run_edges = Running(len(edge_ch))
    for run, uses in zip(edge_runs, train_uses):
        if uses:
            run_edges.merge(run.n * uses, run.mean, run.m2 * uses)
    norm = {"rule": NORMALISATION_RULE, "inputs": run_in.stats(in_ch).to_dict(),
            "targets": run_out.stats(out_ch).to_dict(), "edges": run_edges.stats(edge_ch).to_dict()}
    return {"kind": KINDS[0] if len(meshes) == 1 else KINDS[1], "edge_channels": edge_ch,
            "normalisation": norm, "meshes": meshes, "samples": entries}


def _write_surface_area(folder: Path, pos: np.ndarray, cells: Cells) -> dict[str, Any]:
    """Store a surface's per-point area vectors (``surface-area.npy``, :mod:`meshshard.partition._points`)
    and areas (``surface-point-area.npy``: each face's area split equally among its corners); the
    mesh's ``"surface_area"`` entry (the total area) and ``"point_area"``, or nothing for another mesh."""
    from ._clouds import surface_faces, surface_fields

    faces = surface_faces(pos, cells)
    if not faces:
        return {}
    _, area, vectors = surface_fields(pos, faces)
    save_npy(folder / "surface-area.npy", vectors)
    save_npy(folder / "surface-point-area.npy", area)  # each point's area: a rank reads only its rows
    planar = bool(len(pos)) and float(np.ptp(pos[:, 2])) == 0.0  # a 2-D mesh written with a constant z
    return {"surface_area": float(area.sum()), "point_area": True, **({"planar": True} if planar else {})}


def _write_boundaries(folder: Path, boundaries: Mapping[str, np.ndarray] | None, pos: np.ndarray,
                      cells: Cells, where: str) -> dict[str, Any]:
    """Store a mesh's named boundaries (``boundary-{k:03d}.npy``: sorted node ids;
    ``boundary-{k:03d}-area.npy``: their area vectors); the ``"boundaries"`` entry of the mesh."""
    if not boundaries:
        return {}
    from ._surface import boundary_area_vectors

    entries = []
    for k, (name, ids) in enumerate(sorted(boundaries.items())):
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        if len(ids) and (ids[0] < 0 or ids[-1] >= len(pos)):
            raise ValueError(f"{where}: Expected the nodes of boundary {name!r} in [0, {len(pos)}) "
                             f"(got {ids[0] if ids[0] < 0 else ids[-1]})")
        area = boundary_area_vectors(pos, cells, ids)
        save_npy(folder / f"boundary-{k:03d}.npy", ids)
        save_npy(folder / f"boundary-{k:03d}-area.npy", area)
        entries.append({"name": str(name), "num_nodes": len(ids),
                        "area": float(np.linalg.norm(area, axis=1).sum())})
    return {"boundaries": entries}


def _as_numpy(x: Any) -> np.ndarray:
    """numpy from numpy, lists or torch tensors (duck-typed: this layer never imports torch)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def write_dataset(
    out: str | os.PathLike[str],
    inputs: Any,
    targets: Any = None,
    *,
    pos: Any,
    cells: Any = None,
    edge_index: Any = None,
    input_names: Sequence[Any] | None = None,
    target_names: Sequence[Any] | None = None,
    sample_names: Sequence[str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    boundaries: Any = None,
    mean_field: bool | str = False,
) -> Path:
    """Write a dataset folder from numpy arrays (or torch tensors; the format: :mod:`meshshard.data._dataset`).

    One mesh: ``pos`` an ``(N, D)`` array, ``cells`` (``[(type, conn)]`` or ``{type: conn}``) or
    ``edge_index``, and ``inputs`` / ``targets`` ``(S, N, F)`` arrays (or lists of ``(N, F)``).
    Many meshes: ``pos``, ``cells`` / ``edge_index``, ``inputs`` and ``targets`` all lists with
    one entry per sample. ``targets=None``: inputs only (zero target channels, no validation split
    unless asked), cases for ``meshshard predict`` to predict on; ``meshshard train`` refuses it.

    Args:
        input_names, target_names: Fields in channel order, each a name (one channel) or
            ``(name, components)``; default one field ``x`` / ``y`` with every channel.
        sample_names: Default ``"00000"``, ``"00001"``, ...
        val_fraction, val_samples: See :func:`split_samples` (default: 20 % for validation).
        dtype: Stored precision of the fields.
        boundaries: Named boundaries, ``{name: node ids}`` (one per sample with many meshes), kept
            with each mesh with the area their nodes stand for (``meshshard predict --boundary``).
        mean_field: The training samples' mean of the targets as inputs, the targets learnt as the
            difference from it (``True`` or ``"mean"``; ``"knn:K"`` the nearest cases'; on many
            meshes mapped onto each sample's: ``meshshard dataset --mean-field``).

    Shapes:
        pos: ``(N, D)``. inputs: ``(S, N, F_in)``. targets: ``(S, N, F_out)``.
        cells: ``(C_b, k_b)`` per type. edge_index: ``(2, E)``.
    """
    ins = [_as_numpy(a) for a in inputs]
    s = len(ins)
    if targets is None:
        if target_names:
            raise ValueError("Expected targets with target_names (got target_names but no targets)")
        outs = [np.zeros((len(a), 0)) for a in ins]
        target_names = []
        if val_fraction is None and val_samples is None:
            val_fraction = 0.0  # cases to predict on: nothing to validate against
    else:
        outs = [_as_numpy(a) for a in targets]
    if len(outs) != s:
        raise ValueError(f"Expected as many targets as inputs (got {len(outs)} and {s})")
    many = isinstance(pos, (list, tuple))
    if many and len(pos) != s:
        raise ValueError(f"Expected one 'pos' per sample (got {len(pos)} for {plural(s, 'sample')})")

    def per_sample(value: Any, i: int) -> Any:
        return value[i] if many and value is not None else value

    def cell_list(value: Any) -> list[tuple[str, np.ndarray]]:
        if value is None:
            return []
        items = value.items() if isinstance(value, Mapping) else value
        return [(str(t), _as_numpy(c)) for t, c in items]

    names = list(sample_names) if sample_names is not None else [f"{i:05d}" for i in range(s)]
    if len(names) != s:
        raise ValueError(f"Expected {s} sample names (got {len(names)})")
    f_in = ins[0].shape[1] if s and ins[0].ndim == 2 else 0
    f_out = outs[0].shape[1] if s and outs[0].ndim == 2 else 0
    samples = (Sample(names[i], _as_numpy(per_sample(pos, i)), ins[i], outs[i],
                      cells=cell_list(per_sample(cells, i)),
                      edge_index=None if per_sample(edge_index, i) is None else _as_numpy(per_sample(edge_index, i)),
                      boundaries=per_sample(boundaries, i))
               for i in range(s))
    return write_samples(out, samples, names, input_fields=_fields(input_names, f_in, "x", "input_names"),
                         target_fields=_fields(target_names, f_out, "y", "target_names"),
                         val_fraction=val_fraction, val_samples=val_samples, dtype=dtype, force=force,
                         mean_field=mean_field)


def write_dataset_from_pyg(
    out: str | os.PathLike[str],
    data_list: Sequence[Any],
    *,
    input_names: Sequence[Any] | None = None,
    target_names: Sequence[Any] | None = None,
    **options: Any,
) -> Path:
    """Write a dataset folder from PyG ``Data`` objects (read by duck typing: no torch import).

    Each ``Data`` needs ``x`` ``(N, F_in)``, ``y`` ``(N, F_out)``, ``pos`` ``(N, D)`` and either
    ``edge_index`` ``(2, E)``, ``face`` ``(3 or 4, C)`` (triangles or tetrahedra) or ``cells``
    (``[(type, conn)]``). Without ``y`` on any of them: a dataset of inputs only (new cases for
    ``meshshard predict``). ``options`` as for :func:`write_dataset`.
    """
    with_y = sum(getattr(data, "y", None) is not None for data in data_list)
    if 0 < with_y < len(data_list):
        raise ValueError(f"Expected 'y' on every Data or on none (got it on {with_y} of {len(data_list)})")
    pos, cells, edges, xs, ys = [], [], [], [], []
    for i, data in enumerate(data_list):
        for attr in ("x", "pos"):
            if getattr(data, attr, None) is None:
                raise ValueError(f"Expected data_list[{i}] to have '{attr}' (got none)")
        pos.append(_as_numpy(data.pos))
        xs.append(_as_numpy(data.x).reshape(len(pos[-1]), -1))
        if with_y:
            ys.append(_as_numpy(data.y).reshape(len(pos[-1]), -1))
        face = getattr(data, "face", None)
        own = getattr(data, "cells", None)
        if own is not None:
            cells.append([(str(t), _as_numpy(c)) for t, c in own])
            edges.append(None)
        elif face is not None:
            face = _as_numpy(face)
            cells.append([({3: "triangle", 4: "tetra"}.get(face.shape[0], "face"), face.T)])
            edges.append(None)
        elif getattr(data, "edge_index", None) is not None:
            cells.append(None)
            edges.append(_as_numpy(data.edge_index))
        else:
            raise ValueError(f"Expected data_list[{i}] to have 'edge_index', 'face' or 'cells' (got none)")
    return write_dataset(out, xs, ys if with_y else None, pos=pos, cells=cells, edge_index=edges,
                         input_names=input_names, target_names=target_names, **options)
