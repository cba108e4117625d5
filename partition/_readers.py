"""Reading what a user's folders hold, checked and bounded: the low-level readers under every
offline folder (partitions, datasets) and the metadata JSON on top of them (:mod:`._json_io`).

numpy and the standard library only. Two concerns:

- **Reading files named by metadata**: :func:`read_inside` reads only a regular file inside a
  folder (the name resolved and checked for containment, no absolute path, no ``..``, the file
  type checked with ``fstat`` on a descriptor opened non-blocking, so a FIFO never blocks), and
  at most ``max_bytes`` of it. :func:`read_regular` does the same for a path the user gave, and
  :func:`open_regular` hands the checked file to a reader that takes one (``torch.load``).
- **Decoding what was read, bounded**: :func:`decompress` caps the expansion of ``.bz2`` and
  ``.gz`` files; :func:`read_npy` and :func:`read_npz` check every array's declared shape
  against the bytes actually there before allocating it, and refuse pickles.

Every problem is a one-line ``ValueError``.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import math
import os
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

__all__ = [
    "MAX_EXPANSION",
    "decompress",
    "hash_regular",
    "max_expansion",
    "open_regular",
    "parse_max_expansion",
    "read_inside",
    "read_npy",
    "read_npz",
    "read_regular",
]

#: Default cap on ``decompressed size / compressed size`` (text meshes and graphs compress
#: 3-15x); overridden by ``MESHSHARD_MAX_EXPANSION`` or the ``max_expansion`` arguments.
MAX_EXPANSION = 100.0
#: Output any compressed input may expand to, whatever its ratio (small files compress well).
_EXPANSION_FLOOR = 64 << 20


def _checked_fd(path: Path, label: object, max_bytes: int | None, follow: bool) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path``, opened non-blocking (a FIFO never blocks the
    open), and its ``fstat``; anything else is refused, and the descriptor closed."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ValueError(f"{label}: missing") from None
    except OSError as err:
        raise ValueError(f"{label}: cannot open ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ValueError(f"{label}: is a folder, expected a file")
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{label}: is not a regular file (a FIFO, device or socket)")
        if max_bytes is not None and info.st_size > max_bytes:
            raise ValueError(f"{label}: is larger than expected ({info.st_size:,} bytes, at "
                             f"most {max_bytes:,})")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


@contextmanager
def open_regular(path: str | os.PathLike[str], *, label: object = None, max_bytes: int | None = None,
                 follow: bool = True) -> Iterator[BinaryIO]:
    """The regular file ``path`` opened for reading (``rb``), for a reader that takes a file (``torch.load``,
    ``np.load``): the one checked opener under every file a command reads. A FIFO, device, socket or
    folder is refused in one line (never opened for a blocking read), so is a file over ``max_bytes``
    and, with ``follow=False``, a symbolic link. ``label`` names the file in errors (default ``path``)."""
    fd, _ = _checked_fd(Path(path), path if label is None else label, max_bytes, follow)
    with os.fdopen(fd, "rb") as file:
        yield file


def _open_regular(path: Path, label: object, max_bytes: int | None, *,
                  follow: bool = True, digest: Any = None, head: int | None = None) -> bytes:
    """Read a regular file through a non-blocking descriptor, at most ``max_bytes``.

    With ``digest`` (a ``hashlib`` object) the file is streamed through it in 16 MiB chunks
    and only its first ``head`` bytes are returned, so a large file is never held whole.
    """
    fd, info = _checked_fd(path, label, max_bytes, follow)
    with os.fdopen(fd, "rb") as file:
        if digest is None:
            return file.read(info.st_size)
        first = b""
        while chunk := file.read(1 << 24):
            digest.update(chunk)
            if len(first) < (head or 0):
                first += chunk[:(head or 0) - len(first)]
        return first


def read_regular(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (a FIFO, device or folder is refused, never
    opened for a blocking read)."""
    return _open_regular(Path(path), path, max_bytes)


def hash_regular(path: str | os.PathLike[str], *, head: int = 4096) -> tuple[str, bytes]:
    """SHA-256 of the regular file ``path``, streamed (never held whole), and its first
    ``head`` bytes; refused like :func:`read_regular`."""
    digest = hashlib.sha256()
    first = _open_regular(Path(path), path, None, digest=digest, head=head)
    return digest.hexdigest(), first


def read_inside(folder: str | os.PathLike[str], name: object, *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``name`` inside ``folder``, at most ``max_bytes``.

    ``name`` (from metadata) must be a relative path with no ``..`` that, symbolic links
    resolved, stays inside ``folder``.
    """
    folder = Path(folder)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{folder}: Expected a file name in the metadata (got {name!r})")
    rel = Path(name)
    label = folder / name
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{label}: Expected a file inside the folder (got {name!r})")
    root = folder.resolve()
    target = (root / rel).resolve()
    if target == root or not target.is_relative_to(root):
        raise ValueError(f"{label}: Expected a file inside the folder (it resolves to "
                         f"{target})")
    return _open_regular(target, label, max_bytes, follow=False)


def parse_max_expansion(value: str | float, what: str) -> float:
    """``value`` (``--max-expansion``'s text, ``MESHSHARD_MAX_EXPANSION`` or a number) as the
    expansion cap: a positive finite number, else ``ValueError`` naming ``what``. The one check
    of both the flag and the environment variable."""
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        ratio = math.nan
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"Expected {what} to be a positive finite number (got {str(value)!r})")
    return ratio


def max_expansion() -> float:
    """The expansion cap in force: ``MESHSHARD_MAX_EXPANSION`` or :data:`MAX_EXPANSION`."""
    text = os.environ.get("MESHSHARD_MAX_EXPANSION")
    return MAX_EXPANSION if text is None else parse_max_expansion(text, "MESHSHARD_MAX_EXPANSION")


def decompress(stored: bytes, suffix: str, *, expansion: float | None = None) -> bytes:
    """``stored`` decompressed when ``suffix`` is ``.bz2`` or ``.gz`` (else as is), refusing
    output beyond ``max(64 MiB, expansion * len(stored))`` before producing it.

    ``expansion`` defaults to :func:`max_expansion`.
    """
    openers: dict[str, Callable[[io.BytesIO], Any]] = {
        ".bz2": bz2.BZ2File, ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb")}
    opener = openers.get(suffix.lower())
    if opener is None:
        return stored
    ratio = max_expansion() if expansion is None else parse_max_expansion(expansion, "max_expansion")
    limit = max(_EXPANSION_FLOOR, int(ratio * len(stored)))
    try:
        with opener(io.BytesIO(stored)) as file:
            raw = file.read(limit + 1)
    except (OSError, EOFError, ValueError) as err:
        raise ValueError(f"cannot decompress ({err})") from None
    if len(raw) > limit:
        raise ValueError(
            f"decompresses to more than {limit:,} bytes ({ratio:g} times its {len(stored):,} "
            "bytes, or 64 MiB); if the file is genuine, raise the cap with --max-expansion or "
            "MESHSHARD_MAX_EXPANSION")
    return raw


def _prefix(label: object) -> str:
    return f"{label}: " if label not in (None, "") else ""


def _parse_npy(buf: memoryview, label: object) -> np.ndarray:
    """One ``.npy`` held in ``buf``: header, size check, then a copy of the data."""
    at = _prefix(label)
    fmt = np.lib.format
    head = io.BytesIO(buf[:1 << 16])
    try:
        version = fmt.read_magic(head)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(head)
        else:
            shape, fortran, dtype = fmt.read_array_header_2_0(head)
    except (ValueError, EOFError, OSError, SyntaxError) as err:
        raise ValueError(f"{at}not a valid .npy array ({err})") from None
    if dtype.hasobject:
        raise ValueError(f"{at}holds Python objects (pickled data), refused")
    count = int(np.prod(shape, dtype=np.int64))
    left = len(buf) - head.tell()
    if count * dtype.itemsize != left:
        raise ValueError(f"{at}declares a {'x'.join(map(str, shape)) or 'scalar'} {dtype} "
                         f"array of {count * dtype.itemsize:,} bytes but holds {max(left, 0):,}")
    array = np.frombuffer(buf, dtype=dtype, count=count, offset=head.tell()).copy()
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def read_npy(data: bytes, label: object = None) -> np.ndarray:
    """The array of a ``.npy`` file's bytes (no pickles; size checked before allocating).
    Errors start with ``label:`` when one is given."""
    if not data:
        raise ValueError(f"{_prefix(label)}empty file, expected a .npy array")
    return _parse_npy(memoryview(data), label)


def _member_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo, data: bytes,
                  where: str) -> memoryview:
    """A member's uncompressed bytes: a view into ``data`` when stored (CRC checked), else
    inflated by zipfile (its size already capped)."""
    if info.compress_type != zipfile.ZIP_STORED:
        try:
            with archive.open(info) as member:
                return memoryview(member.read())
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, ValueError) as err:
            raise ValueError(f"{where}: cannot be read ({err})") from None
    local = data[info.header_offset:info.header_offset + 30]
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{where}: truncated or damaged archive")
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + \
        int.from_bytes(local[28:30], "little")
    view = memoryview(data)[start:start + info.file_size]
    if len(view) != info.file_size or zlib.crc32(view) != info.CRC:
        raise ValueError(f"{where}: truncated or damaged (CRC mismatch)")
    return view


def read_npz(data: bytes, label: object = None, *, expansion: float | None = None
             ) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` archive's bytes, by name, in archive order.

    Each member's declared uncompressed size is capped as in :func:`decompress` (stored members
    are bounded by the archive itself), and its array's declared shape checked against it.
    """
    ratio = max_expansion() if expansion is None else parse_max_expansion(expansion, "max_expansion")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise ValueError(f"{_prefix(label)}not a valid .npz archive ({err})") from None
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            where = f"{_prefix(label)}member {info.filename!r}"
            if info.compress_type != zipfile.ZIP_STORED and info.file_size > max(
                    _EXPANSION_FLOOR, ratio * info.compress_size):
                raise ValueError(f"{where}: expands to {info.file_size:,} bytes from "
                                 f"{info.compress_size:,}; raise --max-expansion if genuine")
            if info.compress_type == zipfile.ZIP_STORED and info.file_size > len(data):
                raise ValueError(f"{where}: larger than the archive (truncated?)")
            arrays[name] = _parse_npy(_member_bytes(archive, info, data, where), where)
    return arrays
