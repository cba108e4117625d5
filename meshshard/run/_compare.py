"""A prediction beside a baseline: the table ``meshshard info PRED --compare BASE`` and
``meshshard predict ... --baseline BASE`` print, from the two folders' ``metrics.json`` alone.

Rows: per target the mean relative L2 error over the samples, and over the nodes near boundaries
(``--near``); per named boundary each target's
relative L2 on it and the force's relative error; per force component and per drag or lift
coefficient, the mean absolute error, R² and Spearman's rank correlation over the samples (as
:func:`meshshard.run._boundaries.over_samples` made them). The last column, for the errors, is
how many times the baseline's the model's is (above 1: the model is better).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshshard.partition import listed, read_json_inside

from ._pred_folder import MAX_METRICS_BYTES, METRICS_FILE, prediction_summary

__all__ = ["comparison_table"]


def _label(pred: str | Path, meta: dict[str, Any]) -> str:
    method = (meta.get("baseline") or {}).get("method")
    return f"{Path(pred).name} ({'baseline ' + str(method) if method else 'model'})"


def _rows(meta: dict[str, Any], mean: dict[str, Any]) -> dict[str, tuple[float | None, bool]]:
    """``{row label: (value, is an error)}`` of one folder."""
    rows: dict[str, tuple[float | None, bool]] = {}
    for field, e in mean.items():
        rows[f"{field} rel L2"] = (e.get("rel_l2"), True)
    near = meta.get("near") or {}
    for field, e in (near.get("fields") or {}).items():
        where = f"near {','.join(near.get('boundaries', []))}<={near.get('distance', 0):g}"
        rows[f"{where}: {field} rel L2"] = (e.get("rel_l2"), True)
    for wall, entry in (meta.get("boundaries") or {}).items():
        for field, e in (entry.get("fields") or {}).items():
            rows[f"{wall}: {field} rel L2"] = (e.get("rel_l2"), True)
        force = entry.get("force")
        if force:
            rows[f"{wall}: force rel error"] = (force.get("rel_error"), True)
            of = force.get("r2_of", "force")
            for k in range(len(force.get("r2") or [])):
                for key, label, error in (("mae", "MAE", True), ("r2", "R²", False), ("spearman", "Spearman", False)):
                    values = force.get(key) or []
                    rows[f"{wall}: {of}[{k}] {label}"] = (values[k] if k < len(values) else None, error)
        for name, c in (entry.get("coefficients") or {}).items():
            for key, label, error in (("mae", "MAE", True), ("r2", "R²", False), ("spearman", "Spearman", False)):
                rows[f"{wall}: {name} {label}"] = (c.get(key), error)
    return rows


def _figure(value: float | None, label: str) -> str:
    if value is None:
        return "-"
    return format(value, ".3%") if label.endswith(("rel L2", "rel error")) else format(value, ".4g")


def comparison_table(pred: str | Path, base: str | Path) -> str:
    """The table of ``pred``'s errors beside ``base``'s (two prediction folders, each with the
    ``metrics.json`` of ``meshshard predict`` or ``meshshard baseline``); a one-line
    ``ValueError`` for a folder without one. A note says when they scored different samples."""
    summaries, metas = [], []
    for folder in (pred, base):
        summaries.append(prediction_summary(folder))
        metas.append(read_json_inside(folder, METRICS_FILE, max_bytes=MAX_METRICS_BYTES))
    ours, theirs = (_rows(m, s["mean"]) for m, s in zip(metas, summaries))
    labels = list(dict.fromkeys([*ours, *theirs]))
    heads = [_label(pred, metas[0]), _label(base, metas[1])]
    width = max([len(x) for x in labels] + [10])
    lines = [f"{'':<{width}}  {heads[0]:>28}  {heads[1]:>28}  {'baseline / model':>16}"]
    for label in labels:
        a, error = ours.get(label, (None, True))
        b, _ = theirs.get(label, (None, True))
        ratio = f"{b / a:.3g}x" if error and a and b is not None else "-"
        lines.append(f"{label:<{width}}  {_figure(a, label):>28}  {_figure(b, label):>28}  {ratio:>16}")
    names = [[str(r["name"]) for r in s["samples"]] for s in summaries]
    if names[0] != names[1]:
        only = [n for n in names[0] if n not in set(names[1])] + [n for n in names[1] if n not in set(names[0])]
        lines.append(f"note: the two scored different samples ({len(names[0])} and {len(names[1])}; in one only: "
                     f"{listed(only) or 'none, in another order'})")
    return "\n".join(lines)
