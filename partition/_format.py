"""The on-disk partition format, version 2 (``FORMAT_VERSION``).

A partition is a folder with one metadata file and one archive per rank::

    DIR/
    ├── partition.json     format, parameters, input checksum, counts and checksum per part
    ├── part-00000.npz     rank 0's arrays
    ├── part-00001.npz     rank 1's arrays
    └── ...                part-{rank:05d}.npz, one per rank

Numbering (as in DESIGN.md). Global node ids are the input's own order (mesh points, graph
vertices, cloud points; for ``--graph dual``, the cells of the mesh's highest dimension, block
after block). Global edge ids number the directed edges ``src -> dst`` of the undirected graph
(both directions of every edge, no self-loops) in ``(dst, src)`` lexicographic order. On rank
``r``, local ids ``0..N_own-1`` are the owned nodes in ascending global id, then
``N_own..N_local-1`` the ghosts, grouped by owning rank (ascending) and by ascending global id
within a group.

Edges and halo, for ``k = halo_hops``:

- Ghosts are the nodes within ``k`` hops (undirected) of an owned node that the rank does not
  own. ``node_hops`` gives each local node's hop distance to the owned set: 0 owned, 1..k ghost.
- Local edges are all the global directed edges whose ``dst`` has ``node_hops <= k - 1``.
  The **owned edges** (``dst < N_own``) come first, in global edge id order: every global edge
  is an owned edge of exactly one rank, the owner of its ``dst``. For ``k > 1`` the **redundant
  copies** follow (``dst`` a ghost within ``k - 1`` hops, ``dst >= N_own``), also in global edge
  id order; ``parts[r].num_owned_edges`` in the metadata says where they start. With these edges,
  ``k`` message-passing layers run with no exchange: after layer ``l`` the rows with
  ``node_hops <= k - l`` are exact, so the owned rows are exact after ``k`` layers. For ``k = 1``
  every stored edge is an owned edge and ghosts are exactly the non-owned sources.
- Halo plan (``indexed_all_to_all_v``): rank ``r`` sends ``send_index`` (local owned rows,
  grouped by destination rank ascending, within a destination in that rank's ghost order, i.e.
  ascending global id), ``send_counts[q]`` rows to rank ``q``; it receives ``recv_counts[q]``
  rows from ``q``, and the received rows, grouped by source rank, are exactly its ghost rows in
  local order. ``send_counts[r] == recv_counts[r] == 0``. In k-hop mode the plan covers all
  ``k`` rings of ghosts (one exchange of the input features fills the whole halo).

Part file ``part-{rank:05d}.npz``: a numpy ``.npz`` archive, uncompressed, members in this
order, zip timestamps fixed at 1980-01-01, so its bytes depend only on its content:

=================  =======  ====================  ==============================================
array              dtype    shape                 content
=================  =======  ====================  ==============================================
owned_ids          int64    (N_own,)              global ids of the owned nodes, ascending
ghost_ids          int64    (N_ghost,)            global ids of the ghosts, in local order
ghost_owner        int64    (N_ghost,)            owning rank of each ghost (non-decreasing)
node_hops          int8     (N_local,)            hop distance to the owned set, 0..k
edge_index         int64    (2, E_local)          local ids, row 0 src, row 1 dst
global_edge_ids    int64    (E_local,)            global edge id of each local edge
send_index         int64    (sum(send_counts),)   local owned rows to send, grouped by rank
send_counts        int64    (R,)                  rows sent to each rank
recv_counts        int64    (R,)                  rows received from each rank
pos                float64  (N_local, D)          coordinates; only when the input has them
=================  =======  ====================  ==============================================

``partition.json`` of the example below: the six-node triangle mesh ::

    3 --- 4 --- 5
    | \\   | \\   |
    0 --- 1 --- 2       triangles (0, 1, 4), (0, 4, 3), (1, 2, 5), (1, 5, 4)

with nodes 0, 1, 3 given to rank 0 and 2, 4, 5 to rank 1, written by
``save_partition(partition_mesh(points, [("triangle", triangles)], 2, parts=[0, 0, 1, 0, 1, 1]),
DIR)`` with ``points`` the grid ``(x, y) = (i % 3, i // 3)``. ``input.sha256`` is the SHA-256 of
the input file (in memory: of the graph's CSR ``indptr`` and ``indices`` as int64); every
``parts[r].sha256`` is the part file's. ``imbalance`` is the largest owned count over the mean;
``load_imbalance`` the largest load over its target (vertex weight, target shares);
``halo_fraction`` all ghosts over all nodes; ``refinement`` is ``null`` or
``{"edge_cut_before", "load_imbalance_before", "moved"}``. ``metadata_sha256``, always last,
is the SHA-256 of the canonical JSON (sorted keys, no spaces, ASCII) of everything else, so a
hand-edited ``partition.json`` is refused; version 2 added it (version 1 folders are refused:
re-run ``meshshard partition``). Every ``file`` is read only if it is a regular file inside
the folder, at most as large as its counts allow::

    {
      "format": "meshshard-partition",
      "format_version": 2,
      "num_parts": 2,
      "num_nodes": 6,
      "num_edges": 18,
      "edge_cut": 5,
      "imbalance": 1.0,
      "halo_fraction": 1.0,
      "halo_hops": 1,
      "pos_dim": 2,
      "method": "given",
      "graph": "nodal",
      "input": {
        "kind": "memory",
        "name": null,
        "sha256": "7e04272941e063862f583f92987651553f1fa249e23dbdebc8141ad77ea49ccf"
      },
      "parameters": {},
      "load_imbalance": 1.0,
      "refinement": null,
      "parts": [
        {"part": 0, "num_owned": 3, "num_ghost": 3, "num_edges": 9, "num_owned_edges": 9,
         "num_send": 3, "file": "part-00000.npz",
         "sha256": "ae26607a35477b189e326eea51fb4c4652c701ee05f04ecfe1f992d86eee5fc7"},
        {"part": 1, "num_owned": 3, "num_ghost": 3, "num_edges": 9, "num_owned_edges": 9,
         "num_send": 3, "file": "part-00001.npz",
         "sha256": "834df15200c9473310638d6721ef785d0964a97c8f0cc6c79fae54c585204743"}
      ],
      "metadata_sha256": "5334b62196795e50c9112ecda5705c1200f7ccd780caaf53ba861bcca3530663"
    }

and its two part files (``pos`` left out here)::

    {
      "0": {
        "owned_ids": [0, 1, 3],
        "ghost_ids": [2, 4, 5],
        "ghost_owner": [1, 1, 1],
        "node_hops": [0, 0, 0, 1, 1, 1],
        "edge_index": [[1, 2, 4, 0, 3, 4, 5, 0, 4], [0, 0, 0, 1, 1, 1, 1, 2, 2]],
        "global_edge_ids": [0, 1, 2, 3, 4, 5, 6, 9, 10],
        "send_index": [0, 1, 2],
        "send_counts": [0, 3],
        "recv_counts": [0, 3]
      },
      "1": {
        "owned_ids": [2, 4, 5],
        "ghost_ids": [0, 1, 3],
        "ghost_owner": [0, 0, 0],
        "node_hops": [0, 0, 0, 1, 1, 1],
        "edge_index": [[4, 2, 3, 4, 5, 2, 4, 0, 1], [0, 0, 1, 1, 1, 1, 2, 2, 2]],
        "global_edge_ids": [7, 8, 11, 12, 13, 14, 15, 16, 17],
        "send_index": [0, 1, 2],
        "send_counts": [3, 0],
        "recv_counts": [3, 0]
      }
    }
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ._invariants import part_problems
from ._json_io import dumps_json, naming_write_errors, read_json_inside, write_text_file
from ._partition import PART_ARRAYS, Partition
from ._readers import read_inside, read_npz
from ._safe_io import check_destination, interrupted_hint, is_lock_file, write_folder

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "part_file_name",
    "make_metadata",
    "save_partition",
    "write_partitions",
    "load_partition",
    "read_metadata",
    "check_output_dir",
]

FORMAT_NAME = "meshshard-partition"
FORMAT_VERSION = 2
METADATA_FILE = "partition.json"
#: Largest ``partition.json`` read (about 200 bytes per part).
MAX_METADATA_BYTES = 256 << 20
#: Largest ``halo_hops`` (hop distances are stored as int8).
MAX_HOPS = 100
#: The metadata key holding the SHA-256 of the rest of the metadata (see :func:`dump_metadata`).
CHECKSUM_KEY = "metadata_sha256"
_PART_COUNTS = ("num_owned", "num_ghost", "num_edges", "num_owned_edges", "num_send")

_DTYPES: dict[str, np.dtype] = {name: np.dtype(np.int64) for name in PART_ARRAYS}
_DTYPES.update(node_hops=np.dtype(np.int8), pos=np.dtype(np.float64))
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
#: Part files written at once by :func:`write_partitions` (on 2 idle cores, 2 writers write a
#: 5M-node mesh's 64 parts in 1.7-2.9 s against 3.2-4.2 s for one).
WRITERS = 2


def part_file_name(rank: int) -> str:
    return f"part-{rank:05d}.npz"


def make_metadata(
    *,
    num_nodes: int,
    num_edges: int,
    edge_cut: int,
    imbalance: float,
    halo_hops: int,
    pos_dim: int | None,
    attrs: Mapping[str, Any],
    parts: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The metadata of a partition (without file names and checksums), keys in a fixed order."""
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "num_parts": len(parts),
        "num_nodes": int(num_nodes),
        "num_edges": int(num_edges),
        "edge_cut": int(edge_cut),
        "imbalance": float(imbalance),
        "halo_fraction": float(sum(p["num_ghost"] for p in parts) / max(num_nodes, 1)),
        "halo_hops": int(halo_hops),
        "pos_dim": pos_dim,
        "method": "given",
        "graph": None,
    }
    meta.update(attrs)
    meta["parts"] = [dict(p) for p in parts]
    return meta


def check_is_partition(folder: Path) -> None:
    """Raise unless ``folder`` holds a partition of this format and nothing else (the test
    ``--force`` applies before replacing a folder): a readable ``partition.json`` naming this
    format, and only that file and ``part-NNNNN.npz`` files of its parts, no links or folders (a
    lock file a killed command left, :func:`is_lock_file`, is ours too)."""
    refuse = "refusing to replace it, even with --force"
    try:
        meta = read_json_inside(folder, METADATA_FILE, max_bytes=MAX_METADATA_BYTES)
        num_parts = meta["num_parts"] if meta.get("format") == FORMAT_NAME else None
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError):
        num_parts = None
    if not isinstance(num_parts, int):
        raise ValueError(f"{folder}: is not a partition folder (no readable {METADATA_FILE} "
                         f"of format {FORMAT_NAME!r}); {refuse}")
    allowed = {METADATA_FILE, *(part_file_name(r) for r in range(max(num_parts, 0)))}
    with os.scandir(folder) as entries:
        for entry in entries:
            if (entry.name not in allowed or not entry.is_file(follow_symlinks=False)) and not is_lock_file(entry.path):
                raise ValueError(f"{folder}: holds {entry.name!r}, which is not a file of a "
                                 f"partition; {refuse}")


def check_output_dir(out: Path, force: bool, inputs: Sequence[str | os.PathLike[str]] = ()
                     ) -> list[str]:
    """Raise unless ``out`` is absent, an empty folder, or (with ``force``) a partition folder
    holding only the format's files; never the current folder, its parents, or a folder
    holding an input. Returns notes on the leftovers of an interrupted run that were tidied
    (see :func:`meshshard.partition._safe_io.check_destination`)."""
    return check_destination(out, force=force, is_ours=check_is_partition, inputs=inputs)


class _HashingFile:
    """A binary file being written, and the SHA-256 of its final bytes, without reading it back.

    zipfile writes each member's local header, its data, then seeks back to rewrite the header
    (same length, now with the CRC and sizes) and returns to the end. So writes are kept from
    the oldest byte that may still be rewritten (small ones copied, large ones by reference:
    the arrays outlive the archive) and hashed each time the position returns to the end.
    :meth:`hexdigest` is ``None`` after any other pattern (then hash the file).
    """

    def __init__(self, file: Any) -> None:
        self._file = file
        self._pos = self._end = 0
        self._kept: list[tuple[int, Any]] = []  # (offset, bytes), contiguous, not hashed yet
        self._digest = hashlib.sha256()
        self._ok = True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._pos == self._end:
            self._kept.append((self._pos, view if len(view) >= 1 << 16 else bytes(view)))
        else:  # a rewrite: of a kept block, whole, or the digest cannot follow
            at = [i for i, (offset, old) in enumerate(self._kept)
                  if offset == self._pos and len(old) == len(view)]
            self._ok = self._ok and len(at) == 1
            if at:
                self._kept[at[0]] = (self._pos, bytes(view))
        self._file.write(view)
        self._pos += len(view)
        self._end = max(self._end, self._pos)
        return len(view)

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = self._file.seek(pos, whence)
        if self._pos == self._end:
            for _, data in self._kept:
                self._digest.update(data)
            self._kept.clear()
        return self._pos

    def flush(self) -> None:
        self._file.flush()

    def hexdigest(self) -> str | None:
        self.seek(self._end)
        return self._digest.hexdigest() if self._ok else None


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> str:
    """Write an uncompressed ``.npz`` archive whose bytes depend only on the arrays (fixed
    member order and timestamps); return its SHA-256 (taken as the bytes are written)."""
    with naming_write_errors(path), open(path, "wb") as raw:
        file = _HashingFile(raw)
        with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as archive:  # type: ignore[arg-type]
            for name, array in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
                info.external_attr = 0o644 << 16
                array = np.ascontiguousarray(array, dtype=_DTYPES[name])
                with archive.open(info, "w", force_zip64=True) as member:
                    # the bytes np.save writes (format 1.0 header), without its copy of the data
                    np.lib.format.write_array_header_1_0(
                        member, np.lib.format.header_data_from_array_1_0(array))
                    member.write(memoryview(array.reshape(-1)).cast("B"))
        found = file.hexdigest()
    if found is not None:
        return found
    digest = hashlib.sha256()  # zipfile wrote in a way the running digest could not follow
    with open(path, "rb") as raw:
        while chunk := raw.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def save_partition(
    partitions: Sequence[Partition],
    out_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write a partition folder, atomically (:func:`meshshard.partition._safe_io.write_folder`:
    a staging folder next to it, swapped in at the end; with ``force`` the old one is renamed
    aside first and deleted last, so a crash leaves one of the two whole).

    Args:
        partitions: Every rank's :class:`Partition`, in rank order.
        out_dir: The folder to create.
        force: Replace an existing partition folder.
        progress: Called with 1 after each part file.

    Returns:
        The folder's path.
    """
    if not partitions or [p.rank for p in partitions] != list(range(partitions[0].num_parts)):
        raise ValueError("Expected one partition per rank, in rank order")
    return write_partitions(partitions[0].metadata, partitions, out_dir, force=force,
                            progress=progress)


def write_partitions(
    metadata: Mapping[str, Any],
    partitions: Iterable[Partition],
    out_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """:func:`save_partition` from the metadata and the parts one at a time, as
    :func:`meshshard.partition._plan.plan_partitions` makes them: each part file is written
    and its arrays let go before the next part is built, so memory holds one part.
    """
    out = Path(out_dir)
    for note in check_output_dir(out, force):
        warnings.warn(note, stacklevel=3)
    num_parts = len(metadata["parts"])

    def fill(folder: Path) -> None:
        meta = dict(metadata)
        digests: list[Future[str]] = []
        stream = iter(partitions)
        # Writer threads: parts r - 1 and r are written and hashed (zlib, hashlib and the file
        # system let go of the GIL) while part r + 1 is built; at most WRITERS + 1 parts alive.
        with ThreadPoolExecutor(max_workers=WRITERS) as writer:
            for rank in range(num_parts):
                part = next(stream, None)
                if part is None or part.rank != rank or part.num_parts != num_parts:
                    raise ValueError("Expected one partition per rank, in rank order")
                if len(digests) >= WRITERS:
                    digests[-WRITERS].result()  # raises what a writer raised; bounds the queue
                    if progress is not None:
                        progress(1)
                digests.append(writer.submit(_write_npz, folder / part_file_name(rank),
                                             part.arrays()))
                del part
            if next(stream, None) is not None:
                raise ValueError("Expected one partition per rank, in rank order")
            hashes = [d.result() for d in digests]
        if progress is not None:
            progress(min(len(digests), WRITERS))
        meta["parts"] = [{**entry, "file": part_file_name(rank), "sha256": digest}
                         for rank, (entry, digest) in enumerate(zip(meta["parts"], hashes))]
        write_text_file(folder / METADATA_FILE, dump_metadata(meta))

    write_folder(out, fill)
    return out


def metadata_checksum(meta: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the metadata without its own checksum (sorted keys,
    no spaces, ASCII)."""
    body = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    text = dumps_json(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def dump_metadata(meta: Mapping[str, Any]) -> str:
    """The JSON text of the metadata: two-space indent, one line per part, and last the
    checksum of everything else (:func:`metadata_checksum`), which :func:`read_metadata`
    verifies, so an edited ``partition.json`` is refused."""
    meta = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    parts = meta.get("parts", [])
    body = dumps_json({k: v for k, v in meta.items() if k != "parts"}, indent=2)
    lines = ",\n".join("    " + dumps_json(p) for p in parts)
    return (body[:-2] + ',\n  "parts": [\n' + lines + "\n  ],\n"
            + f'  "{CHECKSUM_KEY}": "{metadata_checksum(meta)}"\n}}\n')


def _is_count(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_summary(meta: dict[str, Any], file: Path) -> None:
    """Types of the entries that ``info`` and the summary print."""
    if not _is_count(meta.get("edge_cut")):
        raise ValueError(f"{file}: Expected 'edge_cut' to be an integer >= 0 "
                         f"(got {meta.get('edge_cut')!r})")
    numbers = ["imbalance", "halo_fraction", *(["load_imbalance"] if "load_imbalance" in meta
                                               else [])]
    for key in numbers:
        if not _is_number(meta.get(key)):
            raise ValueError(f"{file}: Expected {key!r} to be a number (got {meta.get(key)!r})")
    for key in ("method", "graph"):
        if not isinstance(meta.get(key), str) and not (key == "graph" and meta.get(key) is None):
            raise ValueError(f"{file}: Expected {key!r} to be a string (got {meta.get(key)!r})")
    if not isinstance(meta.get("input"), dict):
        raise ValueError(f"{file}: Expected 'input' to be an object (got {meta.get('input')!r})")
    shapes = {"refinement": {"edge_cut_before", "load_imbalance_before", "moved"},
              "metis": {"variant", "seed", "ncuts", "edge_cut", "candidates"}}
    for key, needed in shapes.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, dict) or needed - set(value) or not all(
                _is_number(value[k]) for k in needed - {"variant", "candidates"})):
            raise ValueError(f"{file}: Expected {key!r} to be null or an object with numbers "
                             f"{sorted(needed - {'variant', 'candidates'})} (got {value!r})")
    choice = meta.get("metis")
    if choice is not None and not (isinstance(choice["candidates"], list) and all(
            isinstance(c, dict) and {"variant", "edge_cut"} <= set(c)
            for c in choice["candidates"])):
        raise ValueError(f"{file}: Expected 'metis' to be null or an object with a list of "
                         "candidates")


def _check_schema(meta: dict[str, Any], file: Path) -> None:
    """Types and ranges of every metadata entry that loading and ``info`` rely on."""
    _check_summary(meta, file)
    for key, low in (("num_parts", 1), ("num_nodes", 1), ("num_edges", 0)):
        if not _is_count(meta.get(key), low):
            raise ValueError(f"{file}: Expected {key!r} to be an integer >= {low} "
                             f"(got {meta.get(key)!r})")
    hops = meta.get("halo_hops")
    if not _is_count(hops, 1) or hops > MAX_HOPS:
        raise ValueError(f"{file}: Expected 'halo_hops' to be an integer in 1..{MAX_HOPS} "
                         f"(got {hops!r})")
    if meta.get("pos_dim") is not None and meta.get("pos_dim") not in (1, 2, 3):
        raise ValueError(f"{file}: Expected 'pos_dim' to be null, 1, 2 or 3 "
                         f"(got {meta.get('pos_dim')!r})")
    parts = meta.get("parts")
    if not isinstance(parts, list) or len(parts) != meta["num_parts"]:
        raise ValueError(f"{file}: Expected a 'parts' list of num_parts entries")
    for r, entry in enumerate(parts):
        where = f"{file}: parts[{r}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: Expected an object (got {entry!r})")
        for key in _PART_COUNTS:
            if not _is_count(entry.get(key)):
                raise ValueError(f"{where}: Expected {key!r} to be an integer >= 0 "
                                 f"(got {entry.get(key, 'nothing')!r})")
        name, digest = entry.get("file"), entry.get("sha256")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: Expected 'file' to be a file name (got "
                             f"{name if 'file' in entry else 'nothing'!r})")
        if not isinstance(digest, str) or len(digest) != 64 or set(digest) - set(
                "0123456789abcdef"):
            raise ValueError(f"{where}: Expected 'sha256' to be 64 hex digits (got "
                             f"{digest if 'sha256' in entry else 'nothing'!r})")
        if entry["num_ghost"] > meta["num_nodes"] or entry["num_owned_edges"] > \
                entry["num_edges"] or entry["num_edges"] > meta["num_edges"]:
            raise ValueError(f"{where}: counts larger than the whole graph's")
    owned = sum(entry["num_owned"] for entry in parts)
    if owned != meta["num_nodes"]:
        raise ValueError(f"{file}: the parts' owned counts sum to {owned}, not num_nodes "
                         f"{meta['num_nodes']}")


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a partition folder, after checking its format name and version, its
    own checksum (``metadata_sha256``: any edit is refused), and the types and ranges of its
    entries.

    Raises:
        ValueError: not a partition folder, another format or version, an edited or
            inconsistent ``partition.json``.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder{interrupted_hint(folder)}")
    file = folder / METADATA_FILE
    if not os.path.lexists(file):
        raise ValueError(f"{folder}: not a partition folder (no {METADATA_FILE})")
    meta = read_json_inside(folder, METADATA_FILE, max_bytes=MAX_METADATA_BYTES)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{file}: Expected format {FORMAT_NAME!r} "
                         f"(got {meta.get('format') if isinstance(meta, dict) else meta!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: Expected format version {FORMAT_VERSION} "
                         f"(got {meta.get('format_version')!r}); re-run meshshard partition")
    if meta.get(CHECKSUM_KEY) != metadata_checksum(meta):
        raise ValueError(f"{file}: metadata checksum mismatch, the file was edited (re-run "
                         "meshshard partition)")
    _check_schema(meta, file)
    return meta


def _max_part_bytes(entry: Mapping[str, Any], num_parts: int, pos_dim: int | None) -> int:
    """The largest size a part file with these counts can have (arrays, headers, zip)."""
    n_local = entry["num_owned"] + entry["num_ghost"]
    ints = n_local + entry["num_ghost"] + 3 * entry["num_edges"] + entry["num_send"] + 2 * num_parts
    return 8 * ints + n_local * (1 + 8 * (pos_dim or 0)) + 1024 * len(PART_ARRAYS)


def _read_npz(data: bytes, file: Path) -> dict[str, np.ndarray]:
    try:
        return read_npz(data, file)
    except ValueError as err:
        raise ValueError(f"{file}: not a readable part file ({err})") from None


def _check_arrays(arrays: Mapping[str, np.ndarray], entry: Mapping[str, Any], num_parts: int,
                  pos_dim: int | None, file: Path) -> None:
    """Check names, dtypes and shapes of a part file's arrays against its metadata entry."""
    names = [n for n in PART_ARRAYS if n != "pos" or pos_dim is not None]
    if list(arrays) != names:
        raise ValueError(f"{file}: Expected arrays {names} (got {list(arrays)})")
    n_own, n_ghost, n_edges = entry["num_owned"], entry["num_ghost"], entry["num_edges"]
    shapes = {
        "owned_ids": (n_own,), "ghost_ids": (n_ghost,), "ghost_owner": (n_ghost,),
        "node_hops": (n_own + n_ghost,), "edge_index": (2, n_edges),
        "global_edge_ids": (n_edges,), "send_index": (entry["num_send"],),
        "send_counts": (num_parts,), "recv_counts": (num_parts,),
        "pos": (n_own + n_ghost, pos_dim),
    }
    for name in names:
        a = arrays[name]
        if a.dtype != _DTYPES[name] or a.shape != shapes[name]:
            raise ValueError(f"{file}: Expected '{name}' {_DTYPES[name]} of shape "
                             f"{shapes[name]} (got {a.dtype} {a.shape})")


def load_partition(
    path: str | os.PathLike[str], rank: int, *, check_checksum: bool = True
) -> Partition:
    """Load rank ``rank``'s shard: reads only the metadata and that rank's part file.

    Checks the metadata (:func:`read_metadata`), the file's SHA-256 against it, the arrays'
    names, dtypes and shapes, and every invariant of the shard that needs no other rank
    (:func:`meshshard.partition._invariants.part_problems`: counts, index ranges, ghost order,
    edge order and numbering, hop distances, the send plan, finite coordinates), so a shard
    that ``verify`` would reject for one of these never loads.

    Raises:
        ValueError: a missing, altered, truncated or foreign file, or a rank out of range.
    """
    folder = Path(path)
    meta = read_metadata(folder)
    num_parts = meta["num_parts"]
    if not 0 <= rank < num_parts:
        from ._text import plural

        raise ValueError(f"Expected a rank in [0, {num_parts}) (got {rank}): {folder} has one part per rank for "
                         f"{plural(num_parts, 'rank')}; run that many, or partition into as many parts as ranks")
    entry = meta["parts"][rank]
    file = folder / str(entry["file"])
    data = read_inside(folder, entry["file"],
                       max_bytes=_max_part_bytes(entry, num_parts, meta.get("pos_dim")))
    if check_checksum and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError(f"{file}: checksum mismatch, the file was altered or truncated "
                         "(re-run meshshard partition)")
    arrays = _read_npz(data, file)
    _check_arrays(arrays, entry, num_parts, meta.get("pos_dim"), file)
    part = Partition(
        rank=rank, num_parts=num_parts, num_nodes=meta["num_nodes"],
        halo_hops=meta["halo_hops"],
        num_owned_per_part=np.array([p["num_owned"] for p in meta["parts"]], dtype=np.int64),
        metadata=meta, **arrays)
    problems = part_problems(part, num_owned_edges=entry["num_owned_edges"],
                             num_edges=meta["num_edges"])
    if problems:
        raise ValueError(f"{file}: {problems[0]} (re-run meshshard partition)")
    return part
