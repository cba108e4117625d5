"""The pictures of ``--boundary`` (``meshshard predict`` and ``meshshard baseline`` alike):

- ``PRED/<sample>_boundaries.png``: each target field (the pressure first; a vector field as its
  magnitude) along each named boundary, truth against prediction, one row per boundary. Along
  what (:func:`boundary_order`): in 2-D, a *closed* boundary (one that goes round its centroid:
  ordered by the angle about the centroid, no gap between neighbouring angles of a quarter turn
  or more) against the arc length, starting at the node nearest the direction +x from the
  centroid and going counter-clockwise (an airfoil's trailing edge first, for a flow along +x);
  an open 2-D boundary, and any 3-D one, against the coordinate along which it extends most. At
  most :data:`BOUNDARY_PLOT_MAX_POINTS` nodes per boundary (those whose global id is a multiple
  of a stride, so the same nodes on any number of ranks).
- ``PRED/forces.png``: the force coefficients of every case, predicted against true, with the
  diagonal: the drag and lift coefficients with ``--direction`` (and ``--lift-direction``), else
  each component of the coefficient (with a reference) or of the force; written when at least
  two cases have a known force.

Drawn on rank 0 from rows every rank contributes (one gather per sample); a picture that cannot
be drawn never fails the prediction (:func:`meshshard.run._pictures.sample_picture` alike).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import gather_rows

from ._pictures import _drawn

__all__ = ["BOUNDARY_PLOT_MAX_POINTS", "boundary_order", "boundary_picture", "forces_picture"]

#: Nodes of one boundary drawn at most.
BOUNDARY_PLOT_MAX_POINTS = 20_000


def boundary_order(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """The order in which a boundary's nodes ``pos`` ``(n, D)`` are drawn, the coordinate of each
    along it (in that order) and its name (the rules are the module docstring's)."""
    pos = np.asarray(pos, dtype=np.float64)
    if not len(pos):
        return np.zeros(0, dtype=np.int64), np.zeros(0), "x"
    if pos.shape[1] == 2 and len(pos) >= 3:
        rel = pos - pos.mean(0)
        angle = np.mod(np.arctan2(rel[:, 1], rel[:, 0]), 2 * np.pi)
        order = np.argsort(angle, kind="stable")
        ring = angle[order]
        gaps = np.diff(np.concatenate([ring, ring[:1] + 2 * np.pi]))
        if gaps.max() < np.pi / 2:
            steps = np.linalg.norm(np.diff(pos[order], axis=0), axis=1)
            return order, np.concatenate([[0.0], np.cumsum(steps)]), "arc length (counter-clockwise from +x)"
    axis = int(np.argmax(np.ptp(pos, axis=0)))
    order = np.argsort(pos[:, axis], kind="stable")
    return order, pos[order, axis], "xyz"[axis]


def _pressure_first(fields: list[tuple[str, slice]], pressure: slice | None) -> list[tuple[str, slice]]:
    return sorted(fields, key=lambda f: 0 if pressure is not None and f[1] == pressure else 1)


def _gather(walls: list[tuple[np.ndarray, np.ndarray]], sizes: list[int], layout: Any, pos: np.ndarray,
            y: np.ndarray, pred: np.ndarray, ctx: Any) -> np.ndarray | None:
    """Every rank's drawn rows of every boundary ``[b, pos, y, pred]`` on rank 0 (a collective)."""
    blocks = []
    for b, ((rows, _), size) in enumerate(zip(walls, sizes)):
        stride = max(1, math.ceil(size / BOUNDARY_PLOT_MAX_POINTS))
        rows = rows[layout.owned_ids[rows] % stride == 0]
        blocks.append(np.concatenate([np.full((len(rows), 1), float(b)), pos[rows], y[rows], pred[rows]], axis=1))
    return gather_rows(np.concatenate(blocks) if blocks else np.zeros((0, 1 + pos.shape[1] + y.shape[1]
                                                                       + pred.shape[1])), None, ctx.device)


def _values(a: np.ndarray, order: np.ndarray, sl: slice) -> np.ndarray:
    """Field ``sl`` of rows ``a`` in ``order``: a scalar, or a vector's magnitude."""
    return np.linalg.norm(a[order, sl], axis=1) if sl.stop - sl.start > 1 else a[order, sl][:, 0]


def _panels(path: Path, title: str, shape: tuple[int, int], size: tuple[float, float],
            panels: list[Callable[[Any], tuple[str, str, str | None, bool]]]) -> bool:
    """A figure of ``shape`` (rows, columns) axes, ``size`` inches each (and 0.5 for the title),
    row by row one per ``panels`` entry (the rest hidden): each draws on its axes and returns
    ``(title, x label, y label or None, legend)``, and every panel gets the same type sizes and
    grid; saved at ``path``. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows, cols = shape
    width, height = size[0] * cols, size[1] * rows + 0.5
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), dpi=100, squeeze=False)
    # margins in inches, no layout engine (tight_layout took a third of the picture's time): room for
    # the tick labels and a y label on the left, the x label below, the figure's and the panels' titles
    left, right, top, bottom, gap_x, gap_y = 0.85, 0.2, 0.85, 0.55, 0.95, 0.95
    panel_w = (width - left - right - (cols - 1) * gap_x) / cols
    panel_h = (height - top - bottom - (rows - 1) * gap_y) / rows
    fig.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height,
                        wspace=gap_x / panel_w, hspace=gap_y / panel_h)
    try:
        for ax in axes.ravel()[len(panels):]:
            ax.set_visible(False)
        for ax, draw in zip(axes.ravel(), panels):
            name, xlabel, ylabel, legend = draw(ax)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            if ylabel is not None:
                ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
            if legend:
                ax.legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return True


def plot_boundaries(path: Path, title: str, walls: list[tuple[str, np.ndarray, np.ndarray | None, np.ndarray]],
                    fields: list[tuple[str, slice]]) -> bool:
    """One row per boundary ``(name, pos, truth or None, pred)``, one column per field: the truth
    (a black line) and the prediction (red) along the boundary; False without matplotlib."""

    def panel(row: int, wall: tuple[str, np.ndarray, np.ndarray | None, np.ndarray], field: str,
              sl: slice) -> Callable[[Any], tuple[str, str, str | None, bool]]:
        def draw(ax: Any) -> tuple[str, str, str | None, bool]:
            name, pos, truth, pred = wall
            order, along, label = boundary_order(pos)
            lines = pos.shape[1] == 2 and len(pos) <= 4000
            style = {"lw": 1.4} if lines else {"ls": "none", "marker": ".", "ms": 2}
            if truth is not None:
                ax.plot(along, _values(truth, order, sl), color="black", label="truth", **style)
            ax.plot(along, _values(pred, order, sl), color="tab:red", label="prediction",
                    **({"lw": 1.2, "ls": "--"} if lines else style))
            shown = f"|{field}|" if sl.stop - sl.start > 1 else field
            return f"{shown} on {name}", label, None, row == 0 and sl == fields[0][1]
        return draw

    panels = [panel(row, wall, field, sl) for row, wall in enumerate(walls) for field, sl in fields]
    return _panels(path, title, (len(walls), len(fields)), (4.8, 3.2), panels)


def boundary_picture(path: Path, name: str, data: Any, mesh: int, walls: list[tuple[np.ndarray, np.ndarray]],
                     layout: Any, y: np.ndarray | None, pred: np.ndarray, fields: list[tuple[str, slice]],
                     scoring: Any, ctx: Any) -> str | None:
    """``PRED/<sample>_boundaries.png`` on rank 0 (None elsewhere, or when it cannot be drawn);
    every rank takes part in the one gather. ``walls``: this rank's rows on each boundary
    (:func:`meshshard.run._boundaries.boundary_rows`); ``y`` None: the prediction alone."""
    entry = data.meta["meshes"][mesh]
    stored = {str(b["name"]): int(b["num_nodes"]) for b in entry.get("boundaries", [])}
    sizes = [stored.get(n, int(entry["num_nodes"])) for n in scoring.names]
    pos = np.asarray(data.mesh_points(mesh)[layout.owned_ids], dtype=np.float64)
    known = y is not None and y.shape[1] > 0
    rows = _gather(walls, sizes, layout, pos, y if known else np.zeros((len(pred), 0)), pred, ctx)
    if rows is None:
        return None
    d, k = pos.shape[1], (pred.shape[1] if known else 0)
    parts = []
    for b, wall in enumerate(scoring.names):
        mine = rows[rows[:, 0] == b]
        parts.append((wall, mine[:, 1:1 + d], mine[:, 1 + d:1 + d + k] if known else None, mine[:, 1 + d + k:]))
    title = f"{name}: {'truth and prediction' if known else 'prediction'} along the boundaries"
    return _drawn(path, name, "boundary node", lambda: plot_boundaries(
        path, title, parts, _pressure_first(fields, scoring.pressure)), len(rows))


def _force_pairs(records: list[dict[str, Any]], scoring: Any, wall: str) -> list[tuple[str, np.ndarray]]:
    """Per drawn quantity, ``(label, (cases, 2) true and predicted)``, of the cases that know both."""
    entries = [r["boundaries"][wall] for r in records if r.get("boundaries", {}).get(wall)]
    out = []
    if scoring.directions:
        for coefficient, _ in scoring.directions:
            got = [e["coefficients"][coefficient] for e in entries if "coefficients" in e]
            pairs = [(c["true"], c["pred"]) for c in got if c["true"] is not None and c["pred"] is not None]
            out.append((f"{coefficient} coefficient", np.array(pairs, dtype=np.float64).reshape(-1, 2)))
        return out
    key = "coefficient" if scoring.has_coefficients else "force"
    rows = [(e[key]["true"], e[key]["pred"]) for e in entries
            if e.get(key) and e[key]["true"] is not None and None not in e[key]["true"] + e[key]["pred"]]
    for k in range(scoring.dim):
        pairs = np.array([(t[k], p[k]) for t, p in rows], dtype=np.float64).reshape(-1, 2)
        out.append((f"{key} {'xyz'[k]}", pairs))
    return out


def plot_forces(path: Path, panels: list[tuple[str, str, np.ndarray]], title: str) -> bool:
    """One panel per ``(boundary, quantity, (cases, 2) true and predicted)``: the cases as points,
    the diagonal as a line; False without matplotlib."""

    def panel(wall: str, what: str, pairs: np.ndarray) -> Callable[[Any], tuple[str, str, str | None, bool]]:
        def draw(ax: Any) -> tuple[str, str, str | None, bool]:
            lo, hi = float(pairs.min()), float(pairs.max())
            pad = 0.05 * (hi - lo) or 0.05 * max(abs(hi), 1e-30)
            ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=1, label="prediction = truth")
            ax.plot(pairs[:, 0], pairs[:, 1], "o", color="tab:blue", ms=4, label=f"{len(pairs)} cases")
            ax.set_aspect("equal", adjustable="datalim")
            return f"{what} on {wall}", f"true {what}", f"predicted {what}", True
        return draw

    cols = min(3, len(panels))
    shape = (math.ceil(len(panels) / cols), cols)
    return _panels(path, title, shape, (4.0, 3.8), [panel(*p) for p in panels])


def forces_picture(path: Path, records: list[dict[str, Any]], scoring: Any, title: str) -> str | None:
    """``PRED/forces.png`` (rank 0, no communication): None without a force or with fewer than two
    cases that know theirs, or when it cannot be drawn (with a note)."""
    if scoring is None or scoring.pressure is None:
        return None
    panels = [(wall, what, pairs) for wall in scoring.names for what, pairs in _force_pairs(records, scoring, wall)
              if len(pairs) >= 2 and np.isfinite(pairs).all()]
    if not panels:
        return None
    try:
        ok = plot_forces(path, panels, title)
    except Exception as err:  # noqa: BLE001 - anything matplotlib raises
        print(f"meshshard predict: note: no picture of the forces ({type(err).__name__}: {err}); the files and "
              "metrics are written", file=sys.stderr, flush=True)
        return None
    return path.name if ok else None
