"""``meshshard dataset SOURCES --state NAMES``: trajectory sources to a trajectory dataset (format:
:mod:`meshshard.data._trajectories`): each source's steps (:mod:`meshshard.data._trajectory_steps`)
read one at a time, its node classes from a field or the files' boundary tags, and written by
:func:`meshshard.data._trajectory_writer.write_trajectories`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural

from ._fields import field_records, parse_field_names, point_field, select_fields
from ._folder_guard import check_dataset_output
from ._sources import merged_cells, mesh_difference, sample_names
from ._surface import boundary_classes
from ._trajectory_steps import Step, open_series, step_label, step_mesh, trajectory_steps
from ._trajectory_writer import Trajectory, write_trajectories

__all__ = ["build_trajectories"]


def _field_classes(mesh: Any, name: str, path: Path) -> np.ndarray:
    """``(N,)`` int64 classes from the integer point field ``name``."""
    if name not in mesh.point_data:
        raise ValueError(f"{path}: Expected the node-type field {name!r} in point_data (available: "
                         f"{', '.join(mesh.point_data) or 'none'})")
    values = point_field(mesh, name, path)
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


def _read_trajectory(path: Path, name: str, kind: str, steps: list[Step], state_names: list[str],
                     in_names: list[str], node_type: str | None, registry: dict[str, int] | None,
                     expect: dict[str, Any]) -> Trajectory:
    """The trajectory of one source: its first step read now (mesh, inputs, classes), the states of
    the others read as they are written, each step's mesh checked to be the first's."""
    with open_series(path, kind) as series:
        first = step_mesh(steps[0], series)
    pos = np.asarray(first.points, dtype=np.float64)
    cells = merged_cells([(b.type, np.asarray(b.data)) for b in first.cells])
    for t, c in cells:
        if c.dtype == object or c.ndim != 2:
            raise ValueError(f"{step_label(steps[0])}: cell type {t!r} with a varying node count is not supported")
    inputs, in_sources = select_fields(in_names, first, pos, Path(step_label(steps[0])))
    state0, state_sources = select_fields(state_names, first, pos, Path(step_label(steps[0])))
    for what, got in (("inputs", in_sources), ("state", state_sources)):
        if what in expect and expect[what][0] != got:
            raise ValueError(f"{step_label(steps[0])}: Expected the {what} fields as in {expect[what][1]} "
                             f"({', '.join(map(str, expect[what][0]))}) (got {', '.join(map(str, got))})")
        expect.setdefault(what, (got, step_label(steps[0])))
    if node_type is not None:
        classes = _field_classes(first, node_type, Path(step_label(steps[0])))
    elif registry is not None:
        classes = _tag_classes(first, registry)
    else:
        classes = np.zeros(len(pos), dtype=np.int64)
    del first

    def states() -> Iterator[np.ndarray]:
        yield state0
        with open_series(path, kind) as series:
            for step in steps[1:]:
                mesh = step_mesh(step, series)
                if kind != "xdmf":
                    why = mesh_difference(np.asarray(mesh.points, dtype=np.float64),
                                           merged_cells([(b.type, np.asarray(b.data)) for b in mesh.cells]),
                                           pos, cells, Path(step_label(steps[0])))
                    if why is not None:
                        raise ValueError(f"{step_label(step)}: Expected every step of a trajectory on one mesh, "
                                         f"{step_label(steps[0])}'s (got {why})")
                yield select_fields(state_names, mesh, pos, Path(step_label(step)))[0]

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
    ``.xdmf`` time series, a folder of numbered files), in the format of :mod:`meshshard.data._trajectories`.

    Every source's steps are listed and counted (one step, a stride as long as the trajectory,
    times that do not increase: one line) before anything is read; then each trajectory is read
    and written one step at a time. Nothing is left behind on error.

    Args:
        state: The dynamic fields (comma-separated, or a list of such strings).
        inputs: The static fields, read at each trajectory's first step.
        node_type: A point field of integer node classes (default: the files' boundary tags).
        interior_classes: Classes predicted and in the loss, ids or names (default ``0``).
        Others: as :func:`meshshard.data.build_dataset`.
    """
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
            fields.setdefault("state", field_records(state_names, expect["state"][0]))
            yield traj

    it = trajectories()
    head = next(it)  # the fields' component counts are known once the first trajectory is read

    def chained() -> Iterator[Trajectory]:
        yield head
        yield from it

    source = f"field {node_type!r}" if node_type is not None else ("boundary tags" if registry else None)
    written = write_trajectories(out, chained(), names, state_fields=fields["state"],
                                 input_fields=field_records(in_names, expect["inputs"][0]), time_stride=time_stride,
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
