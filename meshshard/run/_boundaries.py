"""What ``meshshard predict --boundary NAMES`` adds to ``metrics.json``: errors on named
boundaries, and the force on them, predicted against true.

For each named boundary of the dataset (a patch of a foamToVTK ``.vtm``, a node set, a gmsh
physical group; ``meshshard info DATA`` lists them) and each sample:

- ``rel_l2`` per target field over the boundary's nodes (``||pred - true|| / ||true||``, a
  vector field as a vector): the near-wall error that a domain-wide figure hides;
- ``force``: the force the fluid exerts on the boundary, ``sum_i p_i a_i (+ tau_i |a_i|)``, from
  the pressure field (``--pressure``, default ``p``) and, when given, a wall shear stress field
  (``--shear``), with the area vectors ``a_i`` the dataset stores with the boundary
  (:mod:`meshshard.partition._surface`): ``true``, ``pred`` and ``rel_error`` ``|pred - true| /
  |true|``;
- with ``--force-reference EXPR`` (arithmetic of the sample's parameters, e.g. ``0.5*speed**2*0.025``):
  the force coefficients ``force / EXPR``.

Over the samples, ``boundaries[name]`` of the summary holds the mean errors and, per component,
the R² of the force (or coefficient) over the cases: ``1 - sum (pred - true)^2 / sum (true -
mean true)^2``, null with fewer than two cases or none that differ.

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

from meshshard.partition import boundary_force, check_expression, evaluate_expression, plural

__all__ = ["BoundaryScoring", "boundary_record", "boundary_rows", "boundary_summary", "boundary_sums",
           "check_boundary_names",
           "check_boundary_request"]


@dataclass(frozen=True)
class BoundaryScoring:
    """The boundaries to score and how (see the module docstring)."""

    names: tuple[str, ...]
    fields: tuple[tuple[str, slice], ...]  # the target fields, as predict slices them
    pressure: slice | None  # the pressure's channel among the targets; None: no force
    shear: slice | None
    reference: str | None
    dim: int

    @property
    def width(self) -> int:
        """Numbers summed per boundary: (sse, sst) per field, then the true and predicted force."""
        return 2 * len(self.fields) + (2 * self.dim if self.pressure is not None else 0)


def _split(text: str | Sequence[str] | None) -> tuple[str, ...]:
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(s.strip() for s in items if s.strip()))


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
                           samples: Sequence[int]) -> BoundaryScoring | None:
    """The scoring predict does, or None without ``--boundary``; a one-line ``ValueError`` for a
    boundary a sample's mesh lacks, a pressure or shear that is not a target of the right width, or
    a reference that is not arithmetic of the parameters. Raised on every rank before any collective."""
    if not _split(boundaries):
        if pressure or shear or reference:
            raise ValueError("Expected --boundary NAMES with --pressure, --shear or --force-reference (they say "
                             "how the force on those boundaries is made)")
        return None
    names = check_boundary_names(data, boundaries, reference, samples)
    by_name = dict(fields)
    dim = int(data.meta["meshes"][0]["pos_dim"])

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
    p = channel(p_name, 1, "pressure", "--pressure")
    tau = channel(shear, dim, "wall shear stress", "--shear")
    if tau is not None and p is None:
        raise ValueError("Expected a pressure field for the force (--pressure) with --shear")
    if reference is not None and p is None:
        raise ValueError("Expected a pressure field for the force (--pressure) with --force-reference")
    return BoundaryScoring(names, tuple(fields), p, tau, reference, dim)


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
            if scoring.reference is not None:
                ref = float(evaluate_expression(scoring.reference, parameters))
                if not math.isfinite(ref) or ref == 0.0:
                    raise ValueError(f"Expected --force-reference {scoring.reference!r} to be a finite non-zero "
                                     f"number for every sample (got {ref} for {parameters})")
                entry["coefficient"] = {"reference": ref,
                                        "true": [_finite(v / ref) for v in true_f] if truth else None,
                                        "pred": [_finite(v / ref) for v in pred_f]}
        record[name] = entry
    return record


def _r2(true: np.ndarray, pred: np.ndarray) -> list[float | None]:
    """Per column: the R² of ``pred`` against ``true`` over the rows (the cases)."""
    out: list[float | None] = []
    for t, p in zip(true.T, pred.T):
        spread = float(((t - t.mean()) ** 2).sum())
        out.append(_finite(1.0 - float(((p - t) ** 2).sum()) / spread) if len(t) > 1 and spread > 0 else None)
    return out


def boundary_summary(records: list[dict[str, Any]], scoring: BoundaryScoring) -> dict[str, Any]:
    """Per boundary, over the samples: mean errors, and the R² of the force (or coefficient) per component."""
    out: dict[str, Any] = {}
    for name in scoring.names:
        entries = [r["boundaries"][name] for r in records if r.get("boundaries")]
        summary: dict[str, Any] = {"fields": {}}
        for field, _ in scoring.fields:
            known = [e["fields"][field]["rel_l2"] for e in entries if e["fields"][field]["rel_l2"] is not None]
            summary["fields"][field] = {"rel_l2": float(np.mean(known)) if known else None}
        if scoring.pressure is not None:
            key = "coefficient" if scoring.reference is not None else "force"
            pairs = [(e[key]["true"], e[key]["pred"]) for e in entries
                     if e[key]["true"] is not None and None not in e[key]["true"] + e[key]["pred"]]
            errors = [e["force"]["rel_error"] for e in entries if e["force"]["rel_error"] is not None]
            summary["force"] = {"rel_error": float(np.mean(errors)) if errors else None,
                                "r2_of": key,
                                "r2": _r2(np.array([t for t, _ in pairs]), np.array([p for _, p in pairs]))
                                if pairs else [None] * scoring.dim}
        out[name] = summary
    return out
