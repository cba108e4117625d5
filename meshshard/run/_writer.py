"""The prediction writer that ``predict`` and its rollout share: one mesh as a rank sees it, and
the files of one sample (or one step of a rollout).

On one process the model runs on the whole mesh (:func:`whole_layout`); on ``R`` ranks on this
rank's shard of a partition (:func:`shard_layout`), reading only its owned rows. Meshes of at most
:data:`GATHER_MAX_NODES` nodes are gathered into one ``.vtu`` on rank 0 (:func:`write_gathered`);
larger ones are written without gathering the mesh (:func:`write_pieces`): each rank writes the
cells whose smallest node id it owns, with every node they use; the values of nodes it does not
own come from a directory spread over the ranks (node ``g`` is kept by rank ``g * R // N``), so
memory per rank stays O(N / R + its piece). A point cloud (:func:`is_point_cloud`) is written as
PolyData (``.vtp`` / ``.pvtp``).

Every file carries the point field ``global_id`` (the node's id in the dataset's mesh), so pieces
can be matched to the input mesh. The point fields are float64. The writers take ``compression``
(``meshshard.run._vtk.COMPRESSIONS``) and ``submit``: how the file itself is written, at once
(:func:`meshshard.run._background.write_now`) or by a background thread
(``BackgroundWriter.submit``); the collectives before it always run on the calling thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import directory_lookup, gather_rows, is_peer_failure
from meshshard.data import is_point_cloud

from ._background import write_now
from ._recipe import check_model_output, first_line, shard_hint
from ._vtk import COMPRESSIONS, DUPLICATE_POINT, write_pvtp, write_pvtu, write_vtp, write_vtu

__all__ = ["GATHER_MAX_NODES", "MeshOnRank", "field_slices", "is_point_cloud", "physical_rows", "shard_layout",
           "whole_layout", "write_gathered", "write_pieces"]

#: Meshes with at most this many nodes are written as one gathered ``.vtu`` (unless ``--pieces``).
GATHER_MAX_NODES = 200_000


@dataclass
class MeshOnRank:
    """One mesh as this rank sees it: what it needs to predict on, and write, the samples of that mesh."""

    mesh: int  # the mesh's index in the dataset (a mesh is an index here; a loaded one is "whole")
    num_nodes: int
    owned_ids: np.ndarray  # (N_own,) global ids, ascending (all nodes on one process)
    forward: Any  # callable(x_normalised_tensor) -> (N_own, F_out) tensor
    pos_owned: np.ndarray  # (N_own, D)
    piece_ids: np.ndarray | None = None  # (P,) global ids of the piece's nodes, ascending
    piece_cells: list[tuple[str, np.ndarray]] | None = None  # connectivity in piece numbering


def _piece(data: Any, mesh: int, owned_ids: np.ndarray, device: Any = None,
           chunk: int = 1 << 20) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """The cells whose smallest node this rank owns, and the nodes they use (collective).

    Each rank reads only its block of each cell type's rows, ``[r C / R, (r + 1) C / R)`` (in
    slices of ``chunk``), asks the directory which rank owns each cell's smallest node
    (:func:`meshshard.comm.directory_lookup`) and sends the cell there (one all-to-all per type): no
    rank reads a cell file whole. Cells arrive by source rank, each source's in file order: so in file order.
    """
    from meshshard.comm import ArrayExchange

    ex = ArrayExchange(None, "cpu" if device is None else device)
    entry = data.meta["meshes"][mesh]
    folder, n = data.mesh_folder(mesh), int(entry["num_nodes"])
    mine = np.full((len(owned_ids), 1), float(ex.rank))
    kept: list[tuple[str, np.ndarray]] = []
    for cell_type in entry.get("cells", {}):
        conn = data.mesh_cells(mesh, cell_type)  # a memory map of a regular file of the folder, never a link
        lo, hi = ex.rank * len(conn) // ex.size, (ex.rank + 1) * len(conn) // ex.size
        block = np.concatenate([np.asarray(conn[a:min(a + chunk, hi)], dtype=np.int64) for a in range(lo, hi, chunk)]
                               or [np.zeros((0, conn.shape[1]), np.int64)])
        bad = (f"{folder / f'cells-{cell_type}.npy'}: Expected node ids in [0, {n}) (got {block.min()}..{block.max()})"
               if block.size and (block.min() < 0 or block.max() >= n) else None)
        said = [text for text in ex.all_gather(bad) if text is not None]  # raised by every rank alike
        if said:
            raise ValueError(said[0])
        first = block.min(axis=1) if block.size else np.zeros(0, np.int64)
        owner = directory_lookup(owned_ids, mine, first, n, None, device)[:, 0].astype(np.int64)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(ex.size + 1))
        got = ex.all_to_all([block[order[bounds[q]:bounds[q + 1]]] for q in range(ex.size)])
        kept.append((cell_type, np.concatenate(got) if got else np.zeros((0, conn.shape[1]), np.int64)))
    ids = np.unique(np.concatenate([owned_ids] + [c.ravel() for _, c in kept]))
    return ids, [(t, np.searchsorted(ids, c)) for t, c in kept]


def whole_layout(data: Any, mesh: int, model: Any, normaliser: Any, dtype: Any, device: Any,
                  model_spec: str | None, num_targets: int) -> MeshOnRank:
    import torch


    whole = data.mesh(mesh)
    edge_index = torch.as_tensor(whole.graph().edge_index(), device=device)
    pos = torch.as_tensor(np.asarray(whole.points), device=device).to(dtype)
    ea = normaliser.edge_attr(pos, edge_index)
    ids = np.arange(whole.num_nodes, dtype=np.int64)
    extra = {"pos": pos} if getattr(model, "needs_pos", False) else {}  # a point model (ball-attention)

    def forward(x: Any) -> Any:
        out = model(x, edge_index, ea, **extra)
        if model_spec:
            check_model_output(out, whole.num_nodes, num_targets, model_spec, sharded=False)
        return out

    return MeshOnRank(mesh, whole.num_nodes, ids, forward, np.asarray(whole.points),
                       ids, [(t, np.asarray(c, dtype=np.int64)) for t, c in whole.cells])


def shard_layout(data: Any, reader: Any, mesh: int, model: Any, ctx: Any, pieces: bool, model_spec: str | None,
                  num_targets: int) -> MeshOnRank:
    from .._tensor import ShardTensor

    graph, ea, owned = reader.shard(mesh)
    owned = np.asarray(owned, dtype=np.int64)
    pos_owned = graph.pos[: len(owned)].detach().to("cpu").double().numpy()

    def forward(x: Any) -> Any:
        try:
            out = model(ShardTensor.from_local(x, graph.spec), graph, ea)
        except Exception as err:  # the model's own error, whatever its type, on one line
            if is_peer_failure(err):
                raise
            hint = shard_hint(model) if model_spec else ""
            raise RuntimeError(f"the model's forward failed ({type(err).__name__}: {first_line(err)}){hint}") from err
        if model_spec:
            check_model_output(out, len(owned), num_targets, model_spec, sharded=True, group=reader.group)
        return out.to_local()

    layout = MeshOnRank(mesh, int(data.meta["meshes"][mesh]["num_nodes"]), owned, forward, pos_owned)
    if pieces:
        layout.piece_ids, layout.piece_cells = _piece(data, mesh, owned, ctx.device)
    return layout


def field_slices(fields: list[dict[str, Any]]) -> list[tuple[str, slice]]:
    """``[(name, channel slice)]`` of a dataset's field records."""
    out, at = [], 0
    for f in fields:
        k = int(f["components"])
        out.append((f["name"], slice(at, at + k)))
        at += k
    return out


def physical_rows(data: Any, s: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``s``'s inputs and targets at ``ids``, the targets in physical units (multiplied
    by the dataset's own ``target_scales`` where it made them non-dimensional)."""
    x, y = data.rows(s, ids)
    if data.meta.get("target_scales") and y.shape[1]:
        y = y * data.target_factors(s)
    return x, y


def _point_data(data: Any, targets: list[tuple[str, slice]], x: np.ndarray, y: np.ndarray | None, pred: np.ndarray,
                ids: np.ndarray) -> dict[str, np.ndarray]:
    """Point fields of one file: ``<t>_pred``, and with known targets (``y``) ``<t>`` and
    ``<t>_error``, per target; the inputs, ``global_id``."""
    def column(a: np.ndarray, sl: slice) -> np.ndarray:
        c = np.ascontiguousarray(a[:, sl], dtype=np.float64)
        return c[:, 0] if c.shape[1] == 1 else c

    out: dict[str, np.ndarray] = {}
    for name, sl in targets:
        out[f"{name}_pred"] = column(pred, sl)
        if y is not None and y.shape[1]:
            out[name] = column(y, sl)
            out[f"{name}_error"] = column(pred - y, sl)
    taken = {name for name, _ in targets}
    for name, sl in field_slices(data.meta["inputs"]):
        if name != "pos":
            out[f"{name}_input" if name in taken else name] = column(x, sl)
    out["global_id"] = np.asarray(ids, dtype=np.int64)
    return out


def write_gathered(path: Path, data: Any, targets: list[tuple[str, slice]], s: int, layout: MeshOnRank,
                    pred: np.ndarray, ctx: Any, rows_of: Any = None, compression: str = COMPRESSIONS[0],
                    submit: Any = write_now) -> tuple[Any, ...] | None:
    """Rank 0 writes the whole mesh; returns (pos, truth, pred, triangles) on rank 0. ``rows_of(ids)``:
    the inputs and truth (or None) of those nodes (default: sample ``s``'s, :func:`physical_rows`);
    ``compression``, ``submit``: see the module docstring."""
    rows = gather_rows(np.concatenate([layout.owned_ids[:, None].astype(np.float64), pred], axis=1), None, ctx.device)
    if rows is None:
        return None
    full = np.empty((layout.num_nodes, pred.shape[1]))
    full[rows[:, 0].astype(np.int64)] = rows[:, 1:]
    whole = data.mesh(layout.mesh)
    ids = np.arange(layout.num_nodes, dtype=np.int64)
    x, y = physical_rows(data, s, ids) if rows_of is None else rows_of(ids)
    cells = [(t, np.asarray(c, dtype=np.int64)) for t, c in whole.cells]
    writer = write_vtp if path.suffix == ".vtp" else write_vtu
    submit(writer, path, np.asarray(whole.points), cells, _point_data(data, targets, x, y, full, ids), compression)
    tri = next((c for t, c in cells if t == "triangle"), None)
    return np.asarray(whole.points), y, full, tri


def write_pieces(folder: Path, index: Path, data: Any, targets: list[tuple[str, slice]], s: int, layout: MeshOnRank,
                  pred: np.ndarray, ctx: Any, rows_of: Any = None, compression: str = COMPRESSIONS[0],
                  submit: Any = write_now) -> None:
    """Each rank writes its piece; rank 0 the ``.pvtu`` index (``rows_of``, ``compression``, ``submit``:
    as :func:`write_gathered`; the index is written at once).
    An index ``.pvtp`` (a point cloud): ``.vtp`` pieces whose points not owned by the rank (the
    other corners of the faces it writes) carry ``vtkGhostType`` 1, so that the points without it
    are every point of the cloud exactly once."""
    assert layout.piece_ids is not None and layout.piece_cells is not None
    ids = layout.piece_ids
    at = np.minimum(np.searchsorted(layout.owned_ids, ids), max(len(layout.owned_ids) - 1, 0))
    owned = (layout.owned_ids[at] == ids) if len(layout.owned_ids) else np.zeros(len(ids), bool)
    values = np.empty((len(ids), pred.shape[1]))
    values[owned] = pred[at[owned]]
    values[~owned] = directory_lookup(layout.owned_ids, pred, ids[~owned], layout.num_nodes, None, ctx.device)
    points = data.mesh_points(layout.mesh)
    x, y = physical_rows(data, s, ids) if rows_of is None else rows_of(ids)
    fields = _point_data(data, targets, x, y, values, ids)
    folder.mkdir(parents=True, exist_ok=True)
    poly = index.suffix == ".pvtp"
    if poly:
        fields["vtkGhostType"] = np.where(owned, 0, DUPLICATE_POINT).astype(np.uint8)
    suffix = ".vtp" if poly else ".vtu"
    submit(write_vtp if poly else write_vtu, folder / f"part-{ctx.rank:05d}{suffix}", np.asarray(points[ids]),
           layout.piece_cells, fields, compression)
    if ctx.rank == 0:
        kinds = {name: (a.dtype, 1 if a.ndim == 1 else a.shape[1]) for name, a in fields.items()}
        (write_pvtp if poly else write_pvtu)(index, [f"{folder.name}/part-{r:05d}{suffix}"
                                                     for r in range(ctx.world_size)], kinds)
