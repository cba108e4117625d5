"""Trajectory datasets (``meshshard dataset SOURCES --state NAMES``): what a transient task
trains its one-step map on, in the dataset format of :mod:`meshshard.data._dataset`.

Sources (:func:`trajectory_steps`), one trajectory each: a ``.pvd`` collection (steps ordered by
their ``timestep``), an ``.xdmf`` time series (meshio's ``TimeSeriesReader``; its order and
times), or a folder of numbered files (``u_0001.vtu``, foamToVTK's ``case_100.vtm``; a case
folder stands for its ``VTK/``) ordered by the number, timed by a ``.series`` file naming exactly
them, else by the number. Times must increase.

One trajectory is one sample of the dataset: one mesh (trajectories may have different meshes:
the many-meshes machinery, partitions included, applies unchanged), the state at every step
along a time axis, the static inputs and the node classes. The sample folder holds::

    samples/00000/
    ├── state.npy        (T, N, F_state) the dynamic fields at every step, unnormalised
    ├── inputs.npy       (N, F_in) the static fields (F_in may be 0), from the first step
    └── node_type.npy    (N,) int64 class id of every node

A rank reads ``state[t, owned_ids]`` from the memory map: the rows of one step are contiguous,
so a step costs O(shard), never O(N T).

``dataset.json`` is the dataset format's (no ``targets.npy``), with these keys more:
``"task": "transient"``; ``time_stride`` S (the target of step t is the state at step t + S);
``state`` / ``state_channels`` the dynamic fields; ``targets`` / ``target_channels`` the same
fields and channels, since the model's output is the change of each over the stride;
``node_types`` (``source``: what the classes came from, and ``classes``: ``id``, ``name`` where
known, ``boundary``, and ``count``, the nodes of the class over every trajectory); and per sample
``num_steps`` T and ``times``. Of the six-node triangle mesh of the dataset format's example, two
trajectories ``a`` and ``b`` of three steps at times 0, 0.5, 1, a static input ``c`` (1 in ``a``,
2 in ``b``), the state ``T = c * t * x`` at step ``t`` and node class 1 where ``x == 0``, ``b``
for validation, written by ``write_trajectories(DIR, [Trajectory(name, points, [("triangle",
triangles)], [0.0, 0.5, 1.0], [(c * t * x)[:, None] for t in range(3)], np.full((6, 1), c),
(x == 0).astype(int)) for name, c in (("a", 1.0), ("b", 2.0))], ["a", "b"], state_fields=[{"name":
"T", "components": 1}], input_fields=[{"name": "c", "components": 1}], node_type_source="field
'node_type'", val_samples=["b"])``::

    {
      "format": "meshshard-dataset",
      "format_version": 2,
      "task": "transient",
      "kind": "one-mesh",
      "num_samples": 2,
      "dtype": "float32",
      "time_stride": 1,
      "inputs": [{"name": "c", "components": 1}],
      "targets": [{"name": "T", "components": 1}],
      "state": [{"name": "T", "components": 1}],
      "input_channels": ["c"],
      "target_channels": ["T"],
      "state_channels": ["T"],
      "edge_channels": ["dpos[0]", "dpos[1]", "|dpos|"],
      "split": {"train": [0], "val": [1]},
      "node_types": {"source": "field 'node_type'",
                     "classes": [{"id": 0, "name": "interior", "boundary": false, "count": 8},
                                 {"id": 1, "name": null, "boundary": true, "count": 4}]},
      "normalisation": {
        "rule": "(value - mean) / scale, scale = std or 1 where std == 0",
        "inputs": {"mean": [1.0], "std": [0.0], "scale": [1.0], "count": 6},
        "targets": {"mean": [1.0], "std": [0.816496580927726], "scale": [0.816496580927726], "count": 12},
        "state": {"mean": [1.0], "std": [1.3333333333333333], "scale": [1.3333333333333333], "count": 18},
        "edges": {"mean": [0.0, 0.0, 1.0920474583051323],
                  "std": [0.816496580927726, 0.7453559924999299, 0.17220502615058225],
                  "scale": [0.816496580927726, 0.7453559924999299, 0.17220502615058225], "count": 18}
      },
      "meshes": [
        {"folder": "meshes/00000", "num_nodes": 6, "pos_dim": 2, "num_edges": 18, "cells": {"triangle": 4},
         "sha256": "9333b48d40f2189652b07a391c52195193be1435eb1462481f6ab53c8d3e5c63"}
      ],
      "samples": [
        {"name": "a", "mesh": 0, "folder": "samples/00000", "source": null, "num_steps": 3, "times": [0.0, 0.5, 1.0]},
        {"name": "b", "mesh": 0, "folder": "samples/00001", "source": null, "num_steps": 3, "times": [0.0, 0.5, 1.0]}
      ]
    }

``normalisation`` holds, over the **training** trajectories: ``inputs`` (the static fields, each
trajectory's nodes once), ``state`` (every node at every step), ``targets`` (the change
``state[t + S] - state[t]`` over every pair of steps S apart: what the model predicts,
normalised) and ``edges`` (each trajectory's mesh once). The rule is the dataset's
(``(value - mean) / scale``, held channels scaled by 1).

Node classes. ``node_type.npy`` holds class ids; the one-hot input of a node is the position of
its id in ``node_types.classes`` (ascending ids). They come from

- a point field (``--node-type FIELD``): integer values >= 0, taken from each trajectory's first
  step; the classes are the values found, unnamed (``"name": null``) but class 0, "interior";
- else the boundary tags the files carry: the named sets of nodes (``point_sets``: the patches of
  a foamToVTK ``.vtm``, Abaqus node sets) and of cells of a lower dimension than the mesh's
  (``cell_sets``: gmsh physical groups, meshio cell sets). Class 0 is ``interior`` (the nodes on
  none), then one class per set name, numbered in the order first met; a node on several sets
  takes the first in its file's order;
- else none: every node is class 0, ``"source": null``.

Boundary classes: by default every class but 0 (``--interior-classes`` names others that are
predicted too, such as an outflow). The state of boundary nodes is prescribed during a rollout and
left out of the loss.

Public names: :func:`build_trajectories` (``meshshard dataset --state``), :func:`write_trajectories`
(any iterable of :class:`Trajectory`), :func:`open_trajectories` -> :class:`Trajectories` (one
rank's rows of a step, static inputs and node classes), :func:`is_trajectory_dataset`.
"""

from __future__ import annotations

import io
import os
import re
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
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
    NORMALISATION_RULE,
    Dataset,
    _edge_moments,
    _Running,
    _save_npy,
    _stored,
    atomic_folder,
    channel_names,
    check_dataset_output,
    dump_metadata,
    edge_channel_names,
    mesh_checksum,
    open_dataset,
    split_samples,
)
from ._surface import boundary_classes

__all__ = ["TASK", "Trajectory", "Trajectories", "build_trajectories", "write_trajectories", "open_trajectories",
           "is_trajectory_dataset", "trajectory_steps"]

#: The value of ``dataset.json``'s ``"task"`` for a trajectory dataset.
TASK = "transient"
_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_INTERIOR = "interior"


# ---------------------------------------------------------------------------------------------
# Sources: a .pvd, an .xdmf time series, a folder of numbered files


@dataclass(frozen=True)
class _Step:
    """One step of a trajectory: its time and how to read it (``file`` for a mesh file; ``index``
    into an ``.xdmf`` time series)."""
    time: float
    file: Path
    index: int = -1


def trajectory_steps(source: str | os.PathLike[str]) -> tuple[str, list[_Step]]:
    """The kind (``"pvd"``, ``"xdmf"``, ``"folder"``) and the steps of one trajectory source, in
    time order; times are checked to increase (one-line ``ValueError`` otherwise)."""
    path = Path(source)
    if path.is_dir():
        return "folder", _folder_steps(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if suffix == ".pvd":
        return "pvd", _pvd_steps(path)
    if suffix in (".xdmf", ".xmf"):
        return "xdmf", _xdmf_steps(path)
    raise ValueError(f"{path}: Expected a trajectory: a .pvd collection, an .xdmf time series or a folder of "
                     f"numbered files (got a single {suffix or 'extensionless'} file, one step)")


def _check_increasing(times: Sequence[float], labels: Sequence[str], where: Path) -> None:
    t = np.asarray(times, dtype=np.float64)
    if not np.isfinite(t).all():
        i = int(np.flatnonzero(~np.isfinite(t))[0])
        raise ValueError(f"{where}: Expected finite times (got {t[i]} at {labels[i]})")
    bad = np.flatnonzero(np.diff(t) <= 0)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{where}: Expected times that increase from step to step (got t={t[i + 1]:g} at "
                         f"{labels[i + 1]} after t={t[i]:g} at {labels[i]})")


def _pvd_steps(path: Path) -> list[_Step]:
    """The ``<DataSet timestep=... file=...>`` entries of a ParaView collection, by time."""
    try:
        root = ET.fromstring(path.read_bytes())
    except ET.ParseError as err:
        raise ValueError(f"{path}: not a readable .pvd (XML: {err})") from None
    entries = root.findall("./Collection/DataSet")
    if root.get("type") != "Collection" or not entries:
        raise ValueError(f"{path}: Expected a VTKFile of type Collection with DataSet entries (got none)")
    steps = []
    for n, e in enumerate(entries):
        file, stamp = e.get("file"), e.get("timestep")
        if not file or stamp is None:
            raise ValueError(f"{path}: Expected 'file' and 'timestep' on every DataSet (entry {n + 1} lacks one)")
        if e.get("part", "0") != "0":
            raise ValueError(f"{path}: Expected one part per time step (entry {n + 1} is part {e.get('part')}); "
                             "write the pieces as one .pvtu per step")
        try:
            time = float(stamp)
        except ValueError:
            raise ValueError(f"{path}: Expected a number as timestep (got {stamp!r} for {file})") from None
        steps.append(_Step(time, path.parent / file))
    steps.sort(key=lambda s: s.time)  # stable: equal times stay in file order, and are refused below
    _check_increasing([s.time for s in steps], [s.file.name for s in steps], path)
    return steps


def _xdmf_steps(path: Path) -> list[_Step]:
    with _xdmf(path) as reader:  # the times from the XML alone: no step's data is read here
        stamps = [grid.find("Time") for grid in reader.collection]
    if any(s is None or s.get("Value") is None for s in stamps):
        raise ValueError(f"{path}: Expected a Time of every grid of the temporal collection (one has none)")
    try:
        times = [float(s.get("Value")) for s in stamps]  # type: ignore[union-attr, arg-type]
    except ValueError as err:
        raise ValueError(f"{path}: Expected numbers as times ({err})") from None
    _check_increasing(times, [f"step {k}" for k in range(len(times))], path)
    return [_Step(t, path, k) for k, t in enumerate(times)]


def _folder_steps(folder: Path) -> list[_Step]:
    """The numbered files of a folder (``u_0001.vtu``, ``case_100.vtk``), by their number: all of one
    series (one prefix and extension). A case folder stands for its ``VTK/`` folder (foamToVTK).
    The times are those of a ``.series`` file naming exactly these files, else the numbers."""
    numbered = _numbered(folder)
    if not numbered and (folder / "VTK").is_dir():
        folder, numbered = folder / "VTK", _numbered(folder / "VTK")
    if not numbered:
        raise ValueError(f"{folder}: Expected numbered mesh files in the folder (u_0001.vtu, case_100.vtk, ...) "
                         "(got none)")
    series = {(_NUMBERED.match(p.stem).group(1), p.suffix.lower()) for _, p in numbered}  # type: ignore[union-attr]
    if len(series) > 1:
        shown = sorted(f"{prefix}N{suffix}" for prefix, suffix in series)
        raise ValueError(f"{folder}: Expected the files of one series (got {listed(shown)}); give each series its "
                         "own folder")
    numbered.sort()
    numbers = [n for n, _ in numbered]
    if len(set(numbers)) != len(numbers):
        twice = [p.name for n, p in numbered if numbers.count(n) > 1]
        raise ValueError(f"{folder}: Expected one file per step number (got {listed(twice)})")
    files = [p for _, p in numbered]
    times = _series_times(folder, files) or [float(n) for n in numbers]
    _check_increasing(times, [p.name for p in files], folder)
    return [_Step(t, p) for t, p in zip(times, files)]


def _series_times(folder: Path, files: list[Path]) -> list[float] | None:
    """The times a ``.series`` file of the folder gives these files (ParaView's file series, which
    foamToVTK writes: ``{"files": [{"name": "case_100.vtm", "time": 0.5}, ...]}``), when one names
    exactly them; None otherwise (the numbers in the names are then the times)."""
    from meshshard.partition.files import read_json

    want = {p.name for p in files}
    for series in sorted(folder.glob("*.series")):
        try:
            if not series.is_file() or series.stat().st_size > 64 << 20:
                continue
            entries = read_json(series, max_bytes=64 << 20)["files"]  # strict: a deep nest is skipped, not a crash
            by_name = {str(e["name"]): float(e["time"]) for e in entries}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if set(by_name) == want and len(entries) == len(want):
            return [by_name[p.name] for p in files]
    return None


def _numbered(folder: Path) -> list[tuple[int, Path]]:
    """``(number, file)`` of the mesh files of a folder whose name ends in a number."""
    import meshio

    from ._vtk_io import VTK_SUFFIXES

    known = set(meshio.extension_to_filetypes) | set(VTK_SUFFIXES)
    out = []
    for p in folder.iterdir():
        match = _NUMBERED.match(p.stem)
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in known and match:
            out.append((int(match.group(2)), p))
    return out


def _meshio_call(path: Path, call: Callable[[], Any]) -> Any:
    """``call()`` with meshio's printing and exits turned into one-line errors naming ``path``."""
    chatter = io.StringIO()
    try:
        with warnings.catch_warnings(), redirect_stdout(chatter), redirect_stderr(chatter):
            warnings.simplefilter("ignore")
            return call()
    except ModuleNotFoundError as err:
        raise ValueError(f"{path}: reading it needs the {err.name} package (pip install {err.name})") from None
    except (Exception, SystemExit) as err:
        said = [line.strip() for line in chatter.getvalue().splitlines() if line.strip()]
        detail = said[0] if said else str(err).strip().split("\n")[0] or type(err).__name__
        raise ValueError(f"{path}: meshio cannot read it as a time series ({detail})") from None


class _xdmf:
    """meshio's ``TimeSeriesReader`` as a context, its errors one line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Any:
        import meshio

        self.reader = _meshio_call(self.path, lambda: meshio.xdmf.TimeSeriesReader(self.path))
        return self.reader

    def __exit__(self, *exc: object) -> None:
        self.reader.__exit__(*exc)


# ---------------------------------------------------------------------------------------------
# Node classes


def _field_classes(mesh: Any, name: str, path: Path) -> np.ndarray:
    """``(N,)`` int64 classes from the integer point field ``name``."""
    from ._dataset_build import _point_field

    if name not in mesh.point_data:
        raise ValueError(f"{path}: Expected the node-type field {name!r} in point_data (available: "
                         f"{', '.join(mesh.point_data) or 'none'})")
    values = _point_field(mesh, name, path)
    if values.shape[1] != 1:
        raise ValueError(f"{path}: Expected one component in the node-type field {name!r} (got {values.shape[1]})")
    v = values[:, 0].astype(np.float64)
    bad = ~np.isfinite(v) | (v < 0) | (v != np.round(v))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: Expected integers >= 0 in the node-type field {name!r} (got {v[i]} at node {i})")
    return v.astype(np.int64)


def _tag_classes(mesh: Any, registry: dict[str, int]) -> np.ndarray:
    """``(N,)`` int64 classes from the boundary sets (:func:`meshshard.data._surface.boundary_classes`)."""
    return boundary_classes(mesh, registry)


# ---------------------------------------------------------------------------------------------
# Writing


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
                digest: str) -> tuple[dict[str, Any], _Running]:
    from meshshard.partition import nodal_graph

    graph = nodal_graph(cells, len(pos))
    folder = tmp / "meshes" / f"{index:05d}"
    _save_npy(folder / "points.npy", pos)
    for cell_type, conn in cells:
        _save_npy(folder / f"cells-{cell_type}.npy", conn)
    entry = {"folder": f"meshes/{index:05d}", "num_nodes": len(pos), "pos_dim": pos.shape[1],
             "num_edges": graph.num_edges, "cells": {t: len(c) for t, c in cells}, "sha256": digest}
    return entry, _edge_moments(graph, pos)


def _write_states(file: Path, traj: Trajectory, stride: int, channels: Sequence[str], dtype: np.dtype,
                  train: bool, run_state: _Running, run_change: _Running) -> None:
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
        out[t] = _stored(state, dtype, channels, f"{where} (step {t})", traj.name)  # fits dtype, or refused
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
    """Write a trajectory dataset (see the module docstring) from ``trajectories``, one at a time.

    Args:
        names: Every trajectory's name, known up front: the split (by trajectory) is drawn from them.
        state_fields, input_fields: ``[{"name", "components"}]`` in channel order.
        time_stride: S, the steps from an input state to its target.
        node_type_source: What the classes came from, recorded (``None``: no classes, all 0).
        interior_classes: Classes (ids or names) that are not boundary (default: class 0).
        Others: as :func:`meshshard.data._dataset.write_samples`.
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
    edge_runs: list[_Running] = []
    uses: list[int] = []
    width = len(state_ch)
    runs = {"inputs": _Running(len(in_ch)), "state": _Running(width), "change": _Running(width)}
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
        _check_increasing(times.tolist(), [f"step {k}" for k in range(len(times))], Path(where))
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
        _save_npy(folder / "inputs.npy", _stored(inputs, dtype, in_ch, where, traj.name))
        _save_npy(folder / "node_type.npy", node_type.astype(np.int64))
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
    run_edges = _Running(meshes[0]["pos_dim"] + 1)
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


# ---------------------------------------------------------------------------------------------
# From files: meshshard dataset --state


def _step_mesh(step: _Step, series: tuple[Any, np.ndarray, list] | None) -> Any:
    """The mesh of one step: a file's, or of a time series (``series``: its open reader, points
    and cells) the shared points and cells with the step's point data."""
    if step.index < 0:
        from ._dataset_build import _read

        return _read(step.file)
    import meshio

    assert series is not None
    reader, points, cells = series
    _, point_data, _ = _meshio_call(step.file, lambda: reader.read_data(step.index))
    return meshio.Mesh(points, cells, point_data=point_data)


@contextmanager
def _series(path: Path, kind: str) -> Iterator[tuple[Any, np.ndarray, list] | None]:
    """An ``.xdmf`` time series open for reading, with its points and cells; None for other kinds."""
    if kind != "xdmf":
        yield None
        return
    with _xdmf(path) as reader:
        points, cells = _meshio_call(path, reader.read_points_cells)
        yield reader, np.asarray(points), list(cells)


def _label(step: _Step) -> str:
    return str(step.file) if step.index < 0 else f"{step.file} (step {step.index})"


def _read_trajectory(path: Path, name: str, kind: str, steps: list[_Step], state_names: list[str],
                     in_names: list[str], node_type: str | None, registry: dict[str, int] | None,
                     expect: dict[str, Any]) -> Trajectory:
    """The trajectory of one source: its first step read now (mesh, inputs, classes), the states of
    the others read as they are written, each step's mesh checked to be the first's."""
    from ._dataset_build import _merged_cells, _mesh_difference, _select

    with _series(path, kind) as series:
        first = _step_mesh(steps[0], series)
    pos = np.asarray(first.points, dtype=np.float64)
    cells = _merged_cells([(b.type, np.asarray(b.data)) for b in first.cells])
    for t, c in cells:
        if c.dtype == object or c.ndim != 2:
            raise ValueError(f"{_label(steps[0])}: cell type {t!r} with a varying node count is not supported")
    inputs, in_sources = _select(in_names, first, pos, Path(_label(steps[0])))
    state0, state_sources = _select(state_names, first, pos, Path(_label(steps[0])))
    for what, got in (("inputs", in_sources), ("state", state_sources)):
        if what in expect and expect[what][0] != got:
            raise ValueError(f"{_label(steps[0])}: Expected the {what} fields as in {expect[what][1]} "
                             f"({', '.join(map(str, expect[what][0]))}) (got {', '.join(map(str, got))})")
        expect.setdefault(what, (got, _label(steps[0])))
    if node_type is not None:
        classes = _field_classes(first, node_type, Path(_label(steps[0])))
    elif registry is not None:
        classes = _tag_classes(first, registry)
    else:
        classes = np.zeros(len(pos), dtype=np.int64)
    del first

    def states() -> Iterator[np.ndarray]:
        yield state0
        with _series(path, kind) as series:
            for step in steps[1:]:
                mesh = _step_mesh(step, series)
                if kind != "xdmf":
                    why = _mesh_difference(np.asarray(mesh.points, dtype=np.float64),
                                           _merged_cells([(b.type, np.asarray(b.data)) for b in mesh.cells]),
                                           pos, cells, Path(_label(steps[0])))
                    if why is not None:
                        raise ValueError(f"{_label(step)}: Expected every step of a trajectory on one mesh, "
                                         f"{_label(steps[0])}'s (got {why})")
                yield _select(state_names, mesh, pos, Path(_label(step)))[0]

    names = {i: n for n, i in (registry or {}).items()}
    return Trajectory(name, pos, cells, np.array([s.time for s in steps]), states(), inputs, classes,
                      source=str(path), class_names=names)


def build_trajectories(
    sources: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    state: str | Sequence[str],
    inputs: str | Sequence[str] | None = None,
    node_type: str | None = None,
    time_stride: int = 1,
    interior_classes: str | Sequence[int | str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    notes: Callable[[str], None] | None = None,
) -> Path:
    """``meshshard dataset SOURCES --state NAMES``: one trajectory per source (a ``.pvd``, an
    ``.xdmf`` time series, a folder of numbered files), see the module docstring.

    Every source's steps are listed and counted (one step, a stride as long as the trajectory,
    times that do not increase: one line) before anything is read; then each trajectory is read
    and written one step at a time. Nothing is left behind on error.

    Args:
        state: The dynamic fields (comma-separated, or a list of such strings).
        inputs: The static fields, read at each trajectory's first step.
        node_type: A point field of integer node classes (default: the files' boundary tags).
        interior_classes: Classes predicted and in the loss, ids or names (default ``0``).
        Others: as :func:`meshshard.partition.build_dataset`.
    """
    from ._dataset_build import _records, parse_field_names, sample_names

    state_names = parse_field_names(state, "--state")
    in_names = parse_field_names(inputs, "--inputs") if inputs else []
    both = [n for n in state_names if n in in_names]
    if both:
        raise ValueError(f"Expected --inputs apart from --state (got {listed(both)} in both)")
    if isinstance(interior_classes, str):
        interior_classes = parse_field_names(interior_classes, "--interior-classes")
    if int(time_stride) != time_stride or time_stride < 1:
        raise ValueError(f"Expected --time-stride >= 1 (got {time_stride})")
    check_dataset_output(out, force, sources)
    if not sources:
        raise ValueError("Expected at least one trajectory in SOURCES (got none)")
    listed_steps = [trajectory_steps(s) for s in sources]
    for src, (_, steps) in zip(sources, listed_steps):
        if len(steps) < 2:
            raise ValueError(f"{src}: Expected a trajectory of at least two steps (got {plural(len(steps), 'step')})")
        if len(steps) <= time_stride:
            raise ValueError(f"{src}: Expected more steps than --time-stride {time_stride} (got "
                             f"{plural(len(steps), 'step')}: no step has a target {time_stride} steps later)")
    paths = [_naming_path(Path(s)) for s in sources]
    names, renamed = sample_names(paths)
    if renamed and notes is not None:
        notes(f"{plural(len(renamed), 'trajectory', 'trajectories')} share a name with one in another folder, so "
              f"each is named after its folder too: {listed([names[i] for i in renamed])}")
    registry: dict[str, int] | None = None if node_type is not None else {}
    expect: dict[str, Any] = {}
    fields: dict[str, list[dict[str, Any]]] = {}

    tagged: dict[bool, str] = {}  # with boundary tags or without: the first source of each

    def trajectories() -> Iterator[Trajectory]:
        for src, name, (kind, steps) in zip(sources, names, listed_steps):
            traj = _read_trajectory(Path(src), name, kind, steps, state_names, in_names, node_type, registry, expect)
            if registry is not None:  # classes from the files' tags: all of them tagged, or none
                has = bool(np.any(traj.node_type))
                tagged.setdefault(has, str(src))
                if len(tagged) == 2:
                    raise ValueError(f"{src}: Expected boundary tags (patch files, gmsh physical groups, cell sets) "
                                     f"in every trajectory or in none, as node classes (got {tagged[True]} with tags, "
                                     f"{tagged[False]} without: a foamToVTK -legacy case has none); write every case "
                                     "the same way, or give --node-type FIELD")
            fields.setdefault("state", _records(state_names, expect["state"][0]))
            yield traj

    it = trajectories()
    head = next(it)  # the fields' component counts are known once the first trajectory is read

    def chained() -> Iterator[Trajectory]:
        yield head
        yield from it

    source = f"field {node_type!r}" if node_type is not None else ("boundary tags" if registry else None)
    written = write_trajectories(out, chained(), names, state_fields=fields["state"],
                                 input_fields=_records(in_names, expect["inputs"][0]), time_stride=time_stride,
                                 node_type_source=source, interior_classes=interior_classes,
                                 val_fraction=val_fraction, val_samples=val_samples, dtype=dtype, force=force,
                                 sources=sources, progress=progress)
    if registry is not None and not registry and notes is not None:
        notes("no node classes: the files carry no boundary tags and no --node-type was given, so every node is "
              "class 0 (interior)")
    return written


def _naming_path(path: Path) -> Path:
    """The path a trajectory is named after: a file's, a folder's (a foamToVTK ``VTK/`` folder's case)."""
    resolved = path.resolve()
    if path.is_dir() and resolved.name == "VTK":
        return resolved.parent
    return path


# ---------------------------------------------------------------------------------------------
# Reading


def is_trajectory_dataset(meta: Mapping[str, Any]) -> bool:
    """Whether a dataset's metadata is a trajectory dataset's (``"task": "transient"``)."""
    return meta.get("task") == TASK


class Trajectories:
    """A trajectory dataset opened for reading, one rank's rows at a time (memory maps).

    Attributes:
        dataset: The :class:`~meshshard.partition.Dataset` (meshes, split, normalisation).
        num_trajectories, names, time_stride, state_channels, input_channels.
        classes: ``node_types.classes``; ``class_ids`` ``(K,)`` int64 in one-hot order;
        boundary ``(K,)`` bool, per class.
    """

    def __init__(self, data: str | os.PathLike[str] | Dataset) -> None:
        self.dataset = data if isinstance(data, Dataset) else open_dataset(data)
        meta = self.dataset.meta
        if not is_trajectory_dataset(meta):
            raise ValueError(f"{self.dataset.path}: not a trajectory dataset (made without --state)")
        try:
            self.time_stride = int(meta["time_stride"])
            self.state_channels: list[str] = list(meta["state_channels"])
            self.classes: list[dict[str, Any]] = list(meta["node_types"]["classes"])
            self.class_ids = np.array([int(c["id"]) for c in self.classes], dtype=np.int64)
            self.boundary = np.array([bool(c["boundary"]) for c in self.classes], dtype=bool)
            steps = [int(s["num_steps"]) for s in meta["samples"]]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{self.dataset.path}: Expected the keys of a trajectory dataset (missing or malformed "
                             f"{err})") from None
        if self.time_stride < 1 or any(t <= self.time_stride for t in steps) or np.any(np.diff(self.class_ids) <= 0):
            raise ValueError(f"{self.dataset.path}: inconsistent trajectory metadata (stride, steps or classes)")
        self._steps = steps
        self.num_trajectories = len(steps)
        self.names = [str(s["name"]) for s in meta["samples"]]
        self.input_channels = self.dataset.input_channels

    def num_steps(self, k: int) -> int:
        """T, the steps of trajectory ``k``."""
        return self._steps[self.dataset._sample(k)]

    def num_pairs(self, k: int) -> int:
        """The (input, target) pairs of trajectory ``k``: steps ``t`` with ``t + S < T``."""
        return self.num_steps(k) - self.time_stride

    def times(self, k: int) -> np.ndarray:
        """``(T,)`` the times of trajectory ``k``'s steps."""
        return np.asarray(self.dataset.meta["samples"][self.dataset._sample(k)]["times"], dtype=np.float64)

    def _file(self, k: int, name: str) -> Path:
        return self.dataset.path / "samples" / f"{self.dataset._sample(k):05d}" / name

    def state_array(self, k: int) -> np.ndarray:
        """``(T, N, F_state)`` memory map of trajectory ``k``'s states (nothing read yet)."""
        n, f = self.dataset.num_nodes(k), len(self.state_channels)
        a = self._load(self._file(k, "state.npy"))
        if a.shape != (self.num_steps(k), n, f) or a.dtype.kind != "f":
            raise ValueError(f"{self._file(k, 'state.npy')}: Expected a float array of shape "
                             f"({self.num_steps(k)}, {n}, {f}) (got {a.dtype} {a.shape})")
        return a

    def _load(self, file: Path) -> np.ndarray:
        try:
            return self.dataset._load(file, "r")
        except FileNotFoundError:
            raise ValueError(f"{file}: missing (the dataset folder is incomplete)") from None
        except (ValueError, OSError) as err:
            raise ValueError(str(err) if str(err).startswith(str(file)) else f"{file}: not a readable .npy file "
                             f"({err})") from None

    def state(self, k: int, t: int, node_ids: np.ndarray) -> np.ndarray:
        """``(n, F_state)`` float64: the state of ``node_ids`` (global ids) at step ``t`` of trajectory ``k``."""
        if not 0 <= int(t) < self.num_steps(k):
            raise ValueError(f"Expected a step in [0, {self.num_steps(k)}) of trajectory {k} (got {t})")
        return np.asarray(self.state_array(k)[int(t)][np.asarray(node_ids, dtype=np.int64)], dtype=np.float64)

    def inputs(self, k: int, node_ids: np.ndarray) -> np.ndarray:
        """``(n, F_in)`` float64: the static inputs of ``node_ids`` in trajectory ``k``."""
        file, n = self._file(k, "inputs.npy"), self.dataset.num_nodes(k)
        a = self._load(file)
        if a.shape != (n, len(self.input_channels)) or a.dtype.kind != "f":
            raise ValueError(f"{file}: Expected a float array of shape ({n}, {len(self.input_channels)}) (got "
                             f"{a.dtype} {a.shape})")
        return np.asarray(a[np.asarray(node_ids, dtype=np.int64)], dtype=np.float64)

    def node_type(self, k: int, node_ids: np.ndarray) -> np.ndarray:
        """``(n,)`` int64: the class ids of ``node_ids`` in trajectory ``k``."""
        file, n = self._file(k, "node_type.npy"), self.dataset.num_nodes(k)
        a = self._load(file)
        if a.shape != (n,) or a.dtype.kind not in "iu":
            raise ValueError(f"{file}: Expected an integer array of shape ({n},) (got {a.dtype} {a.shape})")
        ids = np.asarray(a[np.asarray(node_ids, dtype=np.int64)], dtype=np.int64)
        if ids.size and not np.isin(ids, self.class_ids).all():
            raise ValueError(f"{file}: holds a class not in {METADATA_FILE}'s node_types (damaged or edited)")
        return ids

    def class_index(self, ids: np.ndarray) -> np.ndarray:
        """Class ids to their one-hot position (the index in :attr:`classes`)."""
        return np.searchsorted(self.class_ids, np.asarray(ids, dtype=np.int64))

    def __repr__(self) -> str:
        return (f"Trajectories({str(self.dataset.path)!r}, {self.num_trajectories} trajectories, stride "
                f"{self.time_stride}, state={self.state_channels}, classes={self.class_ids.tolist()})")


def open_trajectories(path: str | os.PathLike[str] | Dataset) -> Trajectories:
    """Open a trajectory dataset folder (reads ``dataset.json``; arrays are memory-mapped on use)."""
    return Trajectories(path)

