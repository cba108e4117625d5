"""Partitions of real meshes for multi-rank tests, built identically on every rank.

Meshes come from ../shared/data (see its README; SfePy meshes, BSD-3-Clause). Two layouts:

- ``"metis"``: METIS k-way into R uneven parts;
- ``"special"``: the mesh plus a disjoint copy of it; rank 0 owns the whole copy (a rank with no
  ghosts), rank 1 owns nothing when R >= 3 (an empty rank), the other ranks split the mesh with
  METIS.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from meshshard.partition import Partition, assign_parts, build_graph, partition_graph, read_input

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclass(frozen=True)
class MeshCase:
    edge_index: np.ndarray  # (2, E) global directed edges, both directions of each mesh edge
    pos: np.ndarray  # (N, D)
    parts: tuple[Partition, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.pos)


def data_file(relative: str) -> Path:
    path = DATA / relative
    if not path.exists():
        import pytest

        pytest.skip(f"real test data {path} not found (../shared/data beside the repo)")
    return path


@lru_cache(maxsize=8)
def mesh_case(relative: str, world: int, layout: str = "metis", halo_hops: int = 1) -> MeshCase:
    graph = build_graph(read_input(data_file(relative)), "nodal")
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
