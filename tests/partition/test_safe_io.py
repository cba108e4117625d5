"""--force replaces only partitions, atomically; metadata never points outside its folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.partition import load_partition, read_metadata, verify_partition
from tests._processes import hold_folder_lock

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
    assert (tmp_path / ".p.meshshard-lock").is_file()  # the crashed command's lock: the next one takes it over
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("p", ".p.meshshard-lock"))
    assert len(leftovers) == {"staged": 1, "aside": 2, "in": 1}[step], leftovers
    whole = out if out.exists() else tmp_path / next(n for n in leftovers if "-old-" in n)
    assert verify_partition(whole) == []
    assert read_metadata(whole)["num_parts"] == (3 if step == "in" else 2)
    if step == "aside":  # what a reader of the missing folder is told
        with pytest.raises(ValueError, match=f"no such folder; an interrupted --force left the "
                                             f"old partition in {whole.name}"):
            read_metadata(out)

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


# one output guard for every kind of folder ---------------------------------------------------

def _refuse(folder: Path) -> None:
    raise ValueError(f"{folder}: not ours")


def _accept(folder: Path) -> None:
    return None


def test_check_destination_absent_or_empty_may_be_written_and_a_full_one_needs_force(tmp_path: Path) -> None:
    from meshshard.partition import check_destination

    out = tmp_path / "out"
    asked = []
    assert check_destination(out, force=False, is_ours=asked.append) == []  # absent
    out.mkdir()
    assert check_destination(out, force=False, is_ours=asked.append) == []  # empty
    (out / "x").write_text("x")
    with pytest.raises(ValueError, match=r"^.*out: exists and is not empty \(pass --force to replace it\)$"):
        check_destination(out, force=False, is_ours=asked.append)
    assert asked == []  # never asked without force, nor of an absent or empty folder
    assert check_destination(out, force=True, is_ours=asked.append) == [] and asked == [out]
    with pytest.raises(ValueError, match=r"out: not ours$"):
        check_destination(out, force=True, is_ours=_refuse)
    assert (out / "x").read_text() == "x"


def test_check_destination_refuses_a_link_a_file_the_cwd_and_a_folder_holding_an_input(
        tmp_path: Path, monkeypatch) -> None:
    from meshshard.partition import check_destination

    (tmp_path / "real").mkdir()
    for link, target in (("link", "real"), ("dangling", "gone")):
        (tmp_path / link).symlink_to(tmp_path / target)
        with pytest.raises(ValueError, match=rf"{link}: is a symbolic link; refusing to replace it$"):
            check_destination(tmp_path / link, force=True, is_ours=_accept)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"file: exists and is not a folder$"):
        check_destination(tmp_path / "file", force=True, is_ours=_accept)
    (tmp_path / "real" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "real" / "sub")
    for where in (".", "..", str(tmp_path)):
        with pytest.raises(ValueError, match=r"is the current folder or one of its parents; refusing to write there "
                                             r"\(give a new folder\)$"):
            check_destination(where, force=True, is_ours=_accept)
    monkeypatch.chdir(tmp_path)
    for given in (tmp_path / "real", tmp_path / "real" / "sub" / "mesh.vtu"):  # the input itself, or inside
        message = rf"real: holds the input {re.escape(str(given))}; refusing to write there$"
        with pytest.raises(ValueError, match=message):
            check_destination(tmp_path / "real", force=True, is_ours=_accept, inputs=[tmp_path / "x.vtu", given])
    check_destination(tmp_path / "real-2", force=True, is_ours=_accept, inputs=[tmp_path / "real"])  # a mere prefix


def test_check_destination_in_place_keeps_the_cwd_and_leftovers_and_asks_only_what_it_holds(
        tmp_path: Path, monkeypatch) -> None:
    """A folder written in place (a run, a prediction) is never renamed: the current folder may be
    one, nothing is recovered, and only what ``holds`` says counts as something to replace."""
    import subprocess

    from meshshard.partition import check_destination

    out = tmp_path / "out"
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".out.meshshard-old-{dead.pid}").mkdir()  # what an interrupted replace left
    assert check_destination(out, force=False, is_ours=_refuse, in_place=True) == []
    assert (tmp_path / f".out.meshshard-old-{dead.pid}").is_dir() and not out.exists()
    assert check_destination(out, force=False, is_ours=_refuse) == [
        f"{out}: restored from .out.meshshard-old-{dead.pid}, left by an interrupted --force"]
    (out / "notes.txt").write_text("mine")
    monkeypatch.chdir(out)
    holds_run = lambda folder: (folder / "run.pt").exists()  # noqa: E731
    assert check_destination(".", force=False, is_ours=_refuse, in_place=True, holds=holds_run) == []
    (out / "run.pt").write_text("x")
    with pytest.raises(ValueError, match="exists and is not empty"):
        check_destination(".", force=False, is_ours=_refuse, in_place=True, holds=holds_run)
    with pytest.raises(ValueError, match="not ours"):  # ours_first: what is not ours is refused, force or not
        check_destination(".", force=False, is_ours=_refuse, in_place=True, holds=holds_run, ours_first=True)
    assert check_destination(".", force=True, is_ours=_accept, in_place=True, holds=holds_run, ours_first=True) == []


def test_check_destination_says_each_refusal_in_the_words_given(tmp_path: Path, monkeypatch) -> None:
    from meshshard.partition import Refusals, check_destination

    words = Refusals(current="{out}: here", holds_input="{out}: has {input}", link="{out}: a link",
                     not_folder="{out}: a file",
                     not_empty=lambda folder: f"{folder}: holds {len(list(folder.iterdir()))}")
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("x")
    (tmp_path / "f").write_text("x")
    (tmp_path / "l").symlink_to(d)
    for out, inputs, message in ((d, [d / "x"], f"{d}: has {d / 'x'}"),
                                 (tmp_path / "l", [], f"{tmp_path / 'l'}: a link"),
                                 (tmp_path / "f", [], f"{tmp_path / 'f'}: a file"),
                                 (d, [], f"{d}: holds 1")):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check_destination(out, force=False, is_ours=_accept, inputs=inputs, refusals=words)
    monkeypatch.chdir(d)
    with pytest.raises(ValueError, match=r"^\.: here$"):
        check_destination(".", force=False, is_ours=_accept, refusals=words)


def test_a_datasets_output_is_checked_after_an_interrupted_replace_is_put_back(tmp_path: Path, monkeypatch) -> None:
    """The old dataset an interrupted --force set aside is restored before the check, so a rerun
    without --force is refused rather than replacing it; a dataset's partitions are never written
    over the current folder, --force or not."""
    import subprocess

    from meshshard.data import write_dataset
    from meshshard.data._dataset_partitions import _check_parts_output
    from meshshard.data._folder_guard import check_dataset_output

    from .conftest import grid_triangles

    pts, tri = grid_triangles(5, 4)
    data = write_dataset(tmp_path / "d", np.ones((2, len(pts), 1)), np.ones((2, len(pts), 1)), pos=pts,
                         cells=[("triangle", tri)])
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.rename(data, tmp_path / f".d.meshshard-old-{dead.pid}")
    with pytest.raises(ValueError, match=r"d: exists and is not empty \(pass --force to replace a dataset folder\)$"):
        check_dataset_output(data, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "partitions.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "p")
    with pytest.raises(ValueError, match="is the current folder or one of its parents"):
        _check_parts_output(Path("."), True)


# compressed inputs, damaged metadata, the expansion cap (issue 27 §4) ------------------------

def _metis_graph_text(n: int) -> bytes:
    """A ring of ``n`` vertices in METIS's graph format."""
    lines = [f"{n} {n}"] + [f"{(i - 1) % n + 1} {(i + 1) % n + 1}" for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def test_a_gz_input_is_read_end_to_end_and_a_truncated_one_is_one_line(tmp_path: Path, capsys) -> None:
    import gzip

    text = _metis_graph_text(40)
    (tmp_path / "ring.graph").write_bytes(text)
    (tmp_path / "ring.graph.gz").write_bytes(gzip.compress(text))
    assert main(["partition", str(tmp_path / "ring.graph.gz"), "-k", "3", "-o", str(tmp_path / "gz"), "-q"]) == 0
    assert main(["partition", str(tmp_path / "ring.graph"), "-k", "3", "-o", str(tmp_path / "plain"), "-q"]) == 0
    assert main(["verify", str(tmp_path / "gz")]) == 0
    for rank in range(3):
        a, b = load_partition(tmp_path / "gz", rank), load_partition(tmp_path / "plain", rank)
        np.testing.assert_array_equal(a.owned_ids, b.owned_ids)
        np.testing.assert_array_equal(a.edge_index, b.edge_index)
    capsys.readouterr()
    (tmp_path / "cut.graph.gz").write_bytes(gzip.compress(text)[:-12])
    assert main(["partition", str(tmp_path / "cut.graph.gz"), "-k", "3", "-o", str(tmp_path / "cut"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"meshshard partition: error: {tmp_path / 'cut.graph.gz'}: cannot decompress (")
    assert err.count("\n") == 1 and not (tmp_path / "cut").exists()


@pytest.mark.parametrize("text", ["[" * 200000, '{"format": NaN}', "[1, Infinity]"])
def test_damaged_partition_json_is_one_line_in_every_command(text: str, two, capsys) -> None:
    """Nesting deep enough to exhaust Python's recursion, or a NaN/Infinity constant (not JSON):
    verify, info, plot and partition --force print one line naming the file and exit 2."""
    a, _ = two
    (a / "partition.json").write_text(text)
    for argv in (["verify", str(a)], ["info", str(a)], ["info", str(a), "--json"],
                 ["plot", str(a), "--out", str(a.parent / "x.png")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{a / 'partition.json'}: not valid JSON (" in err, (argv, err)
    with pytest.raises(ValueError, match="partition.json: not valid JSON"):
        read_metadata(a)


def test_partition_force_over_a_damaged_partition_json_is_one_line(mesh_file: Path, tmp_path: Path,
                                                                   capsys) -> None:
    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2)) == 0
    (out / "partition.json").write_text("[" * 200000)
    capsys.readouterr()
    assert main(_partition(mesh_file, out, 2, "--force")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a partition folder" in err, err


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "-inf", "lots", "1e400"])
def test_the_expansion_cap_is_checked_alike_from_the_flag_and_the_environment(
        value: str, mesh_file: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2, f"--max-expansion={value}")) == 2
    flag = capsys.readouterr().err
    assert flag == ("meshshard partition: error: Expected --max-expansion to be a positive finite number "
                    f"(got {value!r})\n"), flag
    monkeypatch.setenv("MESHSHARD_MAX_EXPANSION", value)
    assert main(_partition(mesh_file, out, 2)) == 2
    env = capsys.readouterr().err
    assert env == ("meshshard partition: error: Expected MESHSHARD_MAX_EXPANSION to be a positive finite number "
                   f"(got {value!r})\n"), env
    assert not out.exists()


def test_a_valid_expansion_cap_is_taken(mesh_file: Path, tmp_path: Path, monkeypatch) -> None:
    from meshshard.partition._readers import max_expansion, parse_max_expansion

    assert parse_max_expansion("250", "--max-expansion") == 250.0
    monkeypatch.setenv("MESHSHARD_MAX_EXPANSION", "1e6")
    assert max_expansion() == 1e6
    assert main(_partition(mesh_file, tmp_path / "p", 2, "--max-expansion", "3.5")) == 0


def test_a_full_disk_names_the_file_and_leaves_nothing(mesh_file: Path, tmp_path: Path, monkeypatch,
                                                      capsys) -> None:
    import errno

    real = np.lib.format.write_array_header_1_0
    calls = []

    def full(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array_header_1_0", full)
    out = tmp_path / "p"
    assert main(_partition(mesh_file, out, 2)) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"meshshard partition: error: \S*/\.p\.meshshard-new-\d+/part-0000[01]\.npz: cannot write "
                        r"\(No space left on device\)\n", err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# one writer per folder (folder_lock) ---------------------------------------------------------

def test_folder_lock_refuses_a_second_writer_naming_the_holder_and_leaves_nothing(tmp_path: Path) -> None:
    import socket

    from meshshard.partition import folder_lock

    out = tmp_path / "new" / "deeper" / "run"
    holder = hold_folder_lock(out)
    try:
        lock = tmp_path / "new" / "deeper" / ".run.meshshard-lock"
        assert lock.is_file() and not out.exists()
        for spelling in (out, tmp_path / "new" / "." / "deeper" / ".." / "deeper" / "run"):
            with pytest.raises(ValueError, match=(
                    rf"^{re.escape(str(spelling))}: is being written by another meshshard command \(pid {holder.pid} "
                    rf"on {re.escape(socket.gethostname())}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC: meshshard "
                    r"train X --out Y\); wait for it to end, or pick another folder \(the lock is "
                    r"\.run\.meshshard-lock beside it\)$")):
                with folder_lock(spelling):
                    pytest.fail("a second writer took the lock")
    finally:
        holder.communicate("")
    assert holder.returncode == 0, holder.stderr
    assert not (tmp_path / "new").exists()  # the lock file and the folders made for it are gone
    with folder_lock(out) as path:  # free again; nested in one process, one lock
        with folder_lock(out):
            assert path.is_file()
        assert path.is_file()
    assert not path.exists() and not (tmp_path / "new").exists()


def test_a_lock_left_by_a_killed_process_is_taken_over_and_counts_as_ours(tmp_path: Path, mesh_file: Path) -> None:
    import json
    import signal

    from meshshard.partition import folder_lock, is_lock_file

    out = tmp_path / "out"
    holder = hold_folder_lock(out)
    lock = tmp_path / ".out.meshshard-lock"
    assert not is_lock_file(lock)  # held: its command is still writing
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    assert json.loads(lock.read_text())["pid"] == holder.pid  # left behind, but no longer held
    assert is_lock_file(lock) and not is_lock_file(tmp_path / "other.meshshard-lock")
    with folder_lock(out, command="the next one") as path:
        assert path == lock and json.loads(lock.read_text()) | {"started": 0} == {
            "pid": os.getpid(), "host": __import__("socket").gethostname(), "command": "the next one", "started": 0}
    assert not lock.exists()
    # a stale lock inside a partition folder (of a folder that was to be made there) is ours: --force replaces it
    parts = tmp_path / "parts"
    assert main(_partition(mesh_file, parts, 2)) == 0
    holder = hold_folder_lock(parts / "sub")
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    assert (parts / ".sub.meshshard-lock").is_file()
    assert verify_partition(parts) == []
    assert main(_partition(mesh_file, parts, 3, "--force")) == 0
    assert read_metadata(parts)["num_parts"] == 3 and not (parts / ".sub.meshshard-lock").exists()


def test_a_lock_in_the_place_of_a_hard_link_a_link_a_folder_or_a_fifo_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 36, defect 11: a lock file name that was a hard link to a user's file got the file
    replaced by the lock's JSON; a FIFO there said only "[Errno 22] Invalid argument", a link or a
    folder was an OSError (exit 1). Each is one ValueError naming the lock, the user's file untouched."""
    from meshshard.partition import folder_lock

    mine = tmp_path / "notes.txt"
    mine.write_text("the user's words\n")
    lock = tmp_path / ".run.meshshard-lock"
    for make, what in ((lambda: os.link(mine, lock), r"a hard link \(2 names share this file"),
                       (lambda: lock.symlink_to(mine), "a symbolic link, not a lock file of meshshard's"),
                       (lambda: lock.mkdir(), "a folder, not a lock file of meshshard's"),
                       (lambda: os.mkfifo(lock), "a FIFO, not a lock file of meshshard's")):
        make()
        with pytest.raises(ValueError, match=rf"^{re.escape(str(lock))}: is {what}.*\(move it away\)$"):
            with folder_lock(tmp_path / "run"):
                pytest.fail("the lock was taken")
        assert mine.read_text() == "the user's words\n" and not (tmp_path / "run").exists()
        lock.rmdir() if lock.is_dir() and not lock.is_symlink() else lock.unlink()
