"""What a VTK or HDF5 file declares, checked before vtk reads it (:func:`check_vtk_file`), so that a
few-kilobyte file can neither abort the process, hang it, nor make it allocate gigabytes, and the
files a collection names are the ones a user gave.

- **Every file read**, given or named by a collection (a ``.vtm`` block, a ``.pvtu`` piece, a
  ``.pvd`` frame: :func:`check_reference`), is a regular file (opened non-blocking and ``fstat``-ed:
  a FIFO or a device is refused, never waited on). A named file is inside the collection's folder:
  a relative name, no ``..``, no symbolic link out, and (``.vtkhdf``) no HDF5 external link, no
  virtual or externally stored dataset; ``MESHSHARD_ALLOW_OUTSIDE_REFERENCES=1`` lifts this rule
  for collections that genuinely point elsewhere.
- **VTK XML** (``.vtp``, ``.vtu``, ``.vtm``, ``.pvtu``, ...): the tags are scanned with a bounded
  regular expression, up to ``<AppendedData``, on the file mapped read-only (no XML parser, no
  entity expansion, nothing held). Each piece's counts and each array's tuples x components x
  bytes are compared with the bytes the file holds for it: an ascii value takes at least two
  characters, base64 four characters per three bytes, an appended or binary block what its
  header says, the header itself within the file; a compressed block expands at most
  :func:`~meshshard.partition.files.max_expansion` times (``MESHSHARD_MAX_EXPANSION``, 100, and
  never less than 64 MiB), as a ``.bz2`` input does. The last offset of a cell array (the
  connectivity vtk allocates) is checked against its connectivity array the same way.
- **VTKHDF** (with ``h5py``): every dataset's size against the bytes it has stored (compressed:
  the same expansion cap), the counts (``NumberOfPoints``, ``NumberOfCells``, ...) against the
  datasets they index, the datasets vtk reads present, and the cell types against those
  meshshard reads (a polyhedron is refused here, before vtk meets its missing faces).

Every problem is a one-line ``ValueError`` naming the file.
"""

from __future__ import annotations

import base64
import binascii
import lzma
import mmap
import os
import re
import zlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition.files import max_expansion, open_regular

__all__ = ["ALLOW_OUTSIDE", "check_reference", "check_vtk_file", "cell_type_refusal", "outside_allowed"]

#: The environment variable that lets a collection name files outside its folder.
ALLOW_OUTSIDE = "MESHSHARD_ALLOW_OUTSIDE_REFERENCES"
_FLOOR = 64 << 20  # any compressed block may expand to 64 MiB, whatever its ratio (as partition.files)
_MAX_DEPTH = 8  # collections within collections
_XML = {".vtp", ".vtu", ".vti", ".vts", ".vtr", ".vtm", ".vtmb", ".pvtu", ".pvtp", ".pvti", ".pvts", ".pvtr"}
_HDF = {".vtkhdf", ".hdf", ".hdf5", ".h5"}
_SIZES = {"Int8": 1, "UInt8": 1, "Char": 1, "Int16": 2, "UInt16": 2, "Int32": 4, "UInt32": 4, "Float32": 4,
          "Int64": 8, "UInt64": 8, "Float64": 8, "IdType": 8, "Bit": 1}
_NUMPY = {"Int8": "i1", "UInt8": "u1", "Int16": "i2", "UInt16": "u2", "Int32": "i4", "UInt32": "u4", "Int64": "i8",
          "UInt64": "u8", "Float32": "f4", "Float64": "f8"}
_TAG = re.compile(rb"<(/?)([A-Za-z_][\w.:-]*)((?:[^<>\"']|\"[^\"<>]*\"|'[^'<>]*')*)>")
_ATTR = re.compile(rb"([\w.:-]+)\s*=\s*(?:\"([^\"<>]*)\"|'([^'<>]*)')")
_CELL_SECTIONS = {"Cells", "Verts", "Lines", "Strips", "Polys"}
_RESET = "set MESHSHARD_ALLOW_OUTSIDE_REFERENCES=1 if it genuinely points elsewhere"


def outside_allowed() -> bool:
    """Whether ``MESHSHARD_ALLOW_OUTSIDE_REFERENCES`` lets collections name files anywhere."""
    return os.environ.get(ALLOW_OUTSIDE, "").strip() not in ("", "0")


def cell_type_refusal(vtk_type: int, path: Path) -> ValueError:
    """The one-line error for cells of a VTK type meshshard does not read."""
    what = {2: "poly-vertex", 4: "poly-line", 6: "triangle strip", 7: "polygon", 42: "polyhedron"}.get(
        vtk_type, f"VTK type {vtk_type}")
    hint = (" (foamToVTK writes polyhedral cells as they are: decompose them first, or write the mesh with only "
            "hexahedra, prisms, pyramids and tetrahedra)" if vtk_type == 42 else "")
    return ValueError(f"{path}: Expected cells of a fixed node count (got {what} cells, which meshshard does not "
                      f"read){hint}")


def check_reference(owner: Path, name: str) -> Path:
    """The file ``name`` that the collection ``owner`` names, checked: relative, no ``..``, inside
    ``owner``'s folder with links resolved (unless :func:`outside_allowed`), a regular file."""
    rel = Path(name)
    target = owner.parent / rel
    if not outside_allowed():
        root = owner.parent.resolve()
        resolved = target.resolve()
        if rel.is_absolute() or ".." in rel.parts or not resolved.is_relative_to(root):
            raise ValueError(f"{owner}: names {name!r}, outside its folder (it resolves to {resolved}); a collection's "
                             f"files must be inside its folder (no absolute path, no '..', no link out): {_RESET}")
    with open_regular(target, label=f"{owner}: {target}"):
        pass
    return target


def check_vtk_file(path: Path, cell_types: Collection[int], *, _seen: tuple[Path, ...] = ()) -> None:
    """Check ``path`` (and every file it names) before vtk reads it: see the module docstring.
    ``cell_types`` are the VTK cell types meshshard reads."""
    if len(_seen) > _MAX_DEPTH:
        raise ValueError(f"{path}: collections nested more than {_MAX_DEPTH} deep")
    if path.resolve() in _seen:
        raise ValueError(f"{_seen[-1]}: names {path}, which names it again (a cycle)")
    suffix = path.suffix.lower()
    if suffix in _HDF:
        _check_hdf(path, cell_types)
        return
    if suffix == ".vtk":
        _check_legacy(path)
        return
    if suffix not in _XML:
        with open_regular(path):
            return
    for name in _check_xml(path):
        ref = check_reference(path, name)
        check_vtk_file(ref, cell_types, _seen=(*_seen, path.resolve()))


# ---------------------------------------------------------------------------------------------
# VTK XML


class _Xml:
    """The file mapped read-only, what its ``VTKFile`` tag says, and where its appended data starts."""

    def __init__(self, path: Path, buf: Any, attrs: dict[str, str]) -> None:
        self.path, self.buf, self.size = path, buf, len(buf)
        self.header = 8 if attrs.get("header_type") == "UInt64" else 4
        self.order = ">" if attrs.get("byte_order") == "BigEndian" else "<"
        self.compressor = attrs.get("compressor", "")
        self.ratio = max_expansion()
        self.appended: int | None = None
        self.appended_base64 = False

    def expands(self, stored: int) -> int:
        return max(_FLOOR, int(self.ratio * stored))


def _attrs(raw: bytes) -> dict[str, str]:
    return {m.group(1).decode("ascii", "replace"): (m.group(2) if m.group(2) is not None else m.group(3) or b"")
            .decode("utf-8", "replace").strip() for m in _ATTR.finditer(raw)}


def _count(attrs: dict[str, str], key: str, path: Path, default: int = 0) -> int:
    text = attrs.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{path}: Expected a whole number as {key} (got {text[:40]!r})") from None
    if value < 0:
        raise ValueError(f"{path}: Expected {key} >= 0 (got {value:,})")
    return value


def _extent(attrs: dict[str, str], path: Path) -> tuple[int, int] | None:
    """(points, cells) of a structured piece's ``Extent``; None without one."""
    text = attrs.get("Extent")
    if text is None:
        return None
    try:
        ends = [int(v) for v in text.split()]
    except ValueError:
        ends = []
    if len(ends) != 6:
        raise ValueError(f"{path}: Expected six whole numbers as Extent (got {text[:60]!r})")
    dims = [max(hi - lo + 1, 0) for lo, hi in zip(ends[::2], ends[1::2])]
    points = dims[0] * dims[1] * dims[2]
    cells = int(np.prod([d - 1 for d in dims if d > 1], dtype=object)) if points else 0
    return points, cells


def _check_xml(path: Path) -> list[str]:
    """Check a VTK XML file's declared sizes (module docstring); the files it names."""
    with open_regular(path) as file:
        fd = file.fileno()
        if os.fstat(fd).st_size == 0:
            raise ValueError(f"{path}: empty file, expected a VTK XML file")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            return _scan(path, buf)


def _scan(path: Path, buf: Any) -> list[str]:
    end = buf.find(b"<AppendedData")
    end = len(buf) if end < 0 else end
    xml: _Xml | None = None
    refs: list[str] = []
    pieces: list[tuple[dict[str, str], list[tuple[str, dict[str, str], tuple[int, int] | None]]]] = []
    sections: list[str] = []
    open_array: tuple[str, dict[str, str], int] | None = None
    field_arrays: list[tuple[str, dict[str, str], tuple[int, int] | None]] = []
    for m in _TAG.finditer(buf, 0, end):
        closing, name, raw = m.group(1) == b"/", m.group(2).decode("ascii", "replace"), m.group(3)
        empty = raw.rstrip().endswith(b"/")
        if closing:
            if name == "DataArray" and open_array is not None:
                section, attrs, start = open_array
                (pieces[-1][1] if pieces else field_arrays).append((section, attrs, (start, m.start())))
                open_array = None
            elif sections and name == sections[-1]:
                sections.pop()
            continue
        attrs = _attrs(raw)
        if name == "VTKFile":
            xml = _Xml(path, buf, attrs)
        elif name == "Piece":
            if "Source" in attrs:
                refs.append(attrs["Source"])
            else:
                pieces.append((attrs, []))
        elif name == "DataSet" and "file" in attrs:
            refs.append(attrs["file"])
        elif name in ("DataArray", "Array"):
            section = sections[-1] if sections else ""
            if empty:
                (pieces[-1][1] if pieces else field_arrays).append((section, attrs, None))
            else:
                open_array = (section, attrs, m.end())
        elif not empty and name in ("Points", "PointData", "CellData", "FieldData", "Coordinates",
                                    *_CELL_SECTIONS):
            sections.append(name)
    if xml is None:
        raise ValueError(f"{path}: Expected a VTK XML file (got no <VTKFile> tag)")
    if end < len(buf):
        tag = _TAG.match(buf, end)
        if tag is None:
            raise ValueError(f"{path}: damaged <AppendedData> tag")
        at = tag.end()
        while at < len(buf) and buf[at:at + 1] in b" \t\r\n":
            at += 1
        if buf[at:at + 1] != b"_":
            raise ValueError(f"{path}: Expected '_' where the appended data starts")
        xml.appended, xml.appended_base64 = at + 1, _attrs(tag.group(3)).get("encoding") == "base64"
    _check_pieces(xml, pieces, field_arrays)
    return refs


def _check_pieces(xml: _Xml, pieces: list, field_arrays: list) -> None:
    path = xml.path
    bound = xml.expands(xml.size) if xml.compressor else xml.size
    for attrs, arrays in pieces:
        extent = _extent(attrs, path)
        points = extent[0] if extent else _count(attrs, "NumberOfPoints", path)
        kinds = {s: _count(attrs, f"NumberOf{s}", path) for s in ("Verts", "Lines", "Strips", "Polys")}
        cells = extent[1] if extent else _count(attrs, "NumberOfCells", path) + sum(kinds.values())
        for what, n in (("points", points), ("cells", cells)):
            if n > bound:
                raise ValueError(f"{path}: a piece declares {n:,} {what}, more than the file's {xml.size:,} bytes "
                                 "can hold")
        tuples = {"Points": points, "PointData": points, "CellData": cells, "Cells": cells, **kinds}
        for section, a, span in arrays:
            if a.get("Name") != "connectivity" and section in tuples and not (
                    section in _CELL_SECTIONS and a.get("Name") not in ("offsets", "types")):
                _check_array(xml, section, a, span, tuples[section])
            else:
                _check_array(xml, section, a, span, _count(a, "NumberOfTuples", path))
        for section in _CELL_SECTIONS:
            named = {a.get("Name"): (a, span) for s, a, span in arrays if s == section}
            if "offsets" in named and "connectivity" in named:
                last = _last_value(xml, *named["offsets"])
                if last is not None:
                    _check_array(xml, section, *named["connectivity"], last, offsets=True)
    for section, a, span in field_arrays:
        _check_array(xml, section, a, span, _count(a, "NumberOfTuples", path))


def _check_array(xml: _Xml, section: str, attrs: dict[str, str], span: tuple[int, int] | None, tuples: int,
                 offsets: bool = False) -> None:
    """An array's declared values against the bytes the file holds for it."""
    path = xml.path
    comps = max(_count(attrs, "NumberOfComponents", path, 1), 1)
    kind = attrs.get("type", "Float32")
    size = _SIZES.get(kind, 1)
    need = tuples * comps * size
    have = _held(xml, attrs, span, size)
    if need > have:
        label = f"array {attrs.get('Name', section)!r}" + (f" of {section}" if section else "")
        said = (f"{tuples:,} values (the last of its offsets)" if offsets
                else f"{tuples:,} tuples x {comps:,} components")
        raise ValueError(f"{path}: {label} declares {said} of {kind}, {need:,} bytes, more than the {have:,} "
                         "the file holds for it")


def _held(xml: _Xml, attrs: dict[str, str], span: tuple[int, int] | None, size: int) -> int:
    """The most bytes an array's data can give, its block headers checked on the way."""
    fmt = attrs.get("format", "ascii")
    if fmt == "appended":
        if xml.appended is None:
            raise ValueError(f"{xml.path}: an array is appended but the file has no <AppendedData>")
        start = xml.appended + _count(attrs, "offset", xml.path)
        return _block(xml, start, xml.size, xml.appended_base64)[0]
    if span is None:
        return 0
    start, stop = span
    if fmt == "binary":
        return _block(xml, start, stop, True)[0]
    return (stop - start + 1) // 2 * size  # ascii: a digit and a separator per value at least


def _decoded(xml: _Xml, start: int, stop: int, n: int, b64: bool) -> bytes:
    """The first ``n`` bytes at ``start`` (base64: decoded)."""
    if not b64:
        return bytes(xml.buf[start:start + n]) if start + n <= stop else b""
    chars = 4 * -(-n // 3)
    text = re.sub(rb"\s+", b"", bytes(xml.buf[start:min(stop, start + 2 * chars + 256)]))[:chars]
    try:
        return base64.b64decode(text)[:n] if len(text) == chars else b""
    except (binascii.Error, ValueError):
        return b""


def _block(xml: _Xml, start: int, stop: int, b64: bool) -> tuple[int, list[int] | None]:
    """(uncompressed bytes, compressed block sizes or None) of the block at ``start``, its header
    checked against the ``stop - start`` bytes there."""
    path, h = xml.path, xml.header
    room = (stop - start) * 3 // 4 if b64 else stop - start
    dtype = np.dtype(f"{xml.order}u{h}")

    def ints(k: int) -> list[int]:
        raw = _decoded(xml, start, stop, k * h, b64)
        if len(raw) < k * h:
            raise ValueError(f"{path}: a data block's header is cut short ({k * h} bytes expected)")
        return [int(v) for v in np.frombuffer(raw, dtype=dtype)]

    if not xml.compressor:
        (n,) = ints(1)
        if n > room - h:
            raise ValueError(f"{path}: a data block says it holds {n:,} bytes, more than the {max(room - h, 0):,} "
                             "left in the file")
        return n, None
    blocks, size, last = ints(3)
    if (3 + blocks) * h > room:
        raise ValueError(f"{path}: a compressed block's header lists {blocks:,} blocks, more than the file holds")
    stored = ints(3 + blocks)[3:]
    total = (blocks - 1) * size + (last or size) if blocks else 0
    if sum(stored) > room - (3 + blocks) * h:
        raise ValueError(f"{path}: a compressed block says it stores {sum(stored):,} bytes, more than the file holds")
    cap = xml.expands(sum(stored))
    if max(total, size) > cap:
        raise ValueError(f"{path}: a compressed block says it expands to {max(total, size):,} bytes from "
                         f"{sum(stored):,} (at most {cap:,}: {xml.ratio:g} times, or 64 MiB); if the file is genuine, "
                         "raise the cap with MESHSHARD_MAX_EXPANSION")
    return total, stored


def _last_value(xml: _Xml, attrs: dict[str, str], span: tuple[int, int] | None) -> int | None:
    """The last value of an offsets array (how many connectivity values vtk allocates); None when
    it cannot be decoded here (LZ4 without the lz4 package: vtk's own checks then)."""
    kind = _NUMPY.get(attrs.get("type", ""), "")
    fmt = attrs.get("format", "ascii")
    if fmt == "ascii":
        if span is None:
            return None
        tail = bytes(xml.buf[max(span[0], span[1] - 64):span[1]]).split()
        try:
            return int(float(tail[-1])) if tail else None
        except ValueError:
            return None
    if not kind:
        return None
    start, stop = (xml.appended + _count(attrs, "offset", xml.path), xml.size) if fmt == "appended" else span
    b64 = xml.appended_base64 if fmt == "appended" else True
    data = _block_data(xml, start, stop, b64)
    size = np.dtype(kind).itemsize
    if data is None or len(data) < size:
        return None
    return int(np.frombuffer(data[-size:], dtype=f"{xml.order}{kind}")[0])


def _block_data(xml: _Xml, start: int, stop: int, b64: bool) -> bytes | None:
    """A block's data, decoded (its sizes already checked by :func:`_block`)."""
    total, stored = _block(xml, start, stop, b64)
    h = xml.header
    head = h if stored is None else (3 + len(stored)) * h
    body = total if stored is None else sum(stored)
    if b64:  # the header and the data encoded apart (vtk's way) or as one stream: the same bytes either way
        chars, more = 4 * -(-head // 3), 4 * -(-body // 3)
        text = re.sub(rb"\s+", b"", bytes(xml.buf[start:min(stop, start + 2 * (chars + more) + 256)]))
        try:
            first = base64.b64decode(text[:chars])
            whole = first + base64.b64decode(text[chars:chars + 4 * -(-(head + body - len(first)) // 3)])
        except (binascii.Error, ValueError):
            return None
    else:
        whole = bytes(xml.buf[start:start + head + body])
    if stored is None:
        return whole[head:head + total]
    inflate = _inflater(xml.compressor)
    if inflate is None:
        return None
    at, parts = head, []
    for n in stored:
        try:
            parts.append(inflate(whole[at:at + n]))
        except Exception:  # noqa: BLE001 - a damaged block: vtk says so in its own words
            return None
        at += n
    return b"".join(parts)


def _inflater(compressor: str) -> Callable[[bytes], bytes] | None:
    if "ZLib" in compressor:
        return zlib.decompress
    if "LZMA" in compressor:
        return lzma.decompress
    try:
        import lz4.block  # type: ignore[import-not-found]
    except ImportError:
        return None
    return lambda data: lz4.block.decompress(data, uncompressed_size=_FLOOR)


# ---------------------------------------------------------------------------------------------
# Legacy .vtk (PolyData, which vtk reads here)

_LEGACY = re.compile(rb"^[ \t]*(POINTS|VERTICES|LINES|POLYGONS|TRIANGLE_STRIPS|OFFSETS|CONNECTIVITY|POINT_DATA"
                     rb"|CELL_DATA|SCALARS|COLOR_SCALARS|VECTORS|NORMALS|TENSORS|TEXTURE_COORDINATES|FIELD)"
                     rb"[ \t]+([^\r\n]*)$"
                     rb"|^[ \t]*([A-Za-z_][^ \t\r\n]*)[ \t]+(\d+)[ \t]+(\d+)[ \t]+([a-z_]+)[ \t]*\r?$", re.MULTILINE)


def _check_legacy(path: Path) -> None:
    """Every count a legacy file's keyword lines declare (points, cells, attribute values, field
    arrays) against the file's size: a value takes a byte at least."""
    with open_regular(path) as file:
        fd = file.fileno()
        size = os.fstat(fd).st_size
        if size == 0:
            raise ValueError(f"{path}: empty file, expected a legacy VTK file")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            tuples = 0
            for m in _LEGACY.finditer(buf):
                if m.group(1) is None:  # a FIELD array: name, components, tuples, type
                    key, values = m.group(3).decode("utf-8", "replace"), int(m.group(4)) * int(m.group(5))
                else:
                    key = m.group(1).decode()
                    words = m.group(2).split()
                    numbers = [int(w) for w in words if w.isdigit()]
                    per = {"SCALARS": numbers[-1] if len(words) > 2 and numbers else 1, "VECTORS": 3, "NORMALS": 3,
                           "TENSORS": 9, "COLOR_SCALARS": numbers[-1] if numbers else 1,
                           "TEXTURE_COORDINATES": numbers[0] if numbers else 1}.get(key)
                    if key in ("POINT_DATA", "CELL_DATA"):
                        tuples = numbers[0] if numbers else 0
                    values = per * tuples if per is not None else 3 * numbers[0] if key == "POINTS" and numbers \
                        else max(numbers, default=0)
                if values > size:
                    raise ValueError(f"{path}: {key} declares {values:,} values, more than the file's {size:,} bytes "
                                     "can hold")


# ---------------------------------------------------------------------------------------------
# VTKHDF


def _check_hdf(path: Path, cell_types: Collection[int]) -> None:
    """Check a ``.vtkhdf`` file with h5py (module docstring)."""
    try:
        import h5py
    except ImportError:
        raise ValueError(f"{path}: reading {path.suffix} files needs the h5py package, which is not installed "
                         "(pip install h5py)") from None
    silence = getattr(getattr(h5py, "_errors", None), "silence_errors", None)
    if silence is not None:
        silence()  # h5py's HDF5 prints its error stack in threads but the main one: the error is ours, one line
    with open_regular(path) as file:
        fd = file.fileno()
        size = os.fstat(fd).st_size
    try:
        file = h5py.File(path, "r")
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not an HDF5 file h5py can open ({str(err).splitlines()[0] if str(err) else err})"
                         ) from None
    with file:
        _hdf_links(file, path, h5py)
        root = file.get("VTKHDF")
        if not isinstance(root, h5py.Group):
            raise ValueError(f"{path}: Expected a VTKHDF group at the root of the file (got none)")
        _hdf_group(root, path, cell_types, max(_FLOOR, int(max_expansion() * size)), h5py, 0)


def _hdf_links(file: Any, path: Path, h5py: Any) -> None:
    """No external links, virtual or externally stored datasets (unless allowed); every dataset's
    size against what it has stored."""
    allowed, ratio = outside_allowed(), max_expansion()

    def visit(name: str, link: Any) -> str | None:  # a problem stops the visit (h5py takes no exception)
        if isinstance(link, h5py.ExternalLink):
            if not allowed:
                return (f"{path}: links {name!r} to {link.filename}:{link.path}, outside the file (an HDF5 "
                        f"external link): {_RESET}")
            return None
        if not isinstance(link, h5py.HardLink):
            return None
        obj = file.get(name)
        if not isinstance(obj, h5py.Dataset):
            return None
        plist = obj.id.get_create_plist()
        if not allowed and (plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count() > 0):
            return (f"{path}: dataset {name!r} keeps its data in other files, outside the file (a virtual "
                    f"or external dataset): {_RESET}")
        if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count() > 0 or obj.dtype.kind == "O":
            return None
        need = int(np.prod(obj.shape, dtype=object)) * obj.dtype.itemsize if obj.shape else obj.dtype.itemsize
        stored = obj.id.get_storage_size()
        cap = max(_FLOOR, int(ratio * stored)) if plist.get_nfilters() else stored
        if need > cap:
            packed = (f" (at most {ratio:g} times that when compressed; MESHSHARD_MAX_EXPANSION raises the cap)"
                      if plist.get_nfilters() else "")
            return (f"{path}: dataset {name!r} declares {obj.shape} {obj.dtype} ({need:,} bytes) but stores "
                    f"{stored:,}{packed}")
        return None

    problem = file.visititems_links(visit)
    if problem is not None:
        raise ValueError(problem)


def _hdf_group(group: Any, path: Path, cell_types: Collection[int], bound: int, h5py: Any, depth: int) -> None:
    """One VTKHDF dataset group: its counts against its datasets, its cell types."""
    kind = group.attrs.get("Type")
    kind = kind.decode("utf-8", "replace") if isinstance(kind, bytes) else str(kind)
    where = group.name
    if kind in ("PartitionedDataSetCollection", "MultiBlockDataSet"):
        if depth > _MAX_DEPTH:
            raise ValueError(f"{path}: blocks nested more than {_MAX_DEPTH} deep")
        for name, link in ((n, group.get(n, getlink=True)) for n in group):
            child = group.get(name)
            if name != "Assembly" and isinstance(link, h5py.HardLink) and isinstance(child, h5py.Group):
                _hdf_group(child, path, cell_types, bound, h5py, depth + 1)
        return
    if kind == "ImageData":
        ext = np.asarray(group.attrs.get("WholeExtent", np.zeros(6)), dtype=np.int64).reshape(-1)
        points = int(np.prod([max(int(hi) - int(lo) + 1, 0) for lo, hi in zip(ext[::2], ext[1::2])], dtype=object))
        if len(ext) != 6 or points > bound:
            raise ValueError(f"{path}: {where} declares an image of {points:,} points, more than the file can hold")
        return
    if kind not in ("UnstructuredGrid", "PolyData"):
        raise ValueError(f"{path}: Expected a VTKHDF UnstructuredGrid, PolyData, ImageData or a collection of them "
                         f"(got Type {kind!r} in {where})")

    def dataset(name: str, within: Any = group) -> Any:
        found = within.get(name)
        if not isinstance(found, h5py.Dataset):
            raise ValueError(f"{path}: Expected a dataset {name!r} in {within.name} (vtk reads it; got none)")
        return found

    def counts(name: str, within: Any = group) -> np.ndarray:
        values = np.asarray(dataset(name, within)[()], dtype=np.int64).reshape(-1)
        if (values < 0).any():
            raise ValueError(f"{path}: Expected {within.name}/{name} >= 0 (got {int(values.min()):,})")
        return values

    def fits(name: str, n: int, rows: Any, within: Any = group) -> None:
        have = rows.shape[0] if rows.shape else 0
        if n > have:
            raise ValueError(f"{path}: {within.name}/{name} declares {n:,}, more than the {have:,} rows of "
                             f"{rows.name}")

    points = counts("NumberOfPoints")
    temporal = isinstance(group.get("Steps"), h5py.Group)
    total = int(points.max(initial=0)) if temporal else int(points.sum())
    fits("NumberOfPoints", total, dataset("Points"))
    topologies = [group] if kind == "UnstructuredGrid" else [group.get(n) for n in ("Vertices", "Lines", "Polygons",
                                                                                    "Strips")]
    if not all(isinstance(g, h5py.Group) for g in topologies):
        raise ValueError(f"{path}: Expected the groups Vertices, Lines, Polygons and Strips in {where} (vtk reads "
                         "them; got some missing)")
    cells_total = 0
    for topo in topologies:
        cells, ids = counts("NumberOfCells", topo), counts("NumberOfConnectivityIds", topo)
        n_cells = int(cells.max(initial=0)) if temporal else int(cells.sum())
        cells_total += n_cells
        fits("NumberOfCells", n_cells + (1 if temporal else len(cells)), dataset("Offsets", topo), topo)
        fits("NumberOfConnectivityIds", int(ids.max(initial=0)) if temporal else int(ids.sum()),
             dataset("Connectivity", topo), topo)
    for data, n in (("PointData", total), ("CellData", cells_total)):
        arrays = group.get(data)
        for name in (arrays if isinstance(arrays, h5py.Group) else []):
            array = arrays.get(name)
            if isinstance(array, h5py.Dataset) and array.shape and array.shape[0] < n:
                fits(name, n, array, arrays)
    if kind == "UnstructuredGrid":
        types = np.unique(np.asarray(dataset("Types")[()]).reshape(-1))
        for t in types.tolist():  # cell types, not cells: a handful
            if t not in cell_types:
                raise cell_type_refusal(int(t), path)
