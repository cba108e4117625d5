"""``meshshard dataset``: mesh files to a dataset folder (format: :mod:`meshshard.data._dataset`).

The steps: the files of SOURCES and their sample names (:mod:`meshshard.data._sources`); the
fields each name reads (:mod:`meshshard.data._fields`); per-sample parameters and target scales
(:mod:`meshshard.data._parameters`); then each file read, checked against the first and written
one at a time (:func:`meshshard.data._writer.write_samples`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import GraphRule, listed, parse_graph_rule, plural, sample_graph
from meshshard.partition.files import folder_lock

from ._clouds import add_surface_fields, triangulate
from ._dataset import channel_names, read_dataset_metadata
from ._fields import FieldSource, field_records, parse_field_names, select_fields
from ._folder_guard import check_dataset_output
from ._mesh_ops import WALL_DISTANCE, collapse_2d, one_cell_thick_note
from ._mirror import MirrorRequest, mirror_mesh, mirror_plan, parse_mirror
from ._morph import along_columns, parse_along_peak, parse_map_along, peak_column
from ._parameters import read_parameters, target_scales, with_parameters
from ._prior import PriorRequest, check_prior_request, parse_prior, prior_cases_of
from ._reader import open_dataset
from ._sources import list_sources, merged_cells, mesh_difference, read_mesh, sample_names
from ._split import split_samples
from ._statistics import held_note
from ._surface import boundary_classes, named_boundaries, patch_names
from ._wall_geometry import SIGNED_DISTANCE, WALL_NORMAL, WALL_OFFSET, signed_distance, wall_normal
from ._wall_geometry import wall_distance as nearest_wall_distance
from ._writer import Sample, write_samples

__all__ = ["build_dataset"]

#: The input field ``--boundary-classes`` adds: one-hot classes from the named boundaries.
NODE_TYPE = "node_type"


@dataclass(frozen=True)
class _Reading:
    """What is done to every mesh as read (``--cell-data-to-points``, ``--collapse-2d``,
    ``--wall-distance``, ``--wall-normal``, ``--signed-distance``)."""
    cell_data_to_points: bool = False
    collapse_2d: bool = False
    wall_distance: tuple[str, ...] = ()
    wall_normal: tuple[str, ...] = ()
    signed_distance: tuple[str, ...] = ()
    node_types: tuple[str, ...] | None = None  # the boundary classes (--boundary-classes), after "interior"
    graph: GraphRule | None = None  # --graph (None: the cells' edges, or knn:8 for a sample without)


@dataclass(frozen=True, eq=False)
class _Read:
    """A sample as read, and where its input and target fields' channels came from."""
    sample: Sample
    inputs: list[FieldSource]
    targets: list[FieldSource]


def build_dataset(
    sources: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    inputs: str | Sequence[str],
    targets: str | Sequence[str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    same_mesh: bool = False,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    notes: Callable[[str], None] | None = None,
    params: str | os.PathLike[str] | None = None,
    target_scale: str | Mapping[str, str] | None = None,
    cell_data_to_points: bool = False,
    collapse_2d: bool = False,
    wall_distance: str | Sequence[str] | None = None,
    wall_normal: str | Sequence[str] | None = None,
    signed_distance: str | Sequence[str] | None = None,
    node_types: bool = False,
    graph: str | None = None,
    max_points: int | None = None,
    mean_field: bool | str | None = False,
    mean_field_from: str | os.PathLike[str] | None = None,
    shape_params: str | Sequence[str] | None = None,
    map_along: str | None = None,
    position_prior_inputs: bool = False,
    prior_progress: Callable[[int], None] | None = None,
    mirror: str | None = None,
    mirror_params: str | Sequence[str] | None = None,
    mirror_in_prior: bool = False,
) -> Path:
    """``meshshard dataset``: one sample per mesh file (field names: :mod:`meshshard.data._fields`; sample
    names: :func:`meshshard.data._sources.sample_names`).

    Without ``targets`` the dataset holds inputs only (zero target channels, no validation split
    unless asked): new cases for ``meshshard predict``, which ``meshshard train`` refuses.

    Cheap checks (the output folder, the sources and sample names, the field names on the first
    file) come before any sample is written; files are then read and written one at a time, each
    checked before it is written, and nothing is left behind on error.

    Args:
        inputs, targets: Field names, comma-separated, or a list of such strings (added up).
        same_mesh: Refuse, naming the file and how its mesh differs, any file whose mesh is not
            exactly the first file's (``--same-mesh``): the dataset is then surely one-mesh.
        notes: Called with each note for the user (files and subfolders of a source folder that
            were skipped, samples named after their folders, a field that is both an input and a
            target).
        params: A CSV table of per-sample parameters (``--params``: a ``sample`` column of sample
            names, then one numeric column per parameter), as design-of-experiments tools write
            it (:func:`read_parameters`). Each parameter becomes an input channel, the same at
            every node of its sample (the model's global conditioning), marked ``"parameter":
            true`` among the input fields; the table is recorded in ``dataset.json``.
        target_scale: Non-dimensional targets (``--target-scale``): ``"p=0.5*speed**2,U=speed"``
            or a dict, each target field divided by an expression of the parameters (numbers,
            parameter names, ``+ - * / **``); predictions are multiplied back when written.
        cell_data_to_points: A named field found only in a file's ``cell_data`` is averaged onto
            the nodes (the mean over the cells that use each node); without it, such a field is
            refused, saying so (``--cell-data-to-points``).
        collapse_2d: Every mesh is one cell thick in z (OpenFOAM's 2-D cases) and becomes the
            2-D mesh of its lower plane (:func:`meshshard.data._mesh_ops.collapse_2d`); a
            mesh of another shape is refused. Recorded as ``"collapsed_2d": true``
            (``--collapse-2d``). Without it, a first mesh of that shape is a note.
        wall_distance: Named boundaries (patches of a foamToVTK ``.vtm``), comma-separated or a
            list: an input channel ``wall_distance`` after the named inputs, at every node the
            distance to the nearest node of those boundaries; its field record lists them as
            ``"patches"`` (``--wall-distance``).
        wall_normal: Named boundaries, as ``wall_distance``: input fields ``wall_offset`` (at every
            node ``x - x_wall``, to the nearest node of the wall) and ``wall_normal`` (the wall's
            unit normal there, into the fluid), ``D`` channels each (``--wall-normal``;
            :mod:`meshshard.data._wall_geometry`).
        signed_distance: Named boundaries that close around bodies: an input channel
            ``signed_distance``, the distance to the nearest wall node, negative inside a body
            (``--signed-distance``); a wall that does not close is refused in one line.
        node_types: The named boundaries of the files (a ``.vtm``'s patches, node sets, gmsh
            physical groups) as one-hot input channels ``node_type[k]`` after the other inputs:
            class 0 ``interior`` (on no boundary), then one per boundary of the first file, in its
            order (a node on two takes the first); the field's record lists them as ``"classes"``
            (``--boundary-classes``). Every file must name the same boundaries.
        graph: How a sample's graph is made (``--graph``): ``"mesh"`` (its cells' edges),
            ``"knn:K"`` or ``"radius:R"`` (from its points, :mod:`meshshard.partition._points`);
            default: the cells' edges, and ``knn:8`` for a sample without cells that join points.
            Point samples (``.npz`` with ``pos``, ``.vtu`` of vertex cells, ``.vtp``, ``.ply``, ``.stl``
            surfaces) may differ in size; a surface's ``normal`` and ``area`` are input fields.
        max_points: Training's points per sample and epoch (``--max-points``), recorded: training
            of a point model draws about this many at random (``train --max-points`` overrides it).
        mean_field: A prior as input channels ``<target>_mean``, and the model trained on the
            difference from it (``--mean-field [mean|knn:K]``): ``True`` or ``"mean"``, the
            training samples' mean of the targets (:mod:`meshshard.data._mean_field`), or
            ``"knn:K"``, the inverse-distance-weighted mean of the K nearest in parameter space;
            on many meshes each training case is mapped onto the sample's mesh, and a training
            sample's prior leaves out the cases on its own mesh (:mod:`meshshard.data._prior`).
        shape_params: With ``--mean-field`` on many meshes: the parameters that make a shape; a
            training sample's prior leaves out every case of its own shape
            (:mod:`meshshard.data._prior`).
        map_along: With ``--mean-field`` on many 2-D meshes of a family of bodies: the named
            boundaries (one closed wall) along which the training cases are mapped onto each
            sample's mesh, body to body (:mod:`meshshard.data._morph`).
        position_prior_inputs: With ``map_along``: the prior mapped by position too, as more input
            channels ``<target>_mean_by_position`` (the offset stays the one along the wall).
        mean_field_from: The same input channels from another dataset made with ``--mean-field``
            (``--mean-field-from DATA``), made of its training cases with its method, mapped onto
            these cases' meshes: new cases for its runs to predict on.
        prior_progress: Called with 1 after each sample's prior is written.
        mirror, mirror_params: Each training sample's mirror added as a training sample
            (``--mirror AXIS[:VECTORS]``, ``--mirror-params NAMES``): the coordinate AXIS
            negated, and the component along it of each named vector field, and the named
            parameters negated (:mod:`meshshard.data._mirror`).
        mirror_in_prior: The mirrors are cases of the prior too (``--mirror-in-prior``; by
            default a prior is made of the solved cases alone).
        Others: as :func:`meshshard.data._writer.write_samples`.
    """
    with folder_lock(out):  # one writer per folder (held already under meshshard dataset)
        in_names = parse_field_names(inputs, "--inputs")
        out_names = parse_field_names(targets, "--targets") if targets else []
        reading = replace(_reading_of(cell_data_to_points, collapse_2d, wall_distance, graph, max_points),
                          wall_normal=patch_names(wall_normal, "--wall-normal") if wall_normal else (),
                          signed_distance=(patch_names(signed_distance, "--signed-distance") if signed_distance
                                           else ()))
        if not out_names and val_fraction is None and val_samples is None:
            val_fraction = 0.0  # cases to predict on: nothing to validate against
        check_dataset_output(out, force, sources)
        given = _given_mean_field(mean_field, mean_field_from)
        walls, along_fields = _map_along(map_along, mean_field, given)
        if position_prior_inputs and not walls:
            raise ValueError("Expected --map-along with --position-prior-inputs (they are the prior mapped by position "
                             "beside the one mapped along the wall)")
        files, names = _files_and_names(sources, val_samples, notes)
        table = read_parameters(params, names, notes) if params is not None else None
        if node_types:
            reading = replace(reading, node_types=_boundary_names(files[0], reading))
        first = _sample_from(files[0], names[0], in_names, out_names, reading=reading, notes=notes)
        _check_channels(in_names, out_names, first, notes)
        input_fields = _input_fields(in_names, first, reading)
        target_fields = field_records(out_names, first.targets)
        if walls:
            along_columns(target_fields, along_fields)  # a field that is no target: refused before any is written
            peak_column(target_fields, parse_along_peak(map_along))
        scales = target_scales(target_scale, table, params, out_names, names)
        if table is not None:
            _check_parameter_names(table, input_fields, params)
            first = _Read(with_parameters(first.sample, table, 0, scales, target_fields), first.inputs, first.targets)
            input_fields += [{"name": p, "components": 1, "parameter": True} for p in table["names"]]
        check_prior_request(mean_field, given, dtype, target_fields, table)
        shape = _shape_params(shape_params, mean_field, table)
        request = parse_mirror(mirror, mirror_params, table, mirror_in_prior)
        mirrors = _Mirrors.plan(request, files, names, in_names + out_names, reading, table, val_fraction,
                                val_samples, notes)
        if mirrors is not None:
            names, table, val_fraction, val_samples = mirrors.names, mirrors.table, None, mirrors.val
            scales = target_scales(target_scale, table, params, out_names, names)
        samples = _samples(first, files, names, in_names, out_names, reading, table, scales, same_mesh, mirrors)
        del first  # the generator holds the first sample until it is written, then lets it go
        written = write_samples(out, samples, names, input_fields=input_fields, target_fields=target_fields,
                                val_fraction=val_fraction, val_samples=val_samples, dtype=dtype, force=force,
                                sources=sources, progress=progress, parameters=table,
                                target_scales=scales or None, collapsed_2d=collapse_2d, max_points=max_points,
                                mean_field=(given if given is not None else
                                            PriorRequest(mean_field, shape, walls, along_fields,
                                                         position_prior_inputs, parse_along_peak(map_along))
                                            if shape or walls else mean_field),
                                prior_progress=prior_progress,
                                mirror=mirrors.record() if mirrors is not None else None)
        held = held_note(read_dataset_metadata(written))
        if held and notes is not None:
            notes(held)
        return written


def _reading_of(cell_data_to_points: bool, collapse_2d: bool, wall_distance: str | Sequence[str] | None,
                graph: str | None, max_points: int | None) -> _Reading:
    """What is done to every mesh as read, from :func:`build_dataset`'s arguments (checked)."""
    patches = patch_names(wall_distance, "--wall-distance") if wall_distance else ()
    reading = _Reading(cell_data_to_points, collapse_2d, patches,
                       graph=parse_graph_rule(graph) if graph is not None else None)
    if max_points is not None and (isinstance(max_points, bool) or not isinstance(max_points, (int, np.integer))
                                   or max_points < 1):
        raise ValueError(f"Expected --max-points to be an integer >= 1 (got {max_points!r})")
    return reading


def _map_along(map_along: str | None, mean_field: Any, given: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--map-along PATCHES[:FIELDS]``, checked: boundary names (and target fields), only with
    ``--mean-field`` (with ``--mean-field-from`` the prior is mapped as the training dataset's was)."""
    walls, fields = parse_map_along(map_along)
    if walls and given is not None:
        raise ValueError("Expected --map-along with --mean-field, not --mean-field-from (the prior is then made as "
                         "the training dataset made its own, along the walls it names)")
    if walls and mean_field in (None, False):
        raise ValueError("Expected --mean-field with --map-along (it says how the training cases are mapped onto "
                         "each sample's mesh)")
    return walls, fields


def _shape_params(shape_params: str | Sequence[str] | None, mean_field: Any,
                  table: Mapping[str, Any] | None) -> tuple[str, ...]:
    """``--shape-params`` checked: names of ``--params`` columns, and only with ``--mean-field``."""
    if not shape_params:
        return ()
    names = tuple(n.strip() for n in (shape_params.split(",") if isinstance(shape_params, str) else shape_params)
                  if n.strip())
    if mean_field in (None, False):
        raise ValueError("Expected --mean-field with --shape-params (it says which cases a training sample's prior "
                         "leaves out)")
    known = [str(n) for n in (table or {}).get("names", [])]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"Expected --shape-params among the --params columns {', '.join(known) or '(none given)'} "
                         f"(got {', '.join(unknown)})")
    return names


def _given_mean_field(mean_field: bool | str | None, mean_field_from: str | os.PathLike[str] | None) -> Any:
    """Another dataset's training cases for the prior (``--mean-field-from``), or None; a bad
    ``--mean-field`` method is refused here, before any file is read."""
    if mean_field not in (None, False) and mean_field_from is not None:
        raise ValueError("Expected --mean-field or --mean-field-from, not both")
    if mean_field not in (None, False):
        parse_prior(mean_field)
    if mean_field_from is None:
        return None
    return prior_cases_of(open_dataset(mean_field_from))


def _files_and_names(sources: Sequence[str | os.PathLike[str]], val_samples: Sequence[int | str] | None,
                     notes: Callable[[str], None] | None) -> tuple[list[Path], list[str]]:
    """The mesh files of ``sources`` and their sample names (a note on those named after their folders)."""
    files = list_sources(sources, notes)
    names, renamed = sample_names(files)
    if val_samples is not None:
        _check_val_names(val_samples, names, files, renamed)
    if renamed and notes is not None:
        notes(f"{plural(len(renamed), 'file')} share a name with a file in another folder, so each sample is "
              f"named after its folder too: {listed([names[i] for i in renamed])}")
    return files, names


def _input_fields(in_names: list[str], first: _Read, reading: _Reading) -> list[dict[str, Any]]:
    """The input field records: the named fields as the first file holds them, then the channels
    ``--wall-distance``, ``--wall-normal``, ``--signed-distance`` and ``--boundary-classes`` add."""
    input_fields = field_records(in_names, first.inputs)
    dim = first.sample.pos.shape[1]
    for flag, patches, added in (("--wall-distance", reading.wall_distance, [(WALL_DISTANCE, 1)]),
                                 ("--wall-normal", reading.wall_normal, [(WALL_OFFSET, dim), (WALL_NORMAL, dim)]),
                                 ("--signed-distance", reading.signed_distance, [(SIGNED_DISTANCE, 1)])):
        for name, width in added if patches else []:
            if name in channel_names(input_fields) or name in in_names:
                raise ValueError(f"Expected --inputs apart from {name}, the channel{'s' if width > 1 else ''} "
                                 f"{flag} adds (got it in both)")
            input_fields.append({"name": name, "components": width, "patches": list(patches)})
    if reading.node_types is not None:
        if NODE_TYPE in channel_names(input_fields) or NODE_TYPE in in_names:
            raise ValueError(f"Expected --inputs apart from {NODE_TYPE}, the field --boundary-classes adds "
                             "(got it in both)")
        input_fields.append({"name": NODE_TYPE, "components": 1 + len(reading.node_types),
                             "classes": ["interior", *reading.node_types]})
    return input_fields


def _check_parameter_names(table: Mapping[str, Any], input_fields: list[dict[str, Any]],
                           params: str | os.PathLike[str] | None) -> None:
    clash = [p for p in table["names"] if p in channel_names(input_fields)]
    if clash:
        raise ValueError(f"{params}: Expected parameter names apart from the input fields (got {listed(clash)} "
                         "in both)")


@dataclass(frozen=True)
class _Mirrors:
    """``--mirror``: the request, the training files mirrored (indices into the files), and the
    sample names, parameter table and validation split with the mirrors appended."""
    request: MirrorRequest
    originals: list[int]
    names: list[str]
    table: Mapping[str, Any] | None
    val: list[int]

    @classmethod
    def plan(cls, request: MirrorRequest | None, files: list[Path], names: list[str], fields: list[str],
           reading: _Reading, table: Mapping[str, Any] | None, val_fraction: float | None,
           val_samples: Sequence[int | str] | None, notes: Callable[[str], None] | None) -> _Mirrors | None:
        if request is None:
            return None
        mesh = read_mesh(files[0])  # the first file mirrored: its fields and cells checked before any is written
        mirror_mesh(collapse_2d(mesh, files[0]) if reading.collapse_2d else mesh, request, fields, files[0])
        train, val = split_samples(names, val_fraction, val_samples)
        picked, mirrored, rows = mirror_plan(request, names, train, table, notes)
        if table is not None:
            table = {"names": list(table["names"]), "values": [*table["values"], *rows]}
        return cls(request, picked, [*names, *mirrored], table, val)

    def record(self) -> dict[str, Any]:
        return {**self.request.record(),
                "samples": dict(zip(self.names[len(self.names) - len(self.originals):],
                                    [self.names[i] for i in self.originals]))}


def _samples(first: _Read, files: list[Path], names: list[str], in_names: list[str], out_names: list[str],
             reading: _Reading, table: Mapping[str, Any] | None, scales: Mapping[str, str],
             same_mesh: bool, mirrors: _Mirrors | None = None) -> Iterator[Sample]:
    """The samples in file order: the first as read already, then each file read as it is written
    (its fields from where the first file's came from), with its parameters; with ``same_mesh``,
    each checked to be on the first file's mesh. With ``mirrors``, then the mirrored training
    files, in file order (sample ``len(files) + j`` the mirror of file ``mirrors.originals[j]``)."""
    expect = ([*first.inputs, *first.targets], files[0])
    mesh0 = (first.sample.pos, merged_cells(first.sample.cells)) if same_mesh else None
    yield first.sample
    del first  # let the first sample's arrays go
    order = [(i, None) for i in range(1, len(files))]
    order += [(i, mirrors.request) for i in mirrors.originals] if mirrors is not None else []
    for k, (i, mirror) in enumerate(order, start=1):
        read = _sample_from(files[i], names[k], in_names, out_names, expect=expect, reading=reading,
                            mirror=mirror)
        sample = read.sample
        if table is not None:
            sample = with_parameters(sample, table, k, scales, field_records(out_names, read.targets))
        if mesh0 is not None and mirror is None:  # a mirror is on the mirror of its original's mesh
            why = mesh_difference(sample.pos, merged_cells(sample.cells), *mesh0, files[0])
            if why is not None:
                raise ValueError(f"{files[i]}: Expected the mesh of {files[0]} in every sample, as "
                                 f"--same-mesh asks (got {why})")
        yield sample


def _check_val_names(val_samples: Sequence[int | str], names: list[str], files: Sequence[Path],
                     renamed: list[int]) -> None:
    """Refuse a ``--val-samples`` name that is the file name of several samples (named after their
    folders too): it would pick none of them, or a sample by index."""
    if not renamed:
        return
    known = set(names)
    for item in val_samples:
        text = str(item).strip()
        if isinstance(item, str) and text not in known:
            matches = [names[i] for i in renamed if names[i].rsplit("/", 1)[-1] == text]
            if matches:
                raise ValueError(f"Expected --val-samples to name one sample (got {text!r}, the file name of "
                                 f"{len(matches)} samples: {listed(matches)}; name one of them)")


def _check_channels(in_names: list[str], out_names: list[str], first: _Read,
                    notes: Callable[[str], None] | None) -> None:
    """Refuse a channel named twice within ``--inputs`` (``u`` and ``u[0]``) or ``--targets``; a
    channel that is both an input and a target is a note (deliberate for an autoencoder)."""
    per_name = {}
    for what, names, sources in (("--inputs", in_names, first.inputs), ("--targets", out_names, first.targets)):
        owner: dict[str, str] = {}
        for name, record in zip(names, field_records(names, sources)):
            for ch in channel_names([record]):
                if ch in owner:
                    raise ValueError(f"Expected each channel once in {what} (got {ch} from both "
                                     f"{owner[ch]!r} and {name!r})")
                owner[ch] = name
        per_name[what] = owner
    both = list(dict.fromkeys(name for ch, name in per_name["--targets"].items() if ch in per_name["--inputs"]))
    if both and notes is not None:
        notes(f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} both input and target (the model is given "
              "what it predicts: deliberate for an autoencoder, a mistake otherwise)")


def _sample_from(path: Path, name: str, in_names: list[str], out_names: list[str],
                 expect: tuple[Sequence[FieldSource], Path] | None = None, reading: _Reading = _Reading(),
                 notes: Callable[[str], None] | None = None, mirror: MirrorRequest | None = None) -> _Read:
    """Read one mesh file into a :class:`Sample`; with ``expect`` (the first file's), each named
    field must come from the same place with the same component count as there. ``reading``
    says what is done to the mesh as read; ``notes`` (given for the first file) hears of a
    multiblock's blocks left out, and of a mesh one cell thick that could be collapsed. With
    ``mirror``, the mesh is mirrored as read (collapsed first), before any field is taken from it."""
    mesh = read_mesh(path, notes)
    if reading.collapse_2d:
        mesh = collapse_2d(mesh, path)
    elif notes is not None:
        thick = one_cell_thick_note(mesh, path)
        if thick is not None:
            notes(thick)
    if mirror is not None:
        mesh = mirror_mesh(mesh, mirror, [*in_names, *out_names], path)
    add_surface_fields(mesh, [*in_names, *out_names], path)
    pos = np.asarray(mesh.points, dtype=np.float64)
    x, x_sources = select_fields(in_names, mesh, pos, path, reading.cell_data_to_points)
    y, y_sources = select_fields(out_names, mesh, pos, path, reading.cell_data_to_points)
    if reading.wall_distance:
        x = np.concatenate([x, nearest_wall_distance(mesh, reading.wall_distance, path)], axis=1)
    if reading.wall_normal:
        x = np.concatenate([x, wall_normal(mesh, reading.wall_normal, path)], axis=1)
    if reading.signed_distance:
        x = np.concatenate([x, signed_distance(mesh, reading.signed_distance, path)], axis=1)
    if reading.node_types is not None:
        x = np.concatenate([x, _one_hot_classes(mesh, reading.node_types, path)], axis=1)
    if expect is not None:
        for field, got, want in zip([*in_names, *out_names], [*x_sources, *y_sources], expect[0]):
            if got != want:
                raise ValueError(f"{path}: Expected {field!r} to be {want}, as in {expect[1]} (got {got})")
    cells = [(b.type, np.asarray(b.data)) for b in mesh.cells]
    for t, c in cells:
        if c.dtype == object or c.ndim != 2:
            raise ValueError(f"{path}: cell type {t!r} with a varying node count is not supported")
    cells = triangulate(cells)
    edge_index, graph = sample_graph(pos, cells, reading.graph, path)
    return _Read(Sample(name, pos, x, y, cells=cells, source=str(path), boundaries=named_boundaries(mesh),
                        edge_index=edge_index, graph=graph), x_sources, y_sources)


def _boundary_names(path: Path, reading: _Reading) -> tuple[str, ...]:
    """The named boundaries of the first file, as read (collapsed, if asked), for ``--boundary-classes``."""
    mesh = read_mesh(path)
    if reading.collapse_2d:
        mesh = collapse_2d(mesh, path)
    names = tuple(named_boundaries(mesh))
    if not names:
        raise ValueError(f"{path}: Expected named boundaries for --boundary-classes (got none: a .vtm's patches, a "
                         "file's node sets or gmsh physical groups name them)")
    return names


def _one_hot_classes(mesh: Any, classes: tuple[str, ...], path: Path) -> np.ndarray:
    """``(N, 1 + len(classes))`` one-hot node classes: 0 interior, then the boundaries in order
    (a node on two takes the first)."""
    sets = named_boundaries(mesh)
    if tuple(sets) != classes:
        raise ValueError(f"{path}: Expected the named boundaries of the first file for --boundary-classes, "
                         f"{listed(list(classes))} (got {listed(list(sets)) if sets else 'none'})")
    ids = boundary_classes(mesh, {name: k + 1 for k, name in enumerate(classes)})
    return np.eye(1 + len(classes))[ids]
