"""Partitions of real meshes for multi-rank tests, built identically on every rank.

Meshes come from ../shared/data (see its README; SfePy meshes, BSD-3-Clause). When that folder is
missing, or hidden with ``MESHSHARD_TEST_NO_SHARED=1`` (see ``tests/conftest.py``), :func:`mesh_case`
generates a stand-in of the same kind instead (:func:`synthetic_mesh`: a jittered triangle mesh
for a 2-D file, a jittered tetrahedral mesh for a 3-D one), so every sharded test still runs; only
tests that need the exact file call :func:`data_file`, which skips with the reason. Two layouts:

- ``"metis"``: METIS k-way into R uneven parts;
- ``"special"``: the mesh plus a disjoint copy of it; rank 0 owns the whole copy (a rank with no
  ghosts), rank 1 owns nothing when R >= 3 (an empty rank), the other ranks split the mesh with
  METIS.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from meshshard.partition import InputData, Partition, assign_parts, build_graph, partition_graph, read_input

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
NO_SHARED_ENV = "MESHSHARD_TEST_NO_SHARED"

# the stand-in for each real mesh the tests use: dimension, lattice size (about the real node count)
_STAND_INS = {
    "sfepy/big.mesh": (2, (48, 40)),  # 2-D triangles, 2885 nodes
    "sfepy/wheelset.vtk": (3, (16, 12, 9)),  # 3-D tetrahedra
    "sfepy/cube_cylinder.mesh": (3, (11, 10, 9)),  # 3-D tetrahedra
}


def shared_data_dir() -> Path | None:
    """``../shared/data``, or ``None`` when it is missing or hidden by ``MESHSHARD_TEST_NO_SHARED=1``."""
    if os.environ.get(NO_SHARED_ENV, "") not in ("", "0") or not DATA.is_dir():
        return None
    return DATA


@dataclass(frozen=True)
class MeshCase:
    edge_index: np.ndarray  # (2, E) global directed edges, both directions of each mesh edge
    pos: np.ndarray  # (N, D)
    parts: tuple[Partition, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.pos)


def data_file(relative: str) -> Path:
    """The real file, for a test that needs exactly it; skips, with the reason, when it is absent."""
    root = shared_data_dir()
    path = DATA / relative
    if root is None or not path.exists():
        import pytest

        why = f"{NO_SHARED_ENV} is set" if DATA.is_dir() and root is None else "not found"
        pytest.skip(f"needs the real test data {path} ({why}; ../shared/data beside the repo)")
    return path


def synthetic_mesh(relative: str) -> InputData:
    """A generated stand-in for the real mesh ``relative``: a lattice of jittered points (seeded,
    identical on every rank), each square cut into 2 triangles, or each cube into 6 tetrahedra."""
    dims, shape = _STAND_INS.get(relative, (3, (8, 7, 6)))
    axes = [np.arange(n, dtype=np.float64) for n in shape]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, dims)
    pos = grid + np.random.default_rng(len(relative)).uniform(-0.25, 0.25, grid.shape)
    ids = np.arange(len(pos)).reshape(shape)
    if dims == 2:
        a, b, c, d = ids[:-1, :-1], ids[1:, :-1], ids[:-1, 1:], ids[1:, 1:]
        cells = ("triangle", np.stack([np.stack([a, b, d], -1), np.stack([a, d, c], -1)]).reshape(-1, 3))
    else:
        corner = {(i, j, k): ids[i : shape[0] - 1 + i, j : shape[1] - 1 + j, k : shape[2] - 1 + k]
                  for i in (0, 1) for j in (0, 1) for k in (0, 1)}
        # Kuhn's subdivision: one tetrahedron per path from corner 000 to corner 111
        paths = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
        tets = []
        for path in paths:
            step, verts = [0, 0, 0], [corner[(0, 0, 0)]]
            for axis in path:
                step[axis] = 1
                verts.append(corner[tuple(step)])
            tets.append(np.stack(verts, -1).reshape(-1, 4))
        cells = ("tetra", np.concatenate(tets))
    digest = hashlib.sha256(pos.tobytes() + cells[1].tobytes()).hexdigest()
    return InputData(f"synthetic-{Path(relative).name}", digest, "mesh", len(pos), pos, (cells,))


def mesh_input(relative: str) -> InputData:
    """The real mesh when ``../shared/data`` is there, else its generated stand-in."""
    root = shared_data_dir()
    if root is not None and (root / relative).exists():
        return read_input(root / relative)
    return synthetic_mesh(relative)


def mesh_file(relative: str, folder: Path) -> Path:
    """The real mesh file when ``../shared/data`` is there, else its stand-in written into
    ``folder`` in the same format (meshio), for tests that read a file."""
    root = shared_data_dir()
    if root is not None and (root / relative).exists():
        return root / relative
    import meshio

    data = synthetic_mesh(relative)
    path = Path(folder) / f"synthetic-{Path(relative).name}"
    meshio.write(path, meshio.Mesh(data.pos, [data.cells[0]]))
    return path


@lru_cache(maxsize=8)
def mesh_case(relative: str, world: int, layout: str = "metis", halo_hops: int = 1) -> MeshCase:
    graph = build_graph(mesh_input(relative), "nodal")
    n = graph.num_nodes
    dst = np.repeat(np.arange(n), np.diff(graph.indptr))
    edge_index = np.stack([graph.indices, dst])
    pos = graph.pos
    if layout == "metis":
        owner = assign_parts(graph, world, "metis", seed=0) if world > 1 else np.zeros(n, np.int64)
    elif layout == "special":
        edge_index = np.concatenate([edge_index, edge_index + n], axis=1)
        pos = np.concatenate([pos, pos + pos.max(0) - pos.min(0) + 1.0])
        first = 2 if world >= 3 else 1
        rest = world - first
        main = assign_parts(graph, rest, "metis", seed=0) + first if rest > 1 else np.full(n, max(first, world - 1))
        owner = np.concatenate([main if world > 1 else np.zeros(n, np.int64), np.zeros(n, np.int64)])
    else:
        raise ValueError(layout)
    parts = partition_graph(edge_index, world, num_nodes=len(pos), pos=pos, parts=owner, halo_hops=halo_hops)
    return MeshCase(edge_index, pos, tuple(parts))
