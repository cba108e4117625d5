"""``meshshard baseline``: what a model must beat, made from the dataset's training samples alone
and written as ``meshshard predict`` writes a prediction.

``meshshard baseline DATA --out PRED --method mean|nearest|knn:K|linear[:K][,bound=B]|interp:PARAM [--samples LIST]
[--from TRAINING_DATA] [--boundary NAMES ...] [--near PATCHES:DISTANCE]`` writes, for each chosen
sample (default: the validation samples), the same files as predict (``<sample>.vtu`` / ``.vtp``
with ``<target>_pred``, ``<target>``, ``<target>_error``; the pictures) and the same
``metrics.json`` (per target RMSE and relative L2, per boundary errors and forces, the summary over
the samples), with a ``baseline`` entry in place of a run. Its prediction of sample ``s`` is a
weighted sum of training samples' target fields (:func:`baseline_sources` chooses them), each mapped
onto ``s``'s mesh (:func:`meshshard.data.node_map`: identical meshes as the identity, else
piecewise-linear interpolation from the source's points, the nearest source node outside its hull):

- ``mean``: every training sample, weight ``1 / n``;
- ``nearest``: the training sample nearest in parameter space: the dataset's ``--params``
  columns, each divided by its standard deviation over the training samples (1 where they do not
  vary), Euclidean distance; a tie goes to the lower sample index;
- ``knn:K``: the ``K`` nearest, weights ``1 / d`` normalised to sum to 1; training samples at
  distance 0 (an exact parameter match) take the prediction alone, equally weighted;
- ``linear``: at every node, the least-squares fit of the training samples' fields by an affine
  function of the parameters (scaled as above), evaluated at the sample's parameters: a weighted
  sum of the training samples too, weights summing to 1, some negative
  (:func:`meshshard.data.linear_cases`); ``linear:K``: the fit over the ``K`` nearest alone. A
  parameter that does not vary over them drops out;
- ``interp:PARAM``: linear interpolation along ``PARAM``. The *line* is the training samples
  nearest the sample in the other parameters (scaled as above; every training sample within
  ``1e-9 (1 + d_min)`` of the smallest such distance ``d_min``: with a full grid of cases, those
  whose other parameters equal the sample's). On it, ``lo`` is the sample with the largest
  ``PARAM`` at or below the sample's value and ``hi`` the one with the smallest at or above (a tie
  goes to the lower index); the weights are ``1 - t`` and ``t``, ``t = (v - v_lo) / (v_hi -
  v_lo)``; an exact value takes that sample alone. Outside the line's range of ``PARAM``: the
  nearest end alone, with a note.

Targets made non-dimensional (``meshshard dataset --target-scale``) are combined as stored
(divided by each case's scale) and multiplied by the sample's own scale: the "rescaled"
baselines of ``examples/cfd_sweep/run.py``. A sample scored among the training samples is one of
the cases its baseline is made of. The mirrors of a dataset made with ``--mirror`` are not: a
baseline is made of the solved cases alone, as the dataset's prior is.

On surfaces and point clouds (each body its own cloud) the fields are mapped between clouds
(``node_map(..., cloud=True)``) and the errors are area-weighted as predict weights them.

``--from TRAINING_DATA``: the training samples are that dataset's, and DATA holds the samples to
predict, which may be new designs without targets (their fields are written, without errors).
The two must have the same inputs, the same targets (when DATA has any) and meshes of one
dimension, and DATA the parameters the method and the target scales use (refused in one line
otherwise).

One process, whole meshes: mapping reads whole meshes, and one map per pair of meshes serves every
field and sample.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from meshshard.data import (
    MapsOnto,
    along_columns,
    check_expression,
    is_point_cloud,
    is_trajectory_dataset,
    linear_cases,
    method_text,
    nearest_cases,
    open_dataset,
    parameter_scale,
    parse_along_peak,
    parse_linear,
    parse_map_along,
    peak_column,
    solved_training_samples,
)
from meshshard.partition import plural

from ._boundaries import boundary_record, boundary_rows, boundary_sums, check_boundary_request
from ._boundary_pictures import boundary_picture
from ._near import check_near_request, near_mask, near_record
from ._pictures import sample_picture
from ._pred_folder import METRICS_FORMAT, check_prediction_folder, delete_paths, file_stem, write_metrics
from ._request import select_samples
from ._scores import along_name, boundary_view, error_sums, field_errors, summarise, surface_weights
from ._writer import MeshOnRank, field_slices, physical_rows
from ._writer import write_gathered as _write_gathered

__all__ = ["BaselineConfig", "BaselineMethod", "baseline", "baseline_sources", "parse_method"]

#: The methods, as ``--method`` spells them.
METHODS = "mean, nearest, knn:K, linear, linear:K, linear:K,bound=B or interp:PARAM"


@dataclass(frozen=True)
class BaselineMethod:
    """A parsed ``--method``: ``kind`` one of mean, nearest, knn, linear, interp; ``k`` for knn (and
    linear:K); ``param`` for interp."""

    kind: str
    k: int | None = None
    param: str | None = None
    bound: float | None = None  # linear: the most its weights may sum to in absolute value

    def __str__(self) -> str:
        if self.kind == "interp":
            return f"interp:{self.param}"
        return method_text(self.kind, self.k, self.bound)


def parse_method(text: str) -> BaselineMethod:
    """``mean``, ``nearest``, ``knn:K`` (K >= 1), ``linear``, ``linear:K`` (K >= 2), either with
    ``,bound=B`` (B >= 1), or ``interp:PARAM``;
    a one-line ``ValueError`` otherwise."""
    kind, _, rest = str(text).strip().partition(":")
    if kind in ("mean", "nearest") and not rest:
        return BaselineMethod(kind)
    if kind.startswith("linear"):
        k, bound = parse_linear(str(text).strip()[len("linear"):], "--method")
        return BaselineMethod("linear", k=k, bound=bound)
    if kind == "knn":
        try:
            k = int(rest)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"Expected --method knn:K with K a whole number >= 1 (got {text!r})")
        return BaselineMethod("knn", k=k)
    if kind == "interp" and rest.strip():
        return BaselineMethod("interp", param=rest.strip())
    raise ValueError(f"Expected --method {METHODS} (got {text!r})")


@dataclass
class BaselineConfig:
    """A baseline: what ``meshshard baseline`` takes (its options under their long names, the
    boundary and force options as :class:`meshshard.run.PredictConfig` names them)."""

    data: str
    out: str
    method: str = "mean"
    samples: str | None = None
    boundary: str | None = None
    pressure: str | None = None
    shear: str | None = None
    force_reference: str | None = None
    reference_area: float | None = None
    direction: tuple[float, ...] | None = None
    lift_direction: tuple[float, ...] | None = None
    near: str | None = None  # --near PATCHES:DISTANCE (meshshard.run._near)
    source: str | None = None  # --from DATA: the training samples are that dataset's (new designs in DATA)
    map_along: str | None = None  # --map-along PATCHES: fields mapped between meshes along this wall (data._morph)
    view: tuple[float, float, float, float] | None = None
    force: bool = False
    plots: bool = True
    quiet: bool = False


def _check_method(method: BaselineMethod, data: Any) -> tuple[np.ndarray, list[str]]:
    """The training samples' parameters ``(n_train, P)`` and their names; a one-line refusal for a
    method the dataset cannot give."""
    table = data.meta.get("parameters") or {}
    names = [str(n) for n in table.get("names", [])]
    train = solved_training_samples(data.meta)  # a dataset's mirrors (dataset --mirror) are not solved cases
    if not len(train):
        raise ValueError(f"{data.path}: Expected training samples to make a baseline of (the split has none)")
    if method.kind != "mean" and not names:
        raise ValueError(f"{data.path}: Expected parameters (meshshard dataset --params) for --method {method}, "
                         "which measures distances in parameter space (--method mean needs none)")
    values = np.asarray(table.get("values", []), dtype=np.float64).reshape(data.num_samples, len(names))
    if method.kind == "knn" and method.k is not None and method.k > len(train):
        raise ValueError(f"Expected --method {method.kind}:K with K at most the "
                         f"{plural(len(train), 'training sample')} of {data.path} (got K = {method.k})")
    if method.kind == "interp" and method.param not in names:
        raise ValueError(f"Expected --method interp:PARAM to name a parameter of {data.path} "
                         f"({', '.join(names)}) (got {method.param!r})")
    return values[train], names


def baseline_sources(method: BaselineMethod, train_values: np.ndarray, value: np.ndarray,
                     names: list[str]) -> tuple[list[tuple[int, float]], str | None]:
    """The training samples a baseline of the sample with parameters ``value`` ``(P,)`` is made
    of, as ``[(position in train_values, weight)]`` (weights summing to 1), and a note (or None);
    the rules are the module docstring's. ``train_values``: ``(n_train, P)``."""
    n = len(train_values)
    if method.kind == "mean":
        return [(i, 1.0 / n) for i in range(n)], None
    scale = parameter_scale(train_values.reshape(n, len(names)))
    if method.kind in ("nearest", "knn"):
        k = 1 if method.kind == "nearest" else int(method.k or 1)
        return nearest_cases(train_values, value, k, scale), None
    if method.kind == "linear":
        return linear_cases(train_values, value, scale, k=method.k, bound=method.bound), None
    z, zs = train_values / scale, np.asarray(value, dtype=np.float64) / scale
    j = names.index(str(method.param))
    others = [c for c in range(len(names)) if c != j]
    d_other = np.linalg.norm(z[:, others] - zs[others], axis=1) if others else np.zeros(n)
    d_min = float(d_other.min())
    line = np.flatnonzero(d_other <= d_min + 1e-9 * (1.0 + d_min))
    v, vs = train_values[line, j], float(value[j])
    at = line[v == vs]
    if len(at):
        return [(int(at[0]), 1.0)], None
    below, above = line[v < vs], line[v > vs]
    if len(below) and len(above):
        lo = int(below[np.argmax(train_values[below, j])])
        hi = int(above[np.argmin(train_values[above, j])])
        t = (vs - train_values[lo, j]) / (train_values[hi, j] - train_values[lo, j])
        return [(lo, float(1.0 - t)), (hi, float(t))], None
    end = int(above[np.argmin(train_values[above, j])]) if len(above) else int(below[np.argmax(train_values[below, j])])
    side = "below" if len(above) else "above"
    return [(end, 1.0)], (f"{names[j]} = {vs:g} is {side} the training range {float(v.min()):g}..{float(v.max()):g} "
                          f"along {names[j]}: the nearest end, {names[j]} = {float(train_values[end, j]):g}")


class _Mapper:
    """Training samples' stored targets (of dataset ``source``) mapped onto a mesh of dataset
    ``data``: one :class:`NodeMap` per pair of meshes, those onto the last target mesh kept
    (:class:`meshshard.data.MapsOnto`)."""

    def __init__(self, source: Any, data: Any, walls: tuple[str, ...] = (), columns: Any = None,
                 peak: int | None = None) -> None:
        self.source, self.data = source, data
        # onto one target mesh at a time; each training mesh triangulated once; peak: the landmark's channel
        self.maps = MapsOnto(walls, columns, peak)
        self.combined: dict[tuple[int, tuple[tuple[int, float], ...]], np.ndarray] = {}

    def _map(self, source: int, target: int, landmark: tuple[float, float] | None = None) -> Any:
        """The map from mesh ``source`` of the training dataset onto mesh ``target`` of DATA; None: the identity."""
        return self.maps.get(source, self.source.meta["meshes"][source],
                             lambda: np.asarray(self.source.mesh_points(source)), target,
                             self.data.meta["meshes"][target], lambda: np.asarray(self.data.mesh_points(target)),
                             str(self.source.mesh_folder(source)), self.source.mesh_folder(source),
                             self.data.mesh_folder(target), landmark)

    def _target(self, i: int) -> np.ndarray:
        return np.asarray(self.source.sample_arrays(i)[1], dtype=np.float64)

    def stored(self, sources: list[tuple[int, float]], mesh: int) -> np.ndarray:
        """``sum_i w_i * map(stored targets of training sample i)`` on DATA's mesh ``mesh``
        ``(N, F_out)``; kept per mesh and sources (the mean is the same for every sample of a mesh)."""
        key = (mesh, tuple(sources))
        if key not in self.combined:
            total = np.zeros((int(self.data.meta["meshes"][mesh]["num_nodes"]), len(self.source.target_channels)))
            landmarks: list[Any] = [None] * len(sources)
            if self.maps.peak is not None:  # peak=FIELD: each case's peak made to meet the sample's (data._morph)
                landmarks = self.maps.landmarks(
                    [(i, self.source.meta["meshes"][self.source.sample_mesh(i)],
                      self.source.mesh_folder(self.source.sample_mesh(i)), lambda i=i: self._target(i))
                     for i, _ in sources], [w for _, w in sources])
            for (i, w), landmark in zip(sources, landmarks):
                y = self._target(i)
                m = self._map(self.source.sample_mesh(i), mesh, landmark)
                total += w * (y if m is None else m.apply(y))
            self.combined = {key: total}  # one kept: the next sample usually needs another
        return self.combined[key]


def _whole(data: Any, mesh: int) -> MeshOnRank:
    whole = data.mesh(mesh)
    ids = np.arange(whole.num_nodes, dtype=np.int64)
    return MeshOnRank(mesh, whole.num_nodes, ids, None, np.asarray(whole.points), ids,
                      [(t, np.asarray(c, dtype=np.int64)) for t, c in whole.cells])


def _fields_of(meta: dict[str, Any], key: str) -> list[tuple[str, int]]:
    return [(str(f["name"]), int(f["components"])) for f in meta.get(key) or []]


def _check_from(data: Any, source: Any, method: BaselineMethod, param_names: list[str]) -> None:
    """A dataset DATA predicted from the training dataset ``source`` (``--from``): the same inputs,
    the same targets (when DATA has any), meshes of the same dimension, the parameters the method
    and the target scales use; a one-line ``ValueError`` naming both otherwise."""
    where = f"{data.path}: Expected the inputs, targets and mesh dimension of --from {source.path}"
    for key, what in (("inputs", "inputs"), ("targets", "targets")):
        mine, theirs = _fields_of(data.meta, key), _fields_of(source.meta, key)
        if (mine or key == "inputs") and mine != theirs:
            raise ValueError(f"{where} (its {what} are {_listed(theirs)}; got {_listed(mine)})")
    dims = {int(m["pos_dim"]) for m in data.meta["meshes"]}, {int(m["pos_dim"]) for m in source.meta["meshes"]}
    if dims[0] != dims[1]:
        raise ValueError(f"{where} (its meshes are {'/'.join(map(str, sorted(dims[1])))}-D; got "
                         f"{'/'.join(map(str, sorted(dims[0])))}-D)")
    have = [str(n) for n in (data.meta.get("parameters") or {}).get("names", [])]
    scales = [str(e) for e in (source.meta.get("target_scales") or {}).values()]
    missing = [p for p in param_names if p not in have] if method.kind != "mean" else []
    if missing:
        raise ValueError(f"{data.path}: Expected the parameters {', '.join(param_names)} of --from {source.path}, "
                         f"which --method {method} measures distances in (got {', '.join(have) or 'none'})")
    for expression in scales:  # the stored targets of --from are non-dimensional: scaled by the sample's own
        try:
            check_expression(expression, have)
        except ValueError as err:
            raise ValueError(f"{data.path}: Expected parameters for the target scales of --from {source.path} "
                             f"({err})") from None


def _listed(fields: list[tuple[str, int]]) -> str:
    return ", ".join(f"{n} ({k})" for n, k in fields) or "none"


def _datasets(cfg: BaselineConfig, method: BaselineMethod) -> tuple[Any, Any, np.ndarray, list[str]]:
    """DATA, the dataset of the training samples (``--from``, else DATA), the training samples'
    parameters and the parameters' names, after every refusal that the datasets decide."""
    data = open_dataset(cfg.data)
    source = open_dataset(cfg.source) if cfg.source else data
    for d in {id(data): data, id(source): source}.values():
        if is_trajectory_dataset(d.meta):
            raise ValueError(f"{d.path}: Expected a dataset of steady samples (it holds trajectories, whose baselines "
                             "are rollouts: examples/transient)")
    if not source.target_channels:
        raise ValueError(f"{source.path}: Expected a dataset with targets (it holds inputs only): a baseline is made "
                         "of its training samples' targets"
                         + (" (new designs without targets: --from TRAINING_DATA)" if not cfg.source else ""))
    train_values, param_names = _check_method(method, source)
    if cfg.source:
        _check_from(data, source, method, param_names)
    return data, source, train_values, param_names


def baseline(cfg: BaselineConfig) -> dict[str, Any]:
    """Make the baseline of ``cfg.method``, write PRED (as :func:`meshshard.run.predict` does) and
    return the metrics. One-line ``ValueError`` refusals (an unknown method, a dataset without
    targets or training samples, a method that needs parameters it lacks, K beyond the training
    samples, an unknown PARAM, the boundary options predict refuses, an existing PRED without
    ``--force``, a ``--from`` dataset unlike DATA) come before anything is written. With
    ``cfg.source`` (``--from``) the training samples are that dataset's, and DATA may hold new
    designs without targets: their fields are written, without errors."""
    method = parse_method(cfg.method)
    data, source, train_values, param_names = _datasets(cfg, method)
    truth = bool(data.target_channels)
    train = [int(i) for i in solved_training_samples(source.meta)]
    names = [str(e["name"]) for e in data.meta["samples"]]
    picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
    target_fields = field_slices(source.meta["targets"])
    scoring = check_boundary_request(data, target_fields, cfg.boundary, cfg.pressure, cfg.shear, cfg.force_reference,
                                     picks, cfg.reference_area, cfg.direction, cfg.lift_direction)
    region = check_near_request(data, cfg.near, picks)
    along, along_fields = parse_map_along(cfg.map_along)
    columns = along_columns(source.meta["targets"], along_fields) if along else None
    peak_name = parse_along_peak(cfg.map_along)
    peak = peak_column(source.meta["targets"], peak_name) if along else None
    mapper = _Mapper(source, data, along, columns, peak)
    if along:  # the walls of a picked mesh and of a training mesh, read (and kept) before anything is written
        first = data.sample_mesh(picks[0])
        mapper.maps.outline(data.meta["meshes"][first], data.mesh_folder(first))
        mapper.maps.outline(source.meta["meshes"][source.sample_mesh(train[0])],
                            source.mesh_folder(source.sample_mesh(train[0])))
    out = Path(cfg.out)
    stale = check_prediction_folder(out, cfg.force)
    ctx = SimpleNamespace(rank=0, world_size=1, device="cpu")
    head = {"format": METRICS_FORMAT, "format_version": 1, "complete": False, "run": None,
            "baseline": {"method": str(method), "training_samples": len(train), "parameters": param_names,
                         **({"from": str(cfg.source)} if cfg.source else {}),
                         **({"along": list(along)} if along else {}),
                         **({"along_fields": list(along_fields)} if along_fields else {}),
                         **({"along_peak": peak_name} if peak is not None else {})},
            "data": str(cfg.data), "step": None, "checkpoint": None, "world_size": 1,
            "units": "physical (de-normalised)", "targets_known": truth, "files": []}
    delete_paths(stale)
    out.mkdir(parents=True, exist_ok=True)
    write_metrics(out, head | {"samples": []})
    main = not cfg.quiet
    if main:
        print(f"meshshard baseline: {method} of {plural(len(train), 'training sample')} of {cfg.source or cfg.data}, "
              f"{plural(len(picks), 'sample')}" + ("" if truth else f"; {cfg.data} has no targets: predictions only, "
                                                  "no errors"), flush=True)
    stems = [file_stem(name) for name in names]
    val = set(int(v) for v in data.val)
    records: list[dict[str, Any]] = []
    layouts: dict[int, MeshOnRank] = {}
    walls: dict[int, Any] = {}
    views: dict[int, Any] = {}
    areas_of: dict[int, Any] = {}
    masks: dict[int, np.ndarray] = {}
    scales = source.meta.get("target_scales") or {}
    for s in picks:
        mesh, n = data.sample_mesh(s), data.num_nodes(s)
        value = np.array([data.parameters(s)[p] for p in param_names]) if method.kind != "mean" else np.zeros(0)
        positions, note = baseline_sources(method, train_values, value, param_names)
        sources = [(train[i], w) for i, w in positions]
        if note is not None and main:
            print(f"note: {names[s]}: {note}", file=sys.stderr, flush=True)
        pred = mapper.stored(sources, mesh) * data.target_factors(s, scales, source.meta["targets"])
        y = physical_rows(data, s, np.arange(n, dtype=np.int64))[1] if truth else None
        stem = stems[s] if stems.count(stems[s]) == 1 else f"{stems[s]}-{s}"
        along = along_name(stem, stems) if cfg.plots and scoring is not None else None
        cloud = is_point_cloud(data.meta["meshes"][mesh])
        path = out / f"{stem}.{'vtp' if cloud else 'vtu'}"
        head["files"] += [path.name] + ([f"{stem}.png"] if cfg.plots else []) + ([along] if along else [])
        write_metrics(out, head | {"samples": records})
        if mesh not in layouts:
            layouts[mesh] = _whole(data, mesh)
            areas_of[mesh] = surface_weights(data, mesh, layouts[mesh].owned_ids)
        layout = layouts[mesh]
        sums = (error_sums(pred, y, areas_of[mesh], target_fields, ctx) if y is not None
                else [(math.nan,) * 4] * len(target_fields))
        full = _write_gathered(path, data, target_fields, s, layout, pred, ctx)
        record: dict[str, Any] = {
            "sample": s, "name": names[s], "split": ("val" if s in val else "train") if truth else None,
            "num_nodes": n, "file": path.name, "picture": None,
            "fields": field_errors(target_fields, sums, n, areas_of[mesh], truth, names[s] if main else None),
            "baseline": {"sources": [{"sample": str(source.meta["samples"][i]["name"]), "weight": w}
                                     for i, w in sources]}}
        if note is not None:
            record["baseline"]["note"] = note
        if scoring is not None:
            if mesh not in walls:
                walls[mesh] = boundary_rows(data, mesh, layout.owned_ids, scoring)
            record["boundaries"] = boundary_record(boundary_sums(walls[mesh], y, pred, scoring), scoring,
                                                   data.parameters(s), truth)
            if along:
                record["boundary_picture"] = boundary_picture(out / along, names[s], data, mesh, walls[mesh], layout,
                                                              y, pred, target_fields, scoring, ctx)
        if region is not None:
            if mesh not in masks:
                masks[mesh] = near_mask(data, mesh, layout.owned_ids, region)
            record["near"] = near_record(masks[mesh], pred, y, target_fields, region, ctx)
        if cfg.plots:
            if cfg.view is None and scoring is not None and mesh not in views:
                views[mesh] = boundary_view(data, mesh, scoring)
            record["picture"] = sample_picture(out / f"{stem}.png", names[s], layout, y, pred, True, full,
                                               target_fields, ctx, view=cfg.view or views.get(mesh), cloud=cloud)
        records.append(record)
        write_metrics(out, head | {"samples": records})
        if main:
            made = " + ".join(f"{w:.3g} x {source.meta['samples'][i]['name']}" for i, w in sources[:4])
            print(f"  [{len(records)}/{len(picks)}] {names[s]}: {made}{' + ...' if len(sources) > 4 else ''} -> "
                  f"{path.name}", flush=True)
    summary = summarise(cfg, ctx, out, head, records, target_fields, scoring, truth, main, near=region)
    assert summary is not None  # rank 0
    return summary
