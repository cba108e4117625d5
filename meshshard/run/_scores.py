"""Scoring predictions, for ``predict`` and ``baseline`` alike: the error sums of a sample's rows
(area-weighted on a surface), each target field's RMSE and relative L2 error, the summary of all
samples that ``metrics.json`` ends with, and the tables printed from it."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import sum_across
from meshshard.partition import plural

from ._boundaries import (
    BoundaryScoring,
    boundary_summary,
)
from ._boundary_pictures import forces_picture
from ._near import NearRegion, near_summary
from ._pred_folder import (
    mean_known,
    write_metrics,
)
from ._report import gather_peak_memory
from ._request import (
    PredictConfig,
)

__all__ = ["along_name", "boundary_view", "error_sums", "field_errors", "percent", "print_boundaries", "print_table",
           "summarise", "surface_weights"]


def error_sums(pred: np.ndarray, y: np.ndarray, areas: np.ndarray | None, target_fields: list[tuple[str, slice]],
                ctx: Any) -> Any:
    """Per field: sum e^2, sum y^2, sum a e^2, sum a y^2 over this rank's rows; one sum over ranks
    (a collective)."""
    err = pred - y
    w = areas if areas is not None else np.zeros(len(y))
    return sum_across(np.array([[float((err[:, sl] ** 2).sum()), float((y[:, sl] ** 2).sum()),
                                 float(w @ (err[:, sl] ** 2).sum(1)), float(w @ (y[:, sl] ** 2).sum(1))]
                                for _, sl in target_fields]), None, ctx.device)


def field_errors(target_fields: list[tuple[str, slice]], sums: Any, n: int, areas: np.ndarray | None, truth: bool,
                  noting: str | None) -> dict[str, Any]:
    """A sample record's ``fields``: per target its RMSE and relative L2 error (and, on a surface,
    the area-weighted one) from :func:`error_sums`; null where unknown or not finite, which a
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


def along_name(stem: str, stems: list[str]) -> str:
    """The file of a sample's pictures along its boundaries: ``<stem>_boundaries.png``, or, where
    that is another sample's picture, ``_boundaries-of-<stem>.png`` (no sample's stem starts with ``_``)."""
    return f"{stem}_boundaries.png" if f"{stem}_boundaries" not in stems else f"_boundaries-of-{stem}.png"


def summarise(cfg: PredictConfig, ctx: Any, out: Path, head: dict[str, Any], records: list[dict[str, Any]],
             target_fields: list[tuple[str, slice]], scoring: BoundaryScoring | None, truth: bool,
             main: bool, near: NearRegion | None = None) -> dict[str, Any] | None:
    """The finished prediction's metrics (the means over the samples), written and printed by rank 0;
    None on the other ranks. Every rank's peak memory is gathered first (a collective). With
    pictures and a force, ``forces.png`` (:func:`meshshard.run._boundary_pictures.forces_picture`)."""
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
    if near is not None:
        summary["near"] = near_summary(records, near, target_fields)
    if cfg.plots and scoring is not None and truth:
        name = "forces.png" if "forces.png" not in head["files"] else "_forces.png"  # a sample may be named forces
        drawn = forces_picture(out / name, records, scoring, f"{out.name}: force coefficients, predicted against true")
        if drawn:
            summary["files"] = [*head["files"], drawn]
            summary["forces_picture"] = drawn
    write_metrics(out, summary)
    if main:
        if truth:
            print_table(records, [name for name, _ in target_fields])
            if near is not None:
                print(f"near: the nodes within {near.distance:g} of {', '.join(near.names)}: mean " + "; ".join(
                    f"{f} rel L2 {percent(v['rel_l2'])}" for f, v in summary["near"]["fields"].items()), flush=True)
            if scoring is not None:
                print_boundaries(summary["boundaries"], scoring, records)
        print(f"wrote {out}/: {len(records)} sample file(s), metrics.json" + (", pictures" if cfg.plots else ""),
              flush=True)
    return summary


def surface_weights(data: Any, mesh: int, owned_ids: np.ndarray, chunk: int = 1 << 20) -> np.ndarray | None:
    """The area each owned point of a surface stands for: its share of the faces around it (each
    face's area split equally among its corners, the ``area`` field of
    :mod:`meshshard.partition._points`); None when mesh ``mesh`` is not a surface. Read from the
    dataset (only these rows, :meth:`meshshard.data.Dataset.point_areas`) where it stores them, else
    computed from the faces, read in chunks (a dataset written before issue 37)."""
    entry = data.meta["meshes"][mesh]
    if "surface_area" not in entry:
        return None
    stored = data.point_areas(mesh, owned_ids)
    if stored is not None:
        return stored
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


def boundary_view(data: Any, mesh: int, scoring: BoundaryScoring) -> tuple[float, float, float, float] | None:
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


def print_boundaries(summary: dict[str, Any], scoring: BoundaryScoring, records: list[dict[str, Any]]) -> None:
    """One line per boundary: its mean errors and the force's R² and Spearman over the samples;
    with ``--direction``, a table of the drag (and lift) coefficients per sample and a line of
    their mean absolute error, R² and Spearman."""
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
                f"R² {'-' if v['r2'] is None else format(v['r2'], '.4f')}, "
                f"Spearman {'-' if v.get('spearman') is None else format(v['spearman'], '.4f')}"
                for c, v in entry["coefficients"].items()),
                flush=True)
        parts = [f"{field} rel L2 {percent(v['rel_l2'])}" for field, v in entry["fields"].items()]
        if "force" in entry:
            r2 = ", ".join("-" if v is None else f"{v:.4f}" for v in entry["force"]["r2"])
            rho = ", ".join("-" if v is None else f"{v:.4f}" for v in entry["force"].get("spearman", []))
            parts.append(f"force error {percent(entry['force']['rel_error'])}, R² of the {entry['force']['r2_of']} "
                         f"over the samples ({r2}), Spearman ({rho})")
        print(f"on {name}: " + "; ".join(parts), flush=True)
        if entry.get("note"):
            print(f"note: {name}: {entry['note']}", file=sys.stderr, flush=True)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def print_table(rows: list[dict[str, Any]], fields: list[str]) -> None:
    """Per sample its split, nodes and the errors of each target field (and the area-weighted
    relative L2 when some sample is a surface)."""
    weighted = any("rel_l2_area" in r["fields"][f] for r in rows for f in fields)
    near = any("near" in r for r in rows)
    head = (f"{'sample':<24} {'split':<5} {'nodes':>9}"
            + "".join(f" {f + ' RMSE':>14} {f + ' rel L2':>12}" + (f" {f + ' area L2':>13}" if weighted else "")
                      + (f" {f + ' near L2':>13}" if near else "") for f in fields))
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
            if near:
                close = (r.get("near") or {}).get("fields", {}).get(f, {}).get("rel_l2")
                line += f" {'-' if close is None else format(close, '.3%'):>13}"
        print(line)
