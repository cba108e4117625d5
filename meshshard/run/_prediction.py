
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
      <sample>_boundaries.png   with --boundary: each target along each named boundary, truth
                            against prediction (meshshard.run._boundary_pictures)
      forces.png            with a force and >= 2 cases: the force coefficients, predicted against true

``--near PATCHES:DISTANCE`` adds each target's errors over the nodes within DISTANCE of those
boundaries (:mod:`meshshard.run._near`).

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
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import barrier, init_distributed, is_distributed, is_peer_failure, sum_across
from meshshard.data import open_dataset

from ..tasks import TensorNormalisation, get_task
from ._boundaries import (
    boundary_record,
    boundary_rows,
    boundary_sums,
    check_boundary_request,
)
from ._boundary_pictures import boundary_picture
from ._ensemble import ensemble_model
from ._failures import peer_failure
from ._folder import checkpoint_used, read_run
from ._mirror_average import mirror_average_model, mirror_of_run
from ._near import check_near_request, near_mask, near_record
from ._pictures import sample_picture
from ._pred_folder import (
    METRICS_FORMAT,
    check_prediction_folder,
    delete_paths,
    file_stem,
    write_metrics,
)
from ._recipe import build_model, check_model_radius
from ._request import (
    PredictConfig,
    check_model_request,
    check_rollout_request,
    normalisation_of,
    partition_reader,
    select_samples,
)
from ._rollout import rollout
from ._scores import along_name, boundary_view, error_sums, field_errors, summarise, surface_weights
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
    reported as train reports it, naming the sample (:func:`meshshard.run._failures.peer_failure`)."""
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
    model = build_model(ckpt, sizes, dtype, cfg.model, cfg.model_args, str(data.path))
    if cfg.ensemble:  # the mean of these runs' outputs and this one's
        model = ensemble_model(model, cfg.run, run_cfg, cfg.ensemble, cfg.checkpoint, sizes, dtype, cfg.model,
                               cfg.model_args, str(data.path))
    if cfg.mirror_average:  # the mean with the mirror of the mirrored sample's prediction
        model = mirror_average_model(model, mirror_of_run(run_cfg, data.meta, cfg.run), norm, data.meta["inputs"],
                                     target_meta, dtype)
    model = model.to(ctx.device)
    names = [str(e["name"]) for e in data.meta["samples"]]
    picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
    parts, reader = partition_reader(cfg, data, run_cfg, ctx, dtype, normaliser)
    target_fields = field_slices(target_meta)
    scoring = check_boundary_request(data, target_fields, cfg.boundary, cfg.pressure, cfg.shear, cfg.force_reference,
                                     picks, cfg.reference_area, cfg.direction,
                                     cfg.lift_direction)  # on every rank, before any collective
    region = check_near_request(data, cfg.near, picks)
    out = Path(cfg.out)
    stale = check_prediction_folder(out, cfg.force)  # on every rank, so a refusal stops them all before any collective
    head = {"format": METRICS_FORMAT, "format_version": 1, "complete": False, "run": str(cfg.run),
            "data": str(cfg.data), "step": ckpt.get("step"), "checkpoint": checkpoint_used(cfg.run, cfg.checkpoint),
            "world_size": ctx.world_size, "units": "physical (de-normalised)", "targets_known": truth,
            "compression": cfg.compression, "files": []}
    head |= ({"ensemble": list(cfg.ensemble)} if cfg.ensemble else {}) | (
        {"mirror_average": True} if cfg.mirror_average else {})
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
              f"(step {ckpt.get('step')})" + (f" and {', '.join(cfg.ensemble)}, averaged" if cfg.ensemble else "")
              + f"; {where}"
              + ("" if truth else f"; {cfg.data} has no targets: predictions only, no errors"), flush=True)
    layouts: dict[tuple[int, bool], MeshOnRank] = {}
    point_areas: dict[int, np.ndarray | None] = {}  # a surface's area per owned point, per mesh
    walls: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # --boundary: this rank's rows on them, per mesh
    masks: dict[int, np.ndarray] = {}  # --near: which owned rows are near the boundaries, per mesh
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
        along = along_name(stem, stems) if cfg.plots and scoring is not None else None
        cloud = is_point_cloud(data.meta["meshes"][mesh])
        vt = "vtp" if cloud else "vtu"
        if ctx.rank == 0:  # listed before any rank writes them (the ranks meet in the forward below first)
            head["files"] += (([f"{stem}.{vt}"] if gather else [f"{stem}.p{vt}", stem])
                              + ([f"{stem}.png"] if cfg.plots else []) + ([along] if along else []))
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
            point_areas[mesh] = surface_weights(data, mesh, layout.owned_ids)
        areas = point_areas[mesh]
        if truth:
            sums = error_sums(pred, y, areas, target_fields, ctx)
        else:
            y, sums = None, [(math.nan,) * 4] * len(target_fields)
        if gather:
            path = out / f"{stem}.{vt}"
            full = _write_gathered(path, data, target_fields, s, layout, pred, ctx, compression=cfg.compression)
        else:
            path = out / f"{stem}.p{vt}"
            write_pieces(out / stem, path, data, target_fields, s, layout, pred, ctx, compression=cfg.compression)
            full = None
        boundaries = None
        if scoring is not None:
            if mesh not in walls:  # read once per mesh, for every sample on it
                walls[mesh] = boundary_rows(data, mesh, layout.owned_ids, scoring)
            on_walls = sum_across(boundary_sums(walls[mesh], y, pred, scoring), None, ctx.device)
            boundaries = boundary_record(on_walls, scoring, data.parameters(s), truth)
        near = None
        if region is not None:
            if mesh not in masks:
                masks[mesh] = near_mask(data, mesh, layout.owned_ids, region)
            near = near_record(masks[mesh], pred, y, target_fields, region, ctx)
        if cfg.plots and cfg.view is None and scoring is not None and mesh not in views:
            views[mesh] = boundary_view(data, mesh, scoring)
        view = cfg.view or views.get(mesh)
        picture = (sample_picture(out / f"{stem}.png", names[s], layout, y, pred, gather, full, target_fields, ctx,
                                  view=view, cloud=cloud)
                   if cfg.plots else None)
        record = {"sample": s, "name": names[s], "split": ("val" if s in val else "train") if truth else None,
                  "num_nodes": n, "file": path.name, "picture": picture,
                  "fields": field_errors(target_fields, sums, n, areas, truth, names[s] if main else None),
                  "seconds": {"read_and_forward": round(forward_s, 4),
                              "total": round(time.perf_counter() - started, 4)}}
        if boundaries is not None:
            record["boundaries"] = boundaries
            if along:
                record["boundary_picture"] = boundary_picture(out / along, names[s], data, mesh, walls[mesh], layout,
                                                              y, pred, target_fields, scoring, ctx)
        if near is not None:
            record["near"] = near
        records.append(record)
        if ctx.rank == 0:
            write_metrics(out, head | {"samples": records})
        if main:  # progress: a sample of a large mesh takes a while
            print(f"  [{len(records)}/{len(picks)}] {names[s]}: {n:,} nodes, {record['seconds']['total']:.1f} s -> "
                  f"{path.name}", flush=True)
    return summarise(cfg, ctx, out, head, records, target_fields, scoring, truth, main, near=region)
