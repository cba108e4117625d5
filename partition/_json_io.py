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
- a failed write (a full disk) names the file it was writing (:func:`naming_write_errors`).

numpy-free and standard library only.
"""

from __future__ import annotations

import json
import os
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


def write_text_file(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path``; a failure names the file (:func:`naming_write_errors`)."""
    with naming_write_errors(path):
        Path(path).write_text(text)
