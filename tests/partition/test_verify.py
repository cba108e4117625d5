"""The checker finds each kind of damage (and accepts what the builder makes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from meshshard.partition import Graph, Partition, check_partitions, partition_graph, save_partition, verify_partition

from .conftest import grid_triangles


@pytest.fixture(scope="module")
def shards() -> list[Partition]:
    points, triangles = grid_triangles(10, 8)
    edges = np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [2, 0]]]).T
    graph = Graph.from_edge_index(edges, len(points), pos=points)
    return partition_graph(graph, 3, halo_hops=2)


def _edit(rank: int, **changes: Callable[[Partition], object]):
    def apply(parts: list[Partition]) -> list[Partition]:
        out = list(parts)
        out[rank] = dataclasses.replace(
            parts[rank], **{name: f(parts[rank]) for name, f in changes.items()})
        return out
    return apply


def _swap_ghosts(p: Partition) -> np.ndarray:
    ids = p.ghost_ids.copy()
    ids[[0, -1]] = ids[[-1, 0]]
    return ids


DAMAGE = [
    ("owned twice", _edit(1, owned_ids=lambda p: np.sort(np.r_[p.owned_ids[1:], 0])),
     "owned"),
    ("ghost order", _edit(0, ghost_ids=_swap_ghosts), "ghost"),
    ("wrong owner", _edit(0, ghost_owner=lambda p: (p.ghost_owner + 1) % 3), "ghost_owner"),
    ("edge dropped", _edit(2, edge_index=lambda p: p.edge_index[:, 1:],
                           global_edge_ids=lambda p: p.global_edge_ids[1:]), "edge"),
    ("edge redirected", _edit(1, edge_index=lambda p: p.edge_index[[0, 0]] % p.num_owned),
     "edge"),
    ("send index", _edit(0, send_index=lambda p: p.send_index[::-1].copy()), "send"),
    ("recv counts", _edit(1, recv_counts=lambda p: p.recv_counts[::-1].copy()), "recv_counts"),
    ("hops", _edit(2, node_hops=lambda p: np.minimum(p.node_hops, 1)), "node_hops"),
    ("pos", _edit(0, pos=lambda p: p.pos + (np.arange(p.num_local) >= p.num_owned)[:, None]),
     "coordinates"),
    ("missing rank", lambda parts: parts[:2], "rank"),
]


@pytest.mark.parametrize(("name", "damage", "match"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damage_is_found(shards: list[Partition], name: str, damage, match: str) -> None:
    assert check_partitions(shards) == []
    problems = check_partitions(damage(shards))
    assert problems, name
    assert any(match in problem for problem in problems), problems


def test_verify_folder_finds_corrupt_file(shards: list[Partition], tmp_path: Path) -> None:
    folder = save_partition(shards, tmp_path / "p")
    assert verify_partition(folder) == []
    (folder / "part-00001.npz").write_bytes(b"garbage")
    problems = verify_partition(folder)
    assert len(problems) == 1 and "part-00001.npz: checksum mismatch" in problems[0]
