"""Where a trajectory's steps come from (:func:`trajectory_steps`): a ``.pvd`` collection (steps
ordered by their ``timestep``), an ``.xdmf`` time series (meshio's ``TimeSeriesReader``; its order
and times), or a folder of numbered files (``u_0001.vtu``, foamToVTK's ``case_100.vtm``; a case
folder stands for its ``VTK/``) ordered by the number, timed by a ``.series`` file naming exactly
them, else by the number. Times must increase. :func:`step_mesh` reads one step's mesh.
"""

from __future__ import annotations

import io
import os
import re
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed

from ._trajectories import check_increasing

__all__ = ["Step", "trajectory_steps", "step_mesh", "open_series", "step_label"]

_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_MAX_PVD_BYTES = 64 << 20  # a collection's XML: a line per step


@dataclass(frozen=True)
class Step:
    """One step of a trajectory: its time and how to read it (``file`` for a mesh file; ``index``
    into an ``.xdmf`` time series)."""
    time: float
    file: Path
    index: int = -1


def trajectory_steps(source: str | os.PathLike[str]) -> tuple[str, list[Step]]:
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


def _pvd_steps(path: Path) -> list[Step]:
    """The ``<DataSet timestep=... file=...>`` entries of a ParaView collection, by time; each file
    checked as a file given on the command line, and inside the collection's folder
    (:func:`~meshshard.data._vtk_checks.check_reference`)."""
    from meshshard.partition.files import read_regular

    from ._vtk_checks import check_reference

    try:
        root = ET.fromstring(read_regular(path, max_bytes=_MAX_PVD_BYTES))
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
        steps.append(Step(time, check_reference(path, file)))
    steps.sort(key=lambda s: s.time)  # stable: equal times stay in file order, and are refused below
    check_increasing([s.time for s in steps], [s.file.name for s in steps], path)
    return steps


def _xdmf_steps(path: Path) -> list[Step]:
    with _xdmf(path) as reader:  # the times from the XML alone: no step's data is read here
        stamps = [grid.find("Time") for grid in reader.collection]
    if any(s is None or s.get("Value") is None for s in stamps):
        raise ValueError(f"{path}: Expected a Time of every grid of the temporal collection (one has none)")
    try:
        times = [float(s.get("Value")) for s in stamps]  # type: ignore[union-attr, arg-type]
    except ValueError as err:
        raise ValueError(f"{path}: Expected numbers as times ({err})") from None
    check_increasing(times, [f"step {k}" for k in range(len(times))], path)
    return [Step(t, path, k) for k, t in enumerate(times)]


def _folder_steps(folder: Path) -> list[Step]:
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
    check_increasing(times, [p.name for p in files], folder)
    return [Step(t, p) for t, p in zip(times, files)]


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


def step_mesh(step: Step, series: tuple[Any, np.ndarray, list] | None) -> Any:
    """The mesh of one step: a file's, or of a time series (``series``: its open reader, points
    and cells) the shared points and cells with the step's point data."""
    if step.index < 0:
        from ._sources import read_mesh

        return read_mesh(step.file)
    import meshio

    assert series is not None
    reader, points, cells = series
    _, point_data, _ = _meshio_call(step.file, lambda: reader.read_data(step.index))
    return meshio.Mesh(points, cells, point_data=point_data)


@contextmanager
def open_series(path: Path, kind: str) -> Iterator[tuple[Any, np.ndarray, list] | None]:
    """An ``.xdmf`` time series open for reading, with its points and cells; None for other kinds."""
    if kind != "xdmf":
        yield None
        return
    with _xdmf(path) as reader:
        points, cells = _meshio_call(path, reader.read_points_cells)
        yield reader, np.asarray(points), list(cells)


def step_label(step: Step) -> str:
    return str(step.file) if step.index < 0 else f"{step.file} (step {step.index})"
