"""Where the samples of ``meshshard dataset`` come from: the mesh files of SOURCES
(:func:`list_sources`), their sample names (:func:`sample_names`), reading one file
(:func:`read_mesh`: meshio, vtk, a point cloud's ``.npz``), and how a mesh differs from another
(:func:`mesh_difference`). Shared by the steady samples (:mod:`meshshard.data._dataset_build`) and
the trajectories (:mod:`meshshard.data._trajectory_build`).

Sample names (:func:`sample_names`): a file's name without extension (a ``.vtm`` of OpenFOAM's
foamToVTK: its case's, without the iteration); files of the same name in different folders are
named after their folder too (``a/case-0``, ``b/case-0``).
"""

from __future__ import annotations

import io
import os
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural

from ._clouds import is_legacy_polydata, read_npz_cloud
from ._foam import foam_folder, foam_sources, sample_stem
from ._vtk_io import VTK_SUFFIXES, read_vtk

__all__ = ["list_sources", "sample_names", "read_mesh", "merged_cells", "mesh_difference"]


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


def read_mesh(path: Path, notes: Callable[[str], None] | None = None) -> Any:
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


def merged_cells(cells: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """The cells as the dataset stores them: one int64 block per type, in order of first appearance."""
    merged: dict[str, list[np.ndarray]] = {}
    for cell_type, conn in cells:
        merged.setdefault(str(cell_type), []).append(np.asarray(conn))
    return [(t, np.concatenate(c) if len(c) > 1 else c[0]) for t, c in merged.items()]


def mesh_difference(pos: np.ndarray, cells: list[tuple[str, np.ndarray]], pos0: np.ndarray,
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
