"""Writing ParaView files: one ``.vtu``, or one piece per rank and the ``.pvtu`` index that opens
them as one mesh. Point fields only; the points are written in 3-D (2-D meshes get z = 0).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["read_pvtu", "write_pvtu", "write_vtu"]


def _vtk_points(points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    if points.shape[1] < 3:
        points = np.concatenate([points, np.zeros((len(points), 3 - points.shape[1]))], axis=1)
    return points


def write_vtu(path: Path, points: np.ndarray, cells: list[tuple[str, np.ndarray]],
              point_data: dict[str, np.ndarray]) -> None:
    """One VTK unstructured-grid file (meshio's writer; 2-D points get z = 0)."""
    import meshio

    if not any(len(c) for _, c in cells):  # a graph without cells: show the nodes
        cells = [("vertex", np.arange(len(points), dtype=np.int64)[:, None])]
    grid = meshio.Mesh(_vtk_points(points), [(t, np.asarray(c)) for t, c in cells if len(c)], point_data=point_data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, grid, file_format="vtu", binary=True)


_VTK_TYPES = {np.dtype(np.float64): "Float64", np.dtype(np.float32): "Float32", np.dtype(np.int64): "Int64",
              np.dtype(np.int32): "Int32"}


def write_pvtu(path: Path, pieces: list[str], point_data: dict[str, tuple[np.dtype, int]]) -> None:
    """The ``.pvtu`` index of ``pieces`` (file names relative to ``path``'s folder)."""
    arrays = "\n".join(
        f'      <PDataArray type="{_VTK_TYPES[np.dtype(dt)]}" Name="{name}" NumberOfComponents="{k}"/>'
        for name, (dt, k) in point_data.items()
    )
    sources = "\n".join(f'    <Piece Source="{p}"/>' for p in pieces)
    path.write_text(
        '<?xml version="1.0"?>\n'
        '<VTKFile type="PUnstructuredGrid" version="1.0" byte_order="LittleEndian" header_type="UInt32">\n'
        '  <PUnstructuredGrid GhostLevel="0">\n'
        f"    <PPointData>\n{arrays}\n    </PPointData>\n"
        '    <PPoints>\n      <PDataArray type="Float64" NumberOfComponents="3"/>\n    </PPoints>\n'
        f"{sources}\n"
        "  </PUnstructuredGrid>\n</VTKFile>\n"
    )


def read_pvtu(path: str | os.PathLike[str]) -> list[Any]:
    """The pieces of a ``.pvtu`` as meshio meshes (to check what :func:`write_pvtu` wrote)."""
    import xml.etree.ElementTree as ET

    import meshio

    path = Path(path)
    root = ET.parse(path).getroot()
    return [meshio.read(path.parent / piece.attrib["Source"]) for piece in root.iter("Piece")]


# ------------------------------------------------------------------------------------------------
# One mesh's layout on this rank
