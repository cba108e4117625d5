"""The distributed partition in one process (:class:`LocalExchange`): the same folder as ``partition_file``
with ``--method morton``, and its errors. The multi-process runs are in ``tests/comm/test_partition_ranks.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshshard.partition import (
    LocalExchange,
    assign_parts,
    build_graph,
    partition_distributed,
    partition_file,
    read_input,
    read_metadata,
    verify_partition,
)
from meshshard.partition._dist_assign import morton_assign, sample_sort

from ._mixed_mesh import write_mixed_vtkhdf

pytest.importorskip("h5py")

#: Entries of partition.json that say how the partition was made, not what it is.
HOW = ("distributed", "metadata_sha256")


def same_folders(a: Path, b: Path) -> None:
    """Every part file the same bytes; partition.json the same but for :data:`HOW`."""
    meta_a, meta_b = read_metadata(a), read_metadata(b)
    assert {k: v for k, v in meta_a.items() if k not in HOW} == {k: v for k, v in meta_b.items() if k not in HOW}
    for entry in meta_a["parts"]:
        assert (a / entry["file"]).read_bytes() == (b / entry["file"]).read_bytes(), entry["file"]
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())


@pytest.mark.parametrize("num_parts", [1, 4, 7])
def test_one_process_equals_partition_file(tmp_path: Path, num_parts: int) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    one = partition_file(mesh, tmp_path / "one", num_parts, method="morton")
    dist = partition_distributed(mesh, tmp_path / "dist", num_parts, LocalExchange())
    same_folders(one, dist)
    assert read_metadata(dist)["distributed"] == {"engine": "geometric", "processes": 1}
    assert verify_partition(dist) == []
    text = (dist / "partition.json").read_text()
    assert json.loads(text)["method"] == "morton"


def test_morton_assign_is_morton_parts() -> None:
    pos = np.random.default_rng(3).normal(size=(500, 3))
    pos[7] = pos[3]  # a tie of codes, broken by global id
    from meshshard.partition import Graph

    graph = Graph(np.zeros(501, dtype=np.int64), np.zeros(0, dtype=np.int64), pos=pos)
    for k in (1, 3, 8):
        np.testing.assert_array_equal(morton_assign(LocalExchange(), pos, 0, 500, k),
                                      assign_parts(graph, k, "morton"))


def test_sample_sort_in_one_process_sorts_by_code_then_id() -> None:
    codes = np.array([5, 1, 5, 0], dtype=np.uint64)
    ids = np.array([9, 4, 2, 7], dtype=np.int64)
    got_codes, got_ids, offset = sample_sort(LocalExchange(), codes, ids)
    assert got_codes.tolist() == [0, 1, 5, 5] and got_ids.tolist() == [7, 4, 2, 9] and offset == 0


def test_the_graph_is_the_one_process_graph(tmp_path: Path) -> None:
    from meshshard.partition._dist_graph import block_graph
    from meshshard.partition._vtkhdf import read_slice

    mesh = write_mixed_vtkhdf(tmp_path)
    whole = build_graph(read_input(mesh))
    piece = read_slice(mesh)
    rows = block_graph(LocalExchange(), piece.cells, piece.num_nodes, 0)
    np.testing.assert_array_equal(rows.src, whole.indices)
    np.testing.assert_array_equal(rows.dst, np.repeat(np.arange(whole.num_nodes), whole.degree()))
    assert rows.num_edges == whole.num_edges and rows.first_edge == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"halo_hops": 2}, "Expected --halo-hops 1 in a distributed partition"),
    ({"engine": "metis"}, "Expected --engine in geometric"),
    ({"num_parts": 0}, r"Expected --parts >= 1"),
    ({"num_parts": 10**6}, "Expected at most one part per node"),
])
def test_bad_arguments_leave_nothing(tmp_path: Path, kwargs: dict, match: str) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    args = {"num_parts": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        partition_distributed(mesh, tmp_path / "out", args.pop("num_parts"), **args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.vtkhdf"]


def test_a_file_of_another_format_names_convert(tmp_path: Path) -> None:
    mesh = tmp_path / "mesh.vtu"
    mesh.write_text("x")
    with pytest.raises(ValueError, match=r"meshshard convert .*mesh\.vtu --out .*mesh\.vtkhdf"):
        partition_distributed(mesh, tmp_path / "out", 2)


def test_an_existing_folder_needs_force(tmp_path: Path) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    out = partition_distributed(mesh, tmp_path / "out", 2)
    with pytest.raises(ValueError, match="--force"):
        partition_distributed(mesh, out, 3)
    assert read_metadata(out)["num_parts"] == 2
    partition_distributed(mesh, out, 3, force=True)
    assert read_metadata(out)["num_parts"] == 3


def test_too_few_nodes_per_part_is_refused_not_unbalanced(tmp_path: Path) -> None:
    mesh = write_mixed_vtkhdf(tmp_path, shape=(3, 3, 3))  # 29 nodes: 4 parts of 7 or 8
    with pytest.raises(ValueError, match="load imbalance of 1.1034, over --imbalance 0.03"):
        partition_distributed(mesh, tmp_path / "out", 4)
    assert not (tmp_path / "out").exists()
    partition_distributed(mesh, tmp_path / "out", 4, imbalance=0.2)
    assert verify_partition(tmp_path / "out") == []
