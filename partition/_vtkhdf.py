"""VTKHDF unstructured grids (ParaView's HDF5 VTK format), read one slice at a time.

A ``.vtkhdf`` file holds one ``/VTKHDF`` group of ``Type`` ``UnstructuredGrid``::

    /VTKHDF                      attributes Version (2, 0), Type "UnstructuredGrid"
    ├── NumberOfPoints           (1,) int64: N
    ├── NumberOfCells            (1,) int64: C
    ├── NumberOfConnectivityIds  (1,) int64: M
    ├── Points                   (N, 3) float64
    ├── Types                    (C,) uint8, VTK cell type ids
    ├── Offsets                  (C + 1,) int64, cell c's nodes are Connectivity[Offsets[c]:Offsets[c + 1]]
    ├── Connectivity             (M,) int64, node ids in [0, N)
    └── PointData/               one (N,) or (N, k) dataset per field (optional)

Rank ``r`` of ``P`` reads the points ``[block_start(N, r, P), block_start(N, r + 1, P))`` and the
cells ``[block_start(C, r, P), ...)`` by hyperslabs (:func:`read_slice`): nothing of the global
length is read whole. One process reads the whole file as the slice of rank 0 of 1, which is how
``read_input`` reads a ``.vtkhdf``. Only files of one piece are read (``NumberOfPoints`` of length
1); ``meshshard convert`` writes such files (:func:`write_vtkhdf`, ``_convert.py``). Links out of the file (HDF5
external links, virtual or external datasets) are refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._graph import Cells
from ._readers import _EXPANSION_FLOOR, max_expansion, open_regular

__all__ = ["VTKHDF_SUFFIX", "VtkHdfSlice", "block_start", "block_owner", "read_point_data", "read_slice",
           "read_vtkhdf", "vtkhdf_counts", "write_vtkhdf", "write_vtkhdf_slabs"]

VTKHDF_SUFFIX = ".vtkhdf"

#: VTK cell type id -> meshio cell type name (the types whose nodal graph meshshard knows).
VTK_TYPES: dict[int, str] = {
    1: "vertex", 3: "line", 5: "triangle", 7: "polygon", 9: "quad", 10: "tetra", 12: "hexahedron",
    13: "wedge", 14: "pyramid", 21: "line3", 22: "triangle6", 23: "quad8", 24: "tetra10",
    25: "hexahedron20", 26: "wedge15", 27: "pyramid13", 28: "quad9", 29: "hexahedron27",
}
_MESHIO_TYPES = {name: vtk for vtk, name in VTK_TYPES.items()}
#: Node orders that differ between meshio and VTK: ``vtk_nodes = meshio_nodes[:, order]``.
_MESHIO_TO_VTK = {"wedge15": np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 9, 10, 11])}
_SCALARS = ("NumberOfPoints", "NumberOfCells", "NumberOfConnectivityIds")
_DATASETS = ("Points", "Types", "Offsets", "Connectivity")


def block_start(total: int, rank: int, size: int) -> int:
    """First item of rank ``rank``'s block of ``total`` items over ``size`` ranks: ``rank * total // size``."""
    return rank * total // size


def block_owner(ids: np.ndarray, total: int, size: int) -> np.ndarray:
    """The rank whose block holds each id (the inverse of :func:`block_start`), ``(M,)`` int64.

    Id ``g`` is in block ``r`` when ``r * total // size <= g < (r + 1) * total // size``, that is
    ``r = ((g + 1) * size - 1) // total``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    return ((ids + 1) * size - 1) // max(total, 1)


@dataclass(frozen=True, eq=False)
class VtkHdfSlice:
    """One rank's slice of a VTKHDF unstructured grid.

    Args:
        num_nodes: ``N``, the whole grid's point count.
        num_cells: ``C``, the whole grid's cell count.
        first_node: Global id of ``pos[0]`` (``block_start(N, rank, size)``).
        pos: Coordinates of the points of this rank's block.
        cells: This rank's cells as meshio-style blocks ``(type, connectivity)``, global node ids,
            one block per (type, node count) in order of first appearance.

    Shapes:
        pos: ``(N_block, 3)`` float64. connectivity: ``(C_b, k_b)``, int32 while ``N < 2^31 - 1``,
        else int64.
    """

    num_nodes: int
    num_cells: int
    first_node: int
    pos: np.ndarray
    cells: Cells


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ValueError("reading or writing .vtkhdf files needs the h5py package, which is not installed "
                         "(pip install h5py)") from None
    return h5py


def _dataset(root: Any, name: str, h5py: Any) -> Any:
    """The dataset ``/VTKHDF/name``, a hard link to data stored in this file."""
    link = root.get(name, getlink=True)
    if link is None:
        raise ValueError(f"Expected a VTKHDF dataset {name!r} (got none)")
    if not isinstance(link, h5py.HardLink):
        raise ValueError(f"Expected {name!r} stored in the file (got a {type(link).__name__}, refused)")
    data = root[name]
    if not isinstance(data, h5py.Dataset):
        raise ValueError(f"Expected {name!r} to be a dataset (got a group)")
    plist = data.id.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count() > 0:
        raise ValueError(f"Expected {name!r} stored in the file (got a virtual or external dataset, refused)")
    return data


def _root(file: Any, h5py: Any) -> Any:
    root = file.get("VTKHDF", getlink=True)
    if not isinstance(root, h5py.HardLink) or not isinstance(file["VTKHDF"], h5py.Group):
        raise ValueError("Expected a VTKHDF group at the root of the file (got none)")
    root = file["VTKHDF"]
    kind = root.attrs.get("Type")
    kind = kind.decode("ascii", "replace") if isinstance(kind, bytes) else str(kind)
    if kind != "UnstructuredGrid":
        raise ValueError(f"Expected a VTKHDF UnstructuredGrid (got Type {kind!r})")
    return root


def _counts(root: Any, h5py: Any, file_size: int) -> tuple[int, int, int]:
    """``(N, C, M)``, checked against the datasets' shapes, and those against the file's size: a
    dataset may declare at most ``max(64 MiB, MESHSHARD_MAX_EXPANSION x the file's size)`` bytes (a
    compressed or sparse dataset of terabytes that holds nothing is refused before a slice is read)."""
    bound = max(_EXPANSION_FLOOR, int(max_expansion() * file_size))
    found = []
    for name in _SCALARS:
        data = _dataset(root, name, h5py)
        if data.shape != (1,):
            raise ValueError(f"Expected one piece ({name} of shape (1,), got {data.shape}); "
                             "meshshard convert writes a file of one piece")
        value = int(data[0])
        if value < 0:
            raise ValueError(f"Expected {name} >= 0 (got {value})")
        found.append(value)
    n, c, m = found
    shapes = {"Points": (n, 3), "Types": (c,), "Offsets": (c + 1,), "Connectivity": (m,)}
    for name, shape in shapes.items():
        data = _dataset(root, name, h5py)
        if data.shape != shape:
            raise ValueError(f"Expected {name} of shape {shape} (got {data.shape})")
        declared = int(np.prod(shape, dtype=np.float64)) * data.dtype.itemsize
        if declared > bound:
            raise ValueError(f"{name} declares {declared:,} bytes, more than MESHSHARD_MAX_EXPANSION allows "
                             f"for a file of {file_size:,} bytes ({bound:,})")
    return n, c, m


def vtkhdf_counts(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(N, C)``: the points and cells of a ``.vtkhdf`` file, from its headers."""
    h5py = _h5py()
    with open_regular(path) as raw, h5py.File(raw, "r") as file:
        n, c, _ = _counts(_root(file, h5py), h5py, os.fstat(raw.fileno()).st_size)
    return n, c


def _cell_blocks(types: np.ndarray, offsets: np.ndarray, conn: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Cells as meshio-style blocks, one per (type, node count) in order of first appearance."""
    sizes = np.diff(offsets)
    if len(sizes) and (types == types[0]).all() and (sizes == sizes[0]).all():  # one type: no copy
        name = VTK_TYPES.get(int(types[0]))
        if name is not None and name not in _MESHIO_TO_VTK:
            return [(name, conn.reshape(-1, int(sizes[0])))]
    keys = types.astype(np.int64) * (1 << 32) + sizes
    uniq, first = np.unique(keys, return_index=True)
    blocks = []
    for key in uniq[np.argsort(first)]:
        vtk, k = int(key >> 32), int(key & ((1 << 32) - 1))
        name = VTK_TYPES.get(vtk)
        if name is None:
            raise ValueError(f"Expected VTK cell types in {sorted(VTK_TYPES)} (got {vtk})")
        rows = np.flatnonzero(keys == key)
        block = conn[offsets[rows][:, None] - offsets[0] + np.arange(k)]
        if name in _MESHIO_TO_VTK:
            block = block[:, np.argsort(_MESHIO_TO_VTK[name])]
        blocks.append((name, block))
    return blocks


def read_slice(path: str | os.PathLike[str], rank: int = 0, size: int = 1) -> VtkHdfSlice:
    """Rank ``rank`` of ``size``'s block of points and of cells (see the module docstring).

    Raises:
        ValueError: not a one-piece VTKHDF unstructured grid, inconsistent sizes or offsets, node ids out of
            range, an unknown cell type, non-finite coordinates (each found in this rank's slice).
    """
    h5py = _h5py()
    with open_regular(path) as raw, h5py.File(raw, "r") as file:
        root = _root(file, h5py)
        n, c, m = _counts(root, h5py, os.fstat(raw.fileno()).st_size)
        p0, p1 = block_start(n, rank, size), block_start(n, rank + 1, size)
        c0, c1 = block_start(c, rank, size), block_start(c, rank + 1, size)
        pos = np.asarray(root["Points"][p0:p1], dtype=np.float64).reshape(-1, 3)
        offsets = np.asarray(root["Offsets"][c0:c1 + 1], dtype=np.int64)
        types = np.asarray(root["Types"][c0:c1])
        if len(offsets) and (offsets[0] < 0 or offsets[-1] > m or (np.diff(offsets) < 0).any()
                             or (c1 == c and offsets[-1] != m) or (c0 == 0 and offsets[0] != 0)):
            raise ValueError(f"Expected Offsets rising from 0 to NumberOfConnectivityIds {m} "
                             f"(got [{offsets.min()}, {offsets.max()}] in cells {c0}..{c1})")
        # int32 while node ids fit: half the memory of the cells (and of the cell edges made from them)
        conn = np.asarray(root["Connectivity"][offsets[0]:offsets[-1]] if len(offsets) else [],
                          dtype=np.int32 if n < 2**31 - 1 else np.int64)
    if not np.isfinite(pos).all():
        raise ValueError(f"Expected finite point coordinates (got NaN or infinity among points {p0}..{p1})")
    if conn.size and (conn.min() < 0 or conn.max() >= n):
        raise ValueError(f"Expected node ids in [0, {n}) in Connectivity (got [{conn.min()}, {conn.max()}])")
    return VtkHdfSlice(num_nodes=n, num_cells=c, first_node=p0, pos=pos,
                       cells=_cell_blocks(types, offsets, conn))


def read_point_data(path: str | os.PathLike[str], names: list[str], start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows ``[start, stop)`` of the named ``PointData`` fields, by hyperslabs (nothing else is read).

    Shapes:
        each field: ``(stop - start,)`` or ``(stop - start, k)``, as stored.

    Raises:
        ValueError: a field that is not there (the fields that are, listed), or not numbers of ``(N,)`` or ``(N, k)``.
    """
    h5py = _h5py()
    with open_regular(path) as raw, h5py.File(raw, "r") as file:
        root = _root(file, h5py)
        n, _, _ = _counts(root, h5py, os.fstat(raw.fileno()).st_size)
        group = root.get("PointData")
        have = sorted(group.keys()) if isinstance(group, h5py.Group) else []
        out = {}
        for name in names:
            if name not in have:
                raise ValueError(f"Expected a point field {name!r} (got {', '.join(have) or 'no point fields'})")
            data = _dataset(group, name, h5py)
            if data.shape[:1] != (n,) or data.ndim > 2 or data.dtype.kind not in "biuf":
                raise ValueError(f"Expected point field {name!r} of numbers of shape ({n},) or ({n}, k) "
                                 f"(got {data.shape}, {data.dtype})")
            out[name] = np.asarray(data[start:stop])
    return out


def read_vtkhdf(path: str | os.PathLike[str]) -> tuple[np.ndarray, Cells]:
    """The whole grid in one process: ``(pos (N, 3), cells)``."""
    whole = read_slice(path, 0, 1)
    return whole.pos, whole.cells


def _new_root(file: Any, h5py: Any, num_points: int, num_cells: int, num_ids: int) -> Any:
    """The ``/VTKHDF`` group of a new file, with its attributes and its three counts."""
    root = file.create_group("VTKHDF")
    root.attrs["Version"] = np.array([2, 0], dtype=np.int64)
    kind = "UnstructuredGrid".encode("ascii")
    root.attrs.create("Type", kind, dtype=h5py.string_dtype("ascii", len(kind)))
    for name, value in zip(_SCALARS, (num_points, num_cells, num_ids)):
        root.create_dataset(name, data=np.array([value], dtype=np.int64))
    return root


def write_vtkhdf(path: str | os.PathLike[str], points: np.ndarray, cells: Cells,
                 point_data: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write a one-piece VTKHDF unstructured grid (version 2.0), readable by VTK's ``vtkHDFReader``.

    Args:
        path: The file to write (replaced when it exists).
        points: Coordinates; 2-D points get a zero third coordinate (VTK's points are 3-D).
        cells: ``[(meshio cell type, connectivity), ...]``.
        point_data: Fields per point, written under ``PointData``.

    Shapes:
        points: ``(N, 2)`` or ``(N, 3)``. connectivity: ``(C_b, k_b)``. point_data: ``(N,)`` or ``(N, k)``.
    """
    h5py = _h5py()
    pos = np.asarray(points, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] not in (2, 3):
        raise ValueError(f"Expected points of shape (N, 2) or (N, 3) (got {pos.shape})")
    if pos.shape[1] == 2:
        pos = np.concatenate([pos, np.zeros((len(pos), 1))], axis=1)
    types, sizes, conns = [], [], []
    for name, block in cells:
        block = np.asarray(block, dtype=np.int64)
        if name not in _MESHIO_TYPES:
            raise ValueError(f"Expected cell types in {sorted(_MESHIO_TYPES)} (got {name!r})")
        if block.ndim != 2:
            raise ValueError(f"Expected {name} cells of shape (C, k) (got {block.shape})")
        if block.size and (block.min() < 0 or block.max() >= len(pos)):
            raise ValueError(f"Expected {name} node ids in [0, {len(pos)}) (got [{block.min()}, {block.max()}])")
        if name in _MESHIO_TO_VTK:
            block = block[:, _MESHIO_TO_VTK[name]]
        types.append(np.full(len(block), _MESHIO_TYPES[name], dtype=np.uint8))
        sizes.append(np.full(len(block), block.shape[1], dtype=np.int64))
        conns.append(block.reshape(-1))
    type_ids = np.concatenate(types) if types else np.zeros(0, dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(sizes))]) if sizes else np.zeros(1, dtype=np.int64)
    conn = np.concatenate(conns) if conns else np.zeros(0, dtype=np.int64)
    path = Path(path)
    with h5py.File(path, "w") as file:
        root = _new_root(file, h5py, len(pos), len(type_ids), len(conn))
        root.create_dataset("Points", data=pos)
        root.create_dataset("Types", data=type_ids)
        root.create_dataset("Offsets", data=offsets.astype(np.int64))
        root.create_dataset("Connectivity", data=conn)
        fields = root.create_group("PointData")
        for name, values in (point_data or {}).items():
            values = np.asarray(values)
            if values.shape[:1] != (len(pos),) or values.dtype.kind not in "biuf":
                continue  # only numeric per-point fields (meshio may carry others)
            fields.create_dataset(str(name), data=values)
    return path


def write_vtkhdf_slabs(path: str | os.PathLike[str], num_points: int, num_cells: int, cell_type: str,
                       slabs: Iterable[tuple[np.ndarray, np.ndarray]]) -> Path:
    """Write a one-piece VTKHDF grid of one cell type slab by slab, never holding the whole mesh.

    The file is the one :func:`write_vtkhdf` writes for the concatenated slabs (a mesh made, or
    read, a piece at a time: its points and cells in order); the memory is that of one slab.

    Args:
        path: The file to write (replaced when it exists).
        num_points: ``N``, the points of all the slabs together.
        num_cells: ``C``, the cells of all the slabs together.
        cell_type: The meshio cell type of every cell (``"tetra"``), one of VTK's fixed-size types.
        slabs: ``(points, cells)`` pairs in order; either may be empty; cells hold global node ids.

    Shapes:
        points: ``(N_slab, 3)``. cells: ``(C_slab, k)``, the same ``k`` in every slab.

    Raises:
        ValueError: an unknown cell type, a slab of the wrong shape, node ids out of ``[0, N)``,
            or slabs that add up to other counts than ``num_points`` and ``num_cells``.
    """
    h5py = _h5py()
    if cell_type not in _MESHIO_TYPES or cell_type in _MESHIO_TO_VTK or cell_type == "polygon":
        raise ValueError(f"Expected a fixed-size cell type in {sorted(set(_MESHIO_TYPES) - {'polygon'})} "
                         f"(got {cell_type!r})")
    path = Path(path)
    try:
        with h5py.File(path, "w") as file:
            _fill_slabs(file, h5py, num_points, num_cells, cell_type, slabs)
    except BaseException:
        path.unlink(missing_ok=True)  # nothing half-written is left behind
        raise
    return path


def _fill_slabs(file: Any, h5py: Any, num_points: int, num_cells: int, cell_type: str,
                slabs: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
    root, k, p, c = None, 0, 0, 0
    for points, cells in slabs:
        points, cells = np.asarray(points, dtype=np.float64), np.asarray(cells)
        if root is None:
            k = cells.shape[1] if cells.ndim == 2 else 0
            root = _new_root(file, h5py, num_points, num_cells, num_cells * k)
            for name, shape, dtype in (("Points", (num_points, 3), np.float64), ("Types", (num_cells,), np.uint8),
                                       ("Offsets", (num_cells + 1,), np.int64),
                                       ("Connectivity", (num_cells * k,), np.int64)):
                root.create_dataset(name, shape, dtype=dtype)
            root.create_group("PointData")
        if points.ndim != 2 or points.shape[1] != 3 or cells.ndim != 2 or cells.shape[1] != k:
            raise ValueError(f"Expected slabs of points (n, 3) and {cell_type} cells (c, {k}) "
                             f"(got {points.shape} and {cells.shape})")
        if p + len(points) > num_points or c + len(cells) > num_cells:
            raise ValueError(f"Expected slabs of {num_points} points and {num_cells} cells in all (got more)")
        if cells.size and (cells.min() < 0 or cells.max() >= num_points):
            raise ValueError(f"Expected {cell_type} node ids in [0, {num_points}) (got [{cells.min()}, {cells.max()}])")
        root["Points"][p:p + len(points)] = points
        root["Types"][c:c + len(cells)] = _MESHIO_TYPES[cell_type]
        root["Offsets"][c:c + len(cells) + 1] = np.arange(c, c + len(cells) + 1, dtype=np.int64) * k
        root["Connectivity"][c * k:(c + len(cells)) * k] = cells.reshape(-1)
        p, c = p + len(points), c + len(cells)
    if root is None or (p, c) != (num_points, num_cells):
        raise ValueError(f"Expected slabs of {num_points} points and {num_cells} cells in all (got {p} and {c})")
