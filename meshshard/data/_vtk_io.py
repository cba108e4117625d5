"""Reading the VTK files meshio does not read (``.vtp``, ``.vtm``, ``.pvtu``, ``.vtkhdf``) with the
``vtk`` package, into the mesh every other source becomes: a ``meshio.Mesh`` with its points,
cell blocks, ``point_data``, ``cell_data`` and, from a multiblock, ``point_sets``.

- ``.vtp`` (PolyData), and a legacy ``.vtk`` file of PolyData: vertices, lines, triangles and quads
  as they are; poly-vertex cells (a point cloud's) become one vertex cell per point, polygons of
  more than four nodes (a fan from their first node) and triangle strips are split into
  triangles, each with the cell data of the cell it came from.
- ``.pvtu`` (pieces of an unstructured grid), and a ``.vtkhdf`` or ``.vtm`` holding several pieces:
  the pieces are joined, and nodes at exactly the same coordinates (a piece's copy of its
  neighbour's boundary nodes) are merged into one, the first piece's values kept, so that the
  graph is connected across pieces. Ghost cells (``vtkGhostType``) are left out.
- ``.vtm`` (multiblock): one mesh with named node sets. The mesh is the block named ``internal``
  (OpenFOAM's ``foamToVTK``) or else the blocks of the highest cell dimension, joined; every other
  block of a lower dimension is a named boundary (a patch): the mesh's node ids on it, matched by
  coordinates, in ``point_sets[block name]``. Blocks that are not on the mesh's nodes (a cloud of
  particles, a slice) are left out, with a note.

Cell types are meshio's (``hexahedron``, ``wedge`` in meshio's node order, ...): VTK's pixels and
voxels become quads and hexahedra, polyhedra are refused. ``vtk`` is imported inside the
functions, so this module costs nothing where it is not used; where it is not installed, reading
one of these files is a one-line ``ValueError`` that says ``pip install vtk``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural

from ._vtk_checks import cell_type_refusal, check_vtk_file

__all__ = ["VTK_SUFFIXES", "read_vtk", "match_nodes"]

#: The file name endings read here (with the ``vtk`` package) rather than by meshio.
VTK_SUFFIXES = (".vtp", ".vtm", ".pvtu", ".vtkhdf")

# VTK cell type -> (meshio type, dimension, node order from VTK's). Cells of a varying node count
# (poly-vertex 2, poly-line 4, strip 6, polygon 7) are renamed by their size in _cell_codes first.
_TYPES: dict[int, tuple[str, int, tuple[int, ...] | None]] = {
    1: ("vertex", 0, None), 3: ("line", 1, None), 5: ("triangle", 2, None), 9: ("quad", 2, None),
    8: ("quad", 2, (0, 1, 3, 2)), 10: ("tetra", 3, None), 12: ("hexahedron", 3, None),
    11: ("hexahedron", 3, (0, 1, 3, 2, 4, 5, 7, 6)), 13: ("wedge", 3, (0, 2, 1, 3, 5, 4)),
    14: ("pyramid", 3, None), 21: ("line3", 1, None), 22: ("triangle6", 2, None), 23: ("quad8", 2, None),
    24: ("tetra10", 3, None), 25: ("hexahedron20", 3, None), 26: ("wedge15", 3, None),
    27: ("pyramid13", 3, None), 28: ("quad9", 2, None), 29: ("hexahedron27", 3, None),
}
_GHOST = "vtkGhostType"
#: The VTK cell types read here (others are refused before vtk reads the file, where it says them).
_READ_TYPES = frozenset(_TYPES) | {2, 4, 6, 7}


@dataclass(eq=False)
class _Piece:
    """One dataset of a file, as numpy: points ``(N, 3)``, cell blocks by meshio type (and each
    block's rows in the dataset's cell order), point and cell fields (cell fields in cell order)."""
    name: str
    points: np.ndarray
    cells: list[tuple[str, np.ndarray]]
    rows: list[np.ndarray]
    point_data: dict[str, np.ndarray]
    cell_data: dict[str, np.ndarray]
    dim: int
    pieces: int = 1
    point_sets: dict[str, np.ndarray] = field(default_factory=dict)


def read_vtk(path: str | Path, notes: Callable[[str], None] | None = None) -> Any:
    """Read a ``.vtp``, ``.vtm``, ``.pvtu`` or ``.vtkhdf`` file into a ``meshio.Mesh`` (see the
    module docstring); a ``.vtm``'s boundary blocks become ``point_sets``. ``notes`` is told of
    blocks left out. Anything wrong is a one-line ``ValueError`` naming the file."""
    import meshio

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (*VTK_SUFFIXES, ".vtk"):  # .vtk: legacy PolyData, which meshio does not read
        raise ValueError(f"{path}: Expected one of {', '.join(VTK_SUFFIXES)} (got {suffix or 'no extension'})")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    check_vtk_file(path, _READ_TYPES)  # sizes, cell types and the files it names, before vtk allocates anything
    output, pieces = _read_object(path, suffix)
    found = list(_leaves(output, ()))
    if not found:
        raise ValueError(f"{path}: vtk read no mesh from it (an empty file, or blocks whose files are missing)")
    parts = [_piece(ds, name, path) for name, ds in found]
    if suffix == ".vtm":
        piece = _multiblock(parts, path, notes)
    else:
        piece = _join(parts, path) if len(parts) > 1 else parts[0]
        if pieces > 1 or len(parts) > 1:
            piece = _merge_coincident(piece)
    data = {k: v for k, v in piece.point_data.items()}
    cell_data = {k: [v[r] for r in piece.rows] for k, v in piece.cell_data.items()}
    return meshio.Mesh(piece.points, piece.cells, point_data=data, cell_data=cell_data,
                       point_sets=dict(piece.point_sets))


def match_nodes(points: np.ndarray, where: np.ndarray, tol: float) -> np.ndarray | None:
    """The ids of the rows of ``points`` at the coordinates ``where`` (the nearest, through one
    k-d tree query); None when one of ``where`` is farther than ``tol`` from every point.

    Shapes:
        points: ``(N, D)``. where: ``(M, D)``. Returns ``(M,)`` int64.
    """
    from scipy.spatial import cKDTree

    if not len(where):
        return np.zeros(0, dtype=np.int64)
    dist, ids = cKDTree(points).query(where, k=1, distance_upper_bound=tol if tol > 0 else np.inf)
    if not np.all(dist <= tol):
        return None
    return ids.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# vtk: the readers, quiet, their errors as one line


def _modules(path: Path) -> Any:
    try:
        import vtkmodules.vtkCommonCore as core
        import vtkmodules.vtkCommonDataModel as model
        import vtkmodules.vtkIOHDF as hdf
        import vtkmodules.vtkIOLegacy  # noqa: F401 - vtkPolyDataReader, for legacy .vtk PolyData
        import vtkmodules.vtkIOXML as xml
        from vtkmodules.util import numpy_support
    except ImportError:
        raise ValueError(f"{path}: reading {path.suffix} files needs the vtk package, which is not installed "
                         "(pip install vtk)") from None
    return core, model, xml, hdf, numpy_support


@contextmanager
def _captured(core: Any) -> Iterator[Callable[[], str | None]]:
    """vtk's error messages kept, not printed; yields a function that gives the first one."""
    window = core.vtkStringOutputWindow()
    previous = core.vtkOutputWindow.GetInstance()
    cutoff = core.vtkLogger.GetCurrentVerbosityCutoff()
    core.vtkOutputWindow.SetInstance(window)
    core.vtkLogger.SetStderrVerbosity(core.vtkLogger.VERBOSITY_OFF)

    def first() -> str | None:
        for block in window.GetOutput().split("ERROR:")[1:]:
            lines = [line.strip() for line in block.splitlines()[1:] if line.strip()]
            if lines:
                text = lines[0]
                return text.split("): ", 1)[1] if "): " in text else text
        return None

    try:
        yield first
    finally:
        core.vtkOutputWindow.SetInstance(previous)
        core.vtkLogger.SetStderrVerbosity(core.vtkLogger.ConvertToVerbosity(cutoff))


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to a scratch file while vtk reads (vtk's HDF5 library prints its
    diagnostics there, past vtk's output window); the error comes back as one line."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _read_object(path: Path, suffix: str) -> tuple[Any, int]:
    """The data object vtk reads from ``path``, and the number of pieces it was written in."""
    core, _, xml, hdf, _ = _modules(path)
    reader = {".vtp": xml.vtkXMLPolyDataReader, ".vtm": xml.vtkXMLMultiBlockDataReader,
              ".pvtu": xml.vtkXMLPUnstructuredGridReader, ".vtkhdf": hdf.vtkHDFReader,
              ".vtk": _legacy_polydata_reader}[suffix]()
    with _captured(core) as error, _quiet_stderr():  # the HDF5 library in vtk prints its error stack there
        reader.SetFileName(str(path))
        ok = reader.Update()
        problem = error()
    if not ok or problem is not None:
        raise ValueError(f"{path}: vtk cannot read it ({problem or 'the reader failed'})")
    pieces = reader.GetNumberOfPieces() if suffix == ".pvtu" else 1
    return reader.GetOutputDataObject(0), int(pieces)


def _legacy_polydata_reader() -> Any:
    import vtkmodules.vtkIOLegacy as legacy

    return legacy.vtkPolyDataReader()


def _leaves(obj: Any, names: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The datasets of a (possibly composite) data object, each with the names of its blocks."""
    if obj is None:
        return
    if obj.IsA("vtkMultiBlockDataSet") or obj.IsA("vtkPartitionedDataSetCollection"):
        multi = obj.IsA("vtkMultiBlockDataSet")
        count = obj.GetNumberOfBlocks() if multi else obj.GetNumberOfPartitionedDataSets()
        for i in range(count):  # blocks, not cells or nodes: a handful
            meta = obj.GetMetaData(i) if obj.HasMetaData(i) else None
            name = meta.Get(obj.NAME()) if meta is not None and meta.Has(obj.NAME()) else f"block{i}"
            yield from _leaves(obj.GetBlock(i) if multi else obj.GetPartitionedDataSet(i), (*names, str(name)))
    elif obj.IsA("vtkPartitionedDataSet"):
        for i in range(obj.GetNumberOfPartitions()):
            yield from _leaves(obj.GetPartition(i), names)
    elif obj.IsA("vtkDataSet") and obj.GetNumberOfPoints() > 0:
        yield names, obj


# ---------------------------------------------------------------------------------------------
# A dataset as numpy


def _piece(ds: Any, names: tuple[str, ...], path: Path) -> _Piece:
    """One vtk dataset as a :class:`_Piece` (ghost cells left out)."""
    core, model, _, _, ns = _modules(path)
    if ds.IsA("vtkPolyData"):
        types, offsets, conn = _poly_cells(ds, ns)
    else:
        if not ds.IsA("vtkUnstructuredGrid"):
            import vtkmodules.vtkFiltersCore as filters

            append = filters.vtkAppendFilter()  # image and structured grids: their cells, listed
            append.AddInputData(ds)
            append.Update()
            ds = append.GetOutput()
        try:
            kinds = ds.GetCellTypes()
        except TypeError:  # vtk before 9.6
            kinds = ds.GetCellTypesArray()
        types = ns.vtk_to_numpy(kinds).astype(np.int64) if ds.GetNumberOfCells() else np.zeros(0, np.int64)
        cells = ds.GetCells()
        offsets = ns.vtk_to_numpy(cells.GetOffsetsArray()).astype(np.int64)
        conn = ns.vtk_to_numpy(cells.GetConnectivityArray()).astype(np.int64)
    points = ns.vtk_to_numpy(ds.GetPoints().GetData()).astype(np.float64).reshape(-1, 3)
    _check_cells(offsets, conn, len(points), path)
    point_data = _fields(ds.GetPointData(), len(points), ns)
    cell_data = _fields(ds.GetCellData(), len(types), ns)
    keep = np.ones(len(types), dtype=bool)
    if _GHOST in cell_data:
        keep = (cell_data[_GHOST].reshape(len(types), -1)[:, 0].astype(np.int64) & 1) == 0
    point_data.pop(_GHOST, None)
    cell_data = {k: v[keep] for k, v in cell_data.items() if k != _GHOST}
    blocks, rows, dim = _blocks(types[keep], offsets[:-1][keep], np.diff(offsets)[keep], conn, path)
    name = "/".join(names) if names else path.stem
    return _Piece(name, points, blocks, rows, point_data, cell_data, dim)


def _check_cells(offsets: np.ndarray, conn: np.ndarray, n: int, path: Path) -> None:
    """Offsets from 0, not decreasing, within the connectivity; node ids within the points."""
    if len(offsets) and (offsets[0] != 0 or offsets[-1] > len(conn) or (np.diff(offsets) < 0).any()):
        raise ValueError(f"{path}: Expected cell offsets from 0, increasing, up to the {len(conn):,} connectivity ids "
                         f"(got {int(offsets[0]):,} to {int(offsets[-1]):,})")
    bad = np.flatnonzero((conn < 0) | (conn >= n))
    if len(bad):
        raise ValueError(f"{path}: Expected node ids below the {n:,} points in the cells (got node "
                         f"{int(conn[bad[0]])}, {plural(len(bad), 'id')} out of range)")


def _poly_cells(poly: Any, ns: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PolyData's cells as (VTK cell type, offsets, connectivity), in its cell order (vertices,
    lines, polygons, strips)."""
    types, offsets, conns, start = [], [np.zeros(1, np.int64)], [], 0
    for array, fixed, varying in ((poly.GetVerts(), 1, 2), (poly.GetLines(), 3, 4), (poly.GetPolys(), 7, 7),
                                  (poly.GetStrips(), 6, 6)):
        if array.GetNumberOfCells() == 0:
            continue
        off = ns.vtk_to_numpy(array.GetOffsetsArray()).astype(np.int64)
        sizes = np.diff(off)
        single = {1: 1, 3: 2}.get(fixed)
        types.append(np.where(sizes == single, fixed, varying) if single else np.full(len(sizes), fixed))
        offsets.append(off[1:] + start)
        conns.append(ns.vtk_to_numpy(array.GetConnectivityArray()).astype(np.int64))
        start += int(off[-1])
    if not types:
        return np.zeros(0, np.int64), offsets[0], np.zeros(0, np.int64)
    return np.concatenate(types), np.concatenate(offsets), np.concatenate(conns)


def _fields(data: Any, n: int, ns: Any) -> dict[str, np.ndarray]:
    """The numeric arrays of vtk point or cell data, by name, ``(n,)`` or ``(n, components)``."""
    out = {}
    for i in range(data.GetNumberOfArrays()):  # fields, not nodes: a handful
        array = data.GetArray(i)
        name = data.GetArrayName(i)
        if array is None or not name or array.GetNumberOfTuples() != n:
            continue
        values = ns.vtk_to_numpy(array)
        out[name] = np.array(values, copy=True)
    return out


def _blocks(types: np.ndarray, starts: np.ndarray, sizes: np.ndarray, conn: np.ndarray,
            path: Path) -> tuple[list[tuple[str, np.ndarray]], list[np.ndarray], int]:
    """The cells (each its VTK type, where its nodes start in ``conn`` and how many) grouped into
    meshio blocks in order of first appearance, each block's rows in the cell order (a polygon of
    more than four nodes or a triangle strip is split into triangles that share its row), and the
    highest cell dimension (-1 without cells)."""
    code = types.copy()
    # cells of a varying size that are a fixed type (a polygon of 4 nodes is a quad)
    for vtk_type, size, fixed in ((2, 1, 1), (4, 2, 3), (6, 3, 5), (7, 3, 5), (7, 4, 9)):
        code[(types == vtk_type) & (sizes == size)] = fixed
    unique, first = np.unique(code, return_index=True)
    found: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    dim = -1
    for t in unique[np.argsort(first)].tolist():  # cell types, not cells: a handful
        sel = np.flatnonzero(code == t)
        if t == 2:  # poly-vertex cells (a cloud's points, often one cell): one vertex cell per point
            nodes = conn[np.repeat(starts[sel], sizes[sel]) + _ranks(sizes[sel])]
            found.setdefault("vertex", ([], []))[0].append(nodes[:, None])
            found["vertex"][1].append(np.repeat(sel, sizes[sel]))
            dim = max(dim, 0)
            continue
        if t in (6, 7):
            for k in np.unique(sizes[sel]).tolist():  # polygon and strip sizes: a handful
                rows = sel[sizes[sel] == k]
                nodes = conn[starts[rows][:, None] + np.arange(k)]
                tris = _fan(nodes) if t == 7 else _strip(nodes)
                found.setdefault("triangle", ([], []))[0].append(tris.reshape(-1, 3))
                found["triangle"][1].append(np.repeat(rows, k - 2))
            dim = max(dim, 2)
            continue
        if t not in _TYPES:
            raise cell_type_refusal(int(t), path)
        name, cell_dim, order = _TYPES[t]
        block = conn[starts[sel][:, None] + np.arange(int(sizes[sel[0]]))]
        if order is not None:
            block = block[:, list(order)]
        found.setdefault(name, ([], []))[0].append(block)
        found[name][1].append(sel)
        dim = max(dim, cell_dim)
    blocks = [(name, np.concatenate(c)) for name, (c, _) in found.items()]
    return blocks, [np.concatenate(r) for _, r in found.values()], dim


def _ranks(sizes: np.ndarray) -> np.ndarray:
    """``0..k-1`` for each size ``k``, concatenated: ``[2, 3]`` -> ``[0, 1, 0, 1, 2]``."""
    return np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def _fan(nodes: np.ndarray) -> np.ndarray:
    """Polygons ``(C, k)`` as the ``k - 2`` triangles of a fan from their first node, ``(C, k - 2, 3)``."""
    i = np.arange(1, nodes.shape[1] - 1)
    return np.stack([np.broadcast_to(nodes[:, :1], (len(nodes), len(i))), nodes[:, i], nodes[:, i + 1]], axis=2)


def _strip(nodes: np.ndarray) -> np.ndarray:
    """Triangle strips ``(C, k)`` as their ``k - 2`` triangles, every other one turned to keep the
    orientation, ``(C, k - 2, 3)``."""
    i = np.arange(nodes.shape[1] - 2)
    odd = (i % 2 == 1)
    a = np.where(odd, i + 1, i)
    b = np.where(odd, i, i + 1)
    return np.stack([nodes[:, a], nodes[:, b], nodes[:, i + 2]], axis=2)


# ---------------------------------------------------------------------------------------------
# Pieces joined, multiblocks


def _join(parts: list[_Piece], path: Path) -> _Piece:
    """Several pieces as one (points and cells appended, cells renumbered); the fields every
    piece has, with the same number of components."""
    base = np.cumsum([0] + [len(p.points) for p in parts])
    cell_base = np.cumsum([0] + [sum(len(c) for _, c in p.cells) for p in parts])
    blocks: dict[str, list[np.ndarray]] = {}
    rows: dict[str, list[np.ndarray]] = {}
    for p, b, cb in zip(parts, base, cell_base):
        for (t, c), r in zip(p.cells, p.rows):
            blocks.setdefault(t, []).append(c + b)
            rows.setdefault(t, []).append(r + cb)

    def common(attr: str) -> dict[str, np.ndarray]:
        first = getattr(parts[0], attr)
        names = [n for n, v in first.items()
                 if all(n in getattr(p, attr) and getattr(p, attr)[n].shape[1:] == v.shape[1:] for p in parts)]
        return {n: np.concatenate([getattr(p, attr)[n] for p in parts]) for n in names}

    return _Piece(parts[0].name, np.concatenate([p.points for p in parts]),
                  [(t, np.concatenate(c)) for t, c in blocks.items()], [np.concatenate(r) for r in rows.values()],
                  common("point_data"), common("cell_data"), max(p.dim for p in parts),
                  pieces=sum(p.pieces for p in parts))


def _merge_coincident(piece: _Piece) -> _Piece:
    """``piece`` with the nodes at exactly the same coordinates merged into the first of them
    (pieces of one mesh repeat the nodes they share); node order otherwise kept."""
    pts = piece.points + 0.0  # -0.0 and 0.0 are one coordinate
    _, first, inverse = np.unique(pts, axis=0, return_index=True, return_inverse=True)
    if len(first) == len(pts):
        return piece
    order = np.argsort(first)
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    new_id = rank[inverse.reshape(-1)]
    keep = first[order]
    return _Piece(piece.name, piece.points[keep], [(t, new_id[c]) for t, c in piece.cells], piece.rows,
                  {k: v[keep] for k, v in piece.point_data.items()}, piece.cell_data, piece.dim, piece.pieces,
                  {k: np.unique(new_id[v]) for k, v in piece.point_sets.items()})


def _multiblock(parts: list[_Piece], path: Path, notes: Callable[[str], None] | None) -> _Piece:
    """A ``.vtm``'s mesh (the ``internal`` block, else the blocks of the highest dimension,
    joined) with its lower-dimensional blocks as named node sets."""
    leaf = [p.name.split("/")[-1] for p in parts]
    internal = [i for i, n in enumerate(leaf) if n == "internal"]
    top = max(p.dim for p in parts)
    volume = internal if len(internal) == 1 else [i for i, p in enumerate(parts) if p.dim == top]
    mesh = _join([parts[i] for i in volume], path) if len(volume) > 1 else parts[volume[0]]
    if len(volume) > 1:
        mesh = _merge_coincident(mesh)
    short = Counter(leaf[i] for i in range(len(parts)) if i not in volume)
    extent = np.ptp(mesh.points, axis=0).max() if len(mesh.points) else 0.0
    tol = 1e-6 * float(extent)
    sets: dict[str, np.ndarray] = {}
    left_out = []
    for i, p in enumerate(parts):
        if i in volume:
            continue
        name = leaf[i] if short[leaf[i]] == 1 else p.name
        ids = match_nodes(mesh.points, p.points, tol) if 0 < p.dim < mesh.dim else None
        if ids is None:
            left_out.append(name)
            continue
        sets[name] = np.unique(ids)
    if left_out and notes is not None:
        notes(f"{path}: {plural(len(left_out), 'block')} left out, not a boundary of the mesh (not of a lower "
              f"dimension, or not on its nodes): {listed(left_out)}")
    mesh.point_sets = sets
    return mesh
