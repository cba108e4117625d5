"""``meshshard dataset`` and ``meshshard partition DATA``: mesh files to a dataset folder, and a
dataset folder to its partitions (format: :mod:`meshshard.data._dataset`).

Field names (``--inputs`` / ``--targets``): a ``point_data`` array by name (all its components:
``u`` of shape ``(N, 3)`` is the channels ``u[0..2]``), one component of it (``u[1]``), or the
name ``pos`` for the node coordinates (``pos[0]``... for one coordinate), unless ``point_data`` has
a field of that name. Only the named fields are read: every file must hold them, with the same
meaning and component count as the first file; other fields may differ from file to file.

Sample names (:func:`sample_names`): a file's name without extension (a ``.vtm`` of OpenFOAM's
foamToVTK: its case's, without the iteration); files of the same name in different folders are
named after their folder too (``a/case-0``, ``b/case-0``).
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import GraphRule, parse_graph_rule, sample_graph
from meshshard.partition.files import (
    check_destination,
    dumps_json,
    folder_lock,
    is_lock_file,
    read_regular,
    write_text_file,
)

from ._clouds import add_surface_fields, is_legacy_polydata, read_npz_cloud, triangulate
from ._dataset import (
    PARTITIONS_FILE,
    PARTITIONS_FORMAT,
    Sample,
    atomic_folder,
    channel_names,
    check_dataset_output,
    listed,
    open_dataset,
    plural,
    read_dataset_metadata,
    write_samples,
)
from ._expressions import check_expression, evaluate_expression, parse_target_scales
from ._foam import foam_folder, foam_sources, sample_stem
from ._mesh_ops import WALL_DISTANCE, cell_data_to_points, collapse_2d, one_cell_thick_note
from ._mesh_ops import wall_distance as nearest_wall_distance
from ._surface import boundary_classes, named_boundaries
from ._vtk_io import VTK_SUFFIXES, read_vtk

__all__ = ["list_sources", "sample_names", "build_dataset", "partition_dataset", "parse_field_names", "held_note",
           "read_parameters"]

_COMPONENT = re.compile(r"^(.+)\[(\d+)\]$")


def list_sources(sources: Sequence[str | os.PathLike[str]], notes: Callable[[str], None] | None = None) -> list[Path]:
    """The mesh files of ``sources``: files as given, folders expanded to their files with an
    extension meshio reads, or one of :data:`VTK_SUFFIXES` (sorted by name, hidden files skipped).
    Subfolders are not searched; ``notes`` is called once with what a folder held that was
    skipped (other files, subfolders).

    OpenFOAM's ``foamToVTK`` output (:mod:`meshshard.data._foam`): a case folder stands for
    its ``VTK/`` folder, and of a ``VTK/`` folder the last iteration's ``.vtm`` of each case is
    taken (a note says so when there are several), its other files and folders silently."""
    import meshio

    known = set(meshio.extension_to_filetypes) | set(VTK_SUFFIXES) | {".npz"}
    files: list[Path] = []
    other: list[Path] = []
    subfolders: list[Path] = []
    said: list[str] = []
    for src in sources:
        path = Path(src)
        if path.is_dir():
            path = foam_folder(path)
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
            take, own, foam_notes = foam_sources(entries)
            said += foam_notes
            entries = [p for p in entries if p not in own]
            mesh = [p.is_file() and p.suffix.lower() in known for p in entries]
            found = [p for p, m in zip(entries, mesh) if m]
            if not found:
                raise ValueError(f"{path}: Expected mesh files in the folder (got none with an extension "
                                 "meshio reads, such as .vtu, .vtk, .msh, .xdmf, or one of "
                                 f"{', '.join(VTK_SUFFIXES)})")
            files.extend(found)
            subfolders.extend(p for p, m in zip(entries, mesh) if not m and p.is_dir())
            other.extend(p for p, m in zip(entries, mesh) if not m and not p.is_dir())
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{path}: no such file or folder")
    if not files:
        raise ValueError("Expected at least one mesh file or folder in SOURCES (got none)")
    if notes is not None:
        for text in said:
            notes(text)
        if other or subfolders:
            notes(_skipped_note(other, subfolders))
    return files


def _skipped_note(other: list[Path], subfolders: list[Path]) -> str:
    """``skipped 2 files meshio does not read (a/notes.txt, a/README) and 1 subfolder (a/old): ...``."""
    parts = [f"{plural(len(found), what, whats)} ({listed([str(p) for p in found], limit=3)})"
             for found, what, whats in ((other, "file meshio does not read", "files meshio does not read"),
                                        (subfolders, "subfolder", "subfolders")) if found]
    return ("skipped " + " and ".join(parts)
            + ("; subfolders are not searched (name one in SOURCES to read its mesh files)" if subfolders else ""))


def _read(path: Path, notes: Callable[[str], None] | None = None) -> Any:
    """A mesh file as a ``meshio.Mesh``: by meshio, or by vtk for :data:`VTK_SUFFIXES`
    (``notes`` is told of a multiblock's blocks left out)."""
    if path.suffix.lower() == ".npz":
        return read_npz_cloud(path)
    if path.suffix.lower() in VTK_SUFFIXES or (path.suffix.lower() == ".vtk" and is_legacy_polydata(path)):
        try:
            return read_vtk(path, notes)
        except ValueError:
            raise
        except Exception as err:  # anything vtk or numpy raises on a strange file: one line
            text = str(err).strip()
            detail = text.splitlines()[0] if text else type(err).__name__
            raise ValueError(f"{path}: vtk cannot read it ({detail})") from None
    import meshio

    chatter = io.StringIO()  # meshio prints its errors, and may call sys.exit
    try:
        with warnings.catch_warnings(), redirect_stdout(chatter), redirect_stderr(chatter):
            warnings.simplefilter("ignore")
            return meshio.read(path)
    except (Exception, SystemExit) as err:
        from meshshard.partition import meshio_failure

        raise ValueError(f"{path}: {meshio_failure(err, chatter.getvalue())}") from None


def parse_field_names(text: str | Sequence[str], what: str) -> list[str]:
    """Field names from ``"T,u"``, or from a list of such strings (a repeated ``--inputs`` flag:
    the lists add up); each name once."""
    items = [text] if isinstance(text, str) else list(text)
    names = [t.strip() for item in items for t in str(item).split(",")]
    if not names or not all(names):
        raise ValueError(f"Expected {what} as comma-separated field names (got {','.join(map(str, items))!r})")
    twice = [n for n, k in Counter(names).items() if k > 1]
    if twice:
        raise ValueError(f"Expected each field once in {what} (got {', '.join(map(repr, twice))} more than once)")
    return names


def _patch_names(text: str | Sequence[str]) -> tuple[str, ...]:
    """Boundary names from ``"lowerWall,upperWall"`` or a list of such strings, each once."""
    items = [text] if isinstance(text, str) else list(text)
    names = [t.strip() for item in items for t in str(item).split(",")]
    if not names or not all(names):
        raise ValueError("Expected --wall-distance as comma-separated boundary names (got "
                         f"{','.join(map(str, items))!r})")
    return tuple(dict.fromkeys(names))


def sample_names(files: Sequence[Path]) -> tuple[list[str], list[int]]:
    """Each file's sample name, and the indices of the files named after their folder too.

    A sample is named after its file, without the extension (``case-0``). Files of the same name
    in different folders are named ``FOLDER/NAME`` after the folder that holds them (``a/case-0``,
    ``b/case-0``), with as many folders as it takes where those have the same name too
    (``x/a/case-0``, ``y/a/case-0``). The same file twice, or two files of one name in one folder
    (``case-0.vtu``, ``case-0.vtk``), is refused.

    A ``.vtm`` of foamToVTK is named after its case, without the iteration (``pitzDaily_285.vtm`` is
    ``pitzDaily``), unless that makes it one name with another file of its folder (two iterations
    of one case): those keep their iteration (``pitzDaily_100``, ``pitzDaily_285``).
    """
    resolved = [p.resolve() for p in files]
    stems = [sample_stem(p) for p in files]
    in_folder_count = Counter((r.parent, stem) for r, stem in zip(resolved, stems))
    stems = [stem if stem == p.stem or in_folder_count[(r.parent, stem)] == 1 else p.stem
             for p, r, stem in zip(files, resolved, stems)]
    groups: dict[str, list[int]] = {}
    for i, stem in enumerate(stems):
        groups.setdefault(stem, []).append(i)
    names, renamed = list(stems), []
    for stem, members in groups.items():
        if len(members) == 1:
            continue
        in_folder: dict[Path, int] = {}
        for i in members:
            j = in_folder.setdefault(resolved[i].parent, i)
            if j != i and resolved[j] == resolved[i]:
                raise ValueError(f"{files[i]}: Expected each file once in SOURCES (got it twice, also as {files[j]})")
            if j != i:
                raise ValueError(f"{files[i]}: Expected one file per sample name (got {files[j].name} and "
                                 f"{files[i].name} in one folder, both sample {stem!r})")
        parents = [resolved[i].parent.parts[1:] for i in members]  # no root: distinct folders differ within these
        for depth in range(1, max(len(p) for p in parents) + 1):
            tried = ["/".join((*p[-depth:], stem)) for p in parents]
            if len(set(tried)) == len(tried):
                break
        for i, name in zip(members, tried):
            names[i] = name
        renamed.extend(members)
    return names, sorted(renamed)


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


def _point_field(mesh: Any, name: str, path: Path) -> np.ndarray:
    """The ``point_data`` array ``name`` as ``(N, components)``, its length and dtype checked."""
    n = len(mesh.points)
    a = np.asarray(mesh.point_data[name])
    if a.ndim == 0 or a.shape[0] != n:
        raise ValueError(f"{path}: Expected point_data field {name!r} to have one value per node, {n} "
                         f"(got shape {a.shape})")
    if not np.issubdtype(a.dtype, np.number) and a.dtype != bool:
        raise ValueError(f"{path}: Expected a numeric point_data field {name!r} (got dtype {a.dtype})")
    return a.reshape(n, -1)


def _describe(point_data: dict[str, Any]) -> str:
    """``T, u (3 components)``: the ``point_data`` fields of a file."""
    out = []
    for k, v in point_data.items():
        shape = np.shape(v)
        width = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        out.append(k if width == 1 else f"{k} ({width} components)")
    return ", ".join(out)


@dataclass(frozen=True)
class _Source:
    """Where a named field's channels come from: the node coordinates (``coords``) or the
    ``point_data`` field ``base`` (the ``cell_data`` field ``base`` averaged onto the nodes, with
    ``cell``), all of it or its component ``comp``; ``components`` channels."""
    base: str
    comp: int | None
    coords: bool
    components: int
    cell: bool = False

    def __str__(self) -> str:
        what = ("the node coordinates" if self.coords else
                f"cell_data field {self.base!r} averaged onto the nodes" if self.cell else
                f"point_data field {self.base!r}")
        if self.comp is not None:
            return f"component {self.comp} of {what}"
        return what + ("" if self.components == 1 else f" ({self.components} components)")


@dataclass(frozen=True)
class _Reading:
    """What is done to every mesh as read (``--cell-data-to-points``, ``--collapse-2d``,
    ``--wall-distance``)."""
    cell_data_to_points: bool = False
    collapse_2d: bool = False
    wall_distance: tuple[str, ...] = ()
    node_types: tuple[str, ...] | None = None  # the boundary classes (--boundary-classes), after "interior"
    graph: GraphRule | None = None  # --graph (None: the cells' edges, or knn:8 for a sample without)


def _select(names: list[str], mesh: Any, pos: np.ndarray, path: Path,
            cell_to_points: bool = False) -> tuple[np.ndarray, list[_Source]]:
    """The channels of ``names`` from the mesh's ``point_data`` (or ``pos``; with
    ``cell_to_points``, a field only in ``cell_data`` averaged onto the nodes), and where each
    name's channels come from. Only the named fields are read and checked."""
    columns, sources = [np.zeros((len(pos), 0))], []  # no names (no targets): zero channels
    point_data = mesh.point_data
    cell_data = getattr(mesh, "cell_data", None) or {}
    for name in names:
        base, comp = name, None
        match = _COMPONENT.match(name)
        if name not in point_data and name != "pos" and match and not (cell_to_points and name in cell_data):
            base, comp = match.group(1), int(match.group(2))
        coords = base == "pos" and base not in point_data
        cell = False
        if coords:
            array = pos
        elif base in point_data:
            array = _point_field(mesh, base, path)
        elif cell_to_points and base in cell_data:
            array, cell = cell_data_to_points(mesh, base, path), True
        elif cell_to_points:
            raise ValueError(f"{path}: Expected field {name!r} in point_data or cell_data (available: "
                             f"{_describe(point_data) or 'none'}; cell_data: {_describe_cells(cell_data) or 'none'}; "
                             "and pos for the coordinates)")
        else:
            hint = (f"; {base!r} is there as cell data (a value per cell), and meshshard needs point fields: "
                    "interpolate it to the nodes first (ParaView: Cell Data to Point Data)"
                    if base in cell_data else "")
            raise ValueError(f"{path}: Expected field {name!r} in point_data (available: "
                             f"{_describe(point_data) or 'none'}; and pos for the coordinates){hint}")
        if comp is not None:
            if comp >= array.shape[1]:
                raise ValueError(f"{path}: Expected a component of {base!r} in 0..{array.shape[1] - 1} (got {name!r})")
            array = array[:, comp:comp + 1]
        columns.append(np.asarray(array, dtype=np.float64))
        sources.append(_Source(base, comp, coords, array.shape[1], cell))
    return np.concatenate(columns, axis=1), sources


def _describe_cells(cell_data: Mapping[str, Any]) -> str:
    """``k, U (3 components)``: the ``cell_data`` fields of a file (per block lists)."""
    return _describe({k: v[0] if isinstance(v, list | tuple) and len(v) else v for k, v in cell_data.items()})


def _records(names: list[str], sources: list[_Source]) -> list[dict[str, Any]]:
    """The field records ``[{"name", "components"}]`` the dataset stores."""
    return [{"name": n, "components": s.components} for n, s in zip(names, sources)]


def _check_channels(in_names: list[str], out_names: list[str], first: _Read,
                    notes: Callable[[str], None] | None) -> None:
    """Refuse a channel named twice within ``--inputs`` (``u`` and ``u[0]``) or ``--targets``; a
    channel that is both an input and a target is a note (deliberate for an autoencoder)."""
    per_name = {}
    for what, names, sources in (("--inputs", in_names, first.inputs), ("--targets", out_names, first.targets)):
        owner: dict[str, str] = {}
        for name, record in zip(names, _records(names, sources)):
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
    node_types: bool = False,
    graph: str | None = None,
    max_points: int | None = None,
    mean_field: bool = False,
    mean_field_from: str | os.PathLike[str] | None = None,
) -> Path:
    """``meshshard dataset``: one sample per mesh file (see the module docstring for names).

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
        mean_field: The training samples' node-wise mean of the targets as input channels
            ``<target>_mean``, and the model trained on the difference from it (``--mean-field``,
            :mod:`meshshard.data._mean_field`); every sample must be on one mesh.
        mean_field_from: The same input channels from another dataset made with ``--mean-field``
            (``--mean-field-from DATA``), on the same mesh: new cases for its runs to predict on.
        Others: as :func:`meshshard.data._dataset.write_samples`.
    """
    with folder_lock(out):  # one writer per folder (held already under meshshard dataset)
        in_names = parse_field_names(inputs, "--inputs")
        out_names = parse_field_names(targets, "--targets") if targets else []
        patches = _patch_names(wall_distance) if wall_distance else ()
        reading = _Reading(cell_data_to_points, collapse_2d, patches,
                           graph=parse_graph_rule(graph) if graph is not None else None)
        if max_points is not None and (isinstance(max_points, bool) or not isinstance(max_points, (int, np.integer))
                                       or max_points < 1):
            raise ValueError(f"Expected --max-points to be an integer >= 1 (got {max_points!r})")
        if not out_names and val_fraction is None and val_samples is None:
            val_fraction = 0.0  # cases to predict on: nothing to validate against
        check_dataset_output(out, force, sources)
        if mean_field and mean_field_from is not None:
            raise ValueError("Expected --mean-field or --mean-field-from, not both")
        given = None
        if mean_field_from is not None:
            from ._dataset import open_dataset
            from ._mean_field import mean_field_of

            given = mean_field_of(open_dataset(mean_field_from))
        files = list_sources(sources, notes)
        names, renamed = sample_names(files)
        if val_samples is not None:
            _check_val_names(val_samples, names, files, renamed)
        if renamed and notes is not None:
            notes(f"{plural(len(renamed), 'file')} share a name with a file in another folder, so each sample is "
                  f"named after its folder too: {listed([names[i] for i in renamed])}")
        table = read_parameters(params, names, notes) if params is not None else None
        if node_types:
            reading = replace(reading, node_types=_boundary_names(files[0], reading))
        first = _sample_from(files[0], names[0], in_names, out_names, reading=reading, notes=notes)
        _check_channels(in_names, out_names, first, notes)
        input_fields = _records(in_names, first.inputs)
        if patches:
            if WALL_DISTANCE in channel_names(input_fields):
                raise ValueError(f"Expected --inputs apart from {WALL_DISTANCE}, the channel --wall-distance adds (got "
                                 "it in both)")
            input_fields.append({"name": WALL_DISTANCE, "components": 1, "patches": list(patches)})
        if reading.node_types is not None:
            if NODE_TYPE in channel_names(input_fields) or NODE_TYPE in in_names:
                raise ValueError(f"Expected --inputs apart from {NODE_TYPE}, the field --boundary-classes adds "
                                 "(got it in both)")
            input_fields.append({"name": NODE_TYPE, "components": 1 + len(reading.node_types),
                                 "classes": ["interior", *reading.node_types]})
        scales = _target_scales(target_scale, table, params, out_names, names)
        if table is not None:
            clash = [p for p in table["names"] if p in channel_names(input_fields)]
            if clash:
                raise ValueError(f"{params}: Expected parameter names apart from the input fields (got {listed(clash)} "
                                 "in both)")
            first = _with_parameters(first, table, 0, scales, _records(out_names, first.targets))
        expect = (first, files[0])
        mesh0 = (first.sample.pos, _merged_cells(first.sample.cells)) if same_mesh else None

        def samples() -> Iterator[Sample]:
            nonlocal first
            yield first.sample
            first = None  # type: ignore[assignment]  # let the first sample's arrays go
            for i in range(1, len(files)):
                read = _sample_from(files[i], names[i], in_names, out_names, expect=expect, reading=reading)
                if table is not None:
                    read = _with_parameters(read, table, i, scales, _records(out_names, read.targets))
                if mesh0 is not None:
                    why = _mesh_difference(read.sample.pos, _merged_cells(read.sample.cells), *mesh0, files[0])
                    if why is not None:
                        raise ValueError(f"{files[i]}: Expected the mesh of {files[0]} in every sample, as "
                                         f"--same-mesh asks (got {why})")
                yield read.sample

        if table is not None:
            input_fields += [{"name": p, "components": 1, "parameter": True} for p in table["names"]]
        written = write_samples(out, samples(), names, input_fields=input_fields,
                                target_fields=_records(out_names, first.targets), val_fraction=val_fraction,
                                val_samples=val_samples, dtype=dtype, force=force, sources=sources, progress=progress,
                                parameters=table, target_scales=scales or None, collapsed_2d=collapse_2d,
                                max_points=max_points, mean_field=given if given is not None else mean_field)
        held = held_note(read_dataset_metadata(written))
        if held and notes is not None:
            notes(held)
        return written


def held_note(meta: Mapping[str, Any]) -> str | None:
    """The note on a dataset's channels held as constants (their spread is round-off), or None."""
    said = []
    for part in ("inputs", "targets"):
        stats = meta["normalisation"].get(part) or {}
        channels = meta.get(f"{part[:-1]}_channels") or []
        for i, flag in enumerate(stats.get("held") or []):
            if flag:
                name = channels[i] if i < len(channels) else f"{part} channel {i}"
                said.append(f"{name} (std {stats['std'][i]:.3g} about {stats['mean'][i]:.3g})")
    if not said:
        return None
    return (f"{listed(said)} {'is' if len(said) == 1 else 'are'} held as constant: the spread is round-off against "
            "the field's magnitude (as the w of a 2-D velocity), so it is not scaled up into noise the model would "
            "be asked to fit")


#: The largest parameter table read (a row per sample: a few dozen bytes each).
MAX_PARAMS_BYTES = 64 << 20


def read_parameters(path: str | os.PathLike[str], names: Sequence[str],
                    notes: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A CSV table of per-sample parameters: ``{"names": [...], "values": [[...] per sample of
    names]}``, in the order of ``names``.

    The first row names the columns: ``sample`` (the sample names, as ``meshshard dataset`` gives
    them: file names without extension), then one column per parameter, every value a finite
    number. Every sample needs exactly one row; rows of other samples are a note. Bad input is a
    one-line ``ValueError`` naming the file, the row and the column.
    """
    import csv

    label = Path(path)
    text = read_regular(path, max_bytes=MAX_PARAMS_BYTES).decode("utf-8-sig", errors="replace")
    rows = [r for r in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in r)]
    if not rows:
        raise ValueError(f"{label}: Expected a CSV table with a header row (got an empty file)")
    header = [cell.strip() for cell in rows[0]]
    if "sample" not in header:
        raise ValueError(f"{label}: Expected a 'sample' column of sample names (got columns {', '.join(header)})")
    key = header.index("sample")
    columns = [i for i in range(len(header)) if i != key]
    if not columns or any(not header[i] for i in columns) or len(set(header)) != len(header):
        raise ValueError(f"{label}: Expected named parameter columns besides 'sample', each once (got "
                         f"{', '.join(header)})")
    table: dict[str, list[float]] = {}
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{label}: row {n}: Expected {len(header)} values (got {len(row)})")
        name = row[key].strip()
        if name in table:
            raise ValueError(f"{label}: row {n}: sample {name!r} has a row already")
        values = []
        for i in columns:
            try:
                value = float(row[i])
            except ValueError:
                raise ValueError(f"{label}: row {n}, column {header[i]}: Expected a number (got {row[i]!r})") from None
            if not np.isfinite(value):
                raise ValueError(f"{label}: row {n}, column {header[i]}: Expected a finite number (got {row[i]!r})")
            values.append(value)
        table[name] = values
    missing = [s for s in names if s not in table]
    if missing:
        raise ValueError(f"{label}: Expected a row for every sample (no row for {listed(missing)}; the samples are "
                         "named after their files, without extension)")
    extra = [s for s in table if s not in set(names)]
    if extra and notes is not None:
        notes(f"{label}: {plural(len(extra), 'row')} of samples not in this dataset, left out: {listed(extra)}")
    return {"names": [header[i] for i in columns], "values": [table[s] for s in names]}


def _target_scales(given: str | Mapping[str, str] | None, table: Mapping[str, Any] | None,
                   params: Any, out_names: list[str], names: Sequence[str]) -> dict[str, str]:
    """The checked ``--target-scale`` expressions, by target field; each is a finite, non-zero
    number for every sample (one line naming the sample otherwise)."""
    if not given:
        return {}
    scales = parse_target_scales(given) if isinstance(given, str) else {str(k): str(v) for k, v in given.items()}
    if table is None:
        raise ValueError("Expected --params with --target-scale (its expressions are of the parameters)")
    fields = [n.split("[")[0] for n in out_names]
    unknown = [f for f in scales if f not in fields]
    if unknown:
        raise ValueError(f"Expected --target-scale to name target fields ({', '.join(fields) or 'none'}) (got "
                         f"{listed(unknown)})")
    for field, expression in scales.items():
        check_expression(expression, table["names"])
        for i, row in enumerate(table["values"]):
            try:
                factor = evaluate_expression(expression, dict(zip(table["names"], row)))
            except ValueError as err:
                raise ValueError(f"{params}: sample {names[i]}: {err}") from None
            if factor == 0:
                raise ValueError(f"{params}: sample {names[i]}: Expected --target-scale {field}={expression} to be "
                                 "non-zero (got 0), since the targets are divided by it")
    return scales


def _with_parameters(read: _Read, table: Mapping[str, Any], i: int, scales: Mapping[str, str] | None = None,
                     target_fields: Sequence[Mapping[str, Any]] = ()) -> _Read:
    """``read`` with sample ``i``'s parameters appended to its inputs, one column each, the same
    value at every node, and its targets divided by their ``scales`` (non-dimensional)."""
    sample = read.sample
    values = np.asarray(table["values"][i], dtype=np.float64)
    columns = np.broadcast_to(values, (len(sample.inputs), len(values)))
    inputs = np.concatenate([np.asarray(sample.inputs, dtype=np.float64), columns], axis=1)
    targets = sample.targets
    if scales:
        named = dict(zip(table["names"], table["values"][i]))
        factors: list[float] = []
        for f in target_fields:
            expression = scales.get(str(f["name"]))
            factors += [evaluate_expression(expression, named) if expression else 1.0] * int(f["components"])
        targets = np.asarray(targets, dtype=np.float64) / np.asarray(factors)
    return _Read(replace(sample, inputs=inputs, targets=targets), read.inputs, read.targets)


@dataclass(frozen=True, eq=False)
class _Read:
    sample: Sample
    inputs: list[_Source]
    targets: list[_Source]


def _sample_from(path: Path, name: str, in_names: list[str], out_names: list[str],
                 expect: tuple[_Read, Path] | None = None, reading: _Reading = _Reading(),
                 notes: Callable[[str], None] | None = None) -> _Read:
    """Read one mesh file into a :class:`Sample`; with ``expect`` (the first file's), each named
    field must come from the same place with the same component count as there. ``reading``
    says what is done to the mesh as read; ``notes`` (given for the first file) hears of a
    multiblock's blocks left out, and of a mesh one cell thick that could be collapsed."""
    mesh = _read(path, notes)
    if reading.collapse_2d:
        mesh = collapse_2d(mesh, path)
    elif notes is not None:
        thick = one_cell_thick_note(mesh, path)
        if thick is not None:
            notes(thick)
    add_surface_fields(mesh, [*in_names, *out_names], path)
    pos = np.asarray(mesh.points, dtype=np.float64)
    x, x_sources = _select(in_names, mesh, pos, path, reading.cell_data_to_points)
    y, y_sources = _select(out_names, mesh, pos, path, reading.cell_data_to_points)
    if reading.wall_distance:
        x = np.concatenate([x, nearest_wall_distance(mesh, reading.wall_distance, path)], axis=1)
    if reading.node_types is not None:
        x = np.concatenate([x, _one_hot_classes(mesh, reading.node_types, path)], axis=1)
    if expect is not None:
        for field, got, want in zip([*in_names, *out_names], [*x_sources, *y_sources],
                                    [*expect[0].inputs, *expect[0].targets]):
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


#: The input field ``--boundary-classes`` adds: one-hot classes from the named boundaries.
NODE_TYPE = "node_type"


def _boundary_names(path: Path, reading: _Reading) -> tuple[str, ...]:
    """The named boundaries of the first file, as read (collapsed, if asked), for ``--boundary-classes``."""
    mesh = _read(path)
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


def _merged_cells(cells: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """The cells as the dataset stores them: one int64 block per type, in order of first appearance."""
    merged: dict[str, list[np.ndarray]] = {}
    for cell_type, conn in cells:
        merged.setdefault(str(cell_type), []).append(np.asarray(conn))
    return [(t, np.concatenate(c) if len(c) > 1 else c[0]) for t, c in merged.items()]


def _mesh_difference(pos: np.ndarray, cells: list[tuple[str, np.ndarray]], pos0: np.ndarray,
                     cells0: list[tuple[str, np.ndarray]], first: Path) -> str | None:
    """How a mesh differs from the first file's, in words; None when it is the same (exactly, as
    the dataset's mesh checksum compares)."""
    if pos.shape != pos0.shape:
        if len(pos) != len(pos0):
            return f"{plural(len(pos), 'node')}; {first} has {len(pos0):,}"
        return f"{pos.shape[1]}-D points; {first} has {pos0.shape[1]}-D"
    if not np.array_equal(pos, pos0):
        if not (np.isfinite(pos).all() and np.isfinite(pos0).all()):
            return "NaN or inf coordinates"
        gap = np.abs(pos - pos0).max(axis=1)
        node = int(gap.argmax())
        return (f"the same number of nodes at other coordinates: up to {gap[node]:.3g} apart, at node {node}, "
                f"{int((gap > 0).sum()):,} of {len(pos):,} nodes moved")
    types, types0 = [t for t, _ in cells], [t for t, _ in cells0]
    if types != types0:
        return (f"the same nodes, different connectivity: cell types {', '.join(types) or 'none'}; "
                f"{first} has {', '.join(types0)}")
    for (t, c), (_, c0) in zip(cells, cells0):
        if c.shape != c0.shape:
            return f"the same nodes, different connectivity: {plural(len(c), t + ' cell')}; {first} has {len(c0):,}"
        rows = np.flatnonzero((c != c0).any(axis=1))
        if len(rows):
            return (f"the same nodes, different connectivity: {t} cell {int(rows[0])} is {c[rows[0]].tolist()}; "
                    f"{first} has {c0[rows[0]].tolist()}; {len(rows):,} of {plural(len(c), 'cell')} differ)")
    return None


def partition_dataset(
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    num_parts: int,
    *,
    method: str = "metis",
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    tries: int | None = None,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    radius: float | None = None,
) -> Path:
    """``meshshard partition DATA``: partition the one mesh of a dataset (PARTS is a partition
    folder), or every distinct mesh (PARTS holds one partition folder per mesh, see the format
    docstring). Each partition records the mesh's checksum as its ``input.sha256``.

    ``method`` ``"metis"`` partitions each mesh's graph (a point cloud's kNN graph), ``"rcb"`` and
    ``"morton"`` its points. ``radius`` (``--radius``): the geometric halo radius the partition is
    made for, recorded as ``"halo_radius"`` in every partition (and ``partitions.json``) with each
    part's exact ghost count at that radius, ``"radius_ghosts"``; a model with a larger ball
    radius is then refused (:func:`meshshard.partition._points.check_radius`)."""
    with folder_lock(out):  # one writer per folder (held already under meshshard partition)
        from meshshard.partition import (
            Steps,
            check_halo_radius,
            check_num_parts,
            record_halo_radius,
            run_pipeline,
            write_partitions,
        )

        dataset = open_dataset(data)
        out = Path(out)
        radius = check_halo_radius(radius)
        _check_parts_output(out, force)
        if num_parts < 1:
            raise ValueError(f"Expected --parts >= 1 (got {num_parts})")
        if tries is not None and tries < 1:
            raise ValueError(f"Expected --tries >= 1 (got {tries})")
        for entry in dataset.meta["meshes"]:
            check_num_parts(num_parts, entry["num_nodes"])

        def one(m: int, folder: Path) -> None:
            mesh = dataset.mesh(m)
            graph = mesh.graph()
            rule = dataset.meta["meshes"][m].get("graph") or {}
            source = {"kind": "dataset", "name": f"{dataset.path.name}/meshes/{m:05d}", "sha256": mesh.sha256}
            attrs = {"graph": rule.get("rule") or graph.kind, "input": source, "parameters": {}}
            metadata, partitions = run_pipeline(graph, num_parts, Steps(), method=method, halo_hops=halo_hops,
                                        imbalance=imbalance, seed=seed, tries=tries, attrs=attrs)
            owner = np.zeros(mesh.num_nodes, dtype=np.int64)

            def tapped() -> Iterator[Any]:  # each part's owned ids noted as it streams past
                for part in partitions:
                    owner[part.owned_ids] = part.rank
                    yield part

            write_partitions(metadata, tapped(), folder)
            if radius is not None:
                record_halo_radius(folder, mesh.points, owner, radius)
            if progress is not None:
                progress(1)

        with atomic_folder(out) as tmp:
            if dataset.kind == "one-mesh":
                one(0, tmp)
            else:
                meshes = []
                for m, entry in enumerate(dataset.meta["meshes"]):
                    one(m, tmp / f"mesh-{m:05d}")
                    meshes.append({"mesh": m, "folder": f"mesh-{m:05d}", "num_nodes": entry["num_nodes"],
                                   "sha256": entry["sha256"]})
                meta = {"format": PARTITIONS_FORMAT, "format_version": 1, "num_parts": num_parts,
                        "dataset": dataset.path.name, "num_meshes": len(meshes), "meshes": meshes}
                if radius is not None:
                    meta["halo_radius"] = radius
                write_text_file(tmp / PARTITIONS_FILE, dumps_json(meta, indent=2) + "\n")
        return out


def _check_parts_output(out: Path, force: bool) -> None:
    """As for a partition folder; with ``force`` a folder of a dataset's partitions may be replaced
    too, when it holds only ``partitions.json`` and ``mesh-NNNNN`` partition folders."""
    check_destination(out, force=force, is_ours=_check_is_partitions)


def _check_is_partitions(out: Path) -> None:
    """Raise unless ``out`` holds a dataset's partitions (``partitions.json`` and ``mesh-NNNNN``
    partition folders, each only a partition) or one partition, and nothing else."""
    from meshshard.partition import PARTITION_METADATA_FILE, check_is_partition

    if not (out / PARTITIONS_FILE).is_file():
        check_is_partition(out)
        return
    for child in out.iterdir():
        ours = child.name == PARTITIONS_FILE or is_lock_file(child) or (
            re.fullmatch(r"mesh-\d{5}", child.name) and child.is_dir() and not child.is_symlink()
            and (child / PARTITION_METADATA_FILE).is_file())
        if not ours:
            raise ValueError(f"{out}: holds {child.name}, which meshshard did not write; "
                             "refusing to replace it, even with --force")
        if child.is_dir():
            check_is_partition(child)  # a mesh's partition and nothing else in it
