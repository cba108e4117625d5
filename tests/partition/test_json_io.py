"""The strict metadata JSON helper: nothing non-finite written, nothing unbounded or non-JSON read."""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import pytest

from meshshard.partition import WriteError, dumps_json, loads_json, naming_write_errors, read_json, write_text_file


def test_dumps_refuses_what_strict_json_cannot_hold() -> None:
    assert dumps_json({"std": [1.0, 2.5]}) == '{"std": [1.0, 2.5]}'
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^Expected finite numbers only in the metadata \(Out of range float"):
            dumps_json({"std": [1.0, bad]})


@pytest.mark.parametrize(("text", "reason"), [
    ("[" * 200000, r"nested too deeply"),
    ("{\"a\": " * 100000 + "1" + "}" * 100000, r"nested too deeply"),
    ('{"std": [NaN]}', r"NaN is not a JSON number"),
    ('{"std": Infinity}', r"Infinity is not a JSON number"),
    ("[-Infinity]", r"-Infinity is not a JSON number"),
    ('{"a": 1', r"Expecting ',' delimiter"),
    (b"\xff\xfe\x00", r".+"),
])
def test_loads_refuses_deep_nests_constants_and_broken_text_in_one_line(text: str | bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=rf"^where\.json: not valid JSON \({reason}") as info:
        loads_json(text, "where.json")
    assert "\n" not in str(info.value)


def test_read_json_is_bounded_and_reads_regular_files_only(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"a": [1, 2]}')
    assert read_json(tmp_path / "m.json") == {"a": [1, 2]}
    with pytest.raises(ValueError, match=r"m\.json: is larger than expected \(13 bytes, at most 8\)"):
        read_json(tmp_path / "m.json", max_bytes=8)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ValueError, match=r"fifo\.json: is not a regular file"):
        read_json(tmp_path / "fifo.json")


def test_a_failed_write_names_its_file(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    with pytest.raises(WriteError, match=rf"^{target}: cannot write \(No space left on device\)$") as info:
        with naming_write_errors(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    with pytest.raises(WriteError, match=r"missing/x\.json: cannot write \(No such file or directory\)$"):
        write_text_file(tmp_path / "missing" / "x.json", "{}")
    write_text_file(target, "{}\n")
    assert target.read_text() == "{}\n"


def test_nothing_is_written_through_a_hard_link_a_link_or_a_fifo(tmp_path: Path) -> None:
    """Issue 36, defect 11: a file meshshard writes whose name is a hard link to a user's file
    replaced the user's file; a FIFO there blocked the writer. Each is refused before a byte is written."""
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's words\n")
    os.link(mine, tmp_path / "metrics.json")
    with pytest.raises(ValueError, match=r"metrics.json: is a hard link \(2 names share this file"):
        write_text_file(tmp_path / "metrics.json", "{}\n")
    (tmp_path / "link.json").symlink_to(mine)
    with pytest.raises(ValueError, match=r"link.json: is a symbolic link, not a file of meshshard's"):
        write_text_file(tmp_path / "link.json", "{}\n")
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ValueError, match=r"fifo.json: is a FIFO, not a file of meshshard's"):
        write_text_file(tmp_path / "fifo.json", "{}\n")
    assert mine.read_text() == "the user's words\n"
    write_text_file(tmp_path / "new.json", "{}\n")  # a file of its own: written, and written over
    write_text_file(tmp_path / "new.json", "[]\n")
    assert (tmp_path / "new.json").read_text() == "[]\n"
