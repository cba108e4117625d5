"""OpenFOAM's ``foamToVTK`` layout, as ``meshshard dataset`` finds samples in it.

``foamToVTK`` run in a case folder ``CASE`` writes, for every time it converts (named by its
iteration, or time index)::

    CASE/VTK/
    ├── CASE_285.vtm                 the multiblock: the internal mesh and the boundary patches
    ├── CASE_285/
    │   ├── internal.vtu             the cells with their fields (cell data, and point data)
    │   ├── boundary.vtm             the patches alone
    │   └── boundary/<patch>.vtp     one file per patch
    └── CASE.vtm.series              the times of the iterations

A ``CASE_<iteration>.vtm`` beside its ``CASE_<iteration>/`` folder is one sample named ``CASE``
(:func:`sample_stem`). Given the case folder, its ``VTK/`` folder, or an iteration's folder, the
sources are the last iteration's ``.vtm`` of each case (:func:`foam_sources`); the other
iterations, their folders and the ``.series`` file are foamToVTK's own and taken silently.
"""

from __future__ import annotations

import re
from pathlib import Path

from meshshard.partition import plural

__all__ = ["foam_iteration", "sample_stem", "foam_folder", "foam_sources"]

_ITERATION = re.compile(r"^(.+)_(\d+)$")


def foam_iteration(path: Path) -> tuple[str, int] | None:
    """``(CASE, iteration)`` of a ``.vtm`` that foamToVTK wrote (``CASE_<iteration>.vtm`` beside
    its ``CASE_<iteration>/`` folder); None for any other file."""
    if path.suffix.lower() != ".vtm":
        return None
    match = _ITERATION.match(path.stem)
    if match is None or not (path.parent / path.stem).is_dir():
        return None
    return match.group(1), int(match.group(2))


def sample_stem(path: Path) -> str:
    """A file's sample name before collisions are settled: its name without extension, and for
    a foamToVTK ``.vtm`` without the iteration too (``pitzDaily_285.vtm`` is ``pitzDaily``)."""
    found = foam_iteration(path)
    return found[0] if found is not None else path.stem


def foam_folder(path: Path) -> Path:
    """Where a source folder's foamToVTK output is: the folder itself, or for a case folder (no
    ``.vtm`` of its own, a ``VTK/`` folder of foamToVTK output) its ``VTK/``; an iteration's folder
    (``VTK/CASE_285/`` with ``internal.vtu``) is its ``.vtm`` file."""
    vtm = path.parent / f"{path.name}.vtm"
    if (path / "internal.vtu").is_file() and foam_iteration(vtm) is not None and vtm.is_file():
        return vtm
    vtk = path / "VTK"
    if vtk.is_dir() and not any(_is_foam_vtm(p) for p in path.iterdir()) and any(_is_foam_vtm(p)
                                                                                  for p in vtk.iterdir()):
        return vtk
    return path


def _is_foam_vtm(path: Path) -> bool:
    return path.is_file() and foam_iteration(path) is not None


def foam_sources(entries: list[Path]) -> tuple[list[Path], set[Path], list[str]]:
    """Of a folder's entries: the foamToVTK ``.vtm`` to take (the last iteration of each case),
    the entries that are foamToVTK's own and taken silently (the other iterations, every
    iteration's folder, ``CASE.vtm.series``), and a note for each case with several iterations."""
    cases: dict[str, list[tuple[int, Path]]] = {}
    for p in entries:
        found = foam_iteration(p) if p.is_file() else None
        if found is not None:
            cases.setdefault(found[0], []).append((found[1], p))
    take, own, said = [], set(), []
    for case, runs in cases.items():
        runs.sort()
        take.append(runs[-1][1])
        own.update(p for _, p in runs[:-1])
        own.update(p.parent / p.stem for _, p in runs)
        own.update(p for p in entries if p.name == f"{case}.vtm.series")
        if len(runs) > 1:
            said.append(f"{runs[-1][1].parent}: {plural(len(runs), 'iteration')} of {case} "
                        f"({runs[0][0]} to {runs[-1][0]}); taking the last, {runs[-1][1].name} "
                        "(name a .vtm in SOURCES to take another)")
    return sorted(take), own, said
