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

import argparse
import json
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard._launch import check_apart, check_input_folders, check_output_folder, run_command

__all__ = ["GATHER_MAX_NODES", "PredictConfig", "predict", "register"]

#: Meshes with at most this many nodes are written as one gathered ``.vtu`` (unless ``--pieces``).
GATHER_MAX_NODES = 200_000
#: Nodes drawn in one picture at most (a strided subsample beyond that).
PLOT_MAX_NODES = 200_000
#: PRED's record of what predict wrote there: rewritten after each sample (``complete`` is false
#: until the last), it lists every file and piece folder (``files``), which ``--force`` alone may delete.
METRICS_FILE = "metrics.json"
_METRICS_FORMAT = "meshshard-predictions"
_STEM = r"[A-Za-z0-9_-][A-Za-z0-9._-]*"  # what file_stem gives: a plain name, never "." or ".."
_OUR_FILE = re.compile(rf"^{_STEM}\.(vtu|pvtu|png)$")
_OUR_FOLDER = re.compile(rf"^{_STEM}$")
_PIECE = re.compile(r"^part-\d{5}\.vtu$")


@dataclass
class PredictConfig:
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


# ------------------------------------------------------------------------------------------------
# Inputs: the checkpoint, the samples, the output folder


def read_run(run: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint of a run folder (through the package's checkpoint reader)."""
    path = Path(run) / "checkpoint.pt"
    if path.is_symlink():
        raise ValueError(f"{path}: is a link; a run's checkpoint is read from inside its folder only")
    if not path.is_file():
        raise ValueError(f"{run}: no checkpoint.pt (not a run folder of meshshard train, or no step finished yet)")
    from meshshard._checkpoint import load_checkpoint  # tensors and plain values only, checksum checked

    return load_checkpoint(path)


def select_samples(text: str | None, names: list[str], val: list[int]) -> list[int]:
    """Sample indices from ``--samples``: ``val`` (the default when there is a validation split),
    ``train``, ``all``, or a comma-separated list of names and indices."""
    if text is None:
        text = "val" if val else "all"
    if text == "all":
        return list(range(len(names)))
    if text == "val":
        if not val:
            raise ValueError("Expected a dataset with a validation split for --samples val (it has none; pass --samples all)")
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
            raise ValueError(f"Expected --samples to list sample names or indices 0..{len(names) - 1}, or val/train/all "
                             f"(got {item!r})")
    return list(dict.fromkeys(picks))


def file_stem(name: str) -> str:
    """A sample name made safe as a file name (letters, digits, ``._-``)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "sample"
    return stem


def _written_here(out: Path) -> tuple[list[str], bool] | None:
    """The names PRED's ``metrics.json`` says predict wrote there, and whether that prediction
    finished; None when it has none, or one that is not ours. (One written before ``files`` was
    recorded lists its samples' files.)"""
    file = out / METRICS_FILE
    if file.is_symlink() or not file.is_file():  # a link, a FIFO (a reader would block): not our record
        return None
    try:
        meta = json.loads(file.read_text())
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


def check_output(out: Path, force: bool) -> list[Path]:
    """Refuse an existing non-empty PRED unless ``force``; with ``force`` return what to delete:
    the files and piece folders that PRED's ``metrics.json`` lists, and that file (anything else
    there, or no such record, refuses)."""
    if not check_output_folder(out).exists():
        return []
    entries = list(out.iterdir())
    if not entries:
        return []
    record = _written_here(out)
    if not force:
        if record is not None and not record[1]:
            raise ValueError(f"{out}: holds a prediction that stopped part-way ({METRICS_FILE} lists the samples it "
                             "finished); pass --force to replace it")
        raise ValueError(f"{out}: exists and is not empty (pass --force to replace earlier predictions)")
    for path in entries:
        if path.is_symlink():
            raise ValueError(f"{out}: holds a link ({path.name}); refusing to replace it, even with --force")
        if not (path.is_file() and (_OUR_FILE.match(path.name) or path.name in (METRICS_FILE, METRICS_FILE + ".part"))
                or path.is_dir() and _OUR_FOLDER.match(path.name)):
            raise ValueError(f"{out}: holds {path.name}, which meshshard predict did not write; refusing to replace it, even with --force")
    if record is None:
        raise ValueError(f"{out}: holds no {METRICS_FILE} of meshshard predict's, so none of its files is known to be "
                         "ours; refusing to replace them, even with --force")
    ours = set(record[0]) | {METRICS_FILE, METRICS_FILE + ".part"}
    for path in entries:
        if path.name not in ours:
            raise ValueError(f"{out}: holds {path.name}, which meshshard predict did not write (its {METRICS_FILE} does not "
                             "list it); refusing to replace it, even with --force")
        if path.is_dir() and not all(p.is_file() and not p.is_symlink() and _PIECE.match(p.name) for p in path.iterdir()):
            raise ValueError(f"{out}: holds {path.name}/ with files meshshard predict did not write; refusing to replace it, "
                             "even with --force")
    return entries


def _write_metrics(out: Path, record: dict[str, Any]) -> None:
    """Replace ``PRED/metrics.json`` whole (written aside, then renamed), so a crash leaves the last one."""
    part = out / (METRICS_FILE + ".part")
    part.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    os.replace(part, out / METRICS_FILE)


def _delete(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            for piece in path.iterdir():
                piece.unlink()
            path.rmdir()
        else:
            path.unlink()


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


def build_model(ckpt: dict[str, Any], sizes: tuple[int, int, int], dtype: Any, model_spec: Any,
                model_args: dict[str, Any] | None, source: str) -> Any:
    """The run's model with its trained weights, for ``sizes`` = (input, edge, target) channels,
    which come from ``source`` (named in the one-line error when they do not fit it): MeshGraphNet
    (``model_spec`` None), yours built from ``model_spec`` (``file.py:name``), or yours already
    built (``model_spec`` an ``nn.Module``, whose weights are replaced)."""
    from torch import nn

    from meshshard._usermodel import build_user_model
    from meshshard.nn import MeshGraphNet

    cfg = ckpt.get("config", {})
    args = model_args if model_args is not None else dict(cfg.get("model_args") or {})
    if isinstance(model_spec, nn.Module):
        model, given = model_spec.to(dtype), "the model given"
    elif model_spec:
        model = build_user_model(model_spec, args, *sizes).to(dtype)
        given = f"--model {model_spec} with --model-args {json.dumps(args)}"
    else:
        model, given = MeshGraphNet(
            *sizes, latent_size=int(cfg.get("latent_size", 64)), hidden_layers=int(cfg.get("hidden_layers", 2)),
            message_passing_steps=int(cfg.get("message_passing_steps", 6)), activation=cfg.get("activation", "relu"),
        ).to(dtype), None
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        if given:
            raise ValueError(
                f"Expected {given} to rebuild the run's model (it "
                f"trained --model {cfg.get('model')} with --model-args {json.dumps(cfg.get('model_args') or {})}), with "
                f"{sizes[0]} input, {sizes[1]} edge and {sizes[2]} target channels from {source}: {first}"
            ) from None
        raise ValueError(
            f"Expected {source} to fit the run's model ({sizes[0]} input, {sizes[2]} target, "
            f"{sizes[1]} edge channels here): {first}"
        ) from None
    model.eval()
    return model


def run_target_fields(ckpt: dict[str, Any]) -> list[dict[str, Any]]:
    """The target fields a run trained on (``[{"name", "components"}]``): recorded by train, or
    for an older checkpoint rebuilt from its target channels (``u[0]``, ``u[1]`` -> ``u``, 2)."""
    cfg = ckpt.get("config", {})
    recorded = cfg.get("target_fields")
    if recorded:
        return [{"name": str(f["name"]), "components": int(f["components"])} for f in recorded]
    fields: list[dict[str, Any]] = []
    for channel in (cfg.get("normalisation") or {}).get("target_channels", []):
        match = re.fullmatch(r"(.+)\[(\d+)\]", channel)
        base, index = (match.group(1), int(match.group(2))) if match else (channel, -1)
        if index > 0 and fields and fields[-1]["name"] == base and fields[-1]["components"] == index:
            fields[-1]["components"] += 1
        else:
            fields.append({"name": base if index == 0 else channel, "components": 1})
    return fields


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
            raise ValueError(f"Expected {data.path} to have the run's {what} channels {list(theirs)} (got {list(mine)})")
    return norm


# ------------------------------------------------------------------------------------------------
# Cross-rank helpers (all vectorised; none holds O(N) per rank)


def _counts_exchange(send_counts: np.ndarray, group: Any, device: Any) -> np.ndarray:
    import torch

    from meshshard.comm import all_to_all_v

    world = len(send_counts)
    t = torch.as_tensor(send_counts, dtype=torch.int64, device=device)
    return all_to_all_v(t, [1] * world, [1] * world, group=group).cpu().numpy()


def directory_lookup(owned_ids: np.ndarray, owned_values: np.ndarray, want: np.ndarray, num_nodes: int,
                     group: Any, device: Any) -> np.ndarray:
    """The values of any nodes ``want`` (global ids), given each rank's owned values.

    Node ``g`` is kept by rank ``g * R // N``: owners push their rows there, then each rank asks
    the keepers of the nodes it wants. Two rounds of ``all_to_all_v``; memory O(N / R) per rank.

    Shapes:
        owned_ids ``(N_own,)`` ascending; owned_values ``(N_own, F)``; want ``(W,)``; result ``(W, F)``.
    """
    import torch

    from meshshard.comm import all_to_all_v, group_rank_and_size

    _, world = group_rank_and_size(group)
    width = owned_values.shape[1]

    def keeper(ids: np.ndarray) -> np.ndarray:
        return (ids.astype(np.int64) * world // max(num_nodes, 1)).astype(np.int64)

    def a2a(array: np.ndarray, send: np.ndarray, recv: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.ascontiguousarray(array), device=device)
        return all_to_all_v(t, send.tolist(), recv.tolist(), group=group).cpu().numpy()

    # 1. owners -> keepers (owned ids ascending, so their keepers are non-decreasing)
    send = np.bincount(keeper(owned_ids), minlength=world)
    recv = _counts_exchange(send, group, device)
    kept_ids = a2a(owned_ids.astype(np.int64), send, recv)
    kept_values = a2a(owned_values.astype(np.float64).reshape(-1, width), send, recv)
    order = np.argsort(kept_ids, kind="stable")
    kept_ids, kept_values = kept_ids[order], kept_values[order]
    # 2. askers -> keepers -> askers
    by_keeper = np.argsort(keeper(want), kind="stable")
    asked = want[by_keeper].astype(np.int64)
    send = np.bincount(keeper(asked), minlength=world)
    recv = _counts_exchange(send, group, device)
    questions = a2a(asked, send, recv)
    at = np.searchsorted(kept_ids, questions)
    if len(questions) and (at.max() >= len(kept_ids) or np.any(kept_ids[at] != questions)):
        raise RuntimeError("directory_lookup: a node was asked for that no rank owns (inconsistent partition)")
    answers = a2a(kept_values[at].reshape(-1, width), recv, send)
    out = np.empty((len(want), width), dtype=np.float64)
    out[by_keeper] = answers
    return out


def _sum_all(values: np.ndarray, group: Any, device: Any) -> np.ndarray:
    import torch
    import torch.distributed as dist

    t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
    if dist.is_initialized():
        dist.all_reduce(t, group=group)
    return t.cpu().numpy()


def _gather_rows(rows: np.ndarray, group: Any, device: Any, dst: int = 0) -> np.ndarray | None:
    """Every rank's rows ``(n_rank, F)`` concatenated on ``dst`` (``None`` elsewhere); a rank may
    send none."""
    import torch

    from meshshard.comm import all_gather_v, gather_v, group_rank_and_size

    rank, world = group_rank_and_size(group)
    if world == 1:
        return rows
    n = torch.as_tensor([len(rows)], dtype=torch.int64, device=device)
    counts = all_gather_v(n, [1] * world, group=group).cpu().tolist()
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    t = torch.as_tensor(rows[:, None] if rows.ndim == 1 else rows, device=device)
    full = gather_v(t, counts, dst=dst, group=group).cpu().numpy()
    return full if rank == dst else None


# ------------------------------------------------------------------------------------------------
# Writing VTK


def _vtk_points(points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    if points.shape[1] < 3:
        points = np.concatenate([points, np.zeros((len(points), 3 - points.shape[1]))], axis=1)
    return points


def write_vtu(path: Path, points: np.ndarray, cells: list[tuple[str, np.ndarray]], point_data: dict[str, np.ndarray]) -> None:
    """One VTK unstructured-grid file (meshio's writer; 2-D points get z = 0)."""
    import meshio

    if not any(len(c) for _, c in cells):  # a graph without cells: show the nodes
        cells = [("vertex", np.arange(len(points), dtype=np.int64)[:, None])]
    mesh = meshio.Mesh(_vtk_points(points), [(t, np.asarray(c)) for t, c in cells if len(c)], point_data=point_data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshio.write(path, mesh, file_format="vtu", binary=True)


_VTK_TYPES = {np.dtype(np.float64): "Float64", np.dtype(np.float32): "Float32", np.dtype(np.int64): "Int64",
              np.dtype(np.int32): "Int32"}


def write_pvtu(path: Path, pieces: list[str], point_data: dict[str, tuple[np.dtype, int]]) -> None:
    """The ``.pvtu`` index of ``pieces`` (file names relative to ``path``'s folder)."""
    arrays = "\n".join(
        f'      <PDataArray type="{_VTK_TYPES[np.dtype(dt)]}" Name="{name}" NumberOfComponents="{k}"/>'
        for name, (dt, k) in point_data.items()
    )
    sources = "\n".join(f'    <Piece Source="{p}"/>' for p in pieces)
    path.write_text(
        '<?xml version="1.0"?>\n'
        '<VTKFile type="PUnstructuredGrid" version="1.0" byte_order="LittleEndian" header_type="UInt32">\n'
        '  <PUnstructuredGrid GhostLevel="0">\n'
        f"    <PPointData>\n{arrays}\n    </PPointData>\n"
        '    <PPoints>\n      <PDataArray type="Float64" NumberOfComponents="3"/>\n    </PPoints>\n'
        f"{sources}\n"
        "  </PUnstructuredGrid>\n</VTKFile>\n"
    )


def read_pvtu(path: str | os.PathLike[str]) -> list[Any]:
    """The pieces of a ``.pvtu`` as meshio meshes (to check what :func:`write_pvtu` wrote)."""
    import xml.etree.ElementTree as ET

    import meshio

    path = Path(path)
    root = ET.parse(path).getroot()
    return [meshio.read(path.parent / piece.attrib["Source"]) for piece in root.iter("Piece")]


# ------------------------------------------------------------------------------------------------
# One mesh's layout on this rank


@dataclass
class _Layout:
    """What a rank needs to predict on, and write, the samples of one mesh."""

    mesh: int
    num_nodes: int
    owned_ids: np.ndarray  # (N_own,) global ids, ascending (all nodes on one process)
    forward: Any  # callable(x_normalised_tensor) -> (N_own, F_out) tensor
    pos_owned: np.ndarray  # (N_own, D)
    piece_ids: np.ndarray | None = None  # (P,) global ids of the piece's nodes, ascending
    piece_cells: list[tuple[str, np.ndarray]] | None = None  # connectivity in piece numbering


def _mesh_folder(data: Any, mesh: int) -> Path:
    return Path(data.path) / "meshes" / f"{mesh:05d}"


def _piece(data: Any, mesh: int, owned_ids: np.ndarray, chunk: int = 1 << 20) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """The cells whose smallest node this rank owns (read in chunks), and the nodes they use."""
    entry = data.meta["meshes"][mesh]
    folder = _mesh_folder(data, mesh)
    kept: list[tuple[str, np.ndarray]] = []
    for cell_type in entry.get("cells", {}):
        conn = data._load(folder / f"cells-{cell_type}.npy", "r")  # a regular file of the folder, never a link
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


def _whole_layout(data: Any, mesh: int, model: Any, normaliser: Any, dtype: Any, device: Any, spec: str | None,
                  num_targets: int) -> _Layout:
    import torch

    from meshshard import edge_features
    from meshshard._usermodel import check_output

    m = data.mesh(mesh)
    edge_index = torch.as_tensor(m.graph().edge_index(), device=device)
    pos = torch.as_tensor(np.asarray(m.points), device=device).to(dtype)
    ea = normaliser.normalise_edges(edge_features(pos, edge_index))
    ids = np.arange(m.num_nodes, dtype=np.int64)

    def forward(x: Any) -> Any:
        out = model(x, edge_index, ea)
        if spec:
            check_output(out, m.num_nodes, num_targets, spec, sharded=False)
        return out

    return _Layout(mesh, m.num_nodes, ids, forward, np.asarray(m.points),
                   ids, [(t, np.asarray(c, dtype=np.int64)) for t, c in m.cells])


def _shard_layout(data: Any, reader: Any, mesh: int, model: Any, ctx: Any, pieces: bool, spec: str | None,
                  num_targets: int) -> _Layout:
    from meshshard import ShardTensor
    from meshshard._usermodel import check_output, first_line, shard_hint

    graph, ea, owned = reader.shard(mesh)
    owned = np.asarray(owned, dtype=np.int64)
    pos_owned = graph.pos[: len(owned)].detach().to("cpu").double().numpy()

    def forward(x: Any) -> Any:
        try:
            out = model(ShardTensor.from_local(x, graph.spec), graph, ea)
        except Exception as err:  # the model's own error, whatever its type, on one line
            from meshshard._train import is_peer_failure

            if is_peer_failure(err):
                raise
            hint = shard_hint(model) if spec else ""
            raise RuntimeError(f"the model's forward failed ({type(err).__name__}: {first_line(err)}){hint}") from err
        if spec:
            check_output(out, len(owned), num_targets, spec, sharded=True, group=reader.group)
        return out.to_local()

    layout = _Layout(mesh, int(data.meta["meshes"][mesh]["num_nodes"]), owned, forward, pos_owned)
    if pieces:
        layout.piece_ids, layout.piece_cells = _piece(data, mesh, owned)
    return layout


# ------------------------------------------------------------------------------------------------
# Metrics, pictures


def field_slices(fields: list[dict[str, Any]]) -> list[tuple[str, slice]]:
    """``[(name, channel slice)]`` of a dataset's field records."""
    out, at = [], 0
    for f in fields:
        k = int(f["components"])
        out.append((f["name"], slice(at, at + k)))
        at += k
    return out


def _print_table(rows: list[dict[str, Any]], fields: list[str]) -> None:
    """Per sample its split, nodes and the errors of each target field."""
    head = f"{'sample':<24} {'split':<5} {'nodes':>9}" + "".join(f" {f + ' RMSE':>14} {f + ' rel L2':>12}" for f in fields)
    print(head)
    for r in rows:
        line = f"{r['name'][:24]:<24} {r['split']:<5} {r['num_nodes']:>9,}"
        for f in fields:
            rmse, rel = r["fields"][f]["rmse"], r["fields"][f]["rel_l2"]
            line += f" {'-' if rmse is None else format(rmse, '.4g'):>14} {'-' if rel is None else format(rel, '.3%'):>12}"
        print(line)


def _triangulation(pos: np.ndarray, triangles: np.ndarray | None) -> Any:
    """The mesh's triangles, or a Delaunay triangulation of the drawn nodes (a 3-D slab) without
    the triangles much longer than the typical one (they would bridge holes); ``None`` if too few."""
    from matplotlib.tri import Triangulation

    if triangles is not None and len(triangles):
        return Triangulation(pos[:, 0], pos[:, 1], triangles)
    if len(pos) < 4:
        return None
    try:
        tri = Triangulation(pos[:, 0], pos[:, 1])
    except (ValueError, RuntimeError):
        return None
    corners = pos[tri.triangles][:, :, :2]
    longest = np.linalg.norm(corners - np.roll(corners, 1, axis=1), axis=2).max(axis=1)
    tri.set_mask(longest > 2.5 * np.median(longest))
    return tri


def plot_sample(path: Path, title: str, pos: np.ndarray, truth: np.ndarray | None, pred: np.ndarray,
                fields: list[tuple[str, slice]], triangles: np.ndarray | None, note: str) -> bool:
    """Truth, prediction and error side by side, one row per target field (the prediction alone
    when ``truth`` is None); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cols = 1 if truth is None else 3
    fig, axes = plt.subplots(len(fields), cols, figsize=(4.6 * cols, 3.6 * len(fields)), dpi=110, squeeze=False)
    try:  # the figure is closed even when drawing fails
        tri = _triangulation(pos, triangles)
        for row, (name, sl) in enumerate(fields):
            p = pred[:, sl]
            t = p if truth is None else truth[:, sl]
            if p.shape[1] > 1:
                t, p, label = np.linalg.norm(t, axis=1), np.linalg.norm(p, axis=1), f"|{name}|"
            else:
                t, p, label = t[:, 0], p[:, 0], name
            err = p - t
            lim = max(float(np.abs(err).max()) if len(err) else 0.0, 1e-30)
            lo, hi = float(min(t.min(), p.min())), float(max(t.max(), p.max()))
            panels = ((t, "truth", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (p, "prediction", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (err, "error (prediction - truth)", {"vmin": -lim, "vmax": lim, "cmap": "RdBu_r"}))
            for col, (values, what, kw) in enumerate(panels[1:2] if truth is None else panels):
                ax = axes[row, col]
                if tri is not None:
                    art = ax.tripcolor(tri, values, shading="gouraud", **kw)
                else:
                    art = ax.scatter(pos[:, 0], pos[:, 1], c=values, s=max(0.3, 3000 / max(len(values), 1)), linewidths=0, **kw)
                ax.set_aspect("equal")
                ax.set_title(f"{label}: {what}", fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
                fig.colorbar(art, ax=ax, shrink=0.8)
        fig.suptitle(f"{title}\n{note}", fontsize=10)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return True


def _plot_rows(pos: np.ndarray, num_nodes: int, group: Any, device: Any) -> np.ndarray:
    """Which owned rows go into the picture, strided so that at most ``PLOT_MAX_NODES`` in all:
    all of them (2-D), or (3-D) those of a slab ``(zmax - zmin) / max(8, N^(1/3) / 2)`` thick
    centred on the node nearest the middle plane ``z = (zmin + zmax) / 2`` (of those as near, the
    lowest). So the slab holds at least the layer of nodes nearest the middle plane, even on a
    mesh of a few node layers in z, whose middle plane can fall between two layers.

    Every rank enters the same reductions (a rank may own no node, or none in the slab) and gets
    the same slab. Communication: four ``all_reduce`` (3-D), none (2-D).
    """
    take = np.arange(len(pos))
    if pos.shape[1] == 3:
        z = pos[:, 2]
        extent = _max_all([-z.min(), z.max()] if len(z) else [-np.inf, -np.inf], group, device)
        low, high = -extent[0], extent[1]
        gap = np.abs(z - (low + high) / 2) if len(z) else z  # distance to the middle plane
        nearest = -_max_all([-gap.min() if len(z) else -np.inf], group, device)[0]
        here = z[gap == nearest]  # this rank's nodes nearest the middle plane (exact: max returns an input)
        centre = -_max_all([-here.min() if len(here) else -np.inf], group, device)[0]
        slab = (high - low) / max(8.0, round(num_nodes ** (1 / 3)) / 2)
        take = np.flatnonzero(np.abs(z - centre) <= slab / 2) if np.isfinite(centre) else take[:0]
        total = _sum_all(np.array([len(take)]), group, device)[0]
    else:
        total = num_nodes
    stride = max(1, math.ceil(total / PLOT_MAX_NODES))
    return take[::stride]


def _max_all(values: Any, group: Any, device: Any) -> np.ndarray:
    """The elementwise maximum of ``values`` over the ranks (``all_reduce``; float64)."""
    import torch
    import torch.distributed as dist

    t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().numpy()


# ------------------------------------------------------------------------------------------------
# The command


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


def _write_gathered(path: Path, data: Any, targets: list[tuple[str, slice]], s: int, layout: _Layout, pred: np.ndarray,
                    ctx: Any) -> tuple[Any, ...] | None:
    """Rank 0 writes the whole mesh; returns (pos, truth, pred, triangles) on rank 0."""
    rows = _gather_rows(np.concatenate([layout.owned_ids[:, None].astype(np.float64), pred], axis=1), None, ctx.device)
    if rows is None:
        return None
    full = np.empty((layout.num_nodes, pred.shape[1]))
    full[rows[:, 0].astype(np.int64)] = rows[:, 1:]
    mesh = data.mesh(layout.mesh)
    ids = np.arange(layout.num_nodes, dtype=np.int64)
    x, y = data.rows(s, ids)
    cells = [(t, np.asarray(c, dtype=np.int64)) for t, c in mesh.cells]
    write_vtu(path, np.asarray(mesh.points), cells, _point_data(data, targets, x, y, full, ids))
    tri = next((c for t, c in cells if t == "triangle"), None)
    return np.asarray(mesh.points), y, full, tri


def _write_pieces(folder: Path, index: Path, data: Any, targets: list[tuple[str, slice]], s: int, layout: _Layout,
                  pred: np.ndarray, ctx: Any) -> None:
    """Each rank writes its piece; rank 0 the ``.pvtu`` index."""
    assert layout.piece_ids is not None and layout.piece_cells is not None
    ids = layout.piece_ids
    at = np.minimum(np.searchsorted(layout.owned_ids, ids), max(len(layout.owned_ids) - 1, 0))
    owned = (layout.owned_ids[at] == ids) if len(layout.owned_ids) else np.zeros(len(ids), bool)
    values = np.empty((len(ids), pred.shape[1]))
    values[owned] = pred[at[owned]]
    values[~owned] = directory_lookup(layout.owned_ids, pred, ids[~owned], layout.num_nodes, None, ctx.device)
    points = np.load(_mesh_folder(data, layout.mesh) / "points.npy", mmap_mode="r", allow_pickle=False)
    x, y = data.rows(s, ids)
    fields = _point_data(data, targets, x, y, values, ids)
    folder.mkdir(parents=True, exist_ok=True)
    write_vtu(folder / f"part-{ctx.rank:05d}.vtu", np.asarray(points[ids]), layout.piece_cells, fields)
    if ctx.rank == 0:
        kinds = {name: (a.dtype, 1 if a.ndim == 1 else a.shape[1]) for name, a in fields.items()}
        write_pvtu(index, [f"{folder.name}/part-{r:05d}.vtu" for r in range(ctx.world_size)], kinds)


def predict(cfg: PredictConfig) -> dict[str, Any] | None:
    """Predict, write PRED and return the metrics (on rank 0; ``None`` on the other ranks)."""
    import torch
    import torch.distributed as dist

    from meshshard._data import DatasetReader, Normaliser
    from meshshard.comm import init_distributed
    from meshshard.partition import check_partition_matches, open_dataset
    from meshshard.partition._dataset import plural

    ctx = init_distributed()
    data = open_dataset(cfg.data)
    ckpt = read_run(cfg.run)
    run_cfg = ckpt.get("config", {})
    dtype_name = cfg.dtype or run_cfg.get("dtype", "float32")
    if dtype_name not in ("float32", "float64"):
        raise ValueError(f"Expected --dtype float32 or float64 (got {dtype_name!r})")
    dtype = getattr(torch, dtype_name)
    norm = normalisation_of(ckpt, data)
    normaliser = Normaliser(norm, ctx.device, dtype)
    check_model_request(ckpt, cfg.run, cfg.model)
    # the run's target fields: DATA's when it has targets (checked equal above), else recorded by train
    truth = bool(data.target_channels)
    target_meta = data.meta["targets"] if truth else run_target_fields(ckpt)
    num_targets = len(norm.targets.channels)
    sizes = len(data.input_channels), len(data.edge_channels), num_targets
    model = build_model(ckpt, sizes, dtype, cfg.model, cfg.model_args, str(data.path)).to(ctx.device)
    names = [str(e["name"]) for e in data.meta["samples"]]
    picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
    parts, reader = None, None
    if ctx.world_size > 1:
        parts = Path(cfg.partition or run_cfg.get("partition") or "")
        if not cfg.partition and not parts.is_dir():
            raise ValueError(f"{parts}: the run's partition folder is gone; pass --partition PARTS")
        whose = "the run's own partition, which the run needs" if not cfg.partition else "not for these meshes"
        meta = check_partition_matches(data, parts, hint=(
            f"it is {whose}: make one of {cfg.data} in a new folder and pass it: meshshard partition {cfg.data} "
            f"--parts {ctx.world_size} --out NEW_PARTS, then --partition NEW_PARTS"))
        if meta["num_parts"] != ctx.world_size:
            raise ValueError(f"Expected a partition into {plural(ctx.world_size, 'part')}, one per rank (got {meta['num_parts']} in "
                             f"{parts}); make one with meshshard partition {cfg.data} --parts {ctx.world_size} and pass --partition")
        reader = DatasetReader(data, parts, ctx.rank, None, device=ctx.device, dtype=dtype)
        reader.normaliser = normaliser  # the run's statistics, for the edge features too
    out = Path(cfg.out)
    stale = check_output(out, cfg.force)  # on every rank, so a refusal stops them all before any collective
    head = {"format": _METRICS_FORMAT, "format_version": 1, "complete": False, "run": str(cfg.run), "data": str(cfg.data),
            "step": ckpt.get("step"), "world_size": ctx.world_size, "units": "physical (de-normalised)",
            "targets_known": truth, "files": []}
    if dist.is_initialized():
        dist.barrier()  # every rank has looked at PRED before rank 0 changes it
    if ctx.rank == 0:
        _delete(stale)
        out.mkdir(parents=True, exist_ok=True)
        _write_metrics(out, head | {"samples": []})  # from now on PRED says what is ours in it
    if dist.is_initialized():
        dist.barrier()
    main = ctx.rank == 0 and not cfg.quiet
    if main:
        where = "one process, whole meshes" if parts is None else f"{ctx.world_size} ranks, partition {parts}"
        print(f"meshshard predict: {len(picks)} sample(s) of {cfg.data} with {cfg.run} (step {ckpt.get('step')}); {where}"
              + ("" if truth else f"; {cfg.data} has no targets: predictions only, no errors"), flush=True)
    target_fields = field_slices(target_meta)
    layouts: dict[tuple[int, bool], _Layout] = {}
    records = []
    stems = [file_stem(name) for name in names]
    val = set(int(v) for v in data.val)
    for s in picks:
        started = time.perf_counter()
        m, n = data.sample_mesh(s), data.num_nodes(s)
        gather = True if parts is None else (cfg.gather if cfg.gather is not None else n <= GATHER_MAX_NODES)
        stem = stems[s] if stems.count(stems[s]) == 1 else f"{stems[s]}-{s}"
        if ctx.rank == 0:  # listed before any rank writes them (the ranks meet in the forward below first)
            head["files"] += ([f"{stem}.vtu"] if gather else [f"{stem}.pvtu", stem]) + ([f"{stem}.png"] if cfg.plots else [])
            _write_metrics(out, head | {"samples": records})
        key = (m, gather)
        if key not in layouts:
            layouts[key] = (_whole_layout(data, m, model, normaliser, dtype, ctx.device, cfg.model, num_targets)
                            if reader is None else
                            _shard_layout(data, reader, m, model, ctx, pieces=not gather, spec=cfg.model, num_targets=num_targets))
        layout = layouts[key]
        x, y = data.rows(s, layout.owned_ids)
        with torch.no_grad():
            out_t = layout.forward(normaliser.normalise_inputs(torch.as_tensor(x, device=ctx.device).to(dtype)))
        pred = norm.targets.denormalise(out_t.to(torch.float64).cpu().numpy())
        forward_s = time.perf_counter() - started
        if truth:
            err = pred - y
            sums = _sum_all(np.array([[float((err[:, sl] ** 2).sum()), float((y[:, sl] ** 2).sum())] for _, sl in target_fields]),
                            None, ctx.device)
        else:
            y, sums = None, [(math.nan, math.nan)] * len(target_fields)
        if gather:
            path = out / f"{stem}.vtu"
            full = _write_gathered(path, data, target_fields, s, layout, pred, ctx)
        else:
            path = out / f"{stem}.pvtu"
            _write_pieces(out / stem, path, data, target_fields, s, layout, pred, ctx)
            full = None
        picture = _picture(out / f"{stem}.png", names[s], layout, y, pred, gather, full, target_fields, ctx) if cfg.plots else None
        record = {"sample": s, "name": names[s], "split": ("val" if s in val else "train") if truth else None, "num_nodes": n,
                  "file": path.name, "picture": picture, "fields": {},
                  "seconds": {"read_and_forward": round(forward_s, 4), "total": round(time.perf_counter() - started, 4)}}
        for (name, sl), (sse, sst) in zip(target_fields, sums):
            k = sl.stop - sl.start
            if truth and not math.isfinite(sse):  # JSON has no NaN: the figure is null, and said once here
                if main:
                    print(f"note: {names[s]}: the prediction of {name} holds NaN or inf; its errors are null in "
                          "metrics.json", file=sys.stderr, flush=True)
                sse = None
            record["fields"][name] = ({"rmse": math.sqrt(sse / (n * k)), "rel_l2": math.sqrt(sse / sst) if sst > 0 else None}
                                      if truth and sse is not None else {"rmse": None, "rel_l2": None})
        records.append(record)
        if ctx.rank == 0:
            _write_metrics(out, head | {"samples": records})
        if main:  # progress: a sample of a large mesh takes a while
            print(f"  [{len(records)}/{len(picks)}] {names[s]}: {n:,} nodes, {record['seconds']['total']:.1f} s -> "
                  f"{path.name}", flush=True)
    from meshshard._runlog import gather_peak_memory

    memory = gather_peak_memory(ctx.device)  # every rank's peak, in rank order (a collective)
    if ctx.rank != 0:
        return None
    summary = head | {"complete": True, **memory, "samples": records,
                      "mean": {name: {key: _mean([r["fields"][name][key] for r in records]) for key in ("rmse", "rel_l2")}
                               for name, _ in target_fields}}
    _write_metrics(out, summary)
    if main:
        if truth:
            _print_table(records, [name for name, _ in target_fields])
        print(f"wrote {out}/: {len(records)} sample file(s), metrics.json" + (", pictures" if cfg.plots else ""), flush=True)
    return summary


def _picture(path: Path, name: str, layout: _Layout, y: np.ndarray | None, pred: np.ndarray, gathered: bool,
             full: tuple[Any, ...] | None, fields: list[tuple[str, slice]], ctx: Any) -> str | None:
    """``PRED/<sample>.png`` on rank 0; every rank takes part in gathering the drawn nodes, and the
    branch taken depends only on what all ranks know (``gathered``, the mesh's size and dimension).
    ``y`` None: no known targets, the prediction alone is drawn."""
    dim = layout.pos_owned.shape[1]
    if y is None:
        y = np.zeros((len(pred), 0))
    if gathered and dim == 2 and layout.num_nodes <= PLOT_MAX_NODES:
        if full is None:
            return None
        pos, truth, values, tri = full
        note = f"{layout.num_nodes:,} nodes"
    else:
        take = _plot_rows(layout.pos_owned, layout.num_nodes, None, ctx.device)
        rows = _gather_rows(np.concatenate([layout.pos_owned[take], y[take], pred[take]], axis=1), None, ctx.device)
        if rows is None:
            return None
        pos, truth, values, tri = rows[:, :dim], rows[:, dim:dim + y.shape[1]], rows[:, dim + y.shape[1]:], None
        note = f"{len(rows):,} of {layout.num_nodes:,} nodes"
        if dim == 3 and len(rows):
            low, high = pos[:, 2].min(), pos[:, 2].max()
            where = f"z = {low:.4g}" if low == high else f"{low:.4g} <= z <= {high:.4g}"
            note += f": those at {where} (a slab through the nodes nearest the middle plane), seen along z"
    known = truth is not None and truth.shape[1] > 0
    try:  # a picture that cannot be drawn never fails the prediction (only rank 0 is here: no collective)
        if not len(pos):
            raise ValueError("no node to draw")
        ok = plot_sample(path, f"{name}: {'truth, prediction, error' if known else 'prediction'}", pos,
                         truth if known else None, values, fields, tri, note)
    except Exception as err:  # noqa: BLE001 - anything matplotlib raises
        print(f"meshshard predict: note: no picture of {name} ({type(err).__name__}: {err}); the files and metrics "
              "are written", file=sys.stderr, flush=True)
        return None
    if not ok:
        print("meshshard predict: note: matplotlib is not installed, so no pictures (pip install matplotlib)", flush=True)
    return path.name if ok else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def _predict_worker(cfg_dict: dict[str, Any]) -> None:
    predict(PredictConfig(**cfg_dict))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from meshshard._usermodel import load_factory, normalise_spec, parse_model_args

    try:
        if args.model_args and not args.model:
            raise ValueError("Expected --model-args only with --model")
        model = normalise_spec(args.model) if args.model else None
        model_args = parse_model_args(args.model_args) if args.model_args else None
    except ValueError as err:
        print(f"meshshard predict: error: {err}", file=sys.stderr)
        return 2
    cfg = PredictConfig(run=args.run, data=args.data, out=args.out, samples=args.samples, partition=args.partition,
                        gather=True if args.gather else (False if args.pieces else None), dtype=args.dtype,
                        force=args.force, plots=not args.no_plots, quiet=args.quiet, model=model, model_args=model_args)
    folders = ((cfg.run, "run folder"), (cfg.data, "dataset folder"))

    def check() -> None:  # one line before any rank starts
        check_input_folders(*folders)
        # PRED may be inside RUN (run/pred: train --force deletes only its own files), not RUN itself
        check_apart(cfg.out, (cfg.data, "dataset folder"), *(((cfg.partition, "partition folder"),) if cfg.partition else ()))
        if Path(cfg.out).resolve() == Path(cfg.run).resolve():
            raise ValueError(f"{cfg.out}: Expected an output folder apart from the run folder (got the run folder; "
                             f"{Path(cfg.out) / 'pred'} would do)")
        check_model_request(read_run(cfg.run), cfg.run, cfg.model)
        if cfg.model:
            load_factory(cfg.model)

    return run_command("predict", _predict_worker, args.nproc, asdict(cfg), check)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "predict", help="predict with a trained run and write ParaView files (.vtu / .pvtu), metrics and pictures",
        description="Run a trained model (RUN/checkpoint.pt) on samples of a dataset and write, per sample, the mesh "
        "with <target>_pred, <target> and <target>_error fields (.vtu, or .pvtu plus one piece per rank), "
        "PRED/metrics.json (RMSE, relative L2) and PRED/<sample>.png. One process runs on whole meshes; "
        "under torchrun or with --nproc R, on a partition into R parts.",
    )
    p.add_argument("run", help="run folder of meshshard train (checkpoint.pt)")
    p.add_argument("--data", required=True, help="dataset folder (meshshard dataset)")
    p.add_argument("--out", required=True, help="folder for the predictions")
    p.add_argument("--samples", default=None,
                   help="val (default when the dataset has a validation split), train, all, or names/indices, comma-separated")
    p.add_argument("--partition", default=None, help="partition folder for R ranks (default: the run's own)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--gather", action="store_true", help="write one .vtu per sample, whatever its size")
    group.add_argument("--pieces", action="store_true", help=f"write one piece per rank plus a .pvtu even below {GATHER_MAX_NODES:,} nodes")
    p.add_argument("--model", default=None, metavar="FILE.py:NAME",
                   help="the run's own model, when it trained one with train --model (never read from the checkpoint)")
    p.add_argument("--model-args", default=None, metavar="JSON", help="keyword arguments of --model (default: the run's)")
    p.add_argument("--dtype", default=None, choices=["float32", "float64"], help="default: the run's")
    p.add_argument("--no-plots", action="store_true", help="no PNG pictures")
    p.add_argument("--force", action="store_true", help="replace earlier predictions in --out (only the files its metrics.json lists)")
    p.add_argument("--nproc", type=int, default=0, help="start this many local ranks (when not under torchrun)")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-sample lines, no table (errors and notes still print)")
    p.set_defaults(func=_run)
