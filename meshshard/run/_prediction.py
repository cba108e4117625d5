
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
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import barrier, init_distributed, is_distributed, is_peer_failure, sum_across
from meshshard.data import open_dataset
from meshshard.partition import plural

from ..tasks import TensorNormalisation, get_task
from ._boundaries import (
    BoundaryScoring,
    boundary_record,
    boundary_rows,
    boundary_summary,
    boundary_sums,
    check_boundary_request,
)
from ._folder import checkpoint_used, read_run
from ._pictures import sample_picture
from ._pred_folder import (
    METRICS_FORMAT,
    check_prediction_folder,
    delete_paths,
    file_stem,
    mean_known,
    write_metrics,
)
from ._recipe import build_model, check_model_radius
from ._report import gather_peak_memory
from ._request import (
    PredictConfig,
    check_model_request,
    check_rollout_request,
    normalisation_of,
    partition_reader,
    select_samples,
)
from ._rollout import rollout
from ._training import peer_failure
from ._writer import (
    GATHER_MAX_NODES,
    MeshOnRank,
    field_slices,
    is_point_cloud,
    physical_rows,
    shard_layout,
    write_pieces,
)
from ._writer import whole_layout as _whole_layout  # looked up here at each call (a test wraps them)
from ._writer import write_gathered as _write_gathered

__all__ = ["predict"]


def predict(cfg: PredictConfig) -> dict[str, Any] | None:
    """Predict, write PRED and return the metrics (on rank 0; ``None`` on the other ranks). With
    ``cfg.rollout``, a rollout of a transient run (:func:`meshshard.run._rollout.rollout`).

    A collective that raises (a peer rank died or stopped responding, the groups' timeout) is
    reported as train reports it, naming the sample (:func:`meshshard.run._training.peer_failure`)."""
    doing = ["prediction"]  # what this rank is doing, for the error of a collective that raises
    try:
        return rollout(cfg, doing) if cfg.rollout else _predict(cfg, doing)
    except (RuntimeError, OSError) as err:
        writing = isinstance(err, OSError) and getattr(err, "filename", None) is not None  # a file, not a peer
        if writing or not is_peer_failure(err) or not is_distributed():
            raise
        raise peer_failure(err, doing[0]) from err


def _predict(cfg: PredictConfig, doing: list[str]) -> dict[str, Any] | None:
    """The steady prediction: every chosen sample through the model, its files and errors written."""
    import torch

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
    parts, reader = partition_reader(cfg, data, run_cfg, ctx, dtype, normaliser)
    target_fields = field_slices(target_meta)
    scoring = check_boundary_request(data, target_fields, cfg.boundary, cfg.pressure, cfg.shear, cfg.force_reference,
                                     picks, cfg.reference_area, cfg.direction,
                                     cfg.lift_direction)  # on every rank, before any collective
    out = Path(cfg.out)
    stale = check_prediction_folder(out, cfg.force)  # on every rank, so a refusal stops them all before any collective
    head = {"format": METRICS_FORMAT, "format_version": 1, "complete": False, "run": str(cfg.run),
            "data": str(cfg.data), "step": ckpt.get("step"), "checkpoint": checkpoint_used(cfg.run, cfg.checkpoint),
            "world_size": ctx.world_size, "units": "physical (de-normalised)", "targets_known": truth, "files": []}
    barrier()  # every rank has looked at PRED before rank 0 changes it
    if ctx.rank == 0:
        delete_paths(stale)
        out.mkdir(parents=True, exist_ok=True)
        write_metrics(out, head | {"samples": []})  # from now on PRED says what is ours in it
    barrier()
    main = ctx.rank == 0 and not cfg.quiet
    if main:
        where = "one process, whole meshes" if parts is None else f"{ctx.world_size} ranks, partition {parts}"
        print(f"meshshard predict: {len(picks)} sample(s) of {cfg.data} with {cfg.run} "
              f"(step {ckpt.get('step')}); {where}"
              + ("" if truth else f"; {cfg.data} has no targets: predictions only, no errors"), flush=True)
    layouts: dict[tuple[int, bool], MeshOnRank] = {}
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
            write_metrics(out, head | {"samples": records})
        key = (mesh, gather)
        if key not in layouts:
            layouts[key] = (_whole_layout(data, mesh, model, normaliser, dtype, ctx.device, cfg.model, num_targets)
                            if reader is None else
                            shard_layout(data, reader, mesh, model, ctx, pieces=not gather, model_spec=cfg.model,
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
        if truth:
            sums = _error_sums(pred, y, areas, target_fields, ctx)
        else:
            y, sums = None, [(math.nan,) * 4] * len(target_fields)
        if gather:
            path = out / f"{stem}.{vt}"
            full = _write_gathered(path, data, target_fields, s, layout, pred, ctx)
        else:
            path = out / f"{stem}.p{vt}"
            write_pieces(out / stem, path, data, target_fields, s, layout, pred, ctx)
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
                  "num_nodes": n, "file": path.name, "picture": picture,
                  "fields": _field_errors(target_fields, sums, n, areas, truth, names[s] if main else None),
                  "seconds": {"read_and_forward": round(forward_s, 4),
                              "total": round(time.perf_counter() - started, 4)}}
        if boundaries is not None:
            record["boundaries"] = boundaries
        records.append(record)
        if ctx.rank == 0:
            write_metrics(out, head | {"samples": records})
        if main:  # progress: a sample of a large mesh takes a while
            print(f"  [{len(records)}/{len(picks)}] {names[s]}: {n:,} nodes, {record['seconds']['total']:.1f} s -> "
                  f"{path.name}", flush=True)
    return _summary(cfg, ctx, out, head, records, target_fields, scoring, truth, main)


def _error_sums(pred: np.ndarray, y: np.ndarray, areas: np.ndarray | None, target_fields: list[tuple[str, slice]],
                ctx: Any) -> Any:
    """Per field: sum e^2, sum y^2, sum a e^2, sum a y^2 over this rank's rows; one sum over ranks
    (a collective)."""
    err = pred - y
    w = areas if areas is not None else np.zeros(len(y))
    return sum_across(np.array([[float((err[:, sl] ** 2).sum()), float((y[:, sl] ** 2).sum()),
                                 float(w @ (err[:, sl] ** 2).sum(1)), float(w @ (y[:, sl] ** 2).sum(1))]
                                for _, sl in target_fields]), None, ctx.device)


def _field_errors(target_fields: list[tuple[str, slice]], sums: Any, n: int, areas: np.ndarray | None, truth: bool,
                  noting: str | None) -> dict[str, Any]:
    """A sample record's ``fields``: per target its RMSE and relative L2 error (and, on a surface,
    the area-weighted one) from :func:`_error_sums`; null where unknown or not finite, which a
    note to stderr says for sample ``noting`` (None: no note)."""
    fields: dict[str, Any] = {}
    for (name, sl), (sse, sst, a_sse, a_sst) in zip(target_fields, sums):
        k = sl.stop - sl.start
        if truth and not math.isfinite(sse):  # JSON has no NaN: the figure is null, and said once here
            if noting is not None:
                print(f"note: {noting}: the prediction of {name} holds NaN or inf; its errors are null in "
                      "metrics.json", file=sys.stderr, flush=True)
            sse = None
        fields[name] = ({"rmse": math.sqrt(sse / (n * k)),
                         "rel_l2": math.sqrt(sse / sst) if sst > 0 else None}
                        if truth and sse is not None else {"rmse": None, "rel_l2": None})
        if areas is not None:  # a surface: sqrt(sum a_i |e_i|^2 / sum a_i |y_i|^2)
            fields[name]["rel_l2_area"] = (math.sqrt(a_sse / a_sst) if truth and sse is not None
                                           and a_sst > 0 else None)
    return fields


def _summary(cfg: PredictConfig, ctx: Any, out: Path, head: dict[str, Any], records: list[dict[str, Any]],
             target_fields: list[tuple[str, slice]], scoring: BoundaryScoring | None, truth: bool,
             main: bool) -> dict[str, Any] | None:
    """The finished prediction's metrics (the means over the samples), written and printed by rank 0;
    None on the other ranks. Every rank's peak memory is gathered first (a collective)."""
    memory = gather_peak_memory(ctx.device)  # every rank's peak, in rank order (a collective)
    if ctx.rank != 0:
        return None
    summary = head | {"complete": True, **memory, "samples": records,
                      "mean": {name: {key: mean_known([r["fields"][name].get(key) for r in records])
                                      for key in ("rmse", "rel_l2", "rel_l2_area")
                                      if any(key in r["fields"][name] for r in records)}
                               for name, _ in target_fields}}
    if scoring is not None:
        summary["boundaries"] = boundary_summary(records, scoring)
    write_metrics(out, summary)
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
