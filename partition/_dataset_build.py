"""``meshshard dataset`` and ``meshshard partition DATA``: mesh files to a dataset folder, and a
dataset folder to its partitions (format: :mod:`meshshard.partition._dataset`).

Field names (``--inputs`` / ``--targets``): a ``point_data`` array by name (all its components:
``u`` of shape ``(N, 3)`` is the channels ``u[0..2]``), one component of it (``u[1]``), or the
name ``pos`` for the node coordinates (``pos[0]``... for one coordinate), unless ``point_data`` has
a field of that name.
"""

from __future__ import annotations

import io
import json
import os
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition._dataset import (PARTITIONS_FILE, PARTITIONS_FORMAT, Sample, atomic_folder,
                                          check_dataset_output, open_dataset, write_samples)

__all__ = ["list_sources", "build_dataset", "partition_dataset", "parse_field_names"]

_COMPONENT = re.compile(r"^(.+)\[(\d+)\]$")


def list_sources(sources: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The mesh files of ``sources``: files as given, folders expanded to their files with an
    extension meshio reads (sorted by name, hidden files skipped)."""
    import meshio

    known = set(meshio.extension_to_filetypes)
    files: list[Path] = []
    for src in sources:
        path = Path(src)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                           and p.suffix.lower() in known)
            if not found:
                raise ValueError(f"{path}: Expected mesh files in the folder (got none with an extension "
                                 "meshio reads, such as .vtu, .vtk, .msh, .xdmf)")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{path}: no such file or folder")
    if not files:
        raise ValueError("Expected at least one mesh file or folder in SOURCES (got none)")
    return files


def _read(path: Path) -> Any:
    import meshio

    chatter = io.StringIO()  # meshio prints its errors, and may call sys.exit
    try:
        with warnings.catch_warnings(), redirect_stdout(chatter), redirect_stderr(chatter):
            warnings.simplefilter("ignore")
            return meshio.read(path)
    except (Exception, SystemExit) as err:
        said = [line.strip() for line in chatter.getvalue().splitlines() if line.strip()]
        detail = said[0] if said else str(err).strip().split("\n")[0] or type(err).__name__
        raise ValueError(f"{path}: meshio cannot read it ({detail})") from None


def parse_field_names(text: str | Sequence[str], what: str) -> list[str]:
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    if not names or not all(names):
        raise ValueError(f"Expected {what} as comma-separated field names (got {text!r})")
    return names


def _point_fields(mesh: Any, path: Path) -> dict[str, np.ndarray]:
    """The ``point_data`` arrays as ``(N, components)``, lengths checked."""
    n = len(mesh.points)
    fields = {}
    for name, array in mesh.point_data.items():
        a = np.asarray(array)
        if a.ndim == 0 or a.shape[0] != n:
            raise ValueError(f"{path}: Expected point_data field {name!r} to have one value per node, {n} "
                             f"(got shape {a.shape})")
        if not np.issubdtype(a.dtype, np.number) and a.dtype != bool:
            raise ValueError(f"{path}: Expected a numeric point_data field {name!r} (got dtype {a.dtype})")
        fields[name] = a.reshape(n, -1)
    return fields


def _describe(fields: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k}" if v.shape[1] == 1 else f"{k} ({v.shape[1]} components)" for k, v in fields.items())


def _select(names: list[str], fields: dict[str, np.ndarray], pos: np.ndarray, path: Path) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The channels of ``names`` from ``fields`` (or ``pos``), and their field records."""
    columns, records = [np.zeros((len(pos), 0))], []  # no names (no targets): zero channels
    for name in names:
        base, comp = name, None
        match = _COMPONENT.match(name)
        if name not in fields and name != "pos" and match:
            base, comp = match.group(1), int(match.group(2))
        if base == "pos" and base not in fields:
            array = pos
        elif base in fields:
            array = fields[base]
        else:
            raise ValueError(f"{path}: Expected field {name!r} in point_data (available: "
                             f"{_describe(fields) or 'none'}; and pos for the coordinates)")
        if comp is not None:
            if comp >= array.shape[1]:
                raise ValueError(f"{path}: Expected a component of {base!r} in 0..{array.shape[1] - 1} (got {name!r})")
            array = array[:, comp:comp + 1]
        columns.append(np.asarray(array, dtype=np.float64))
        records.append({"name": name, "components": array.shape[1]})
    return np.concatenate(columns, axis=1), records


def build_dataset(
    sources: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    inputs: str | Sequence[str],
    targets: str | Sequence[str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """``meshshard dataset``: one sample per mesh file (see the module docstring for names).

    Without ``targets`` the dataset holds inputs only (zero target channels, no validation split
    unless asked): new cases for ``meshshard predict``, which ``meshshard train`` refuses.

    Cheap checks (the output folder, the sources, the field names on the first file) come
    before any sample is written; files are then read and written one at a time.
    """
    in_names = parse_field_names(inputs, "--inputs")
    out_names = parse_field_names(targets, "--targets") if targets else []
    if not out_names and val_fraction is None and val_samples is None:
        val_fraction = 0.0  # cases to predict on: nothing to validate against
    check_dataset_output(out, force, sources)
    files = list_sources(sources)
    names = [p.stem for p in files]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            names[i] = f"{name}-{i}"
        seen[name] = i
    first = _sample_from(files[0], names[0], in_names, out_names)
    shape0 = first.fields

    def samples() -> Iterator[Sample]:
        nonlocal first
        yield first.sample
        first = None  # type: ignore[assignment]  # let the first sample's arrays go
        for i in range(1, len(files)):
            yield _sample_from(files[i], names[i], in_names, out_names, expect=(shape0, files[0])).sample

    return write_samples(out, samples(), names, input_fields=first.inputs, target_fields=first.targets,
                         val_fraction=val_fraction, val_samples=val_samples, dtype=dtype, force=force,
                         sources=sources, progress=progress)


@dataclass(frozen=True, eq=False)
class _Read:
    sample: Sample
    fields: dict[str, int]
    inputs: list[dict[str, Any]]
    targets: list[dict[str, Any]]


def _sample_from(path: Path, name: str, in_names: list[str], out_names: list[str],
                 expect: tuple[dict[str, int], Path] | None = None) -> _Read:
    """Read one mesh file into a :class:`Sample`, checking its field set against ``expect``."""
    mesh = _read(path)
    fields = _point_fields(mesh, path)
    shape = {k: v.shape[1] for k, v in fields.items()}
    if expect is not None and shape != expect[0]:
        raise ValueError(f"{path}: Expected the same point_data fields in every sample (got "
                         f"{_describe(fields) or 'none'}; {expect[1]} has "
                         f"{', '.join(f'{k} ({v})' for k, v in expect[0].items()) or 'none'})")
    pos = np.asarray(mesh.points, dtype=np.float64)
    x, x_fields = _select(in_names, fields, pos, path)
    y, y_fields = _select(out_names, fields, pos, path)
    cells = [(b.type, np.asarray(b.data)) for b in mesh.cells]
    for t, c in cells:
        if c.dtype == object or c.ndim != 2:
            raise ValueError(f"{path}: cell type {t!r} with a varying node count is not supported")
    return _Read(Sample(name, pos, x, y, cells=cells, source=str(path)), shape, x_fields, y_fields)


def partition_dataset(
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    num_parts: int,
    *,
    method: str = "metis",
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """``meshshard partition DATA``: partition the one mesh of a dataset (PARTS is a partition
    folder), or every distinct mesh (PARTS holds one partition folder per mesh, see the format
    docstring). Each partition records the mesh's checksum as its ``input.sha256``."""
    from meshshard.partition._api import _run
    from meshshard.partition._assign import check_num_parts
    from meshshard.partition._format import write_partitions
    from meshshard.partition._progress import Steps

    dataset = open_dataset(data)
    out = Path(out)
    _check_parts_output(out, force)
    if num_parts < 1:
        raise ValueError(f"Expected --parts >= 1 (got {num_parts})")
    for entry in dataset.meta["meshes"]:
        check_num_parts(num_parts, entry["num_nodes"])

    def one(m: int, folder: Path) -> None:
        mesh = dataset.mesh(m)
        graph = mesh.graph()
        attrs = {"graph": graph.kind, "input": {"kind": "dataset", "name": f"{dataset.path.name}/meshes/{m:05d}",
                                                  "sha256": mesh.sha256}, "parameters": {}}
        metadata, partitions = _run(graph, num_parts, Steps(), method=method, halo_hops=halo_hops,
                                    imbalance=imbalance, seed=seed, attrs=attrs)
        write_partitions(metadata, partitions, folder)
        if progress is not None:
            progress(1)

    with atomic_folder(out) as tmp:
        if dataset.kind == "one-mesh":
            one(0, tmp)
        else:
            tmp.mkdir()
            meshes = []
            for m, entry in enumerate(dataset.meta["meshes"]):
                one(m, tmp / f"mesh-{m:05d}")
                meshes.append({"mesh": m, "folder": f"mesh-{m:05d}", "num_nodes": entry["num_nodes"],
                               "sha256": entry["sha256"]})
            meta = {"format": PARTITIONS_FORMAT, "format_version": 1, "num_parts": num_parts,
                    "dataset": dataset.path.name, "num_meshes": len(meshes), "meshes": meshes}
            (tmp / PARTITIONS_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def _check_parts_output(out: Path, force: bool) -> None:
    """As for a partition folder; with ``force`` a folder of a dataset's partitions may be replaced
    too, when it holds only ``partitions.json`` and ``mesh-NNNNN`` partition folders."""
    from meshshard.partition._format import METADATA_FILE, check_output_dir

    if force and (out / PARTITIONS_FILE).is_file() and not out.is_symlink():
        for child in out.iterdir():
            ours = child.name == PARTITIONS_FILE or (
                re.fullmatch(r"mesh-\d{5}", child.name) and child.is_dir() and not child.is_symlink()
                and (child / METADATA_FILE).is_file())
            if not ours:
                raise ValueError(f"{out}: holds {child.name}, which meshshard did not write; "
                                 "refusing to replace it, even with --force")
        return
    check_output_dir(out, force)
