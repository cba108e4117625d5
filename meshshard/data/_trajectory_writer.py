"""Writing a trajectory dataset (format: :mod:`meshshard.data._trajectories`) from any iterable of
:class:`Trajectory`, one trajectory and one step at a time, the statistics of the training
trajectories taken as they stream past.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural
from meshshard.partition.files import write_text_file

from ._dataset import (
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
from ._trajectories import TASK, check_increasing
from ._writer import stored_as

__all__ = ["Trajectory", "write_trajectories"]

_INTERIOR = "interior"


@dataclass(frozen=True, eq=False)
class Trajectory:
    """One trajectory to write. ``states`` yields its ``T`` steps' state, ``(N, F_state)`` each,
    and is consumed once, after the mesh and the inputs are checked.

    Shapes:
        pos ``(N, D)``; cells ``(C_b, k_b)`` per type; times ``(T,)``; inputs ``(N, F_in)``;
        node_type ``(N,)`` int.
    """

    name: str
    pos: np.ndarray
    cells: Sequence[tuple[str, np.ndarray]]
    times: np.ndarray
    states: Iterable[np.ndarray]
    inputs: np.ndarray
    node_type: np.ndarray
    source: str | None = None
    class_names: Mapping[int, str] = field(default_factory=dict)


def _store_mesh(tmp: Path, index: int, pos: np.ndarray, cells: list[tuple[str, np.ndarray]],
                digest: str) -> tuple[dict[str, Any], Running]:
    from meshshard.partition import nodal_graph

    graph = nodal_graph(cells, len(pos))
    folder = tmp / "meshes" / f"{index:05d}"
    save_npy(folder / "points.npy", pos)
    for cell_type, conn in cells:
        save_npy(folder / f"cells-{cell_type}.npy", conn)
    entry = {"folder": f"meshes/{index:05d}", "num_nodes": len(pos), "pos_dim": pos.shape[1],
             "num_edges": graph.num_edges, "cells": {t: len(c) for t, c in cells}, "sha256": digest}
    return entry, edge_moments(graph, pos)


def _write_states(file: Path, traj: Trajectory, stride: int, channels: Sequence[str], dtype: np.dtype,
                  train: bool, run_state: Running, run_change: Running) -> None:
    """Stream the states into ``(T, N, F)`` ``file``; add the statistics of a training trajectory."""
    n, steps, width = len(traj.pos), len(traj.times), len(channels)
    where = traj.source or traj.name
    out = np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=(steps, n, width))
    recent: list[np.ndarray] = []
    count = 0
    for t, state in enumerate(traj.states):
        state = np.asarray(state, dtype=np.float64)
        if t >= steps or state.shape != (n, width):
            raise ValueError(f"{where}: Expected {steps} states of shape ({n}, {width}) (got "
                             f"{'more' if t >= steps else state.shape} at step {t})")
        bad = ~np.isfinite(state)
        if bad.any():
            node = int(np.flatnonzero(bad.any(axis=1))[0])
            raise ValueError(f"{where}: Expected finite state values (got NaN or inf at step {t}, node {node})")
        out[t] = stored_as(state, dtype, channels, f"{where} (step {t})", traj.name)  # fits dtype, or refused
        if train:
            run_state.add(state)
            recent.append(state)
            if len(recent) > stride:
                run_change.add(recent[-1] - recent.pop(0))
        count += 1
    out.flush()
    del out
    if count != steps:
        raise ValueError(f"{where}: Expected {steps} states, one per time (got {count})")


def write_trajectories(
    out: str | os.PathLike[str],
    trajectories: Iterable[Trajectory],
    names: Sequence[str],
    *,
    state_fields: Sequence[Mapping[str, Any]],
    input_fields: Sequence[Mapping[str, Any]] = (),
    time_stride: int = 1,
    node_type_source: str | None = None,
    interior_classes: Sequence[int | str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    sources: Sequence[str | os.PathLike[str]] = (),
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write a trajectory dataset (:mod:`meshshard.data._trajectories`) from ``trajectories``, one at a time.

    Args:
        names: Every trajectory's name, known up front: the split (by trajectory) is drawn from them.
        state_fields, input_fields: ``[{"name", "components"}]`` in channel order.
        time_stride: S, the steps from an input state to its target.
        node_type_source: What the classes came from, recorded (``None``: no classes, all 0).
        interior_classes: Classes (ids or names) that are not boundary (default: class 0).
        Others: as :func:`meshshard.data._writer.write_samples`.
    """
    out = check_dataset_output(out, force, sources)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"Expected dtype float32 or float64 (got {dtype!r})")
    if int(time_stride) != time_stride or time_stride < 1:
        raise ValueError(f"Expected --time-stride >= 1 (got {time_stride})")
    if not names or len(set(names)) != len(names):
        raise ValueError("Expected at least one trajectory, each with its own name")
    train, val = split_samples(names, val_fraction, val_samples)
    state_ch, in_ch = channel_names(state_fields), channel_names(input_fields)
    with atomic_folder(out) as tmp:
        found = _write_all(tmp, trajectories, names, set(train), state_ch, in_ch, time_stride,
                           np.dtype(dtype), progress)
        classes = _classes(found.pop("class_counts"), found.pop("class_names"), interior_classes)
        norm = found.pop("normalisation")
        meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "task": TASK,
                "kind": KINDS[0] if len(found["meshes"]) == 1 else KINDS[1], "num_samples": len(names),
                "dtype": dtype, "time_stride": int(time_stride),
                "inputs": [dict(f) for f in input_fields], "targets": [dict(f) for f in state_fields],
                "state": [dict(f) for f in state_fields], "input_channels": in_ch, "target_channels": state_ch,
                "state_channels": state_ch, "edge_channels": edge_channel_names(found["meshes"][0]["pos_dim"]),
                "split": {"train": train, "val": val},
                "node_types": {"source": node_type_source, "classes": classes},
                "normalisation": {"rule": NORMALISATION_RULE, "inputs": norm["inputs"].stats(in_ch).to_dict(),
                                  "targets": norm["change"].stats(state_ch).to_dict(),
                                  "state": norm["state"].stats(state_ch).to_dict(),
                                  "edges": norm["edges"]},
                **found}
        meta["normalisation"]["edges"] = norm["edges"].stats(meta["edge_channels"]).to_dict()
        write_text_file(tmp / METADATA_FILE, dump_metadata(meta))
    return out


def _write_all(tmp: Path, trajectories: Iterable[Trajectory], names: Sequence[str], train: set[int],
               state_ch: list[str], in_ch: list[str], stride: int, dtype: np.dtype,
               progress: Callable[[int], None] | None) -> dict[str, Any]:
    meshes: list[dict[str, Any]] = []
    mesh_of: dict[str, int] = {}
    edge_runs: list[Running] = []
    uses: list[int] = []
    width = len(state_ch)
    runs = {"inputs": Running(len(in_ch)), "state": Running(width), "change": Running(width)}
    entries: list[dict[str, Any]] = []
    counts: dict[int, int] = {}
    class_names: dict[int, str] = {}
    for i, traj in enumerate(trajectories):
        if i >= len(names) or traj.name != names[i]:
            raise ValueError(f"Expected trajectory {i} to be named {names[i] if i < len(names) else None!r} "
                             f"(got {traj.name!r})")
        where = traj.source or traj.name
        pos = np.asarray(traj.pos, dtype=np.float64)
        n = len(pos)
        cells = [(str(t), np.asarray(c, dtype=np.int64)) for t, c in traj.cells]
        times = np.asarray(traj.times, dtype=np.float64)
        if len(times) < 2:
            raise ValueError(f"{where}: Expected a trajectory of at least two steps (got {plural(len(times), 'step')})")
        if len(times) <= stride:
            raise ValueError(f"{where}: Expected more steps than --time-stride {stride} (got "
                             f"{plural(len(times), 'step')}: no step has a target {stride} steps later)")
        check_increasing(times.tolist(), [f"step {k}" for k in range(len(times))], Path(where))
        inputs = np.asarray(traj.inputs, dtype=np.float64).reshape(n, -1)
        node_type = np.asarray(traj.node_type)
        if inputs.shape[1] != len(in_ch) or node_type.shape != (n,) or node_type.dtype.kind not in "iu":
            raise ValueError(f"{where}: Expected inputs ({n}, {len(in_ch)}) and integer node types ({n},) (got "
                             f"{inputs.shape}, {node_type.dtype} {node_type.shape})")
        if not np.isfinite(inputs).all():
            raise ValueError(f"{where}: Expected finite static inputs (got NaN or inf)")
        if not cells or any(c.ndim != 2 or (c.size and (c.min() < 0 or c.max() >= n)) for _, c in cells):
            raise ValueError(f"{where}: Expected cells with node ids in [0, {n})")
        digest = mesh_checksum(pos, cells)
        if digest not in mesh_of:
            if meshes and meshes[0]["pos_dim"] != pos.shape[1]:
                raise ValueError(f"{where}: Expected {meshes[0]['pos_dim']}-D points like the first trajectory "
                                 f"(got {pos.shape[1]}-D)")
            mesh_of[digest] = len(meshes)
            entry, edges = _store_mesh(tmp, len(meshes), pos, cells, digest)
            meshes.append(entry)
            edge_runs.append(edges)
            uses.append(0)
        m = mesh_of[digest]
        if meshes[m]["num_edges"] == 0:
            raise ValueError(f"{where}: Expected a mesh with edges (got {plural(n, 'node')} and no edge); "
                             "a graph network cannot learn on a mesh without edges")
        folder = tmp / "samples" / f"{i:05d}"
        folder.mkdir(parents=True)
        save_npy(folder / "inputs.npy", stored_as(inputs, dtype, in_ch, where, traj.name))
        save_npy(folder / "node_type.npy", node_type.astype(np.int64))
        _write_states(folder / "state.npy", traj, stride, state_ch, dtype, i in train, runs["state"], runs["change"])
        ids, k = np.unique(node_type, return_counts=True)
        for c, count in zip(ids.tolist(), k.tolist()):
            counts[c] = counts.get(c, 0) + count
        class_names.update({int(c): str(v) for c, v in traj.class_names.items()})
        if i in train:
            runs["inputs"].add(inputs)
            uses[m] += 1
        entries.append({"name": traj.name, "mesh": m, "folder": f"samples/{i:05d}", "source": traj.source,
                        "num_steps": len(times), "times": times.tolist()})
        if progress is not None:
            progress(1)
    if len(entries) != len(names):
        raise ValueError(f"Expected {len(names)} trajectories (got {len(entries)})")
    run_edges = Running(meshes[0]["pos_dim"] + 1)
    for run, u in zip(edge_runs, uses):
        if u:
            run_edges.merge(run.n * u, run.mean, run.m2 * u)
    return {"normalisation": {**runs, "edges": run_edges}, "class_counts": counts, "class_names": class_names,
            "meshes": meshes, "samples": entries}


def _classes(counts: Mapping[int, int], names: Mapping[int, str],
             interior: Sequence[int | str] | None) -> list[dict[str, Any]]:
    """The ``node_types.classes`` entries, by id; every class but those of ``interior`` (default:
    0) is boundary."""
    ids = sorted(counts)
    named = {c: names.get(c, _INTERIOR if c == 0 else None) for c in ids}
    known = {name: c for c, name in named.items() if name is not None}
    chosen = set()
    for item in (interior if interior is not None else [0]):
        text = str(item).strip()
        if text in known:
            chosen.add(known[text])
        elif text.isdigit() and int(text) in counts:
            chosen.add(int(text))
        elif interior is not None:
            shown = [f"{c} ({named[c]})" if named[c] else str(c) for c in ids]
            raise ValueError(f"Expected --interior-classes among the node classes found: {listed(shown)} "
                             f"(got {text!r})")
    return [{"id": c, "name": named[c], "boundary": c not in chosen, "count": int(counts[c])} for c in ids]
