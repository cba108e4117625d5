"""Solver output made in the tests: one-cell-thick 3-D meshes as OpenFOAM's 2-D cases are, VTK
files of every kind meshio does not write (with the ``vtk`` package), and foamToVTK's layout.

``data/foam_cavity/`` holds the real thing, small: what ``foamToVTK`` wrote for OpenFOAM's
``icoFoam`` cavity tutorial on a 4 x 3 x 1 mesh (``data/foam_cavity/README.md``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import meshio
import numpy as np

FOAM_CAVITY = Path(__file__).resolve().parent / "data" / "foam_cavity" / "cavity"


def extruded(nx: int = 5, ny: int = 4, *, wedges: bool = False, thickness: float = 0.1,
             seed: int = 0) -> dict[str, np.ndarray]:
    """A 2-D grid on ``[0, 1] x [0, 0.6]`` extruded one cell in z, as OpenFOAM meshes a 2-D case.

    The node ids are shuffled (lower- and upper-plane nodes mixed), and the cells are written in
    several orientations (the VTK face ``0 1 2 3`` of a hexahedron is on the lower plane, the upper
    one or a side, as foamToVTK writes them). With ``wedges``, the right half's squares are split
    into two triangles each, extruded to wedges (meshio's node order).

    Returns ``points3`` ``(2 n, 3)``, ``hexahedron`` ``(C_h, 8)``, ``wedge`` ``(C_w, 6)``, and the 2-D
    mesh it came from: ``points2`` ``(n, 2)``, ``lower`` ``(n,)`` (the 3-D id of each 2-D node),
    ``upper`` ``(n,)``, ``quad`` ``(C_h, 4)`` and ``triangle`` ``(C_w, 3)`` in 2-D ids.
    """
    x, y = np.meshgrid(np.linspace(0, 1, nx), np.linspace(0, 0.6, ny), indexing="ij")
    points2 = np.stack([x.ravel(), y.ravel()], 1)
    n = len(points2)
    i, j = np.meshgrid(np.arange(nx - 1), np.arange(ny - 1), indexing="ij")
    a = (i * ny + j).ravel()
    squares = np.stack([a, a + ny, a + ny + 1, a + 1], 1)  # counter-clockwise
    split = (i.ravel() >= (nx - 1) // 2) if wedges else np.zeros(len(a), dtype=bool)
    quads = squares[~split]
    tris = np.concatenate([squares[split][:, [0, 1, 2]], squares[split][:, [0, 2, 3]]])
    order = np.random.default_rng(seed).permutation(2 * n)  # 3-D id of (plane, 2-D node)
    lower, upper = order[:n], order[n:]
    points3 = np.zeros((2 * n, 3))
    points3[lower, :2] = points2
    points3[upper, :2] = points2
    points3[upper, 2] = thickness
    lo, hi = lower[quads], upper[quads]
    a_, b_, c_, d_ = lo.T
    a2, b2, c2, d2 = hi.T
    variants = [np.stack([a_, b_, c_, d_, a2, b2, c2, d2], 1),     # lower face first
                np.stack([a_, b_, b2, a2, d_, c_, c2, d2], 1),     # a side face first (as foamToVTK)
                np.stack([a2, b2, c2, d2, a_, b_, c_, d_], 1),     # the upper face first
                np.stack([b_, c_, c2, b2, a_, d_, d2, a2], 1)]     # another side
    hexa = np.stack(variants)[np.arange(len(quads)) % 4, np.arange(len(quads))]
    t_lo, t_hi = lower[tris], upper[tris]
    wedge = np.where((np.arange(len(tris)) % 2 == 0)[:, None], np.concatenate([t_lo, t_hi], 1),
                     np.concatenate([t_hi, t_lo], 1))
    return {"points3": points3, "hexahedron": hexa, "wedge": wedge, "points2": points2, "lower": lower,
            "upper": upper, "quad": quads, "triangle": tris}


def write_vtu(path: Path, points: np.ndarray, cells: Sequence[tuple[str, np.ndarray]],
              point_data: Mapping[str, np.ndarray] | None = None,
              cell_data: Mapping[str, Sequence[np.ndarray]] | None = None) -> Path:
    """A ``.vtu`` written by meshio (binary, as solvers write them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, meshio.Mesh(points, [(t, c) for t, c in cells if len(c)], point_data=dict(point_data or {}),
                                       cell_data={k: [v for v, (_, c) in zip(vs, cells) if len(c)]
                                                  for k, vs in (cell_data or {}).items()}))
    return path


def vtk_grid(path: Path) -> object:
    """The ``vtkUnstructuredGrid`` of a ``.vtu`` (to write it again in other formats)."""
    from vtkmodules.vtkIOXML import vtkXMLUnstructuredGridReader

    reader = vtkXMLUnstructuredGridReader()
    reader.SetFileName(str(path))
    reader.Update()
    return reader.GetOutput()


def polydata(points: np.ndarray, polys: Sequence[Sequence[int]] = (), lines: Sequence[Sequence[int]] = (),
             verts: Sequence[int] = (), point_data: Mapping[str, np.ndarray] | None = None,
             cell_data: Mapping[str, np.ndarray] | None = None) -> object:
    """A ``vtkPolyData`` (cell data in VTK's cell order: vertices, lines, then polygons)."""
    from vtkmodules.util.numpy_support import numpy_to_vtk
    from vtkmodules.vtkCommonCore import vtkPoints
    from vtkmodules.vtkCommonDataModel import vtkCellArray, vtkPolyData

    def cell_array(items: Sequence[Sequence[int]]) -> vtkCellArray:
        array = vtkCellArray()
        for item in items:
            array.InsertNextCell(len(item), [int(v) for v in item])
        return array

    pts = np.zeros((len(points), 3))
    pts[:, :np.shape(points)[1]] = points
    poly = vtkPolyData()
    vp = vtkPoints()
    vp.SetData(numpy_to_vtk(pts, deep=True))
    poly.SetPoints(vp)
    poly.SetVerts(cell_array([[v] for v in verts]))
    poly.SetLines(cell_array(lines))
    poly.SetPolys(cell_array(polys))
    for data, fields in ((poly.GetPointData(), point_data), (poly.GetCellData(), cell_data)):
        for name, values in (fields or {}).items():
            array = numpy_to_vtk(np.ascontiguousarray(values, dtype=np.float64), deep=True)
            array.SetName(name)
            data.AddArray(array)
    return poly


def write_vtk(path: Path, data: object) -> Path:
    """``data`` written by vtk's writer for ``path``'s extension (``.vtu``, ``.vtp``, ``.pvtu``
    (``data`` a list of pieces), ``.vtkhdf`` (one dataset, or a list of pieces))."""
    from vtkmodules.vtkIOXML import vtkXMLPolyDataWriter, vtkXMLUnstructuredGridWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix
    if suffix == ".vtkhdf":
        from vtkmodules.vtkCommonDataModel import vtkPartitionedDataSet
        from vtkmodules.vtkIOHDF import vtkHDFWriter

        if isinstance(data, list):
            pieces = vtkPartitionedDataSet()
            for k, piece in enumerate(data):
                pieces.SetPartition(k, piece)
            data = pieces
        writer = vtkHDFWriter()
    elif suffix == ".pvtu":
        return _write_pieces(path, data)
    else:
        writer = {".vtu": vtkXMLUnstructuredGridWriter, ".vtp": vtkXMLPolyDataWriter}[suffix]()
    writer.SetFileName(str(path))
    writer.SetInputData(data)
    assert writer.Write() == 1
    return path


def _write_pieces(path: Path, pieces: Sequence[object]) -> Path:
    """A ``.pvtu`` of several ``vtkUnstructuredGrid`` pieces: each piece a ``.vtu`` beside it, as a
    parallel solver writes them."""
    from vtkmodules.vtkIOXML import vtkXMLUnstructuredGridWriter

    names = []
    for k, piece in enumerate(pieces):
        name = f"{path.stem}_{k}.vtu"
        writer = vtkXMLUnstructuredGridWriter()
        writer.SetFileName(str(path.parent / name))
        writer.SetInputData(piece)
        assert writer.Write() == 1
        names.append(name)
    first = pieces[0]
    point_arrays = "".join(_array_xml(first.GetPointData().GetArray(i)) for i in
                           range(first.GetPointData().GetNumberOfArrays()))
    cell_arrays = "".join(_array_xml(first.GetCellData().GetArray(i)) for i in
                          range(first.GetCellData().GetNumberOfArrays()))
    path.write_text(
        '<?xml version="1.0"?>\n<VTKFile type="PUnstructuredGrid" version="0.1" byte_order="LittleEndian">\n'
        '  <PUnstructuredGrid GhostLevel="0">\n'
        f"    <PPointData>{point_arrays}</PPointData>\n    <PCellData>{cell_arrays}</PCellData>\n"
        '    <PPoints><PDataArray type="Float64" NumberOfComponents="3"/></PPoints>\n'
        + "".join(f'    <Piece Source="{n}"/>\n' for n in names)
        + "  </PUnstructuredGrid>\n</VTKFile>\n")
    return path


def _array_xml(array: object) -> str:
    kind = {10: "Float32", 11: "Float64", 6: "Int32", 12: "Int64"}.get(array.GetDataType(), "Float64")
    return f'<PDataArray type="{kind}" Name="{array.GetName()}" NumberOfComponents="{array.GetNumberOfComponents()}"/>'


def write_vtm(path: Path, blocks: Mapping[str, object]) -> Path:
    """A ``.vtm`` as foamToVTK writes it: ``blocks`` maps a block path (``internal``,
    ``boundary/lowerWall``) to a file, relative to the ``.vtm``'s folder."""
    tree: dict[str, list[tuple[str, str]]] = {}
    for name, file in blocks.items():
        parent, _, leaf = name.rpartition("/")
        tree.setdefault(parent, []).append((leaf, str(file)))
    lines = ["<?xml version='1.0'?>", "<VTKFile type='vtkMultiBlockDataSet' version='1.0' byte_order='LittleEndian' "
             "header_type='UInt64'>", "  <vtkMultiBlockDataSet>"]
    lines += [f"    <DataSet name='{leaf}' file='{file}' />" for leaf, file in tree.pop("", [])]
    for block, leaves in tree.items():
        lines.append(f"    <Block name='{block}'>")
        lines += [f"      <DataSet name='{leaf}' file='{file}' />" for leaf, file in leaves]
        lines.append("    </Block>")
    lines += ["  </vtkMultiBlockDataSet>", "</VTKFile>", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def foam_case(case: Path, iteration: int, mesh: dict[str, np.ndarray], fields: Mapping[str, np.ndarray],
              patches: Mapping[str, np.ndarray], *, cell_fields: Mapping[str, Sequence[np.ndarray]] | None = None,
              point_fields: bool = True) -> Path:
    """foamToVTK's layout for one iteration of a case made by :func:`extruded`:
    ``CASE/VTK/CASE_<iteration>.vtm``, ``.../internal.vtu`` (point fields ``fields``, per 3-D node,
    unless not ``point_fields``; cell fields ``cell_fields``, per block) and
    ``.../boundary/<patch>.vtp`` (each patch: the quads between consecutive 3-D node pairs of
    ``patches[patch]``, a list of 2-D node ids along the boundary). Returns the ``.vtm``."""
    name = f"{case.name}_{iteration}"
    folder = case / "VTK" / name
    cells = [("hexahedron", mesh["hexahedron"]), ("wedge", mesh["wedge"])]
    write_vtu(folder / "internal.vtu", mesh["points3"], cells, point_data=fields if point_fields else None,
              cell_data=cell_fields)
    blocks = {"internal": f"{name}/internal.vtu"}
    for patch, chain in patches.items():
        lo, hi = mesh["lower"][chain], mesh["upper"][chain]
        ids = np.concatenate([lo, hi])
        local = {int(v): k for k, v in enumerate(ids.tolist())}
        faces = [[local[int(lo[k])], local[int(lo[k + 1])], local[int(hi[k + 1])], local[int(hi[k])]]
                 for k in range(len(chain) - 1)]
        write_vtk(folder / "boundary" / f"{patch}.vtp", polydata(mesh["points3"][ids], polys=faces))
        blocks[f"boundary/{patch}"] = f"{name}/boundary/{patch}.vtp"
    return write_vtm(case / "VTK" / f"{name}.vtm", blocks)
