"""What ``meshshard predict --boundary NAMES`` adds to ``metrics.json``: errors on named
boundaries, and the force on them, predicted against true.

For each named boundary of the dataset (a patch of a foamToVTK ``.vtm``, a node set, a gmsh
physical group; ``meshshard info DATA`` lists them) and each sample:

- ``rel_l2`` per target field over the boundary's nodes (``||pred - true|| / ||true||``, a
  vector field as a vector): the near-wall error that a domain-wide figure hides;
- ``force``: the force the fluid exerts on the boundary, ``sum_i p_i a_i (+ tau_i |a_i|)``, from
  the pressure field (``--pressure``, default ``p``) and, when given, a wall shear stress field
  (``--shear``), with the area vectors ``a_i`` the dataset stores with the boundary
  (:mod:`meshshard.data._surface`): ``true``, ``pred`` and ``rel_error`` ``|pred - true| /
  |true|``;
- with ``--force-reference EXPR`` (the reference dynamic pressure ``q``, arithmetic of the sample's
  parameters, e.g. ``0.5*speed**2``) or ``--reference-area A``: the force coefficients ``force / (q A)``
  (``q`` and ``A`` default to 1);
- with ``--direction X,Y,Z`` (the drag direction) and optionally ``--lift-direction X,Y,Z``: the
  drag and lift coefficients ``C = F . d / (q A)`` (``d`` made a unit vector), predicted and true,
  and their absolute and relative errors.

The force is ``integral of (-p n + tau) dA``, ``n`` the normal out of the body into the fluid: the
area vectors point out of the fluid, ``a_i = -n_i A_i``. ``--force-field`` (alias ``--pressure``)
names the pressure, ``--shear-field`` (alias ``--shear``) the wall shear stress; on a dataset of
surfaces, any of the force options without ``--boundary`` takes the boundary ``surface`` (every
point).

Over the samples, ``boundaries[name]`` of the summary holds the mean errors and, per component
of the force (or coefficient), over the cases: ``mae`` the mean absolute error, ``r2`` the R²
``1 - sum (pred - true)^2 / sum (true - mean true)^2`` (null with fewer than two cases or none
that differ), ``spearman`` Spearman's rank correlation, the Pearson correlation of the ranks
(ties share their mean rank; null with fewer than three cases, with a ``note`` saying so, or
where either does not vary): whether the model ranks the designs as the solver does. The drag and
lift coefficients get the same three. :func:`over_samples` is the one place they are computed,
for ``meshshard predict`` and ``meshshard baseline`` alike.

On shards each rank sums over the boundary nodes it owns; one ``all_reduce`` per sample adds the
sums (the boundary's ids and area vectors are read whole on each rank: a boundary is a small part
of a mesh).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshshard.data import boundary_force, check_expression, evaluate_expression
from meshshard.partition import plural

__all__ = ["BoundaryScoring", "boundary_record", "boundary_rows", "boundary_summary", "boundary_sums",
           "check_boundary_names", "check_boundary_request", "check_force_options", "over_samples", "parse_direction"]

#: The force options, as the command line names them (for the refusals).
_FORCE_FLAGS = "--force-field, --shear-field, --force-reference, --reference-area or --direction"


@dataclass(frozen=True)
class BoundaryScoring:
    """The boundaries to score and how (see the module docstring)."""

    names: tuple[str, ...]
    fields: tuple[tuple[str, slice], ...]  # the target fields, as predict slices them
    pressure: slice | None  # the pressure's channel among the targets; None: no force
    shear: slice | None
    reference: str | None
    dim: int
    area: float = 1.0  # --reference-area
    drag: tuple[float, ...] | None = None  # --direction, a unit vector
    lift: tuple[float, ...] | None = None  # --lift-direction, a unit vector

    @property
    def has_coefficients(self) -> bool:
        """Whether coefficients are asked for: a reference, a reference area or a direction."""
        return self.reference is not None or self.area != 1.0 or self.drag is not None

    @property
    def directions(self) -> list[tuple[str, tuple[float, ...]]]:
        """The named coefficients: ``[("drag", d), ("lift", l)]`` as given."""
        return [(name, d) for name, d in (("drag", self.drag), ("lift", self.lift)) if d is not None]

    @property
    def width(self) -> int:
        """Numbers summed per boundary: (sse, sst) per field, then the true and predicted force."""
        return 2 * len(self.fields) + (2 * self.dim if self.pressure is not None else 0)


def _split(text: str | Sequence[str] | None) -> tuple[str, ...]:
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(s.strip() for s in items if s.strip()))


def parse_direction(text: str | Sequence[float], flag: str = "--direction") -> tuple[float, ...]:
    """``X,Y,Z`` (or ``X,Y`` in 2-D) as a tuple of finite numbers, not all zero; a one-line
    ``ValueError`` naming ``flag`` otherwise."""
    try:
        values = tuple(float(v) for v in (text.split(",") if isinstance(text, str) else text))
    except (TypeError, ValueError):
        values = ()
    if len(values) not in (2, 3) or not all(math.isfinite(v) for v in values) or not any(values):
        raise ValueError(f"Expected {flag} X,Y,Z, a non-zero vector of finite numbers (got {text!r})")
    return values


def check_force_options(area: float | None, drag: Sequence[float] | None, lift: Sequence[float] | None,
                        dim: int | None = None) -> tuple[float, tuple[float, ...] | None, tuple[float, ...] | None]:
    """The reference area (default 1) and the unit drag and lift directions; a one-line
    ``ValueError`` for an area that is not a positive finite number, a zero direction, one with
    as many components as the meshes have not (``dim``), or a lift without a drag direction."""
    if area is not None and not (isinstance(area, (int, float)) and math.isfinite(area) and area > 0):
        raise ValueError(f"Expected --reference-area to be a positive number (got {area})")
    if lift is not None and drag is None:
        raise ValueError("Expected --direction (the drag direction) with --lift-direction")
    units = []
    for vector, flag in ((drag, "--direction"), (lift, "--lift-direction")):
        if vector is None:
            units.append(None)
            continue
        v = np.array(parse_direction(vector, flag))
        if dim is not None and len(v) != dim:
            raise ValueError(f"Expected {flag} to have {dim} components, as the meshes have dimensions "
                             f"(got {','.join(f'{x:g}' for x in v)})")
        units.append(tuple(float(x) for x in v / np.linalg.norm(v)))
    if units[0] is not None and units[1] is not None and abs(float(np.dot(units[0], units[1]))) > 1 - 1e-9:
        raise ValueError(f"Expected --lift-direction across --direction, the drag direction (got "
                         f"{','.join(f'{x:g}' for x in units[1])} parallel to {','.join(f'{x:g}' for x in units[0])}, "
                         "as unit vectors): "
                         "the lift would be the drag")
    return float(area) if area is not None else 1.0, units[0], units[1]


def _all_surfaces(data: Any, samples: Sequence[int]) -> bool:
    return bool(samples) and all(SURFACE in data.boundary_names(m) for m in {data.sample_mesh(s) for s in samples})


SURFACE = "surface"


def check_boundary_names(data: Any, boundaries: str | Sequence[str] | None, reference: str | None,
                         samples: Sequence[int]) -> tuple[str, ...]:
    """The boundary names asked for; a one-line ``ValueError`` for one that a sample's mesh lacks,
    or for a reference that is not arithmetic of the parameters (what DATA alone decides)."""
    names = _split(boundaries)
    for mesh in sorted({data.sample_mesh(s) for s in samples}):
        have = data.boundary_names(mesh)
        missing = [n for n in names if n not in have]
        if missing:
            raise ValueError(f"{data.path}: Expected --boundary to name boundaries of the meshes (got "
                             f"{', '.join(missing)}; mesh {mesh} has {', '.join(have) if have else 'none'})")
    if reference is not None:
        check_expression(reference, list((data.meta.get("parameters") or {}).get("names", [])))
    return names


def check_boundary_request(data: Any, fields: list[tuple[str, slice]], boundaries: str | Sequence[str] | None,
                           pressure: str | None, shear: str | None, reference: str | None,
                           samples: Sequence[int], area: float | None = None, drag: Sequence[float] | None = None,
                           lift: Sequence[float] | None = None) -> BoundaryScoring | None:
    """The scoring predict does, or None without ``--boundary`` or force options; a one-line
    ``ValueError`` for a boundary a sample's mesh lacks, force options without ``--boundary`` on
    a dataset that is not of surfaces, a pressure or shear that is not a target of the right
    width, a reference that is not arithmetic of the parameters, a reference area or direction
    :func:`check_force_options` refuses. Raised on every rank before any collective."""
    asked = bool(pressure or shear or reference or area is not None or drag is not None or lift is not None)
    if not _split(boundaries):
        if not asked:
            return None
        if not _all_surfaces(data, samples):
            raise ValueError(f"Expected --boundary NAMES with {_FORCE_FLAGS} (they say how the force on those "
                             f"boundaries is made; on a dataset of surfaces they take the boundary {SURFACE!r})")
        boundaries = SURFACE
    names = check_boundary_names(data, boundaries, reference, samples)
    by_name = dict(fields)
    dim = int(data.meta["meshes"][0]["pos_dim"])
    ref_area, drag_unit, lift_unit = check_force_options(area, drag, lift, dim)

    def channel(name: str | None, width: int, what: str, flag: str) -> slice | None:
        if name is None:
            return None
        sl = by_name.get(name)
        if sl is None or sl.stop - sl.start != width:
            raise ValueError(f"Expected {flag} to name a target field of {plural(width, 'component')}, the {what} "
                             f"(got {name!r}; the targets are "
                             + ", ".join(f"{n} ({s.stop - s.start})" for n, s in fields) + ")")
        return sl

    p_name = pressure if pressure is not None else ("p" if (sl := by_name.get("p")) and sl.stop - sl.start == 1
                                                    else None)
    p = channel(p_name, 1, "pressure", "--force-field (--pressure)")
    tau = channel(shear, dim, "wall shear stress", "--shear-field (--shear)")
    if p is None and (tau is not None or reference is not None or area is not None or drag is not None):
        raise ValueError(f"Expected a pressure field for the force (--force-field, a scalar target; there is no "
                         f"target p) with {_FORCE_FLAGS}")
    return BoundaryScoring(names, tuple(fields), p, tau, reference, dim, ref_area, drag_unit, lift_unit)


def boundary_rows(data: Any, mesh: int, owned_ids: np.ndarray,
                  scoring: BoundaryScoring) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per boundary, the rows of this rank's owned nodes on it and their area vectors: read once
    per mesh (every sample of the mesh reuses them)."""
    owned = np.asarray(owned_ids, dtype=np.int64)
    return [data.boundary_rows(mesh, name, owned) for name in scoring.names]


def boundary_sums(on_rank: list[tuple[np.ndarray, np.ndarray]], truth: np.ndarray | None, pred: np.ndarray,
                  scoring: BoundaryScoring) -> np.ndarray:
    """This rank's sums over the boundary nodes it owns (``on_rank``: :func:`boundary_rows`),
    ``(len(names), width)`` (add them over the ranks). Without the truth (``truth`` None) only the
    predicted force is non-zero."""
    out = np.zeros((len(scoring.names), scoring.width))
    for b, (rows, area) in enumerate(on_rank):
        if not len(rows):
            continue
        p_rows = pred[rows]
        t_rows = truth[rows] if truth is not None else None
        col = 0
        for _, sl in scoring.fields:
            if t_rows is not None:
                out[b, col] = float(((p_rows[:, sl] - t_rows[:, sl]) ** 2).sum())
                out[b, col + 1] = float((t_rows[:, sl] ** 2).sum())
            col += 2
        if scoring.pressure is not None:
            d = scoring.dim
            for k, values in enumerate((t_rows, p_rows)):
                if values is None:
                    continue
                tau = values[:, scoring.shear] if scoring.shear is not None else None
                out[b, col + k * d: col + (k + 1) * d] = boundary_force(values[:, scoring.pressure], area, tau)
    return out


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def boundary_record(sums: np.ndarray, scoring: BoundaryScoring, parameters: dict[str, float],
                    truth: bool) -> dict[str, Any]:
    """The ``boundaries`` entry of one sample's record, from the sums over every rank."""
    record: dict[str, Any] = {}
    for b, name in enumerate(scoring.names):
        row = sums[b]
        entry: dict[str, Any] = {"fields": {}}
        for k, (field, _) in enumerate(scoring.fields):
            sse, sst = row[2 * k], row[2 * k + 1]
            entry["fields"][field] = {"rel_l2": _finite(math.sqrt(sse / sst)) if truth and sst > 0 else None}
        if scoring.pressure is not None:
            col, d = 2 * len(scoring.fields), scoring.dim
            true_f, pred_f = row[col:col + d], row[col + d:col + 2 * d]
            size = float(np.linalg.norm(true_f))
            entry["force"] = {"true": [_finite(v) for v in true_f] if truth else None,
                              "pred": [_finite(v) for v in pred_f],
                              "rel_error": _finite(float(np.linalg.norm(pred_f - true_f)) / size)
                              if truth and size > 0 else None}
            if scoring.has_coefficients:
                ref = float(evaluate_expression(scoring.reference, parameters)) if scoring.reference else 1.0
                if not math.isfinite(ref) or ref == 0.0:
                    raise ValueError(f"Expected --force-reference {scoring.reference!r} to be a finite non-zero "
                                     f"number for every sample (got {ref} for "
                                     + (", ".join(f"{k}={v:g}" for k, v in parameters.items()) or "no parameters")
                                     + ")")
                scale = ref * scoring.area  # q A
                entry["coefficient"] = {"reference": ref, "reference_area": scoring.area,
                                        "true": [_finite(v / scale) for v in true_f] if truth else None,
                                        "pred": [_finite(v / scale) for v in pred_f]}
                if scoring.directions:
                    entry["coefficients"] = {}
                for coefficient, d in scoring.directions:
                    t, p = float(true_f @ np.array(d)) / scale, float(pred_f @ np.array(d)) / scale
                    entry["coefficients"][coefficient] = {
                        "direction": list(d), "true": _finite(t) if truth else None, "pred": _finite(p),
                        "abs_error": _finite(abs(p - t)) if truth else None,
                        "rel_error": _finite(abs(p - t) / abs(t)) if truth and t != 0 else None}
        record[name] = entry
    return record


def _r2(true: np.ndarray, pred: np.ndarray) -> list[float | None]:
    """Per column: the R² of ``pred`` against ``true`` over the rows (the cases); None for a
    column that does not vary beyond round-off of the largest true value (the side force of a
    symmetric body, 1e-17 against 1)."""
    out: list[float | None] = []
    size = float(np.abs(true).max()) if true.size else 0.0
    for t, p in zip(true.T, pred.T):
        spread = float(((t - t.mean()) ** 2).sum())
        varies = len(t) > 1 and spread > len(t) * (1e-12 * size) ** 2
        out.append(_finite(1.0 - float(((p - t) ** 2).sum()) / spread) if varies and spread > 0 else None)
    return out


#: The fewest samples a rank correlation is given for (with 2 it is always +-1).
SPEARMAN_MIN_SAMPLES = 3


def _spearman(true: np.ndarray, pred: np.ndarray) -> list[float | None]:
    """Per column: Spearman's rank correlation of ``pred`` with ``true`` over the rows (the
    cases): the Pearson correlation of their ranks (ties share their mean rank); None with fewer
    than :data:`SPEARMAN_MIN_SAMPLES` rows, or for a column where either does not vary (the true
    beyond round-off of the largest true value, as :func:`_r2`)."""
    from scipy.stats import rankdata

    out: list[float | None] = []
    size = float(np.abs(true).max()) if true.size else 0.0
    for t, p in zip(true.T, pred.T):
        if len(t) < SPEARMAN_MIN_SAMPLES or float(((t - t.mean()) ** 2).sum()) <= len(t) * (1e-12 * size) ** 2:
            out.append(None)
            continue
        rt, rp = rankdata(t) - (len(t) + 1) / 2, rankdata(p) - (len(p) + 1) / 2
        spread = float(np.sqrt((rt ** 2).sum() * (rp ** 2).sum()))
        out.append(_finite(float(rt @ rp) / spread) if spread > 0 else None)
    return out


def over_samples(true: np.ndarray, pred: np.ndarray) -> dict[str, list[float | None]]:
    """Per column of ``(cases, k)`` arrays: the mean absolute error, the R² (:func:`_r2`) and
    Spearman's rank correlation (:func:`_spearman`) over the cases; what the summary gives of each
    force component and coefficient, for predict and baseline alike."""
    true, pred = np.asarray(true, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    if not len(true):
        k = true.shape[1] if true.ndim == 2 else 0
        return {"mae": [None] * k, "r2": [None] * k, "spearman": [None] * k}
    return {"mae": [_finite(float(v)) for v in np.abs(pred - true).mean(0)], "r2": _r2(true, pred),
            "spearman": _spearman(true, pred)}


def _spearman_note(count: int) -> str | None:
    return (f"Spearman's rank correlation needs at least {SPEARMAN_MIN_SAMPLES} samples (got {count}): null"
            if count < SPEARMAN_MIN_SAMPLES else None)


def boundary_summary(records: list[dict[str, Any]], scoring: BoundaryScoring) -> dict[str, Any]:
    """Per boundary, over the samples: mean errors; per component of the force (or coefficient)
    its mean absolute error, R² and Spearman's rank correlation (:func:`over_samples`); per
    drag or lift coefficient the same; a ``note`` where there are too few samples for a rank
    correlation."""
    out: dict[str, Any] = {}
    for name in scoring.names:
        entries = [r["boundaries"][name] for r in records if r.get("boundaries")]
        summary: dict[str, Any] = {"fields": {}}
        for field, _ in scoring.fields:
            known = [e["fields"][field]["rel_l2"] for e in entries if e["fields"][field]["rel_l2"] is not None]
            summary["fields"][field] = {"rel_l2": float(np.mean(known)) if known else None}
        if scoring.pressure is not None:
            key = "coefficient" if scoring.has_coefficients else "force"
            pairs = [(e[key]["true"], e[key]["pred"]) for e in entries
                     if e[key]["true"] is not None and None not in e[key]["true"] + e[key]["pred"]]
            errors = [e["force"]["rel_error"] for e in entries if e["force"]["rel_error"] is not None]
            stats = (over_samples(np.array([t for t, _ in pairs]), np.array([p for _, p in pairs])) if pairs else
                     {"mae": [None] * scoring.dim, "r2": [None] * scoring.dim, "spearman": [None] * scoring.dim})
            summary["force"] = {"rel_error": float(np.mean(errors)) if errors else None, "r2_of": key, **stats}
            note = _spearman_note(len(pairs))
            if scoring.directions:
                summary["coefficients"] = {}
            for coefficient, _ in scoring.directions:
                got = [e["coefficients"][coefficient] for e in entries if "coefficients" in e]
                pairs_c = np.array([(c["true"], c["pred"]) for c in got
                                    if c["true"] is not None and c["pred"] is not None]).reshape(-1, 2)
                rel = [c["rel_error"] for c in got if c["rel_error"] is not None]
                figures = over_samples(pairs_c[:, :1], pairs_c[:, 1:])
                summary["coefficients"][coefficient] = {
                    **{key: figures[key][0] if len(pairs_c) else None for key in ("mae", "r2", "spearman")},
                    "mean_rel_error": float(np.mean(rel)) if rel else None, "samples": len(pairs_c)}
            if note is not None:
                summary["note"] = note
        out[name] = summary
    return out
