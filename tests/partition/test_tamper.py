"""Edited partitions never load: the metadata protects itself, and ``load_partition`` checks
the cheap invariants of its own part, so training never runs on a plan ``verify`` would reject.
Hand-edited metadata and bad point-cloud files give one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.partition import load_partition, partition_file, read_metadata

from .conftest import rewrite_metadata, rewrite_part


@pytest.fixture(params=[1, 2], ids=["k1", "k2"])
def folder(request, mesh_file: Path, tmp_path: Path) -> Path:
    return partition_file(mesh_file, tmp_path / "p", 3, halo_hops=request.param)


def test_editing_the_metadata_is_caught(folder: Path, capsys) -> None:
    k = read_metadata(folder)["halo_hops"]
    rewrite_metadata(folder, lambda m: m.update(halo_hops=3 - k), reseal=False)
    with pytest.raises(ValueError, match="partition.json: metadata checksum mismatch"):
        load_partition(folder, 0)
    for command in ("info", "verify"):
        assert main([command, str(folder)]) == 2
        err = capsys.readouterr().err
        assert "metadata checksum mismatch" in err and err.count("\n") == 1


def test_a_resealed_halo_hops_change_is_caught(folder: Path) -> None:
    k = read_metadata(folder)["halo_hops"]
    rewrite_metadata(folder, lambda m: m.update(halo_hops=3 - k))
    with pytest.raises(ValueError, match="part-00000.npz: "):
        load_partition(folder, 0)


def _roll_edges(a: dict) -> None:
    a["edge_index"] = np.roll(a["edge_index"], 1, axis=1)


def _roll_edges_and_ids(a: dict) -> None:
    _roll_edges(a)
    a["global_edge_ids"] = np.roll(a["global_edge_ids"], 1)


def _swap_src_dst(a: dict) -> None:
    a["edge_index"] = a["edge_index"][::-1].copy()


def _swap_ghosts(a: dict) -> None:
    a["ghost_ids"][[0, -1]] = a["ghost_ids"][[-1, 0]]


def _send_out_of_range(a: dict) -> None:
    a["send_index"][0] = len(a["owned_ids"])



def _nan_pos(a: dict) -> None:
    a["pos"][3, 1] = np.nan


@pytest.mark.parametrize(("change", "match"), [
    (_roll_edges, "(not in global edge id order|owned edges .* do not all come first)"),
    (_roll_edges_and_ids, "(not in global edge id order|owned edges .* do not all come first)"),
    (_swap_src_dst, "edge"),
    (_swap_ghosts, "ghosts not sorted by owner rank, then global id"),
    (_send_out_of_range, r"send_index outside the owned rows"),
    (_nan_pos, "Expected finite coordinates .* node"),
])
def test_a_resealed_part_that_breaks_an_invariant_does_not_load(
        folder: Path, change, match: str, capsys) -> None:
    rewrite_part(folder, 1, change)
    load_partition(folder, 0)
    with pytest.raises(ValueError, match=f"part-00001.npz: .*{match}"):
        load_partition(folder, 1)
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "Traceback" not in out


def _drop(key: str):
    return lambda m: m["parts"][0].pop(key)


def _set(key: str, value: object, part: bool = True):
    return lambda m: (m["parts"][0] if part else m).update({key: value})


@pytest.mark.parametrize(("change", "match"), [
    (_drop("file"), r"parts\[0\]: Expected 'file'"),
    (_drop("sha256"), r"parts\[0\]: Expected 'sha256'"),
    (_set("num_owned", "3"), r"parts\[0\]: Expected 'num_owned' to be an integer"),
    (_set("num_ghost", -1), r"parts\[0\]: Expected 'num_ghost' to be an integer >= 0"),
    (_set("sha256", 5), r"parts\[0\]: Expected 'sha256' to be 64 hex digits"),
    (_set("file", ["x"]), r"parts\[0\]: Expected 'file' to be a file name"),
    (_set("halo_hops", "1", part=False), "Expected 'halo_hops' to be an integer"),
    (_set("num_nodes", 10**12, part=False), "owned counts sum to 600, not num_nodes"),
    (_set("pos_dim", 7, part=False), "Expected 'pos_dim'"),
    (lambda m: m.update(parts={"a": 1}), "Expected a 'parts' list"),
    (lambda m: m["parts"].__setitem__(0, 3), r"parts\[0\]: Expected an object"),
])
def test_hand_edited_metadata_is_one_line(mesh_file: Path, tmp_path: Path, change, match: str,
                                          capsys) -> None:
    folder = partition_file(mesh_file, tmp_path / "p", 2)
    rewrite_metadata(folder, change)
    with pytest.raises(ValueError, match=match):
        load_partition(folder, 0)
    for command in ("info", "verify"):
        assert main([command, str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err


def test_file_a_folder_is_one_line(mesh_file: Path, tmp_path: Path, capsys) -> None:
    folder = partition_file(mesh_file, tmp_path / "p", 2)
    (folder / "sub").mkdir()
    rewrite_metadata(folder, lambda m: m["parts"][0].update(file="sub"))
    assert main(["plot", str(folder), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "sub: is a folder, expected a file" in err and err.count("\n") == 1
    assert main(["verify", str(folder)]) == 1
    assert "is a folder, expected a file" in capsys.readouterr().out


def test_bad_point_files_are_one_line(tmp_path: Path, capsys) -> None:
    good = tmp_path / "good.npz"
    np.savez(good, pos=np.random.default_rng(0).random((50, 3)))
    files = {
        "empty.npy": b"",
        "garbage.npz": b"this is not a zip archive at all",
        "truncated.npz": good.read_bytes()[:-40],
        "cut.npz": good.read_bytes()[:200],
        "header-only.npy": b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, "
                           b"'shape': (100000000000, 3), }".ljust(118) + b"\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        code = main(["partition", str(tmp_path / name), "-k", "2", "-o", str(tmp_path / "o"),
                     "-q"])
        err = capsys.readouterr().err
        assert code == 2, name
        assert err.startswith(f"meshshard partition: error: {tmp_path / name}: "), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert main(["partition", str(good), "-k", "2", "-o", str(tmp_path / "o"), "-q"]) == 0


@pytest.mark.parametrize(("change", "match"), [
    (_set("edge_cut", "many", part=False), "Expected 'edge_cut' to be an integer"),
    (_set("imbalance", None, part=False), "Expected 'imbalance' to be a number"),
    (_set("halo_fraction", "x", part=False), "Expected 'halo_fraction' to be a number"),
    (_set("method", 3, part=False), "Expected 'method' to be a string"),
    (_set("input", "file.vtu", part=False), "Expected 'input' to be an object"),
    (_set("refinement", {"moved": 1}, part=False), "Expected 'refinement' to be null or"),
    (_set("metis", [], part=False), "Expected 'metis' to be null or"),
])
def test_edited_summary_fields_are_one_line(mesh_file: Path, tmp_path: Path, change,
                                            match: str, capsys) -> None:
    folder = partition_file(mesh_file, tmp_path / "p", 2)
    rewrite_metadata(folder, change)
    assert main(["info", str(folder)]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
