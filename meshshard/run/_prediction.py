
"""``meshshard predict``: a trained run's predictions, written back onto the mesh for ParaView.

``meshshard predict RUN --data DATA [--samples LIST] --out PRED [--nproc R | under torchrun]``
rebuilds the model from ``RUN/checkpoint.pt`` (its config and weights), runs it on each chosen
sample of the dataset folder DATA, de-normalises the output with the statistics the run trained
with, and writes::

    PRED/
      metrics.json          per sample and target field: RMSE and relative L2 error (physical units);
                            rewritten after each sample, with the files written so far (the only
                            ones --force deletes) and whether the prediction is complete
      <sample>.vtu          the mesh with <target>_pred, <target> (truth), <target>_error, the inputs
                            (one file: a small mesh, or --gather)
      <sample>.pvtu         ... or, for a large mesh, an index ParaView opens as one mesh
      <sample>/part-00000.vtu   with one piece per rank
      <sample>.png          truth, prediction and error side by side (2-D: the field on the mesh;
                            3-D: a slab through the nodes nearest the middle plane z = const;
                            a picture that cannot be drawn is skipped with a note)

On one process (no torchrun, no ``--nproc``) the model runs on the whole mesh of each sample. On
``R`` ranks it runs sharded on a partition into ``R`` parts: the run's own (recorded in its
checkpoint) or ``--partition``. Each rank reads only its owned rows of a sample, and the model's
output equals the single-process output (1e-10 in float64). Writing does not gather the mesh
either: each rank writes the cells whose smallest node id it owns, with every node they use; the
values of nodes it does not own come from a directory spread over the ranks (node ``g`` is kept by
rank ``g * R // N``), so memory per rank stays O(N / R + its piece). Meshes of at most
``GATHER_MAX_NODES`` nodes are gathered into one ``.vtu`` on rank 0 unless ``--pieces`` is given;
``--gather`` gathers any size.

Every ``.vtu`` carries the point field ``global_id`` (the node's id in the dataset's mesh), so
pieces can be matched to the input mesh. The point fields are float64.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import (
    barrier,
    directory_lookup,
    gather_rows,
    init_distributed,
    is_distributed,
    is_peer_failure,
    sum_across,
)
from meshshard.partition import (
    Refusals,
    check_apart,
    check_destination,
    check_input_folders,
    check_partition_matches,
    dumps_json,
    is_lock_file,
    open_dataset,
    plural,
    read_json,
    read_json_inside,
    write_text_file,
)

from ..tasks import DatasetReader, TensorNormalisation, get_task
from ._boundaries import (
    BoundaryScoring,
    boundary_record,
    boundary_rows,
    boundary_summary,
    boundary_sums,
    check_boundary_names,
    check_boundary_request,
)
from ._checkpoint import peek
from ._folder import checkpoint_path, read_run
from ._pictures import sample_picture
from ._recipe import build_model, check_model_output, check_model_radius, first_line, load_factory, shard_hint
from ._report import gather_peak_memory
from ._training import peer_failure
from ._vtk import DUPLICATE_POINT, write_pvtp, write_pvtu, write_vtp, write_vtu

__all__ = ["GATHER_MAX_NODES", "METRICS_FILE", "PredictConfig", "check_prediction_request", "parse_view", "predict",
           "prediction_summary"]

#: Meshes with at most this many nodes are written as one gathered ``.vtu`` (unless ``--pieces``).
GATHER_MAX_NODES = 200_000
#: PRED's record of what predict wrote there: rewritten after each sample (``complete`` is false
#: until the last), it lists every file and piece folder (``files``), which ``--force`` alone may delete.
METRICS_FILE = "metrics.json"
_METRICS_FORMAT = "meshshard-predictions"
_STEM = r"[A-Za-z0-9_+=@-][A-Za-z0-9._+=@-]*"  # what file_stem gives: a plain name, never "." or ".."
_OUR_FILE = re.compile(rf"^{_STEM}\.(vtu|pvtu|vtp|pvtp|png|pvd|gif)$")
_OUR_FOLDER = re.compile(rf"^{_STEM}$")
_PIECE = re.compile(r"^part-\d{5}\.(vtu|vtp)$")
_STEP = re.compile(r"^step-\d{5}(\.vtu|\.pvtu)?$")  # a rollout's folder: its steps' files and piece folders


@dataclass
class PredictConfig:
    """A prediction: what ``meshshard predict`` takes (its options under their long names)."""

    run: str
    data: str
    out: str
    samples: str | None = None
    partition: str | None = None
    gather: bool | None = None  # True: --gather, False: --pieces, None: by size
    dtype: str | None = None
    force: bool = False
    plots: bool = True
    quiet: bool = False
    model: str | None = None  # --model: needed (and only allowed) when the run trained your own model
    model_args: dict[str, Any] | None = None  # --model-args; None: those the run trained with
    checkpoint: str = "best"  # --checkpoint: best (lowest validation loss; the last without one) or last
    boundary: str | None = None  # --boundary NAMES: errors and forces on these named boundaries (_boundaries.py)
    pressure: str | None = None  # --force-field (--pressure) FIELD: the force's pressure (default: a scalar target "p")
    shear: str | None = None  # --shear-field (--shear) FIELD: a wall shear stress target, added to the force
    force_reference: str | None = None  # --force-reference EXPR: the reference dynamic pressure q (default 1)
    reference_area: float | None = None  # --reference-area A: coefficients = force / (q A) (default 1)
    direction: tuple[float, ...] | None = None  # --direction X,Y,Z: the drag coefficient along it
    lift_direction: tuple[float, ...] | None = None  # --lift-direction X,Y,Z: the lift coefficient along it
    view: tuple[float, float, float, float] | None = None  # --view: the pictures' x and y ranges
    rollout: bool = False  # --rollout: a transient run applied step after step from each trajectory's first state
    steps: int | None = None  # --rollout-steps N: a rollout's model applications (default: T - 1 strides)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PredictConfig:
        """From ``asdict(config)`` (what a command hands its ranks)."""
        values = dict(values)
        for key in ("view", "direction", "lift_direction"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


# ------------------------------------------------------------------------------------------------
# Inputs: the checkpoint, the samples, the output folder


def parse_view(text: str) -> tuple[float, float, float, float]:
    """``--view XMIN,XMAX,YMIN,YMAX`` as four finite numbers with XMIN < XMAX and YMIN < YMAX."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if (len(values) != 4 or not all(math.isfinite(v) for v in values) or values[0] >= values[1]
            or values[2] >= values[3]):
        raise ValueError(f"Expected --view XMIN,XMAX,YMIN,YMAX, four numbers with XMIN < XMAX and YMIN < YMAX "
                         f"(got {text!r})")
    return values  # type: ignore[return-value]


def select_samples(text: str | None, names: list[str], val: list[int]) -> list[int]:
    """Sample indices from ``--samples``: ``val`` (the default when there is a validation split),
    ``train``, ``all``, or a comma-separated list of names and indices."""
    if text is None:
        text = "val" if val else "all"
    if text == "all":
        return list(range(len(names)))
    if text == "val":
        if not val:
            raise ValueError("Expected a dataset with a validation split for --samples val "
                             "(it has none; pass --samples all)")
        return sorted(val)
    if text == "train":
        return [i for i in range(len(names)) if i not in set(val)]
    by_name = {n: i for i, n in enumerate(names)}
    picks: list[int] = []
    for item in (t.strip() for t in text.split(",")):
        if item in by_name:
            picks.append(by_name[item])
        elif item.isdigit() and int(item) < len(names):
            picks.append(int(item))
        else:
            raise ValueError(f"Expected --samples to list sample names or indices 0..{len(names) - 1}, "
                             f"or val/train/all (got {item!r})")
    return list(dict.fromkeys(picks))


def file_stem(name: str) -> str:
    """A sample name made safe as a file name: letters, digits and ``._+=@-`` are kept (``aoa+02``
    keeps its sign), every other run of characters becomes ``_``; never a leading ``-`` (which a
    shell would read as an option)."""
    stem = re.sub(r"[^A-Za-z0-9._+=@-]+", "_", name).strip("._").lstrip("-").strip("._") or "sample"
    return stem


def _written_here(out: Path) -> tuple[list[str], bool] | None:
    """The names PRED's ``metrics.json`` says predict wrote there, and whether that prediction
    finished; None when it has none, or one that is not ours. (One written before ``files`` was
    recorded lists its samples' files.)"""
    file = out / METRICS_FILE
    if file.is_symlink() or not file.is_file():  # a link, a FIFO (a reader would block): not our record
        return None
    try:
        meta = read_json(file, max_bytes=MAX_METRICS_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("samples"), list):
        return None
    if "format" in meta:
        if meta["format"] != _METRICS_FORMAT or not isinstance(meta.get("files"), list):
            return None
        names = meta["files"]
    else:
        names = []
        for record in meta["samples"]:
            if isinstance(record, dict):
                names += [record.get("file"), record.get("picture")]
                if str(record.get("file")).endswith(".pvtu"):
                    names.append(str(record["file"])[:-5])
        names = [n for n in names if n is not None]
    if not all(isinstance(n, str) and (_OUR_FILE.match(n) or _OUR_FOLDER.match(n)) for n in names):
        return None  # a name predict never gives (a path, say): not our record
    return names, meta.get("complete") is not False


def _holds_a_prediction(out: Path) -> str:
    """The refusal of a PRED that holds something, without ``--force``."""
    record = _written_here(out)
    if record is not None and not record[1]:
        return (f"{out}: holds a prediction that stopped part-way ({METRICS_FILE} lists the samples it finished); "
                "pass --force to replace it")
    return f"{out}: exists and is not empty (pass --force to replace earlier predictions)"


#: A prediction folder's words for ``check_destination``'s refusals.
_REFUSALS = Refusals(link="{out}: exists and is not a folder", not_empty=_holds_a_prediction)


def _check_is_a_prediction(out: Path) -> None:
    """Raise unless everything in PRED is what its ``metrics.json`` says predict wrote there."""
    entries = [path for path in out.iterdir() if not is_lock_file(path)]  # a killed command's lock is ours
    for path in entries:
        if path.is_symlink():
            raise ValueError(f"{out}: holds a link ({path.name}); refusing to replace it, even with --force")
        if not (path.is_file() and (_OUR_FILE.match(path.name) or path.name in (METRICS_FILE, METRICS_FILE + ".part"))
                or path.is_dir() and _OUR_FOLDER.match(path.name)):
            raise ValueError(f"{out}: holds {path.name}, which meshshard predict did not write; refusing to replace "
                             "it, even with --force")
    record = _written_here(out)
    if record is None:
        raise ValueError(f"{out}: holds no {METRICS_FILE} of meshshard predict's, so none of its files is known to be "
                         "ours; refusing to replace them, even with --force")
    ours = set(record[0]) | {METRICS_FILE, METRICS_FILE + ".part"}
    for path in entries:
        if path.name not in ours:
            raise ValueError(f"{out}: holds {path.name}, which meshshard predict did not write "
                             f"(its {METRICS_FILE} does not list it); refusing to replace it, even with --force")
        if path.is_dir() and not _ours_inside(path):
            raise ValueError(f"{out}: holds {path.name}/ with files meshshard predict did not write; "
                             "refusing to replace it, even with --force")


def check_prediction_folder(out: Path, force: bool) -> list[Path]:
    """Refuse an existing non-empty PRED unless ``force``; with ``force`` return what to delete:
    the files and piece folders that PRED's ``metrics.json`` lists, and that file (anything else
    there, or no such record, refuses). ``meshshard.partition.check_destination``'s rule for a
    folder written in place."""
    check_destination(out, force=force, is_ours=_check_is_a_prediction, in_place=True, refusals=_REFUSALS)
    return list(Path(out).iterdir()) if force and Path(out).is_dir() else []


def _write_metrics(out: Path, record: dict[str, Any]) -> None:
    """Replace ``PRED/metrics.json`` whole (written aside, then renamed), so a crash leaves the last one."""
    part = out / (METRICS_FILE + ".part")
    write_text_file(part, dumps_json(record, indent=2) + "\n")
    os.replace(part, out / METRICS_FILE)


def _delete(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            _delete(list(path.iterdir()))  # piece folders, and a rollout's folder of steps (checked: ours)
            path.rmdir()
        else:
            path.unlink()


def _ours_inside(path: Path) -> bool:
    """A folder predict writes: one piece per rank (``part-00000.vtu``), or a rollout's steps
    (``step-00000.vtu`` / ``.pvtu``, and ``step-00000/`` folders of pieces)."""
    for p in path.iterdir():
        if p.is_symlink():
            return False
        if p.is_file() and (_PIECE.match(p.name) or _STEP.match(p.name) and p.suffix):
            continue
        if p.is_dir() and _STEP.match(p.name) and not p.suffix and all(
                q.is_file() and not q.is_symlink() and _PIECE.match(q.name) for q in p.iterdir()):
            continue
        return False
    return True


# ------------------------------------------------------------------------------------------------
# Model and features


def check_model_request(ckpt: dict[str, Any], run: str, model: str | None) -> None:
    """A run of your own model needs ``--model`` (never imported from the checkpoint); a
    MeshGraphNet run refuses one. One line, before any rank starts."""
    trained = ckpt.get("config", {}).get("model") or ""
    if trained and not model:
        raise ValueError(f"{run}: trained your own model ({trained}); pass --model with it to rebuild it "
                         "(predict imports code named on the command line only, never from a checkpoint)")
    if model and not trained:
        raise ValueError(f"{run}: trained the built-in MeshGraphNet; leave out --model")


def normalisation_of(ckpt: dict[str, Any], data: Any) -> Any:
    """The statistics the run trained with (stored in its checkpoint's config), or else the dataset's."""
    from meshshard.partition import Normalisation

    stored = ckpt.get("config", {}).get("normalisation")
    if stored is None:
        return data.normalisation
    norm = Normalisation.from_dict(stored)
    checks = [("input", norm.inputs.channels, data.input_channels)]
    if data.target_channels:  # a dataset of inputs only has no targets to compare
        checks.append(("target", norm.targets.channels, data.target_channels))
    for what, theirs, mine in checks:
        if list(theirs) != list(mine):
            hint = ("; the run learnt the difference from its training cases' mean field: make these cases with "
                    "meshshard dataset ... --mean-field-from THE_RUN'S_DATA" if norm.target_offset is not None else "")
            raise ValueError(f"Expected {data.path} to have the run's {what} channels {list(theirs)} "
                             f"(got {list(mine)}){hint}")
    if norm.offset_sha256 is not None and (data.meta.get("mean_field") or {}).get("sha256") != norm.offset_sha256:
        raise ValueError(f"Expected {data.path} to carry the mean field the run trained with (the run learnt the "
                         "difference from it); this dataset's is another: make these cases with meshshard dataset "
                         "... --mean-field-from THE_RUN'S_DATA")
    theirs, mine = list(norm.edges.channels), list(data.edge_channels)
    if theirs != mine:  # the meshes' dimension: edge features are dpos[0..D-1], |dpos|
        d_run, d_data = len(theirs) - 1, len(mine) - 1
        hint = (" (the run's dataset was made with --collapse-2d: make this one with it too)"
                if d_run == 2 and d_data == 3 and data.meta.get("collapsed_2d") is not True else
                " (the run's dataset was one-cell-thick 3-D: make this one without --collapse-2d)"
                if d_run == 3 and data.meta.get("collapsed_2d") else "")
        raise ValueError(f"Expected {data.path} to have {d_run}-D meshes like the run's (got {d_data}-D){hint}")
    return norm


# ------------------------------------------------------------------------------------------------
# One mesh's layout on this rank

#: Cell types that are not volume cells in 3-D (faces, lines, vertices) and in 2-D (lines, vertices).
_SURFACE_TYPES = frozenset({"vertex", "line", "line3", "triangle", "triangle6", "quad", "quad8", "quad9", "polygon"})
_POINT_TYPES = frozenset({"vertex", "line", "line3"})


def is_point_cloud(entry: dict[str, Any]) -> bool:
    """Whether a dataset mesh (its ``meshes[m]`` entry) is a point cloud: no volume cells, that
    is a surface in 3-D (faces only), or bare points (vertex cells, or no cells and a graph built
    from the points), but not a flat mesh of faces at one z (``"planar"``: a 2-D mesh written in
    3-D, as many solvers do). Its predictions are written as PolyData (``.vtp`` / ``.pvtp``)."""
    types = set(entry.get("cells") or {})
    if entry.get("planar"):  # a 2-D mesh written with a constant z: an unstructured grid, drawn in 2-D
        return False
    if "surface_area" in entry:
        return True
    if not types:
        return "graph" in entry  # a graph given as edges, without cells, stays an unstructured grid
    return types <= (_SURFACE_TYPES if int(entry.get("pos_dim", 0)) == 3 else _POINT_TYPES)



@dataclass
class _MeshOnRank:
    """One mesh as this rank sees it: what it needs to predict on, and write, the samples of that mesh."""

    mesh: int  # the mesh's index in the dataset (a mesh is an index here; a loaded one is "whole")
    num_nodes: int
    owned_ids: np.ndarray  # (N_own,) global ids, ascending (all nodes on one process)
    forward: Any  # callable(x_normalised_tensor) -> (N_own, F_out) tensor
    pos_owned: np.ndarray  # (N_own, D)
    piece_ids: np.ndarray | None = None  # (P,) global ids of the piece's nodes, ascending
    piece_cells: list[tuple[str, np.ndarray]] | None = None  # connectivity in piece numbering


def _piece(data: Any, mesh: int, owned_ids: np.ndarray,
           chunk: int = 1 << 20) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """The cells whose smallest node this rank owns (read in chunks), and the nodes they use."""
    entry = data.meta["meshes"][mesh]
    folder = data.mesh_folder(mesh)
    kept: list[tuple[str, np.ndarray]] = []
    for cell_type in entry.get("cells", {}):
        conn = data.mesh_cells(mesh, cell_type)  # a memory map of a regular file of the folder, never a link
        parts = []
        for lo in range(0, len(conn), chunk):
            block = np.asarray(conn[lo:lo + chunk], dtype=np.int64)
            if block.size and (block.min() < 0 or block.max() >= entry["num_nodes"]):
                raise ValueError(f"{folder / f'cells-{cell_type}.npy'}: Expected node ids in [0, {entry['num_nodes']}) "
                                 f"(got {block.min()}..{block.max()})")
            first = block.min(axis=1)
            at = np.minimum(np.searchsorted(owned_ids, first), max(len(owned_ids) - 1, 0))
            mine = (owned_ids[at] == first) if len(owned_ids) else np.zeros(len(block), bool)
            parts.append(block[mine])
        kept.append((cell_type, np.concatenate(parts) if parts else np.zeros((0, conn.shape[1]), np.int64)))
    ids = np.unique(np.concatenate([owned_ids] + [c.ravel() for _, c in kept]))
    return ids, [(t, np.searchsorted(ids, c)) for t, c in kept]


def _whole_layout(data: Any, mesh: int, model: Any, normaliser: Any, dtype: Any, device: Any,
                  model_spec: str | None, num_targets: int) -> _MeshOnRank:
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

    return _MeshOnRank(mesh, whole.num_nodes, ids, forward, np.asarray(whole.points),
                       ids, [(t, np.asarray(c, dtype=np.int64)) for t, c in whole.cells])


def _shard_layout(data: Any, reader: Any, mesh: int, model: Any, ctx: Any, pieces: bool, model_spec: str | None,
                  num_targets: int) -> _MeshOnRank:
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

    layout = _MeshOnRank(mesh, int(data.meta["meshes"][mesh]["num_nodes"]), owned, forward, pos_owned)
    if pieces:
        layout.piece_ids, layout.piece_cells = _piece(data, mesh, owned)
    return layout


# ------------------------------------------------------------------------------------------------
# Metrics, and the files of one sample


def field_slices(fields: list[dict[str, Any]]) -> list[tuple[str, slice]]:
    """``[(name, channel slice)]`` of a dataset's field records."""
    out, at = [], 0
    for f in fields:
        k = int(f["components"])
        out.append((f["name"], slice(at, at + k)))
        at += k
    return out


def _print_table(rows: list[dict[str, Any]], fields: list[str]) -> None:
    """Per sample its split, nodes and the errors of each target field (and the area-weighted
    relative L2 when some sample is a surface)."""
    weighted = any("rel_l2_area" in r["fields"][f] for r in rows for f in fields)
    head = (f"{'sample':<24} {'split':<5} {'nodes':>9}"
            + "".join(f" {f + ' RMSE':>14} {f + ' rel L2':>12}" + (f" {f + ' area L2':>13}" if weighted else "")
                      for f in fields))
    print(head)
    for r in rows:
        line = f"{r['name'][:24]:<24} {r['split']:<5} {r['num_nodes']:>9,}"
        for f in fields:
            rmse, rel = r["fields"][f]["rmse"], r["fields"][f]["rel_l2"]
            line += (f" {'-' if rmse is None else format(rmse, '.4g'):>14}"
                     f" {'-' if rel is None else format(rel, '.3%'):>12}")
            if weighted:
                area = r["fields"][f].get("rel_l2_area")
                line += f" {'-' if area is None else format(area, '.3%'):>13}"
        print(line)


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


def _write_gathered(path: Path, data: Any, targets: list[tuple[str, slice]], s: int, layout: _MeshOnRank,
                    pred: np.ndarray, ctx: Any, rows_of: Any = None) -> tuple[Any, ...] | None:
    """Rank 0 writes the whole mesh; returns (pos, truth, pred, triangles) on rank 0. ``rows_of(ids)``:
    the inputs and truth (or None) of those nodes (default: sample ``s``'s, :func:`physical_rows`)."""
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
    writer(path, np.asarray(whole.points), cells, _point_data(data, targets, x, y, full, ids))
    tri = next((c for t, c in cells if t == "triangle"), None)
    return np.asarray(whole.points), y, full, tri


def _write_pieces(folder: Path, index: Path, data: Any, targets: list[tuple[str, slice]], s: int, layout: _MeshOnRank,
                  pred: np.ndarray, ctx: Any, rows_of: Any = None) -> None:
    """Each rank writes its piece; rank 0 the ``.pvtu`` index (``rows_of``: as :func:`_write_gathered`).
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
    (write_vtp if poly else write_vtu)(folder / f"part-{ctx.rank:05d}{suffix}", np.asarray(points[ids]),
                                       layout.piece_cells, fields)
    if ctx.rank == 0:
        kinds = {name: (a.dtype, 1 if a.ndim == 1 else a.shape[1]) for name, a in fields.items()}
        (write_pvtp if poly else write_pvtu)(index, [f"{folder.name}/part-{r:05d}{suffix}"
                                                     for r in range(ctx.world_size)], kinds)


def _partition_reader(cfg: PredictConfig, data: Any, run_cfg: dict[str, Any], ctx: Any, dtype: Any,
                      normaliser: Any) -> tuple[Path | None, DatasetReader | None]:
    """On R ranks: the partition into R parts (``--partition``, else the run's) and this rank's
    reader of it; on one process ``(None, None)``, the model runs on whole meshes."""
    if ctx.world_size == 1:
        return None, None
    parts = Path(cfg.partition or run_cfg.get("partition") or "")
    if not cfg.partition and not parts.is_dir():
        raise ValueError(f"{parts}: the run's partition folder is gone; pass --partition PARTS")
    whose = "the run's own partition, which the run needs" if not cfg.partition else "not for these meshes"
    meta = check_partition_matches(data, parts, hint=(
        f"it is {whose}: make one of {cfg.data} in a new folder and pass it: meshshard partition {cfg.data} "
        f"--parts {ctx.world_size} --out NEW_PARTS, then --partition NEW_PARTS"))
    if meta["num_parts"] != ctx.world_size:
        raise ValueError(f"Expected a partition into {plural(ctx.world_size, 'part')}, one per rank "
                         f"(got {meta['num_parts']} in {parts}); make one with meshshard partition {cfg.data} "
                         f"--parts {ctx.world_size} and pass --partition")
    reader = DatasetReader(data, parts, ctx.rank, None, device=ctx.device, dtype=dtype, normaliser=normaliser,
                           parts_meta=meta)  # the run's statistics, for the edge features too
    return parts, reader


def predict(cfg: PredictConfig) -> dict[str, Any] | None:
    """Predict, write PRED and return the metrics (on rank 0; ``None`` on the other ranks). With
    ``cfg.rollout``, a rollout of a transient run (:func:`meshshard.run._rollout.rollout`).

    A collective that raises (a peer rank died or stopped responding, the groups' timeout) is
    reported as train reports it, naming the sample (:func:`meshshard.run._training.peer_failure`)."""
    doing = ["prediction"]  # what this rank is doing, for the error of a collective that raises
    try:
        return _predict(cfg, doing)
    except (RuntimeError, OSError) as err:
        writing = isinstance(err, OSError) and getattr(err, "filename", None) is not None  # a file, not a peer
        if writing or not is_peer_failure(err) or not is_distributed():
            raise
        raise peer_failure(err, doing[0]) from err


def _predict(cfg: PredictConfig, doing: list[str]) -> dict[str, Any] | None:
    import torch

    if cfg.rollout:
        from ._rollout import rollout

        return rollout(cfg, doing)

    ctx = init_distributed()
    data = open_dataset(cfg.data)
    ckpt = read_run(cfg.run, cfg.checkpoint)
    run_cfg = ckpt.get("config", {})
    dtype_name = cfg.dtype or run_cfg.get("dtype", "float32")
    if dtype_name not in ("float32", "float64"):
        raise ValueError(f"Expected --dtype float32 or float64 (got {dtype_name!r})")
    dtype = getattr(torch, dtype_name)
    norm = normalisation_of(ckpt, data)
    normaliser = TensorNormalisation(norm, ctx.device, dtype)
    check_model_request(ckpt, cfg.run, cfg.model)
    if cfg.partition:
        check_model_radius(run_cfg, cfg.partition)
    # the run's target fields: DATA's when it has targets (checked equal above), else recorded by train
    truth = bool(data.target_channels)
    check_rollout_request(cfg, run_cfg)
    target_meta = get_task(str(run_cfg.get("task") or "steady"), run_cfg).output_fields(data, run_cfg)
    scales = dict(run_cfg.get("target_scales") or {})  # the run's non-dimensional targets, if any
    if scales and not data.meta.get("parameters"):
        raise ValueError(f"{data.path}: Expected parameters (meshshard dataset --params): the run predicts "
                         f"non-dimensional targets ({', '.join(f'{k}={v}' for k, v in scales.items())}), which "
                         "need each sample's parameters to be written in physical units")
    num_targets = len(norm.targets.channels)
    sizes = len(data.input_channels), len(data.edge_channels), num_targets
    model = build_model(ckpt, sizes, dtype, cfg.model, cfg.model_args, str(data.path)).to(ctx.device)
    names = [str(e["name"]) for e in data.meta["samples"]]
    picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
    parts, reader = _partition_reader(cfg, data, run_cfg, ctx, dtype, normaliser)
    target_fields = field_slices(target_meta)
    scoring = check_boundary_request(data, target_fields, cfg.boundary, cfg.pressure, cfg.shear, cfg.force_reference,
                                     picks, cfg.reference_area, cfg.direction,
                                     cfg.lift_direction)  # on every rank, before any collective
    out = Path(cfg.out)
    stale = check_prediction_folder(out, cfg.force)  # on every rank, so a refusal stops them all before any collective
    head = {"format": _METRICS_FORMAT, "format_version": 1, "complete": False, "run": str(cfg.run),
            "data": str(cfg.data), "step": ckpt.get("step"), "checkpoint": cfg.checkpoint,
            "world_size": ctx.world_size, "units": "physical (de-normalised)", "targets_known": truth, "files": []}
    barrier()  # every rank has looked at PRED before rank 0 changes it
    if ctx.rank == 0:
        _delete(stale)
        out.mkdir(parents=True, exist_ok=True)
        _write_metrics(out, head | {"samples": []})  # from now on PRED says what is ours in it
    barrier()
    main = ctx.rank == 0 and not cfg.quiet
    if main:
        where = "one process, whole meshes" if parts is None else f"{ctx.world_size} ranks, partition {parts}"
        print(f"meshshard predict: {len(picks)} sample(s) of {cfg.data} with {cfg.run} "
              f"(step {ckpt.get('step')}); {where}"
              + ("" if truth else f"; {cfg.data} has no targets: predictions only, no errors"), flush=True)
    layouts: dict[tuple[int, bool], _MeshOnRank] = {}
    point_areas: dict[int, np.ndarray | None] = {}  # a surface's area per owned point, per mesh
    walls: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # --boundary: this rank's rows on them, per mesh
    views: dict[int, tuple[float, float, float, float] | None] = {}  # the pictures' frame, per mesh
    records = []
    stems = [file_stem(name) for name in names]
    val = set(int(v) for v in data.val)
    for s in picks:
        doing[0] = f"sample {names[s]}"
        started = time.perf_counter()
        mesh, n = data.sample_mesh(s), data.num_nodes(s)
        gather = True if parts is None else (cfg.gather if cfg.gather is not None else n <= GATHER_MAX_NODES)
        stem = stems[s] if stems.count(stems[s]) == 1 else f"{stems[s]}-{s}"
        cloud = is_point_cloud(data.meta["meshes"][mesh])
        vt = "vtp" if cloud else "vtu"
        if ctx.rank == 0:  # listed before any rank writes them (the ranks meet in the forward below first)
            head["files"] += (([f"{stem}.{vt}"] if gather else [f"{stem}.p{vt}", stem])
                              + ([f"{stem}.png"] if cfg.plots else []))
            _write_metrics(out, head | {"samples": records})
        key = (mesh, gather)
        if key not in layouts:
            layouts[key] = (_whole_layout(data, mesh, model, normaliser, dtype, ctx.device, cfg.model, num_targets)
                            if reader is None else
                            _shard_layout(data, reader, mesh, model, ctx, pieces=not gather, model_spec=cfg.model,
                                          num_targets=num_targets))
        layout = layouts[key]
        x, y = physical_rows(data, s, layout.owned_ids)
        with torch.no_grad():
            out_t = layout.forward(normaliser.normalise_inputs(torch.as_tensor(x, device=ctx.device).to(dtype)))
        pred = norm.targets.denormalise(out_t.to(torch.float64).cpu().numpy()) + norm.offset(x)
        if scales:  # non-dimensional targets (--target-scale): back to physical units
            pred = pred * data.target_factors(s, scales, target_meta)
        forward_s = time.perf_counter() - started
        if mesh not in point_areas:  # a surface's point areas (|area vector|), for area-weighted errors
            point_areas[mesh] = _surface_weights(data, mesh, layout.owned_ids)
        areas = point_areas[mesh]
        if truth:  # per field: sum e^2, sum y^2, sum a e^2, sum a y^2 over this rank's rows; one sum over ranks
            err = pred - y
            w = areas if areas is not None else np.zeros(len(y))
            sums = sum_across(np.array([[float((err[:, sl] ** 2).sum()), float((y[:, sl] ** 2).sum()),
                                         float(w @ (err[:, sl] ** 2).sum(1)), float(w @ (y[:, sl] ** 2).sum(1))]
                                        for _, sl in target_fields]), None, ctx.device)
        else:
            y, sums = None, [(math.nan,) * 4] * len(target_fields)
        if gather:
            path = out / f"{stem}.{vt}"
            full = _write_gathered(path, data, target_fields, s, layout, pred, ctx)
        else:
            path = out / f"{stem}.p{vt}"
            _write_pieces(out / stem, path, data, target_fields, s, layout, pred, ctx)
            full = None
        boundaries = None
        if scoring is not None:
            if mesh not in walls:  # read once per mesh, for every sample on it
                walls[mesh] = boundary_rows(data, mesh, layout.owned_ids, scoring)
            on_walls = sum_across(boundary_sums(walls[mesh], y, pred, scoring), None, ctx.device)
            boundaries = boundary_record(on_walls, scoring, data.parameters(s), truth)
        if cfg.plots and cfg.view is None and scoring is not None and mesh not in views:
            views[mesh] = _boundary_view(data, mesh, scoring)
        view = cfg.view or views.get(mesh)
        picture = (sample_picture(out / f"{stem}.png", names[s], layout, y, pred, gather, full, target_fields, ctx,
                                  view=view, cloud=cloud)
                   if cfg.plots else None)
        record = {"sample": s, "name": names[s], "split": ("val" if s in val else "train") if truth else None,
                  "num_nodes": n, "file": path.name, "picture": picture, "fields": {},
                  "seconds": {"read_and_forward": round(forward_s, 4),
                              "total": round(time.perf_counter() - started, 4)}}
        for (name, sl), (sse, sst, a_sse, a_sst) in zip(target_fields, sums):
            k = sl.stop - sl.start
            if truth and not math.isfinite(sse):  # JSON has no NaN: the figure is null, and said once here
                if main:
                    print(f"note: {names[s]}: the prediction of {name} holds NaN or inf; its errors are null in "
                          "metrics.json", file=sys.stderr, flush=True)
                sse = None
            record["fields"][name] = ({"rmse": math.sqrt(sse / (n * k)),
                                       "rel_l2": math.sqrt(sse / sst) if sst > 0 else None}
                                      if truth and sse is not None else {"rmse": None, "rel_l2": None})
            if areas is not None:  # a surface: sqrt(sum a_i |e_i|^2 / sum a_i |y_i|^2)
                record["fields"][name]["rel_l2_area"] = (math.sqrt(a_sse / a_sst) if truth and sse is not None
                                                         and a_sst > 0 else None)
        if boundaries is not None:
            record["boundaries"] = boundaries
        records.append(record)
        if ctx.rank == 0:
            _write_metrics(out, head | {"samples": records})
        if main:  # progress: a sample of a large mesh takes a while
            print(f"  [{len(records)}/{len(picks)}] {names[s]}: {n:,} nodes, {record['seconds']['total']:.1f} s -> "
                  f"{path.name}", flush=True)
    memory = gather_peak_memory(ctx.device)  # every rank's peak, in rank order (a collective)
    if ctx.rank != 0:
        return None
    summary = head | {"complete": True, **memory, "samples": records,
                      "mean": {name: {key: _mean([r["fields"][name].get(key) for r in records])
                                      for key in ("rmse", "rel_l2", "rel_l2_area")
                                      if any(key in r["fields"][name] for r in records)}
                               for name, _ in target_fields}}
    if scoring is not None:
        summary["boundaries"] = boundary_summary(records, scoring)
    _write_metrics(out, summary)
    if main:
        if truth:
            _print_table(records, [name for name, _ in target_fields])
            if scoring is not None:
                _print_boundaries(summary["boundaries"], scoring, records)
        print(f"wrote {out}/: {len(records)} sample file(s), metrics.json" + (", pictures" if cfg.plots else ""),
              flush=True)
    return summary


def _surface_weights(data: Any, mesh: int, owned_ids: np.ndarray, chunk: int = 1 << 20) -> np.ndarray | None:
    """The area each owned point of a surface stands for: its share of the faces around it (each
    face's area split equally among its corners, the ``area`` field of
    :mod:`meshshard.partition._points`), from the faces read in chunks; None when mesh ``mesh`` is
    not a surface."""
    entry = data.meta["meshes"][mesh]
    if "surface_area" not in entry:
        return None
    points = data.mesh_points(mesh)
    owned = np.asarray(owned_ids, dtype=np.int64)
    weights = np.zeros(len(owned))
    for cell_type in entry.get("cells", {}):
        if cell_type not in ("triangle", "quad"):
            continue
        conn = data.mesh_cells(mesh, cell_type)
        for lo in range(0, len(conn), chunk):
            block = np.asarray(conn[lo:lo + chunk], dtype=np.int64)
            if block.size and (block.min() < 0 or block.max() >= entry["num_nodes"]):
                raise ValueError(f"{data.mesh_folder(mesh) / f'cells-{cell_type}.npy'}: Expected node ids in "
                                 f"[0, {entry['num_nodes']})")
            used, local = np.unique(block, return_inverse=True)
            v = np.asarray(points[used], dtype=np.float64)[local.reshape(block.shape)]
            if block.shape[1] == 3:
                area = 0.5 * np.linalg.norm(np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]), axis=1)
            else:  # a quad: half the cross product of its diagonals, as the dataset's ``area`` field
                area = 0.5 * np.linalg.norm(np.cross(v[:, 2] - v[:, 0], v[:, 3] - v[:, 1]), axis=1)
            corners = block.reshape(-1)
            at = np.minimum(np.searchsorted(owned, corners), max(len(owned) - 1, 0))
            mine = owned[at] == corners if len(owned) else np.zeros(len(corners), bool)
            np.add.at(weights, at[mine], np.repeat(area / block.shape[1], block.shape[1])[mine])
    return weights


def _boundary_view(data: Any, mesh: int, scoring: BoundaryScoring) -> tuple[float, float, float, float] | None:
    """The pictures' frame by default with ``--boundary``: the boundaries' nodes, with a margin of
    a quarter of their extent (at least a twentieth of the mesh's) on each side."""
    if "surface" in scoring.names and "surface" not in [str(b["name"]) for b in
                                                        data.meta["meshes"][mesh].get("boundaries", [])]:
        return None  # a whole surface: the picture's own framing
    points = data.mesh_points(mesh)
    ids = np.unique(np.concatenate([data.boundary(mesh, name)[0] for name in scoring.names]))
    if not len(ids):
        return None
    xy = np.asarray(points[ids], dtype=np.float64)[:, :2]
    low, high = xy.min(0), xy.max(0)
    whole = float(np.ptp(np.asarray(points[:: max(1, len(points) // 100_000)])[:, :2], axis=0).max())
    margin = np.maximum(0.25 * (high - low), 0.05 * whole)
    return float(low[0] - margin[0]), float(high[0] + margin[0]), float(low[1] - margin[1]), float(high[1] + margin[1])


def _print_boundaries(summary: dict[str, Any], scoring: BoundaryScoring, records: list[dict[str, Any]]) -> None:
    """One line per boundary: its mean errors and the force's R² over the samples; with
    ``--direction``, a table of the drag (and lift) coefficients per sample and a line of their
    mean absolute error and R²."""
    for name, entry in summary.items():
        if "coefficients" in entry:
            coefficients = list(entry["coefficients"])
            print(f"force coefficients on {name}:")
            print(f"{'sample':<24}" + "".join(f" {c + ' true':>12} {c + ' pred':>12} {c + ' error':>12}"
                                              for c in coefficients))
            for r in records:
                got = r.get("boundaries", {}).get(name, {}).get("coefficients", {})
                print(f"{r['name'][:24]:<24}" + "".join(
                    "".join(f" {'-' if got.get(c, {}).get(k) is None else format(got[c][k], '.5g'):>12}"
                            for k in ("true", "pred", "abs_error")) for c in coefficients))
            print(f"{name} over {plural(len(records), 'sample')}: " + "; ".join(
                f"{c} MAE {'-' if v['mae'] is None else format(v['mae'], '.4g')}, "
                f"R² {'-' if v['r2'] is None else format(v['r2'], '.4f')}" for c, v in entry["coefficients"].items()),
                flush=True)
        parts = [f"{field} rel L2 {_percent(v['rel_l2'])}" for field, v in entry["fields"].items()]
        if "force" in entry:
            r2 = ", ".join("-" if v is None else f"{v:.4f}" for v in entry["force"]["r2"])
            parts.append(f"force error {_percent(entry['force']['rel_error'])}, R² of the {entry['force']['r2_of']} "
                         f"over the samples ({r2})")
        print(f"on {name}: " + "; ".join(parts), flush=True)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


#: The largest metrics.json info reads (a record per sample: a few hundred bytes each).
MAX_METRICS_BYTES = 64 << 20


def _error_figure(value: Any, where: str) -> float | None:
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    raise ValueError(f"{where}: Expected a number or null (got {value!r})")


def prediction_summary(pred: str | Path) -> dict[str, Any]:
    """The facts ``meshshard info PRED`` prints, from ``PRED/metrics.json`` of ``meshshard predict``
    (read as JSON only, from inside PRED; the paths it names are printed, never opened)."""
    file = Path(pred) / METRICS_FILE
    meta = read_json_inside(pred, METRICS_FILE, max_bytes=MAX_METRICS_BYTES)
    if not isinstance(meta, dict) or meta.get("format", _METRICS_FORMAT) != _METRICS_FORMAT:
        raise ValueError(f"{file}: Expected format {_METRICS_FORMAT!r} "
                         f"(got {meta.get('format') if isinstance(meta, dict) else type(meta).__name__!r})")
    samples = meta.get("samples")
    if not isinstance(samples, list) or not all(isinstance(r, dict) and isinstance(r.get("fields"), dict)
                                                for r in samples):
        raise ValueError(f"{file}: Expected a list of samples, each with its fields' errors "
                         "(not a metrics.json of meshshard predict)")
    complete = meta.get("complete") is not False  # one from before "complete" was recorded was written at the end
    keys = ("rmse", "rel_l2")
    weighted = {name for r in samples for name, e in r["fields"].items()  # surfaces: area-weighted too
                if isinstance(e, dict) and "rel_l2_area" in e}

    def keys_of(name: str) -> tuple[str, ...]:
        return keys + (("rel_l2_area",) if name in weighted else ())

    errors = [{name: {key: _error_figure((e if isinstance(e, dict) else {}).get(key),
                                         f"{file}: samples[{i}].fields.{name}.{key}") for key in keys_of(name)}
               for name, e in r["fields"].items()} for i, r in enumerate(samples)]
    recorded = meta.get("mean")
    if complete and isinstance(recorded, dict):
        mean = {str(name): {key: _error_figure((e if isinstance(e, dict) else {}).get(key),
                                               f"{file}: mean.{name}.{key}")
                            for key in keys_of(str(name))} for name, e in recorded.items()}
    else:  # a prediction that stopped part-way: the mean over the samples it finished
        fields = list(dict.fromkeys(name for e in errors for name in e))
        mean = {name: {key: _mean([e[name].get(key) for e in errors if name in e]) for key in keys_of(name)}
                for name in fields}
    return {
        "prediction": str(pred),
        "run": meta.get("run"),
        "data": meta.get("data"),
        "step": meta.get("step"),
        "world_size": meta.get("world_size"),
        "complete": complete,
        "targets_known": meta.get("targets_known", any(e["rmse"] is not None for e in mean.values())),
        "samples": [{"name": r.get("name"), "num_nodes": r.get("num_nodes"), "file": r.get("file")} for r in samples],
        "mean": mean,
    }


def check_rollout_request(cfg: PredictConfig, run_cfg: dict[str, Any]) -> None:
    """A run of a task of trajectories predicts rollouts (``--rollout``), any other run does not;
    ``--rollout-steps`` is a positive count, with ``--rollout`` only. One line, before any collective."""
    task = get_task(str(run_cfg.get("task") or "steady"), run_cfg)
    if cfg.steps is not None and (not cfg.rollout or int(cfg.steps) < 1):
        raise ValueError(f"Expected --rollout-steps to be a positive number of steps, with --rollout (got {cfg.steps}"
                         + ("" if cfg.rollout else " without --rollout") + ")")
    if task.rolls_out and not cfg.rollout:
        raise ValueError(f"{cfg.run}: trained the {task.name} task, whose predictions are rollouts: pass --rollout")
    if cfg.rollout and not task.rolls_out:
        raise ValueError(f"{cfg.run}: trained the {task.name} task, which does not roll out (a run trained on a "
                         "trajectory dataset does); leave out --rollout")


def check_prediction_request(cfg: PredictConfig) -> None:
    """Every refusal of :func:`predict` that files alone decide, as a one-line ``ValueError``,
    before any rank starts: the folders, where PRED goes, and the model (a run of your own model
    needs ``model``, whose file is imported here once)."""
    check_input_folders((cfg.run, "run folder"), (cfg.data, "dataset folder"))
    # PRED may be inside RUN (run/pred: train --force deletes only its own files), not RUN itself
    check_apart(cfg.out, (cfg.data, "dataset folder"),
                *(((cfg.partition, "partition folder"),) if cfg.partition else ()))
    if Path(cfg.out).resolve() == Path(cfg.run).resolve():
        raise ValueError(f"{cfg.out}: Expected an output folder apart from the run folder (got the run folder; "
                         f"{Path(cfg.out) / 'pred'} would do)")
    # the model it trained, from a look at the checkpoint's entries (its tensors are not read; a
    # checkpoint that does not load so is read whole, for the one-line reason); the ranks check it whole
    path = checkpoint_path(cfg.run, cfg.checkpoint)
    seen = peek(path) if not path.is_symlink() else None
    ckpt = seen if isinstance((seen or {}).get("config"), dict) else read_run(cfg.run, cfg.checkpoint)
    check_model_request(ckpt, cfg.run, cfg.model)
    check_rollout_request(cfg, ckpt.get("config", {}))
    if cfg.partition:
        check_model_radius(ckpt.get("config", {}), cfg.partition)
    if cfg.model:
        load_factory(cfg.model)
    if (cfg.boundary or cfg.pressure or cfg.shear or cfg.force_reference or cfg.reference_area is not None
            or cfg.direction is not None or cfg.lift_direction is not None):  # what DATA and the run decide
        data = open_dataset(cfg.data)
        run_cfg = ckpt.get("config", {})
        try:
            fields = field_slices(get_task(str(run_cfg.get("task") or "steady"), run_cfg).output_fields(data, run_cfg))
        except (KeyError, TypeError, ValueError):  # the ranks refuse it, from the whole checkpoint
            fields = None
        names = [str(e["name"]) for e in data.meta["samples"]]
        picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
        if fields is None:
            check_boundary_names(data, cfg.boundary, cfg.force_reference, picks)
        else:
            check_boundary_request(data, fields, cfg.boundary, cfg.pressure, cfg.shear, cfg.force_reference, picks,
                                   cfg.reference_area, cfg.direction, cfg.lift_direction)
