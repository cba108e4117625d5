"""``meshshard convert MESH OUT.vtkhdf``: a mesh as a one-piece VTKHDF file, which each process of a
distributed partition reads in part (:mod:`meshshard.partition._vtkhdf`)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._io import InputData, _read_meshio, read_input
from ._readers import open_regular
from ._vtkhdf import VTKHDF_SUFFIX, write_vtkhdf

__all__ = ["convert_mesh"]


def convert_mesh(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the mesh ``source`` as the one-piece ``.vtkhdf`` file ``out`` (replaced when it exists, and
    written whole or not at all: through a temporary file beside it).

    ``source`` is any mesh meshio reads (its numeric point fields are kept, under ``PointData``), or a
    ``.vtkhdf`` (its points and cells). 2-D points get a zero third coordinate.

    Returns:
        The file written.

    Raises:
        ValueError: ``out`` does not end in ``.vtkhdf`` or is ``source``; ``source`` is not a mesh.
    """
    source, out = Path(source), Path(out)
    if out.suffix != VTKHDF_SUFFIX:
        raise ValueError(f"{out}: Expected an output file ending in {VTKHDF_SUFFIX}")
    if out.exists() and source.exists() and out.resolve() == source.resolve():
        raise ValueError(f"{out}: is the input itself; choose another output file")
    if out.is_dir():
        raise ValueError(f"{out}: is a folder; expected a file to write")
    fields: dict[str, np.ndarray] = {}
    suffix = source.suffix.lower()
    if suffix in (".bz2", ".gz", ".npy", ".npz", ".graph", ".mgraph", ".metis", ".mesh", VTKHDF_SUFFIX):
        data = read_input(source)
    else:  # meshio's formats: read once, with their point fields
        if not source.is_file():
            raise ValueError(f"{source}: no such file" if not source.exists() else f"{source}: not a regular file")
        with open_regular(source):  # refuses a FIFO or device before meshio opens it
            pass
        try:
            pos, cells = _read_meshio(source, fields)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
        data = InputData(source.name, "", "mesh", len(pos), pos=pos, cells=cells)
    if data.kind != "mesh" or data.pos is None:
        raise ValueError(f"{source}: Expected a mesh with points and cells (got a {data.kind} input)")
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        write_vtkhdf(staging, data.pos, data.cells, fields)
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    return out
