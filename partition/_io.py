"""Reading inputs: meshes (meshio), METIS graph and mesh files, point clouds (``.npy``/``.npz``).

The format is chosen from the file name, or forced with ``format=``:

=================  ===========================================================================
``metis-graph``    ``.graph``, ``.mgraph``, ``.metis``, optionally ``.bz2``/``.gz``-compressed
``metis-mesh``     METIS's own mesh format (``mpmetis`` input); a ``.mesh`` file whose first
                   token is an integer is taken as METIS (Medit files start with a keyword)
``points``         ``.npy`` (an ``(N, 2)`` or ``(N, 3)`` array of real numbers) or ``.npz`` (its
                   array named ``pos``)
``vtkhdf``         ``.vtkhdf``: a VTKHDF unstructured grid of one piece (h5py; see ``_vtkhdf.py``)
``meshio``         any other extension meshio knows
=================  ===========================================================================

Every problem is raised as a one-line ``ValueError`` (or ``OSError`` from the file system)
that names what is wrong, never a traceback from deep inside a parser.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp

from ._graph import Cells, Graph
from ._readers import decompress, hash_regular, read_npy, read_npz, read_regular

__all__ = ["InputData", "read_input", "read_metis_graph", "read_metis_mesh", "meshio_failure", "FORMATS"]

#: Values accepted by ``read_input(format=...)`` / ``--format``.
FORMATS = ("auto", "meshio", "metis-graph", "metis-mesh", "points", "vtkhdf")

_GRAPH_SUFFIXES = (".graph", ".mgraph", ".metis")
_COMMENT = re.compile(rb"^[ \t]*%[^\n]*(\n|$)", re.MULTILINE)


@dataclass(frozen=True, eq=False)
class InputData:
    """What an input file holds, before any graph is built.

    Args:
        name: The file's name (no directories), recorded in the partition's metadata.
        sha256: SHA-256 of the file's bytes.
        kind: ``"mesh"`` (cells), ``"graph"`` (a METIS graph) or ``"points"``.
        num_nodes: Number of nodes (mesh points, graph vertices or cloud points).
        pos: Coordinates, when the input has them.
        cells: Mesh cell blocks ``(meshio cell type, connectivity)``; METIS mesh elements are
            typed ``"metis:<nodes per element>"``.
        graph: The graph of a METIS graph file.

    Shapes:
        pos: ``(N, D)`` float64, ``D`` 2 or 3. cells: ``(C_b, k_b)`` node ids, int32 from
        a meshio file (int64 beyond 2^31 nodes), int64 otherwise.
    """

    name: str
    sha256: str
    kind: Literal["mesh", "graph", "points"]
    num_nodes: int
    pos: np.ndarray | None = None
    cells: Cells = ()
    graph: Graph | None = None

    def __repr__(self) -> str:
        return f"InputData(name={self.name!r}, kind={self.kind!r}, num_nodes={self.num_nodes})"


def read_input(path: str | Path, *, format: str = "auto",
               max_expansion: float | None = None) -> InputData:
    """Read a mesh, METIS graph or mesh, or point cloud (see the module docstring).

    Only a regular file is read (a FIFO or device is refused). A ``.bz2`` or ``.gz`` file may
    expand to at most ``max(64 MiB, max_expansion * its size)``; ``max_expansion`` defaults
    to ``MESHSHARD_MAX_EXPANSION`` or 100. Declared sizes (METIS headers, ``.npy`` shapes)
    are checked against the file before anything is allocated.

    Raises:
        ValueError: unknown format, unparsable file, empty input, non-finite coordinates.
        OSError: the file cannot be opened.
    """
    path = Path(path)
    if format not in FORMATS:
        raise ValueError(f"Expected --format in {', '.join(FORMATS)} (got {format!r})")
    if path.is_dir():
        raise ValueError("is a directory, expected a file")
    if not path.exists():
        raise ValueError("no such file")
    if format in ("meshio", "vtkhdf") or (format == "auto" and _meshio_by_name(path)):
        # hashed in chunks: a mesh that meshio reads itself is never held as bytes too
        digest, raw = hash_regular(path)
    else:  # parsed from bytes: read once, hashed from memory
        stored = read_regular(path)
        digest = hashlib.sha256(stored).hexdigest()
        raw = decompress(stored, path.suffix, expansion=max_expansion)
        del stored
    if format == "auto":
        format = _detect_format(path, raw)
    if format == "metis-graph":
        graph = read_metis_graph(raw)
        data = InputData(path.name, digest, "graph", graph.num_nodes, graph=graph)
    elif format == "metis-mesh":
        cells, num_nodes = read_metis_mesh(raw)
        data = InputData(path.name, digest, "mesh", num_nodes, cells=cells)
    elif format == "vtkhdf":
        from ._vtkhdf import read_vtkhdf

        pos, cells = read_vtkhdf(path)
        data = InputData(path.name, digest, "mesh", len(pos), pos=pos, cells=cells)
    elif format == "points":
        pos = _read_points(raw)
        data = InputData(path.name, digest, "points", len(pos), pos=pos)
    else:
        pos, cells = _read_meshio(path)
        data = InputData(path.name, digest, "mesh", len(pos), pos=pos, cells=cells)
    if data.num_nodes == 0:
        raise ValueError("Expected at least one node (got an empty input)")
    if data.pos is not None:
        check_finite(data.pos)
    return data


def check_finite(pos: np.ndarray) -> None:
    """Raise when coordinates hold NaN or infinity."""
    bad = ~np.isfinite(pos).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"Expected finite coordinates (got {int(bad.sum())} nodes with NaN or inf, "
            f"the first is node {first})")


def _meshio_by_name(path: Path) -> bool:
    """Whether the name alone makes ``path`` a meshio input (not compressed, not a METIS graph,
    point cloud or ``.mesh``, which :func:`_detect_format` tells apart by content)."""
    suffix = path.suffix.lower()
    return suffix not in (".bz2", ".gz", ".npy", ".npz", ".mesh", *_GRAPH_SUFFIXES)


def _detect_format(path: Path, raw: bytes) -> str:
    name = path.name.lower()
    for ext in (".bz2", ".gz"):
        name = name.removesuffix(ext)
    suffix = Path(name).suffix
    if suffix in _GRAPH_SUFFIXES:
        return "metis-graph"
    if suffix in (".npy", ".npz"):
        return "points"
    if suffix == ".vtkhdf":
        return "vtkhdf"
    if suffix == ".mesh":
        first = _COMMENT.sub(b"", raw[:4096]).split(maxsplit=1)[:1]
        if first and first[0].isdigit():
            return "metis-mesh"
    import meshio

    if suffix not in meshio.extension_to_filetypes or name != path.name.lower():
        raise ValueError(
            f"unknown input format {path.suffix!r} (expected a mesh meshio reads, "
            "a METIS graph .graph[.bz2], a point cloud .npy/.npz, or --format metis-mesh)")
    return "meshio"


def _parse_ints(text: bytes, what: str) -> np.ndarray:
    """All whitespace-separated integers of ``text``, parsed in C."""
    if not text.strip():
        return np.zeros(0, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return np.fromstring(text, dtype=np.int64, sep=" ")
        except (ValueError, DeprecationWarning):
            raise ValueError(f"Expected only integers in the {what}") from None


def _line_token_counts(body: bytes, num_lines: int, what: str) -> np.ndarray:
    """Number of whitespace-separated tokens on each line of ``body`` (vectorised), after
    checking that ``body`` has the ``num_lines`` lines (of ``what``) its header declares.

    Shapes:
        Returns ``(max(num_lines, lines in body),)`` int64.
    """
    total_lines = body.count(b"\n") + 1
    if num_lines > total_lines:
        raise ValueError(f"Expected as many lines as the header says: the header declares "
                         f"{num_lines} {what} lines but the file has {total_lines}")
    data = np.frombuffer(body, dtype=np.uint8)
    newline = data == 10
    space = newline | (data == 32) | (data == 9) | (data == 13)
    token_start = ~space
    token_start[1:] &= space[:-1]
    line_of = np.cumsum(newline, dtype=np.int64) - newline
    return np.bincount(line_of[token_start], minlength=max(num_lines, total_lines))


def _split_header(raw: bytes, least: int, most: int, form: str) -> tuple[bytes, np.ndarray, bytes]:
    """Strip ``%`` comments; return the header line, its integers (``least`` to ``most`` of them,
    non-negative) and the rest of the file."""
    body = _COMMENT.sub(b"", raw).lstrip(b" \t\r\n")
    header, _, body = body.partition(b"\n")
    head = _parse_ints(header, "header line")
    if not least <= len(head) <= most or head.min() < 0:
        raise ValueError(f"Expected the header '{form}' (got {header.decode(errors='replace')!r})")
    return header, head, body


def read_metis_graph(raw: bytes) -> Graph:
    """Parse a METIS graph file (``%`` comments, ``fmt`` and ``ncon`` in the header).

    The header is ``n m [fmt [ncon]]``; ``fmt`` is up to three digits ``[vsize][vwgt][adjwgt]``.
    Each of the next ``n`` lines (blank for an isolated vertex) holds the vertex's size, its
    ``ncon`` weights and its neighbours (1-based), each followed by the edge's weight when
    ``adjwgt`` is set. Vertex sizes are read and ignored.

    Shapes:
        Returns a graph with ``N = n``, ``E = 2 m``.
    """
    header, head, body = _split_header(raw, 2, 4, "n m [fmt [ncon]]")
    n, m = int(head[0]), int(head[1])
    fmt = header.split()[2].decode().zfill(3) if len(head) > 2 else "000"
    if len(fmt) != 3 or set(fmt) - {"0", "1"}:
        raise ValueError(f"Expected fmt to be up to three 0/1 digits (got {fmt!r})")
    has_size, has_vwgt, has_ewgt = (c == "1" for c in fmt)
    ncon = int(head[3]) if len(head) > 3 else int(has_vwgt)
    if not has_vwgt:
        ncon = 0
    per_line = _line_token_counts(body, n, "vertex")
    if per_line[n:].any():
        raise ValueError(f"Expected {n} vertex lines (got more non-empty lines than that)")
    per_line = per_line[:n]
    tokens = _parse_ints(body, "vertex lines")
    if len(tokens) != per_line.sum():
        raise ValueError("Expected only integers in the vertex lines")
    lead = int(has_size) + ncon
    stride = 2 if has_ewgt else 1
    rest = per_line - lead
    if (rest < 0).any() or (rest % stride).any():
        line = int(np.flatnonzero((rest < 0) | (rest % stride != 0))[0]) + 1
        raise ValueError(f"Expected {lead} weights then neighbour{' weight pairs' * has_ewgt} "
                         f"on vertex line {line}")
    line_start = np.cumsum(per_line) - per_line
    offset = np.arange(len(tokens), dtype=np.int64) - np.repeat(line_start, per_line)
    vertex_weights = None
    if ncon:
        is_w = (offset >= int(has_size)) & (offset < lead)
        vertex_weights = tokens[is_w].reshape(n, ncon)
    adj = offset >= lead
    neighbours = tokens[adj & ((offset - lead) % stride == 0)] - 1
    weights = tokens[adj & ((offset - lead) % stride == 1)] if has_ewgt else None
    degree = rest // stride
    if len(neighbours) != 2 * m:
        raise ValueError(f"Expected {m} edges as the header says (the vertex lines list "
                         f"{len(neighbours)} neighbours, i.e. {len(neighbours) / 2:g} edges)")
    if len(neighbours) and (neighbours.min() < 0 or neighbours.max() >= n):
        raise ValueError(f"Expected neighbour ids in 1..{n} (got {neighbours.min() + 1}.."
                         f"{neighbours.max() + 1})")
    return _checked_csr(n, degree, neighbours, weights, vertex_weights)


def _checked_csr(n: int, degree: np.ndarray, neighbours: np.ndarray, weights: np.ndarray | None,
                 vertex_weights: np.ndarray | None) -> Graph:
    """Sort the rows of a METIS adjacency and check it is a simple undirected graph."""
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    rows = np.repeat(np.arange(n, dtype=np.int64), degree)
    if (rows == neighbours).any():
        v = int(rows[rows == neighbours][0]) + 1
        raise ValueError(f"Expected no self-loops (vertex {v} lists itself)")
    data = weights if weights is not None else np.ones(len(neighbours), dtype=np.int64)
    if weights is not None and len(weights) and weights.min() <= 0:
        raise ValueError("Expected positive edge weights")
    if vertex_weights is not None and vertex_weights.size and vertex_weights.min() < 0:
        raise ValueError("Expected non-negative vertex weights")
    order = np.lexsort((neighbours, rows))
    sorted_cols = neighbours[order]
    if (np.diff(sorted_cols)[np.diff(rows) == 0] == 0).any():
        raise ValueError("Expected each edge listed once per end (found a repeated neighbour)")
    a = sp.csr_array((data[order], sorted_cols, indptr), shape=(n, n))
    if (a != a.T).nnz:
        raise ValueError("Expected a symmetric graph (some edge is listed at one end only, or "
                         "with different weights at its two ends)")
    return Graph(indptr, sorted_cols, vertex_weights=vertex_weights,
                 edge_weights=data[order] if weights is not None else None, kind="file")


def read_metis_mesh(raw: bytes) -> tuple[list[tuple[str, np.ndarray]], int]:
    """Parse METIS's mesh format: ``ne [ncon]``, then one element per line (1-based node ids,
    after ``ncon`` element weights, which are ignored).

    Elements are grouped into blocks by node count, typed ``"metis:<k>"`` in file order within
    a block. The number of nodes is the largest node id.
    """
    header, head, body = _split_header(raw, 1, 2, "ne [ncon]")
    ne = int(head[0])
    ncon = int(head[1]) if len(head) > 1 else 0
    per_line = _line_token_counts(body, ne, "element")
    if per_line[ne:].any():
        raise ValueError(f"Expected {ne} element lines (got more non-empty lines than that)")
    per_line = per_line[:ne] - ncon
    tokens = _parse_ints(body, "element lines")
    if len(tokens) != per_line.sum() + ncon * ne or (per_line < 1).any():
        raise ValueError(f"Expected {ne} elements of at least one node each")
    if ncon:
        offset = np.arange(len(tokens)) - np.repeat(np.cumsum(per_line + ncon) - per_line - ncon,
                                                    per_line + ncon)
        tokens = tokens[offset >= ncon]
    if tokens.min() < 1:
        raise ValueError(f"Expected 1-based node ids (got {tokens.min()})")
    nodes = tokens - 1
    starts = np.cumsum(per_line) - per_line
    cells = []
    for k in np.unique(per_line):
        rows = np.flatnonzero(per_line == k)
        idx = starts[rows][:, None] + np.arange(k)
        cells.append((f"metis:{int(k)}", nodes[idx]))
    return cells, int(nodes.max()) + 1


def _read_points(raw: bytes) -> np.ndarray:
    """The points of a ``.npy`` file, or of a ``.npz`` archive's ``pos`` array (an archive
    without one is refused: which of its arrays are the points is not guessed)."""
    if raw[:2] == b"PK":
        arrays = read_npz(raw)
        if "pos" not in arrays:
            raise ValueError("Expected the points as an array named 'pos' in the .npz archive "
                             f"(got {', '.join(arrays) or 'no array'})")
        pos = arrays["pos"]
    else:
        pos = read_npy(raw)
    if pos.ndim != 2 or pos.shape[1] not in (2, 3):
        raise ValueError(f"Expected points of shape (N, 2) or (N, 3) (got {pos.shape})")
    if np.issubdtype(pos.dtype, np.complexfloating):  # astype(float64) would drop the imaginary part
        raise ValueError(f"Expected real coordinates (got a {pos.dtype} array)")
    if not np.issubdtype(pos.dtype, np.number):
        raise ValueError(f"Expected numeric points (got dtype {pos.dtype})")
    return pos.astype(np.float64)


#: What meshio's readers raise when a file ends early or its sizes disagree: bare assertions,
#: indexing past the data, a section name cut short, unpacking too few bytes. The reason given
#: is then the file's state.
_TRUNCATED = (AssertionError, IndexError, KeyError, EOFError, struct.error)


def meshio_failure(err: BaseException, said: str) -> str:
    """The one-line reason meshio could not read a file: what it printed (``said``) or raised,
    and for an exception that says nothing of the file (a bare ``AssertionError``, an index
    past the data), that the file is truncated or malformed."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    detail = lines[0] if lines else str(err).strip().split("\n")[0]
    if isinstance(err, _TRUNCATED) or not detail:
        why = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
        return f"meshio cannot read it: the file is truncated or malformed ({why})"
    return f"meshio cannot read it ({detail})"


def _read_meshio(path: Path, fields: dict[str, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """Points and cell blocks of a mesh meshio reads (and, into ``fields`` when given, its point data)."""
    import meshio

    chatter = io.StringIO()  # meshio prints its errors, and may call sys.exit
    try:
        with warnings.catch_warnings(), redirect_stdout(chatter), redirect_stderr(chatter):
            warnings.simplefilter("ignore")
            mesh = meshio.read(path)
    except (Exception, SystemExit) as err:  # anything from ReadError to struct.error
        raise ValueError(meshio_failure(err, chatter.getvalue())) from None
    pos = np.asarray(mesh.points, dtype=np.float64)
    if fields is not None:
        fields.update(mesh.point_data)
    if pos.ndim != 2 or pos.shape[1] not in (2, 3):
        raise ValueError(f"Expected 2-D or 3-D points (got shape {pos.shape})")
    dtype = np.int32 if len(pos) < 2**31 else np.int64  # half the memory of big meshes
    cells = []
    blocks, mesh.cells = mesh.cells, []
    for block in blocks:
        conn = np.asarray(block.data)
        block.data = None  # each block's original goes as soon as it is converted
        if conn.dtype == object or conn.ndim != 2:
            raise ValueError(f"Cell type {block.type!r} with a varying node count is not supported")
        if not np.issubdtype(conn.dtype, np.integer):
            raise ValueError(f"Expected integer {block.type} node ids (got dtype {conn.dtype})")
        if conn.size and (conn.min() < 0 or conn.max() >= len(pos)):
            raise ValueError(f"Expected {block.type} node ids in [0, {len(pos)}) "
                             f"(got [{conn.min()}, {conn.max()}])")
        cells.append((block.type, conn.astype(dtype, copy=False)))
        del conn
    return pos, cells
