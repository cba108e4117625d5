"""The on-disk format: the documented example, determinism, and damaged folders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from meshshard.partition import (
    FORMAT_VERSION,
    _format,
    load_partition,
    partition_file,
    partition_mesh,
    partition_points,
    read_metadata,
    save_partition,
)

from .conftest import grid_triangles, rewrite_metadata


def _doc_json_blocks() -> list[object]:
    """The JSON blocks of the format docstring (indented literal blocks starting with '{')."""
    blocks = re.findall(r"::\n\n(    \{\n.*?\n    \})\n", _format.__doc__, flags=re.S)
    return [json.loads(block) for block in blocks]


@pytest.fixture
def example(tmp_path: Path) -> tuple[Path, list]:
    points = np.array([[i % 3, i // 3] for i in range(6)], dtype=np.float64)
    triangles = np.array([[0, 1, 4], [0, 4, 3], [1, 2, 5], [1, 5, 4]])
    partitions = partition_mesh(points, [("triangle", triangles)], 2, parts=[0, 0, 1, 0, 1, 1])
    return save_partition(partitions, tmp_path / "example"), partitions


def test_documented_example_is_what_is_written(example) -> None:
    folder, partitions = example
    meta_doc, arrays_doc = _doc_json_blocks()
    assert json.loads((folder / "partition.json").read_text()) == meta_doc
    assert sorted(p.name for p in folder.iterdir()) == [
        "part-00000.npz", "part-00001.npz", "partition.json"]
    for rank, documented in arrays_doc.items():
        loaded = load_partition(folder, int(rank))
        assert list(loaded.arrays()) == [*documented, "pos"]
        for name, value in documented.items():
            np.testing.assert_array_equal(getattr(loaded, name), value, err_msg=name)
            assert getattr(loaded, name).dtype == _format._DTYPES[name]
        in_memory = partitions[int(rank)]
        for name, value in in_memory.arrays().items():
            np.testing.assert_array_equal(getattr(loaded, name), value)
        assert loaded.num_owned_per_part.tolist() == [3, 3]
        assert loaded.num_nodes == 6 and loaded.num_parts == 2


def test_format_constants() -> None:
    assert FORMAT_VERSION == 2
    assert _format.part_file_name(12) == "part-00012.npz"


def test_rerun_gives_identical_bytes(mesh_file: Path, tmp_path: Path) -> None:
    first = partition_file(mesh_file, tmp_path / "a", 3, halo_hops=2)
    second = partition_file(mesh_file, tmp_path / "b", 3, halo_hops=2)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_metadata_records_counts_and_checksums(mesh_file: Path, tmp_path: Path) -> None:
    meta = read_metadata(partition_file(mesh_file, tmp_path / "p", 4))
    assert meta["input"]["name"] == "grid.vtu" and len(meta["input"]["sha256"]) == 64
    assert sum(p["num_owned"] for p in meta["parts"]) == meta["num_nodes"] == 600
    assert all(len(p["sha256"]) == 64 for p in meta["parts"])


def test_part_digest_is_taken_as_written(tmp_path: Path) -> None:
    """The SHA-256 of a part file follows zipfile's writes (header rewritten after the data)
    and equals the file's; np.load reads the arrays back. A write pattern it cannot follow
    falls back to hashing the file."""
    import hashlib
    import zipfile

    rng = np.random.default_rng(0)
    arrays = {"owned_ids": np.arange(5), "ghost_ids": np.zeros(0, dtype=np.int64),
              "node_hops": np.zeros(7, dtype=np.int8),
              "edge_index": rng.integers(0, 9, (2, 40_000)),  # 640 kB: kept by reference
              "pos": rng.random((7, 3))}
    digest = _format._write_npz(tmp_path / "p.npz", arrays)
    assert digest == hashlib.sha256((tmp_path / "p.npz").read_bytes()).hexdigest()
    with np.load(tmp_path / "p.npz") as loaded:
        for name, array in arrays.items():
            np.testing.assert_array_equal(loaded[name], array)

    with open(tmp_path / "q.npz", "wb") as raw:
        file = _format._HashingFile(raw)
        with zipfile.ZipFile(file, "w") as archive:  # type: ignore[arg-type]
            archive.writestr("a", b"x" * 10)
        assert file.hexdigest() == hashlib.sha256((tmp_path / "q.npz").read_bytes()).hexdigest()
        file.seek(3)
        file.write(b"yy")  # not a whole kept block: the digest cannot follow
        assert file.hexdigest() is None


@pytest.fixture
def folder(mesh_file: Path, tmp_path: Path) -> Path:
    return partition_file(mesh_file, tmp_path / "p", 3)


def test_load_rejects_altered_file(folder: Path) -> None:
    file = folder / "part-00001.npz"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 1
    file.write_bytes(bytes(data))
    load_partition(folder, 0)
    with pytest.raises(ValueError, match="part-00001.npz: checksum mismatch"):
        load_partition(folder, 1)


def test_load_rejects_truncated_file(folder: Path) -> None:
    file = folder / "part-00002.npz"
    file.write_bytes(file.read_bytes()[:100])
    with pytest.raises(ValueError, match="checksum mismatch, the file was altered or truncated"):
        load_partition(folder, 2)
    with pytest.raises(ValueError, match="not a readable part file"):
        load_partition(folder, 2, check_checksum=False)


def test_load_rejects_missing_file_and_bad_rank(folder: Path) -> None:
    (folder / "part-00000.npz").unlink()
    with pytest.raises(ValueError, match="part-00000.npz: missing"):
        load_partition(folder, 0)
    with pytest.raises(ValueError, match=r"Expected a rank in \[0, 3\) \(got 3\): .* has one part per rank for 3 ranks; run that many"):
        load_partition(folder, 3)


@pytest.mark.parametrize(("change", "match"), [
    (lambda m: m.update(format_version=99), "Expected format version 2 .got 99."),
    (lambda m: m.update(format="other"), "Expected format 'meshshard-partition' .got 'other'."),
    (lambda m: m["parts"].pop(), "Expected a 'parts' list of num_parts entries"),
])
def test_load_rejects_foreign_metadata(folder: Path, change, match: str) -> None:
    rewrite_metadata(folder, change)
    with pytest.raises(ValueError, match=match):
        load_partition(folder, 0)


def test_load_rejects_bad_json_and_missing_folder(folder: Path, tmp_path: Path) -> None:
    (folder / "partition.json").write_text("{not json")
    with pytest.raises(ValueError, match="partition.json: not valid JSON"):
        load_partition(folder, 0)
    with pytest.raises(ValueError, match="no such folder"):
        load_partition(tmp_path / "nowhere", 0)
    with pytest.raises(ValueError, match=r"not a partition folder \(no partition.json\)"):
        load_partition(tmp_path, 0)


def test_load_checks_shapes_against_metadata(folder: Path) -> None:
    rewrite_metadata(folder, lambda m: m["parts"][0].update(num_ghost=m["parts"][0]["num_ghost"] + 1))
    with pytest.raises(ValueError, match="Expected 'ghost_ids' int64 of shape"):
        load_partition(folder, 0)


def test_save_is_atomic_and_refuses_existing(tmp_path: Path) -> None:
    points, triangles = grid_triangles(5, 4)
    partitions = partition_mesh(points, [("triangle", triangles)], 2)
    out = save_partition(partitions, tmp_path / "out")
    with pytest.raises(ValueError, match="exists and is not empty .pass --force"):
        save_partition(partitions, out)
    save_partition(partitions, out, force=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not a partition folder .* even with --force"):
        save_partition(partitions, other, force=True)
    assert (other / "precious.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out"]


def test_point_cloud_partition_round_trip(tmp_path: Path) -> None:
    pos = np.random.default_rng(0).random((300, 3))
    partitions = partition_points(pos, 4, knn=5)
    folder = save_partition(partitions, tmp_path / "pc")
    loaded = load_partition(folder, 2)
    np.testing.assert_array_equal(loaded.pos, partitions[2].pos)
    np.testing.assert_array_equal(loaded.pos[:loaded.num_owned], pos[loaded.owned_ids])
