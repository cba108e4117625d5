"""Metadata JSON, strict both ways, and write errors that name their file.

Every metadata file meshshard writes or reads (``partition.json``, ``partitions.json``,
``dataset.json``, a run's ``log.jsonl``, a prediction's ``metrics.json``) goes through this
module, so that:

- what is written is strict JSON (:func:`dumps_json`): a NaN or an infinity is refused rather
  than written as ``NaN`` / ``Infinity``, which no strict reader accepts;
- what is read is bounded and strict (:func:`loads_json`, :func:`read_json`): at most
  ``max_bytes``, nesting that would exhaust Python's recursion refused (the decoder's
  ``RecursionError`` caught), no ``NaN`` / ``Infinity`` constants; every problem is a one-line
  ``ValueError("FILE: not valid JSON (...)")``;
- a failed write (a full disk) names the file it was writing (:func:`naming_write_errors`);
- a file is written only where it is a regular file of its own (:func:`open_own`): never through a
  hard link to another name (a user's file), a symbolic link or a FIFO found in its place.

numpy-free and standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._readers import read_inside, read_regular

__all__ = [
    "WriteError",
    "MAX_JSON_BYTES",
    "dumps_json",
    "loads_json",
    "naming_write_errors",
    "open_own",
    "read_json",
    "read_json_inside",
    "write_text_file",
]

#: The largest metadata file read by default (a dataset of a million samples is ~150 MB).
MAX_JSON_BYTES = 256 << 20


def dumps_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, allow_nan=False, **options)``: strict JSON, or a one-line
    ``ValueError`` saying that a value is not finite."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError as err:
        raise ValueError(f"Expected finite numbers only in the metadata ({err})") from None


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_json(data: bytes | str, label: object) -> Any:
    """The JSON value of ``data``, strictly: no nesting deeper than Python's recursion allows,
    no ``NaN`` / ``Infinity``; else ``ValueError("LABEL: not valid JSON (...)")``."""
    try:
        return json.loads(data, parse_constant=_constant)
    except RecursionError:  # json's decoder recurses once per level: a deep nest is refused, not a crash
        raise ValueError(f"{label}: not valid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{label}: not valid JSON ({err})") from None


def read_json(path: str | os.PathLike[str], *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of the regular file ``path`` (at most ``max_bytes``; a FIFO or a folder is
    refused), parsed by :func:`loads_json`."""
    return loads_json(read_regular(path, max_bytes=max_bytes), path)



def read_json_inside(folder: str | os.PathLike[str], name: str, *, max_bytes: int) -> Any:
    """The JSON value of the file ``name`` inside ``folder`` (read as :func:`read_inside` reads,
    parsed strictly as :func:`loads_json` parses);
    ``ValueError("FOLDER/NAME: not valid JSON (...)")`` when it does not parse."""
    return loads_json(read_inside(folder, name, max_bytes=max_bytes), Path(folder) / name)

class WriteError(OSError):
    """A write that failed, its message starting with the file's name (``PATH: cannot write
    (No space left on device)``); ``errno`` is the original error's."""


@contextmanager
def naming_write_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise an ``OSError`` of the block (a full disk, a read-only folder) as one that names
    ``path``: :class:`WriteError` ``("PATH: cannot write (No space left on device)")``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as err:
        named = WriteError(f"{path}: cannot write ({err.strerror or err})")
        named.errno = err.errno
        raise named from None


def own_descriptor(path: str | os.PathLike[str], flags: int = 0, *, what: str = "file") -> int:
    """A descriptor open for writing on ``path``, a regular file of its own: made when missing; one
    found in its place that is a hard link (``st_nlink > 1``: another name shares its content, a
    user's file), a symbolic link, a folder or a FIFO is refused in one ``ValueError`` before a byte
    is written. ``flags`` adds to ``O_WRONLY | O_CREAT`` (``O_RDWR`` replaces ``O_WRONLY``)."""
    mode = os.O_RDWR if flags & os.O_RDWR else os.O_WRONLY
    base = (mode | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            | getattr(os, "O_CLOEXEC", 0) | (flags & ~(os.O_RDWR | os.O_TRUNC)))
    try:
        fd = os.open(path, base, 0o644)  # non-blocking: a FIFO never blocks the open; no O_TRUNC before the checks
    except OSError as err:
        try:
            found = os.lstat(path)
        except OSError:
            raise err from None
        if stat.S_ISREG(found.st_mode):  # a file of ours we may not write (no permission): the OSError as it is
            raise
        raise ValueError(f"{path}: is {_kind(found.st_mode)}, not a {what} of meshshard's; refusing to write over "
                         "it (move it away)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: is {_kind(info.st_mode)}, not a {what} of meshshard's; refusing to write "
                             "over it (move it away)")
        if info.st_nlink > 1:
            raise ValueError(f"{path}: is a hard link ({info.st_nlink} names share this file: one may be yours); "
                             f"refusing to write a {what} over it (move it away)")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_NONBLOCK", 0))
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a device or socket")


def open_own(path: str | os.PathLike[str], mode: str = "w") -> Any:
    """``open(path, mode)`` for writing (``w``, ``a``, ``wb``, ``ab``), checked as
    :func:`own_descriptor` checks: never through a hard link, a symbolic link or a FIFO."""
    if mode.rstrip("b") not in ("w", "a"):
        raise ValueError(f"Expected a mode to write (w, a, wb or ab; got {mode!r})")
    flags = os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    return os.fdopen(own_descriptor(path, flags), mode)


def write_text_file(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` (:func:`open_own`: never through a hard link, a symbolic link or a
    FIFO in its place); a failure names the file (:func:`naming_write_errors`)."""
    with naming_write_errors(path), open_own(path) as file:
        file.write(text)
