"""--force replaces only partitions, atomically; metadata never points outside its folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import main
from meshshard.partition import load_partition, read_metadata, verify_partition

from .conftest import rewrite_metadata


def _partition(mesh_file: Path, out: Path, parts: int, *extra: str) -> list[str]:
    return ["partition", str(mesh_file), "-k", str(parts), "-o", str(out), "-q", *extra]


# --force ------------------------------------------------------------------------------------

def test_force_refuses_a_folder_with_other_files(mesh_file: Path, tmp_path: Path,
                                                  capsys) -> None:
    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2)) == 0
    (out / "notes.txt").write_text("mine")
    assert main(_partition(mesh_file, out, 3, "--force")) == 2
    err = capsys.readouterr().err
    assert "'notes.txt', which is not a file of a partition; refusing to replace it" in err
    assert (out / "notes.txt").read_text() == "mine" and read_metadata(out)["num_parts"] == 2
    (out / "notes.txt").unlink()
    (out / "sub").mkdir()
    assert main(_partition(mesh_file, out, 3, "--force")) == 2
    assert "'sub', which is not a file of a partition" in capsys.readouterr().err


def test_force_refuses_a_foreign_partition_json(mesh_file: Path, tmp_path: Path,
                                                capsys) -> None:
    out = tmp_path / "p"
    out.mkdir()
    (out / "partition.json").write_text('{"format": "something-else"}')
    assert main(_partition(mesh_file, out, 2, "--force")) == 2
    assert "is not a partition folder" in capsys.readouterr().err
    assert (out / "partition.json").exists()


def test_force_never_replaces_the_cwd_its_parents_or_the_input(
        mesh_file: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2)) == 0
    monkeypatch.chdir(out)
    for target in (".", str(out), str(tmp_path)):
        assert main(_partition(mesh_file, Path(target), 2, "--force")) == 2
        assert "is the current folder or one of its parents" in capsys.readouterr().err
    assert read_metadata(out)["num_parts"] == 2
    monkeypatch.chdir(tmp_path.parent)
    holder = tmp_path / "holder"
    holder.mkdir()
    (holder / "grid.vtu").write_bytes(mesh_file.read_bytes())
    assert main(_partition(holder / "grid.vtu", holder, 2, "--force")) == 2
    assert "holds the input" in capsys.readouterr().err
    assert (holder / "grid.vtu").exists()


_CRASH = """
import os, sys
import meshshard.partition._safe_io as safe_io
safe_io._crash_point = lambda step: os._exit(70) if step == sys.argv[1] else None
from meshshard.cli import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("step", ["staged", "aside", "in"])
def test_a_crash_leaves_the_old_or_the_new_partition_whole(
        step: str, mesh_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2)) == 0
    crash = subprocess.run([sys.executable, "-c", _CRASH, step,
                            *_partition(mesh_file, out, 3, "--force")],
                           capture_output=True, text=True)
    assert crash.returncode == 70, crash.stderr
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "p")
    assert len(leftovers) == {"staged": 1, "aside": 2, "in": 1}[step], leftovers
    whole = out if out.exists() else tmp_path / next(n for n in leftovers if "-old-" in n)
    assert verify_partition(whole) == []
    assert read_metadata(whole)["num_parts"] == (3 if step == "in" else 2)

    # the next run puts things right and says what it did
    assert main(_partition(mesh_file, out, 4, "--force")) == 0
    err = capsys.readouterr().err
    assert ("restored from" if step == "aside" else "removed (left by an interrupted run)") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    assert read_metadata(out)["num_parts"] == 4 and verify_partition(out) == []


def test_an_error_while_writing_keeps_the_old_partition(mesh_file: Path, tmp_path: Path,
                                                        monkeypatch) -> None:
    from meshshard.partition import _safe_io

    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2)) == 0

    def fail(step: str) -> None:
        if step == "aside":
            raise KeyboardInterrupt

    monkeypatch.setattr(_safe_io, "_crash_point", fail)
    assert main(_partition(mesh_file, out, 3, "--force")) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    assert read_metadata(out)["num_parts"] == 2 and verify_partition(out) == []


# files named by the metadata ------------------------------------------------------------------

@pytest.fixture
def two(mesh_file: Path, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(_partition(mesh_file, a, 2)) == 0
    assert main(_partition(mesh_file, b, 2)) == 0
    return a, b


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "dev_zero", "symlink_out", "folder",
                                  "dot"])
def test_metadata_cannot_point_outside_the_folder(kind: str, two, capsys) -> None:
    a, b = two
    name = {"absolute": str(b / "part-00000.npz"), "dotdot": "../b/part-00000.npz",
            "dev_zero": "/dev/zero", "symlink_out": "link.npz", "folder": "sub", "dot": "."}[kind]
    if kind == "symlink_out":
        (a / "link.npz").symlink_to(b / "part-00000.npz")
    if kind == "folder":
        (a / "sub").mkdir()
    rewrite_metadata(a, lambda m: m["parts"][0].update(file=name))
    expected = {"folder": "is a folder, expected a file", "dot": "Expected a file inside"}.get(
        kind, "Expected a file inside the folder")
    with pytest.raises(ValueError, match=expected):
        load_partition(a, 0)
    assert main(["verify", str(a)]) == 1
    out = capsys.readouterr().out
    assert expected in out and ": OK" not in out


@pytest.mark.timeout(30)
def test_a_fifo_never_hangs_load_verify_or_plot(two, tmp_path: Path, capsys) -> None:
    a, _ = two
    os.mkfifo(a / "fifo.npz")
    rewrite_metadata(a, lambda m: m["parts"][1].update(file="fifo.npz"))
    with pytest.raises(ValueError, match="fifo.npz: is not a regular file"):
        load_partition(a, 1)
    assert main(["verify", str(a)]) == 1
    assert "is not a regular file" in capsys.readouterr().out
    assert main(["plot", str(a), "--out", str(tmp_path / "x.png")]) == 2
    assert "is not a regular file" in capsys.readouterr().err
    os.mkfifo(tmp_path / "in.npy")
    assert main(["partition", str(tmp_path / "in.npy"), "-k", "2", "-o", str(tmp_path / "q"),
                 "-q"]) == 2
    assert "is not a regular file" in capsys.readouterr().err
