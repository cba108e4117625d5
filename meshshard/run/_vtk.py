"""Writing ParaView files: one ``.vtu``, or one piece per rank and the ``.pvtu`` index that opens
them as one mesh; for point clouds and surfaces, VTK PolyData: one ``.vtp``, or pieces and a
``.pvtp``. Point fields only; the points are written in 3-D (2-D meshes get z = 0).

A ``.vtp`` is written here as VTK XML (raw little-endian arrays, base64 inline, a UInt64 byte
count before each), so neither meshio (which writes no PolyData) nor vtk is needed to write one.
Its cells: ``Verts`` for vertex cells (every point when there are no cells), ``Lines``, and
``Polys`` for faces (triangles, quads, polygons of one size).
"""

from __future__ import annotations

import base64
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["read_pvtu", "read_vtp", "write_pvtp", "write_pvtu", "write_vtp", "write_vtu"]


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
              np.dtype(np.int32): "Int32", np.dtype(np.uint8): "UInt8"}
#: PolyData's cell sections, and the meshio cell types each takes.
_POLY_SECTIONS = (("Verts", ("vertex",)), ("Lines", ("line",)), ("Strips", ()),
                  ("Polys", ("triangle", "quad", "polygon")))
#: VTK's mark of a point that another piece owns (vtkDataSetAttributes::DUPLICATEPOINT).
DUPLICATE_POINT = 1


def _data_array(values: np.ndarray, name: str | None = None, components: int | None = None) -> str:
    a = np.ascontiguousarray(values)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    raw = a.tobytes()
    text = base64.b64encode(np.array([len(raw)], dtype="<u8").tobytes()).decode() + base64.b64encode(raw).decode()
    attrs = f' type="{_VTK_TYPES[np.dtype(a.dtype.str.replace("<", "="))]}"'
    attrs += f' Name="{name}"' if name is not None else ""
    attrs += f' NumberOfComponents="{components}"' if components is not None else ""
    return f'        <DataArray{attrs} format="binary">{text}</DataArray>\n'


def write_vtp(path: Path, points: np.ndarray, cells: list[tuple[str, np.ndarray]],
              point_data: dict[str, np.ndarray]) -> None:
    """One VTK PolyData file (see the module docstring): ``cells`` as meshio gives them (vertex,
    line, triangle, quad, polygon); without any, one vertex cell per point. Point fields of
    float64, float32, int64, int32 or uint8 (``vtkGhostType``)."""
    pts = _vtk_points(points)
    cells = [(t, np.asarray(c, dtype=np.int64)) for t, c in cells if len(c)]
    if not cells:
        cells = [("vertex", np.arange(len(pts), dtype=np.int64)[:, None])]
    unknown = sorted({t for t, _ in cells} - {t for _, ts in _POLY_SECTIONS for t in ts})
    if unknown:
        raise ValueError(f"{path}: Expected PolyData cells (vertex, line, triangle, quad, polygon), got {unknown}")
    counts, sections = {}, []
    for section, types in _POLY_SECTIONS:
        blocks = [c for t, c in cells if t in types]
        conn = np.concatenate([c.reshape(-1) for c in blocks]) if blocks else np.zeros(0, np.int64)
        sizes = np.concatenate([np.full(len(c), c.shape[1], np.int64) for c in blocks]) if blocks else conn
        counts[section] = len(sizes)
        sections.append(f"      <{section}>\n" + _data_array(conn, "connectivity")
                        + _data_array(np.cumsum(sizes, dtype=np.int64), "offsets") + f"      </{section}>\n")
    fields = "".join(_data_array(v, name, 1 if np.ndim(v) == 1 else np.shape(v)[1])
                     for name, v in point_data.items())
    path.write_text(
        '<?xml version="1.0"?>\n'
        '<VTKFile type="PolyData" version="1.0" byte_order="LittleEndian" header_type="UInt64">\n'
        "  <PolyData>\n"
        f'    <Piece NumberOfPoints="{len(pts)}" NumberOfVerts="{counts["Verts"]}" NumberOfLines="{counts["Lines"]}" '
        f'NumberOfStrips="0" NumberOfPolys="{counts["Polys"]}">\n'
        f"      <PointData>\n{fields}      </PointData>\n"
        f"      <Points>\n{_data_array(pts, None, 3)}      </Points>\n"
        + "".join(sections) + "    </Piece>\n  </PolyData>\n</VTKFile>\n")


def write_pvtp(path: Path, pieces: list[str], point_data: dict[str, tuple[np.dtype, int]]) -> None:
    """The ``.pvtp`` index of ``pieces`` (``.vtp`` file names relative to ``path``'s folder)."""
    _write_index(path, "PPolyData", pieces, point_data)


def read_vtp(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ``.vtp`` read back with vtk (to check what :func:`write_vtp` wrote): ``points`` ``(N, 3)``,
    ``point_data`` by name, and ``verts``, ``lines``, ``polys`` as lists of point-id arrays."""
    from vtkmodules.util.numpy_support import vtk_to_numpy
    from vtkmodules.vtkIOXML import vtkXMLPolyDataReader

    reader = vtkXMLPolyDataReader()
    reader.SetFileName(str(path))
    reader.Update()
    poly = reader.GetOutput()
    pd = poly.GetPointData()
    out: dict[str, Any] = {"points": vtk_to_numpy(poly.GetPoints().GetData()) if poly.GetNumberOfPoints() else
                           np.zeros((0, 3)),
                           "point_data": {pd.GetArrayName(i): vtk_to_numpy(pd.GetArray(i))
                                          for i in range(pd.GetNumberOfArrays())}}
    for key, cells in (("verts", poly.GetVerts()), ("lines", poly.GetLines()), ("polys", poly.GetPolys())):
        offsets = vtk_to_numpy(cells.GetOffsetsArray())
        conn = vtk_to_numpy(cells.GetConnectivityArray())
        out[key] = [conn[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    return out


def write_pvtu(path: Path, pieces: list[str], point_data: dict[str, tuple[np.dtype, int]]) -> None:
    """The ``.pvtu`` index of ``pieces`` (file names relative to ``path``'s folder)."""
    _write_index(path, "PUnstructuredGrid", pieces, point_data)


def _write_index(path: Path, kind: str, pieces: list[str], point_data: dict[str, tuple[np.dtype, int]]) -> None:
    arrays = "\n".join(
        f'      <PDataArray type="{_VTK_TYPES[np.dtype(dt)]}" Name="{name}" NumberOfComponents="{k}"/>'
        for name, (dt, k) in point_data.items()
    )
    sources = "\n".join(f'    <Piece Source="{p}"/>' for p in pieces)
    path.write_text(
        '<?xml version="1.0"?>\n'
        f'<VTKFile type="{kind}" version="1.0" byte_order="LittleEndian" header_type="UInt32">\n'
        f'  <{kind} GhostLevel="0">\n'
        f"    <PPointData>\n{arrays}\n    </PPointData>\n"
        '    <PPoints>\n      <PDataArray type="Float64" NumberOfComponents="3"/>\n    </PPoints>\n'
        f"{sources}\n"
        f"  </{kind}>\n</VTKFile>\n"
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
