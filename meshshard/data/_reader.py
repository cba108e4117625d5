"""Reading a dataset folder (the format: :mod:`meshshard.data._dataset`): :func:`open_dataset` ->
:class:`Dataset`, which reads ``dataset.json`` up front and memory-maps the arrays on use, so that
a rank reads only its own rows; :class:`Mesh`, one stored mesh.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._dataset import METADATA_FILE, SURFACE, mesh_checksum, read_dataset_metadata
from ._statistics import Normalisation

if TYPE_CHECKING:  # imported where used: a training rank reading samples needs no scipy
    from meshshard.partition import Graph

__all__ = ["Mesh", "Dataset", "open_dataset"]


@dataclass(frozen=True, eq=False)
class Mesh:
    """One stored mesh. Shapes: points ``(N, D)``; cells ``(C_b, k_b)`` per type; edge_index ``(2, E)``."""

    points: np.ndarray
    cells: list[tuple[str, np.ndarray]]
    edge_index: np.ndarray | None
    sha256: str

    @property
    def num_nodes(self) -> int:
        return len(self.points)

    def graph(self) -> Graph:
        """The nodal graph training uses (edges of the cells, or the stored edge_index)."""
        from meshshard.partition import Graph, nodal_graph

        if self.edge_index is None:
            return nodal_graph(self.cells, self.num_nodes, pos=self.points)
        return Graph.from_edge_index(self.edge_index, self.num_nodes, pos=self.points)


class Dataset:
    """A dataset folder opened for reading; only ``dataset.json`` is read up front.

    Attributes:
        path: The folder. meta: ``dataset.json``. kind: ``"one-mesh"`` or ``"many-meshes"``.
        num_samples, train, val: ``train`` / ``val`` sample indices (int64 arrays).
        input_channels, target_channels, edge_channels: channel names.
        normalisation: The :class:`Normalisation` of the training split.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.meta = read_dataset_metadata(self.path)
        m = self.meta
        self.kind: str = m["kind"]
        self.num_samples: int = m["num_samples"]
        self.train = np.asarray(m["split"]["train"], dtype=np.int64)
        self.val = np.asarray(m["split"]["val"], dtype=np.int64)
        self.input_channels: list[str] = m["input_channels"]
        self.target_channels: list[str] = m["target_channels"]
        self.edge_channels: list[str] = m["edge_channels"]
        self.normalisation = Normalisation.from_dict(m["normalisation"], self.input_channels,
                                                     self.target_channels, self.edge_channels)

    @property
    def num_meshes(self) -> int:
        return len(self.meta["meshes"])

    def sample_mesh(self, sample: int) -> int:
        """Index of the mesh sample ``sample`` lives on."""
        return int(self.meta["samples"][self.sample_index(sample)]["mesh"])

    def num_nodes(self, sample: int) -> int:
        """The node count of sample ``sample``'s mesh."""
        return int(self.meta["meshes"][self.sample_mesh(sample)]["num_nodes"])

    def sample_index(self, sample: int) -> int:
        """``sample`` as an index, checked to be in ``[0, num_samples)``."""
        if not 0 <= int(sample) < self.num_samples:
            raise ValueError(f"Expected a sample in [0, {self.num_samples}) (got {sample})")
        return int(sample)

    def load_npy(self, file: Path, mmap_mode: str | None) -> np.ndarray:
        """``np.load`` of a file of this folder: never a link (it could point anywhere) or a special
        file (a FIFO would block the reader)."""
        if file.is_symlink() or (file.exists() and not file.is_file()):
            raise ValueError(f"{file}: not a regular file of the dataset folder (a link or a special file); "
                             "refusing to read it")
        return np.load(file, mmap_mode=mmap_mode, allow_pickle=False)

    def _array(self, file: Path, rows: int, width: int | None) -> np.ndarray:
        try:
            a = self.load_npy(file, "r")
        except FileNotFoundError:
            raise ValueError(f"{file}: missing (the dataset folder is incomplete)") from None
        except (ValueError, OSError) as err:
            raise ValueError(f"{file}: not a readable .npy file ({err})") from None
        if a.ndim != 2 or a.shape[0] != rows or (width is not None and a.shape[1] != width) or a.dtype.kind != "f":
            raise ValueError(f"{file}: Expected a float array of shape ({rows}, {width}) (got {a.dtype} {a.shape})")
        return a

    def sample_arrays(self, sample: int) -> tuple[np.ndarray, np.ndarray]:
        """Memory maps of a sample's inputs ``(N, F_in)`` and targets ``(N, F_out)`` (nothing read yet)."""
        s = self.sample_index(sample)
        folder = self.path / "samples" / f"{s:05d}"
        n = self.num_nodes(s)
        return (self._array(folder / "inputs.npy", n, len(self.input_channels)),
                self._array(folder / "targets.npy", n, len(self.target_channels)))

    def rows(self, sample: int, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unnormalised inputs and targets of ``node_ids`` (global ids) only, float64.

        Shapes:
            node_ids: ``(n,)``. Returns ``(n, F_in)`` and ``(n, F_out)``.
        """
        inputs, targets = self.sample_arrays(sample)
        ids = np.asarray(node_ids, dtype=np.int64)
        return np.asarray(inputs[ids], dtype=np.float64), np.asarray(targets[ids], dtype=np.float64)

    def parameters(self, sample: int) -> dict[str, float]:
        """Sample ``sample``'s parameters (``--params``), by name; empty without a table."""
        table = self.meta.get("parameters") or {"names": [], "values": []}
        row = table["values"][self.sample_index(sample)] if table["names"] else []
        return {str(n): float(v) for n, v in zip(table["names"], row)}

    def target_factors(self, sample: int, scales: Mapping[str, str] | None = None,
                       fields: Sequence[Mapping[str, Any]] | None = None) -> np.ndarray:
        """``(F_out,)``: what sample ``sample``'s targets (stored, or predicted) are multiplied by to
        be in physical units: each field's ``scales`` expression (default: this dataset's
        ``target_scales``) evaluated on the sample's parameters, 1 for a field without one.
        ``fields``: the target fields, ``[{"name", "components"}]`` (default: this dataset's)."""
        from ._expressions import evaluate_expression

        scales = (self.meta.get("target_scales") or {}) if scales is None else scales
        fields = self.meta["targets"] if fields is None else fields
        values = self.parameters(sample) if scales else {}
        factors: list[float] = []
        for f in fields:
            expression = scales.get(str(f["name"]))
            factor = evaluate_expression(expression, values) if expression else 1.0
            factors += [factor] * int(f["components"])
        return np.asarray(factors, dtype=np.float64)

    def mesh_folder(self, index: int) -> Path:
        """The folder of mesh ``index`` (``meshes/NNNNN``), the one place its path is made."""
        if not 0 <= index < self.num_meshes:
            raise ValueError(f"Expected a mesh in [0, {self.num_meshes}) (got {index})")
        return self.path / "meshes" / f"{index:05d}"

    def mesh_points(self, index: int) -> np.ndarray:
        """The coordinates of mesh ``index``, ``(N, D)``, as a read-only memory map (read the rows
        you need: a rank writing its piece never reads the whole mesh)."""
        entry = self.meta["meshes"][index]
        return self._array(self.mesh_folder(index) / "points.npy", entry["num_nodes"], entry["pos_dim"])

    def mesh_cells(self, index: int, cell_type: str) -> np.ndarray:
        """The cells of one type of mesh ``index``, ``(C, k)`` node ids, as a read-only memory map
        (a regular file inside the folder, never a link; check the ids of what you read)."""
        return self.load_npy(self.mesh_folder(index) / f"cells-{cell_type}.npy", "r")

    def boundary_names(self, index: int) -> list[str]:
        """The named boundaries stored with mesh ``index`` (patches, node sets, gmsh groups), and
        ``"surface"`` for a surface in 3-D (every point, :meth:`boundary_rows`)."""
        entry = self.meta["meshes"][index]
        names = [str(b["name"]) for b in entry.get("boundaries", [])]
        return names + ([SURFACE] if "surface_area" in entry and SURFACE not in names else [])

    def boundary_rows(self, index: int, name: str, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of the nodes ``node_ids`` (sorted global ids, a rank's own), which lie on boundary
        ``name`` (their positions in ``node_ids``) and the area vector of each, out of the fluid.
        ``"surface"`` is every point of a surface sample, its area vector the faces' (wound out of
        the body, into the fluid) turned around; only the rows asked for are read.

        Shapes:
            node_ids ``(n,)`` -> ``(m,)`` int64 positions, ``(m, D)``.
        """
        ids = np.asarray(node_ids, dtype=np.int64)
        entry = self.meta["meshes"][index]
        stored = [str(b["name"]) for b in entry.get("boundaries", [])]
        if name == SURFACE and name not in stored and "surface_area" in entry:
            file = self.mesh_folder(index) / "surface-area.npy"
            vectors = self.load_npy(file, "r")
            if vectors.shape != (entry["num_nodes"], 3):
                raise ValueError(f"{file}: damaged (Expected ({entry['num_nodes']}, 3), got {vectors.shape})")
            return np.arange(len(ids), dtype=np.int64), -np.asarray(vectors[ids], dtype=np.float64)
        on, area = self.boundary(index, name)
        if not len(on) or not len(ids):
            return np.zeros(0, dtype=np.int64), np.zeros((0, entry["pos_dim"]))
        at = np.minimum(np.searchsorted(on, ids), len(on) - 1)
        hit = on[at] == ids
        return np.flatnonzero(hit), area[at[hit]]

    def boundary(self, index: int, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Boundary ``name`` of mesh ``index``: its sorted node ids ``(n,)`` and the area vector
        each stands for ``(n, D)`` (out of the mesh; :mod:`meshshard.data._surface`). A
        boundary is a small part of a mesh, so both are read whole."""
        names = self.boundary_names(index)
        if name not in names:
            raise ValueError(f"{self.path}: Expected a named boundary of mesh {index} (got {name!r}; it has "
                             + (", ".join(names) if names else "none: they come from a .vtm's patches, a file's "
                                "node sets or gmsh physical groups") + ")")
        k = names.index(name)
        entry = self.meta["meshes"][index]
        folder = self.mesh_folder(index)
        try:
            ids = np.asarray(self.load_npy(folder / f"boundary-{k:03d}.npy", None))
            area = np.asarray(self.load_npy(folder / f"boundary-{k:03d}-area.npy", None))
        except (OSError, ValueError) as err:
            raise ValueError(f"{folder}: boundary {name!r} unreadable ({err})") from None
        n = int(entry["boundaries"][k]["num_nodes"])
        if (ids.shape != (n,) or ids.dtype.kind != "i" or area.shape != (n, entry["pos_dim"])
                or (n and (ids.min() < 0 or ids.max() >= entry["num_nodes"] or (np.diff(ids) <= 0).any()))):
            raise ValueError(f"{folder}: boundary {name!r} is damaged (Expected {n} sorted node ids in "
                             f"[0, {entry['num_nodes']}) and their ({n}, {entry['pos_dim']}) area vectors)")
        return ids.astype(np.int64), area.astype(np.float64)

    def surface_area(self, index: int) -> np.ndarray | None:
        """The area vector of each point of mesh ``index`` when it is a surface in 3-D, ``(N, 3)``
        (length: the point's lumped area; direction: its normal by the faces' winding), else None."""
        entry = self.meta["meshes"][index]
        if "surface_area" not in entry:
            return None
        file = self.mesh_folder(index) / "surface-area.npy"
        try:
            vectors = np.asarray(self.load_npy(file, None))
        except (OSError, ValueError) as err:
            raise ValueError(f"{file}: unreadable ({err})") from None
        if vectors.shape != (entry["num_nodes"], 3) or vectors.dtype.kind != "f":
            raise ValueError(f"{file}: damaged (Expected a float array of shape ({entry['num_nodes']}, 3), got "
                             f"{vectors.dtype} {vectors.shape})")
        return vectors.astype(np.float64)

    def point_areas(self, index: int, node_ids: np.ndarray) -> np.ndarray | None:
        """The area each of the points ``node_ids`` of mesh ``index`` stands for (its share of the
        faces around it), read from ``surface-point-area.npy`` (only those rows); None when the
        dataset does not store it (not a surface, or written before issue 37).

        Shapes:
            node_ids ``(n,)`` -> ``(n,)`` float64.
        """
        entry = self.meta["meshes"][index]
        if not entry.get("point_area") or "surface_area" not in entry:
            return None
        file = self.mesh_folder(index) / "surface-point-area.npy"
        try:
            areas = self.load_npy(file, "r")
        except (OSError, ValueError) as err:
            raise ValueError(f"{file}: unreadable ({err})") from None
        if areas.shape != (entry["num_nodes"],) or areas.dtype.kind != "f":
            raise ValueError(f"{file}: damaged (Expected a float array of shape ({entry['num_nodes']},), got "
                             f"{areas.dtype} {areas.shape})")
        return np.asarray(areas[np.asarray(node_ids, dtype=np.int64)], dtype=np.float64)

    def mesh(self, index: int) -> Mesh:
        """The stored mesh ``index`` (whole: for partitioning and for writing predictions)."""
        if not 0 <= index < self.num_meshes:
            raise ValueError(f"Expected a mesh in [0, {self.num_meshes}) (got {index})")
        entry = self.meta["meshes"][index]
        folder = self.mesh_folder(index)
        points = np.array(self._array(folder / "points.npy", entry["num_nodes"], entry["pos_dim"]))
        cells = []
        try:
            for cell_type in entry["cells"]:
                cells.append((cell_type, self.load_npy(folder / f"cells-{cell_type}.npy", None)))
            edge_index = self.load_npy(folder / "edge_index.npy", None) if not cells or "graph" in entry else None
        except (OSError, ValueError) as err:
            raise ValueError(str(err) if str(err).startswith(str(folder)) else f"{folder}: a mesh file is not readable "
                             f"({err})") from None
        n = len(points)
        for name, ids in [(f"cells-{t}.npy", c) for t, c in cells] + [("edge_index.npy", edge_index)]:
            if ids is None:
                continue
            if ids.ndim != 2 or ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= n)):
                raise ValueError(f"{folder / name}: Expected integer node ids in [0, {n}) in a 2-D array "
                                 f"(got {ids.dtype} {ids.shape}"
                                 f"{f', ids {ids.min()}..{ids.max()}' if ids.size and ids.dtype.kind in 'iu' else ''})")
        if mesh_checksum(points, cells, edge_index) != entry["sha256"]:
            raise ValueError(f"{folder}: the mesh's files differ from the checksum in {METADATA_FILE} "
                             "(damaged or edited); make the dataset again")
        return Mesh(points, cells, edge_index, entry["sha256"])

    def __repr__(self) -> str:
        return (f"Dataset({str(self.path)!r}, kind={self.kind!r}, samples={self.num_samples} "
                f"(train {len(self.train)}, val {len(self.val)}), inputs={self.input_channels}, "
                f"targets={self.target_channels})")


def open_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Open a dataset folder (reads ``dataset.json`` only; arrays are memory-mapped on use)."""
    return Dataset(path)
