"""Fixtures and numpy reference computations for the partition tests.

The real data come from ``../shared/data`` through the ``shared_data`` fixture of
``tests/conftest.py`` (skips when absent); everything else is generated here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from meshshard.partition import Graph, Partition


def grid_triangles(nx: int, ny: int) -> tuple[np.ndarray, np.ndarray]:
    """A structured triangle mesh of ``nx * ny`` points on the unit square (two per square).

    Shapes:
        Returns points ``(nx * ny, 2)`` and triangles ``(2 (nx - 1)(ny - 1), 3)``.
    """
    x, y = np.meshgrid(np.linspace(0, 1, nx), np.linspace(0, 1, ny))
    points = np.stack([x.ravel(), y.ravel()], 1)
    i, j = np.meshgrid(np.arange(nx - 1), np.arange(ny - 1))
    a = (j * nx + i).ravel()
    b, c, d = a + 1, a + nx, a + nx + 1
    return points, np.concatenate([np.stack([a, b, d], 1), np.stack([a, d, c], 1)])


@pytest.fixture(scope="session")
def grid_mesh() -> tuple[np.ndarray, np.ndarray]:
    """A 12 x 9 triangle mesh (108 nodes)."""
    return grid_triangles(12, 9)


@pytest.fixture(scope="session")
def mesh_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 30 x 20 triangle mesh written as VTU, for the commands."""
    import meshio

    points, triangles = grid_triangles(30, 20)
    path = tmp_path_factory.mktemp("mesh") / "grid.vtu"
    meshio.write(path, meshio.Mesh(points, [("triangle", triangles)]))
    return path


def message_passing(edge_index: np.ndarray, x: np.ndarray, layers: int) -> np.ndarray:
    """``layers`` rounds of ``x <- tanh(x + sum over edges src -> dst of w * x[src])`` where
    ``w`` depends on the edge's two features (so a missing or extra edge changes the result).

    Shapes:
        edge_index: ``(2, E)``. x: ``(N,)`` float64.
    """
    src, dst = edge_index
    for _ in range(layers):
        message = np.sin(x[src] - 0.5 * x[dst]) + x[src]
        x = np.tanh(x + np.bincount(dst, weights=message, minlength=len(x)))
    return x


def halo_exchange(partitions: Sequence[Partition], x: np.ndarray) -> list[np.ndarray]:
    """What ``indexed_all_to_all_v`` returns on each rank, computed in one process.

    Each rank sends ``x_own[send_index]`` split by ``send_counts``; rank ``q`` receives, by
    source rank, the segment each rank addressed to it.

    Shapes:
        x: ``(N,)`` global features. Returns per rank ``(sum(recv_counts),)``.
    """
    segments = []
    for p in partitions:
        rows = x[p.owned_ids][p.send_index]
        segments.append(np.split(rows, np.cumsum(p.send_counts)[:-1]))
    received = []
    for q in partitions:
        parts = [segments[r][q.rank] for r in range(len(partitions))]
        assert [len(s) for s in parts] == list(q.recv_counts)
        received.append(np.concatenate(parts))
    return received


@pytest.fixture
def reference() -> dict[str, Callable[..., object]]:
    """The numpy references: ``message_passing`` and ``halo_exchange``."""
    return {"message_passing": message_passing, "halo_exchange": halo_exchange}


def random_graph(rng: np.random.Generator, n: int, m: int) -> Graph:
    """A random simple undirected graph (isolated nodes likely)."""
    edges = rng.integers(0, n, size=(2, m))
    return Graph.from_edge_index(edges, n, pos=rng.random((n, 2)))


def rewrite_metadata(folder: Path, change: Callable[[dict], object], *,
                     reseal: bool = True) -> None:
    """Edit a partition's metadata in place; with ``reseal`` as a careful forger would (its
    own checksum recomputed, so only the checks of the content can catch the edit)."""
    import json

    from meshshard.partition import _format

    meta = json.loads((folder / "partition.json").read_text())
    change(meta)
    if reseal:
        meta[_format.CHECKSUM_KEY] = _format.metadata_checksum(meta)
    (folder / "partition.json").write_text(json.dumps(meta, indent=2))


def rewrite_part(folder: Path, rank: int, change: Callable[[dict], object]) -> None:
    """Edit one part file's arrays, then update its checksum in the (resealed) metadata."""
    from meshshard.partition import _format

    with np.load(folder / _format.part_file_name(rank)) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays)
    digest = _format._write_npz(folder / _format.part_file_name(rank), arrays)
    rewrite_metadata(folder, lambda m: m["parts"][rank].update(sha256=digest))
