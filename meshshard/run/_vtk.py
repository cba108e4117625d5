"""Writing ParaView files: one ``.vtu``, or one piece per rank and the ``.pvtu`` index that opens
them as one mesh; for point clouds and surfaces, VTK PolyData: one ``.vtp``, or pieces and a
``.pvtp``. Point fields only; the points are written in 3-D (2-D meshes get z = 0).

Both ``.vtu`` and ``.vtp`` are written here as VTK XML (little-endian arrays as raw appended data,
UInt64 headers), so neither meshio (which writes no PolyData and no LZ4) nor vtk is needed to write one.
A ``.vtp``'s cells: ``Verts`` for vertex cells (every point when there are no cells), ``Lines``, and
``Polys`` for faces (triangles, quads, polygons of one size); a ``.vtu``'s: any cell type meshio
names, in VTK's node order (meshio's polyhedra alone go through meshio's own writer).

``compression`` (:data:`COMPRESSIONS`): ``"none"`` (raw arrays), ``"zlib"`` (VTK's
``vtkZLibDataCompressor``, level 1: within a few percent of the default level's size on float
fields, several times faster) or ``"lz4"`` (``vtkLZ4DataCompressor``, which vtk 9 reads; needs the
``lz4`` package: :func:`check_compression`). Arrays are compressed in blocks of
:data:`BLOCK_BYTES`, as VTK's readers expect (a header of the block count, sizes, and each block's
compressed size).
"""

from __future__ import annotations

import os
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["COMPRESSIONS", "check_compression", "read_pvtu", "read_vtp", "write_pvtp", "write_pvtu", "write_vtp",
           "write_vtu"]

#: The compressions of ``--compression``; the first is the default: no compression, the fastest to write and
#: read by meshio too (which reads no LZ4); see docs/prediction.md for the figures (bench/rollout.py).
COMPRESSIONS = ("none", "lz4", "zlib")
#: The uncompressed size of one compressed block (VTK's readers take any; its own writers use 32 KiB).
BLOCK_BYTES = 1 << 20
_COMPRESSORS = {"zlib": "vtkZLibDataCompressor", "lz4": "vtkLZ4DataCompressor"}


def check_compression(name: str) -> str:
    """``name`` if it is one of :data:`COMPRESSIONS` that can be written here (``lz4`` needs the
    ``lz4`` package); else a one-line ``ValueError`` naming ``--compression``."""
    if name not in COMPRESSIONS:
        raise ValueError(f"Expected --compression {'|'.join(COMPRESSIONS)} (got {name!r})")
    if name == "lz4":
        try:
            import lz4.block  # noqa: F401
        except ImportError:
            raise ValueError("--compression lz4 needs the lz4 package (pip install lz4); "
                             "--compression zlib or none need nothing") from None
    return name


def _compress(raw: bytes, compression: str) -> list[bytes]:
    """``raw`` in blocks of :data:`BLOCK_BYTES`, each compressed (zlib and lz4 release the GIL)."""
    blocks = [raw[at:at + BLOCK_BYTES] for at in range(0, len(raw), BLOCK_BYTES)] or [b""]
    if compression == "zlib":
        return [zlib.compress(b, 1) for b in blocks]
    import lz4.block

    return [lz4.block.compress(b, store_size=False) for b in blocks]



def _vtk_points(points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    if points.shape[1] < 3:
        points = np.concatenate([points, np.zeros((len(points), 3 - points.shape[1]))], axis=1)
    return points


def write_vtu(path: Path, points: np.ndarray, cells: list[tuple[str, np.ndarray]],
              point_data: dict[str, np.ndarray], compression: str = "zlib") -> None:
    """One VTK unstructured-grid file (2-D points get z = 0; see the module docstring for
    ``compression``). Cells of any type meshio names, in VTK's node order (meshio's table); polyhedra
    through meshio's own writer (zlib, or none where ``compression`` is none)."""
    if not any(len(c) for _, c in cells):  # a graph without cells: show the nodes
        cells = [("vertex", np.arange(len(points), dtype=np.int64)[:, None])]
    cells = [(t, np.asarray(c)) for t, c in cells if len(c)]
    if any(t.startswith("polyhedron") for t, _ in cells):
        _meshio_vtu(path, points, cells, point_data, compression)
        return
    from meshio._vtk_common import meshio_to_vtk_order, meshio_to_vtk_type

    unknown = sorted({t for t, _ in cells} - set(meshio_to_vtk_type))
    if unknown:
        raise ValueError(f"{path}: Expected cell types VTK knows (got {unknown})")
    conn, sizes, types = [], [], []
    for t, c in cells:
        order = meshio_to_vtk_order(t)
        conn.append((c if order is None else c[:, order]).astype(np.int64, copy=False).reshape(-1))
        sizes.append(np.full(len(c), c.shape[1], np.int64))
        types.append(np.full(len(c), meshio_to_vtk_type[t], np.uint8))
    pts = _vtk_points(points)
    z, out = compression, []
    fields = "".join(_data_array(out, v, name, None if np.ndim(v) == 1 else np.shape(v)[1], z)
                     for name, v in point_data.items())  # a scalar field without NumberOfComponents, as meshio
    body = (f'    <Piece NumberOfPoints="{len(pts)}" NumberOfCells="{sum(len(c) for _, c in cells)}">\n'
            f"      <PointData>\n{fields}      </PointData>\n"
            f"      <Points>\n{_data_array(out, pts, 'Points', 3, z)}      </Points>\n"
            f"      <Cells>\n{_data_array(out, np.concatenate(conn), 'connectivity', None, z)}"
            f"{_data_array(out, np.cumsum(np.concatenate(sizes)), 'offsets', None, z)}"
            f"{_data_array(out, np.concatenate(types), 'types', None, z)}      </Cells>\n    </Piece>\n")
    _write_xml(path, "UnstructuredGrid", body, compression, out)


def _write_xml(path: Path, kind: str, body: str, compression: str, appended: list[list[bytes]]) -> None:
    """A VTK XML file of one ``kind`` element around ``body`` (the pieces), then the arrays' bytes
    as raw appended data (no base64: a third smaller and faster to write and read).

    ``appended`` holds each array's bytes in the order of the ``DataArray`` elements in ``body``, whose
    offsets are placeholders (:func:`_data_array`). The bytes are laid out in the REVERSE order: the
    last element's array first. meshio's reader of raw appended data looks each array up by its offset
    while rewriting the offsets of those it has read to offsets into a longer base64 text; with the
    arrays in document order, a rewritten offset can equal a later array's, and meshio then reads the
    wrong array without a word. In reverse order the element it looks for always comes first."""
    compressor = f' compressor="{_COMPRESSORS[compression]}"' if compression != "none" else ""
    offsets, at = [0] * len(appended), 0
    for k in reversed(range(len(appended))):
        offsets[k] = at
        at += sum(len(b) for b in appended[k])
    for k, offset in enumerate(offsets):
        body = body.replace(f'offset="@{k}@"', f'offset="{offset}"', 1)
    with open(path, "wb") as file:
        file.write(('<?xml version="1.0"?>\n'
                    f'<VTKFile type="{kind}" version="1.0" byte_order="LittleEndian" header_type="UInt64"'
                    f"{compressor}>\n"
                    f'  <{kind}>\n{body}  </{kind}>\n  <AppendedData encoding="raw">\n   _').encode())
        for chunks in reversed(appended):
            for chunk in chunks:
                file.write(chunk)
        file.write(b"\n  </AppendedData>\n</VTKFile>\n")


def _meshio_vtu(path: Path, points: np.ndarray, cells: list[tuple[str, np.ndarray]],
                point_data: dict[str, np.ndarray], compression: str) -> None:
    import meshio

    grid = meshio.Mesh(_vtk_points(points), cells, point_data=point_data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, grid, file_format="vtu", binary=True, compression=None if compression == "none" else "zlib")


_VTK_TYPES = {np.dtype(np.float64): "Float64", np.dtype(np.float32): "Float32", np.dtype(np.int64): "Int64",
              np.dtype(np.int32): "Int32", np.dtype(np.uint8): "UInt8"}
#: PolyData's cell sections, and the meshio cell types each takes.
_POLY_SECTIONS = (("Verts", ("vertex",)), ("Lines", ("line",)), ("Strips", ()),
                  ("Polys", ("triangle", "quad", "polygon")))
#: VTK's mark of a point that another piece owns (vtkDataSetAttributes::DUPLICATEPOINT).
DUPLICATE_POINT = 1


def _data_array(out: list[list[bytes]], values: np.ndarray, name: str | None = None, components: int | None = None,
                compression: str = "none") -> str:
    """The ``DataArray`` element of ``values``, whose bytes (a header, then the array, compressed in
    blocks or raw) go onto ``out``, the file's appended data, one entry per array; its offset is a
    placeholder that :func:`_write_xml` fills in."""
    a = np.ascontiguousarray(values)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    raw = a.tobytes()
    index = len(out)
    if compression == "none":
        out.append([np.array([len(raw)], dtype="<u8").tobytes(), raw])
    else:
        blocks = _compress(raw, compression)
        last = len(raw) - (len(blocks) - 1) * BLOCK_BYTES
        out.append([np.array([len(blocks), BLOCK_BYTES, last, *[len(b) for b in blocks]], dtype="<u8").tobytes(),
                    *blocks])
    attrs = f' type="{_VTK_TYPES[np.dtype(a.dtype.str.replace("<", "="))]}"'
    attrs += f' Name="{name}"' if name is not None else ""
    attrs += f' NumberOfComponents="{components}"' if components is not None else ""
    return f'        <DataArray{attrs} format="appended" offset="@{index}@"/>\n'


def write_vtp(path: Path, points: np.ndarray, cells: list[tuple[str, np.ndarray]],
              point_data: dict[str, np.ndarray], compression: str = "zlib") -> None:
    """One VTK PolyData file (see the module docstring): ``cells`` as meshio gives them (vertex,
    line, triangle, quad, polygon); without any, one vertex cell per point. Point fields of
    float64, float32, int64, int32 or uint8 (``vtkGhostType``); ``compression``: see the module docstring."""
    pts = _vtk_points(points)
    cells = [(t, np.asarray(c, dtype=np.int64)) for t, c in cells if len(c)]
    if not cells:
        cells = [("vertex", np.arange(len(pts), dtype=np.int64)[:, None])]
    unknown = sorted({t for t, _ in cells} - {t for _, ts in _POLY_SECTIONS for t in ts})
    if unknown:
        raise ValueError(f"{path}: Expected PolyData cells (vertex, line, triangle, quad, polygon), got {unknown}")
    counts, sections, out = {}, [], []
    for section, types in _POLY_SECTIONS:
        blocks = [c for t, c in cells if t in types]
        conn = np.concatenate([c.reshape(-1) for c in blocks]) if blocks else np.zeros(0, np.int64)
        sizes = np.concatenate([np.full(len(c), c.shape[1], np.int64) for c in blocks]) if blocks else conn
        counts[section] = len(sizes)
        sections.append(f"      <{section}>\n" + _data_array(out, conn, "connectivity", None, compression)
                        + _data_array(out, np.cumsum(sizes, dtype=np.int64), "offsets", None, compression)
                        + f"      </{section}>\n")
    fields = "".join(_data_array(out, v, name, 1 if np.ndim(v) == 1 else np.shape(v)[1], compression)
                     for name, v in point_data.items())
    body = (f'    <Piece NumberOfPoints="{len(pts)}" NumberOfVerts="{counts["Verts"]}" '
            f'NumberOfLines="{counts["Lines"]}" NumberOfStrips="0" NumberOfPolys="{counts["Polys"]}">\n'
            f"      <PointData>\n{fields}      </PointData>\n"
            f"      <Points>\n{_data_array(out, pts, None, 3, compression)}      </Points>\n"
            + "".join(sections) + "    </Piece>\n")
    _write_xml(path, "PolyData", body, compression, out)


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
