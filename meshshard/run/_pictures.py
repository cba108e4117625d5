"""``PRED/<sample>.png``: truth, prediction and error side by side, drawn on rank 0 from rows that
every rank contributes (a strided subsample of at most :data:`PLOT_MAX_NODES`; a slab through
the middle plane of a 3-D mesh). A point cloud or surface (:func:`plot_cloud`) is drawn as
points coloured by the field: a 3-D one seen from three sides (side along y, top along z, front
along x), the nearer points drawn over the farther; a 2-D one as one scatter; of at most
:data:`CLOUD_PLOT_MAX_POINTS` points (those whose global id is a multiple of a stride, so the
same points on any number of ranks). A picture that cannot be drawn never fails the prediction.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.comm import gather_rows, max_across, sum_across

__all__ = ["ANIMATION_MAX_FRAMES", "CLOUD_PLOT_MAX_POINTS", "PLOT_MAX_NODES", "RolloutFrames", "animation_steps",
           "cloud_rows", "gather_plot_rows", "plot_cloud", "plot_rows", "plot_sample", "rollout_animation",
           "sample_picture"]


#: Nodes drawn in one picture at most (a strided subsample beyond that).
PLOT_MAX_NODES = 200_000
#: Points of a point cloud drawn at most (every panel draws them all).
CLOUD_PLOT_MAX_POINTS = 40_000
#: The three views of a 3-D cloud: (name, horizontal axis, vertical axis, depth axis, viewer on the + side).
_VIEWS = (("side (along y)", 0, 2, 1, False), ("top (along z)", 0, 1, 2, True), ("front (along x)", 1, 2, 0, False))

#: Frames of a rollout's animation at most (its steps subsampled evenly beyond that).
ANIMATION_MAX_FRAMES = 60


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
                fields: list[tuple[str, slice]], triangles: np.ndarray | None, note: str,
                view: tuple[float, float, float, float] | None = None) -> bool:
    """Truth, prediction and error side by side, one row per target field (the prediction alone
    when ``truth`` is None); False without matplotlib. ``view`` ``(xmin, xmax, ymin, ymax)``
    frames every panel, and the colour ranges are those of the nodes inside it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cols = 1 if truth is None else 3
    seen = np.ones(len(pos), dtype=bool)
    if view is not None:
        seen = (pos[:, 0] >= view[0]) & (pos[:, 0] <= view[1]) & (pos[:, 1] >= view[2]) & (pos[:, 1] <= view[3])
        if not seen.any():
            raise ValueError(f"no node inside the view x in [{view[0]:.4g}, {view[1]:.4g}], y in "
                             f"[{view[2]:.4g}, {view[3]:.4g}]")
    height = 3.6 * len(fields) + 0.4
    fig, axes = plt.subplots(len(fields), cols, figsize=(4.6 * cols, height), dpi=110, squeeze=False)
    fig.subplots_adjust(left=0.02, right=0.96, bottom=0.03, top=1 - 0.8 / height, wspace=0.3,
                        hspace=0.22)  # no layout engine: tight_layout took half of the picture's time
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
            lim = max(float(np.abs(err[seen]).max()) if len(err) else 0.0, 1e-30)
            lo, hi = float(min(t[seen].min(), p[seen].min())), float(max(t[seen].max(), p[seen].max()))
            panels = ((t, "truth", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (p, "prediction", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (err, "error (prediction - truth)", {"vmin": -lim, "vmax": lim, "cmap": "RdBu_r"}))
            for col, (values, what, kw) in enumerate(panels[1:2] if truth is None else panels):
                ax = axes[row, col]
                if tri is not None:
                    art = ax.tripcolor(tri, values, shading="gouraud", **kw)
                else:
                    art = ax.scatter(pos[:, 0], pos[:, 1], c=values, s=max(0.3, 3000 / max(len(values), 1)),
                                     linewidths=0, **kw)
                ax.set_aspect("equal")
                if view is not None:
                    ax.set_xlim(view[0], view[1])
                    ax.set_ylim(view[2], view[3])
                ax.set_title(f"{label}: {what}", fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
                fig.colorbar(art, ax=ax, shrink=0.8)
        if view is not None:
            note += f"; framed on x in [{view[0]:.4g}, {view[1]:.4g}], y in [{view[2]:.4g}, {view[3]:.4g}]"
        fig.suptitle(f"{title}\n{note}", fontsize=10)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return True


def cloud_rows(owned_ids: np.ndarray, num_points: int) -> np.ndarray:
    """The owned rows of a point cloud to draw: those whose global id is a multiple of
    ``ceil(N / CLOUD_PLOT_MAX_POINTS)`` (no communication; the same points on any number of ranks)."""
    stride = max(1, math.ceil(num_points / CLOUD_PLOT_MAX_POINTS))
    return np.flatnonzero(np.asarray(owned_ids) % stride == 0)


def _scalar(values: np.ndarray, name: str) -> tuple[np.ndarray, str]:
    return (np.linalg.norm(values, axis=1), f"|{name}|") if values.shape[1] > 1 else (values[:, 0], name)


def plot_cloud(path: Path, title: str, pos: np.ndarray, truth: np.ndarray | None, pred: np.ndarray,
               fields: list[tuple[str, slice]], note: str) -> bool:
    """Truth, prediction and error (columns; the prediction alone when ``truth`` is None) at the
    points of a cloud, per target field one row (2-D) or three (3-D: side, top and front views,
    equal aspect, the points nearest the viewer drawn last). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    views = _VIEWS if pos.shape[1] == 3 else (("", 0, 1, None, False),)
    cols = 1 if truth is None else 3
    rows = len(fields) * len(views)
    size = max(0.2, min(6.0, 4000 / max(len(pos), 1)))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 0.6), dpi=90, squeeze=False)
    fig.subplots_adjust(left=0.06, right=0.97, bottom=0.04, top=1 - 0.9 / (3.4 * rows + 0.6), wspace=0.35,
                        hspace=0.45)  # no layout engine: it costs more than the drawing
    try:
        for f, (name, sl) in enumerate(fields):
            p, label = _scalar(pred[:, sl], name)
            t = p if truth is None else _scalar(truth[:, sl], name)[0]
            err = p - t
            lo, hi = float(min(t.min(), p.min())), float(max(t.max(), p.max()))
            lim = max(float(np.abs(err).max()), 1e-30)
            panels = ((t, "truth", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (p, "prediction", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (err, "error (prediction - truth)", {"vmin": -lim, "vmax": lim, "cmap": "RdBu_r"}))
            for v, (view, h, w, depth, plus) in enumerate(views):
                order = np.arange(len(pos)) if depth is None else np.argsort(pos[:, depth] * (1 if plus else -1),
                                                                              kind="stable")
                for col, (values, what, kw) in enumerate(panels[1:2] if truth is None else panels):
                    ax = axes[f * len(views) + v, col]
                    art = ax.scatter(pos[order, h], pos[order, w], c=values[order], s=size, linewidths=0, **kw)
                    ax.set_aspect("equal")
                    ax.set_title(f"{label}: {what}" + (f", {view}" if view else ""), fontsize=9)
                    ax.set_xlabel("xyz"[h], fontsize=8)
                    ax.set_ylabel("xyz"[w], fontsize=8)
                    ax.set_xticks([])  # the views' coordinates are the axis names: ticks cost most of the drawing
                    ax.set_yticks([])
                    fig.colorbar(art, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
        fig.suptitle(f"{title}\n{note}", fontsize=10)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return True


def plot_rows(pos: np.ndarray, num_nodes: int, group: Any, device: Any) -> np.ndarray:
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
        extent = max_across([-z.min(), z.max()] if len(z) else [-np.inf, -np.inf], group, device)
        low, high = -extent[0], extent[1]
        gap = np.abs(z - (low + high) / 2) if len(z) else z  # distance to the middle plane
        nearest = -max_across([-gap.min() if len(z) else -np.inf], group, device)[0]
        here = z[gap == nearest]  # this rank's nodes nearest the middle plane (exact: max returns an input)
        centre = -max_across([-here.min() if len(here) else -np.inf], group, device)[0]
        slab = (high - low) / max(8.0, round(num_nodes ** (1 / 3)) / 2)
        take = np.flatnonzero(np.abs(z - centre) <= slab / 2) if np.isfinite(centre) else take[:0]
        total = sum_across(np.array([len(take)]), group, device)[0]
    else:
        total = num_nodes
    stride = max(1, math.ceil(total / PLOT_MAX_NODES))
    return take[::stride]




def gather_plot_rows(layout: Any, take: np.ndarray, y: np.ndarray, pred: np.ndarray,
                     ctx: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, str] | None:
    """The rows ``take`` (of :func:`plot_rows`) of every rank gathered on rank 0: positions, truth
    ``y``, prediction and the note saying what they are (the slab of a 3-D mesh); None on the
    other ranks (a collective every rank enters alike)."""
    dim = layout.pos_owned.shape[1]
    rows = gather_rows(np.concatenate([layout.pos_owned[take], y[take], pred[take]], axis=1), None, ctx.device)
    if rows is None:
        return None
    pos = rows[:, :dim]
    note = f"{len(rows):,} of {layout.num_nodes:,} nodes"
    if dim == 3 and len(rows):
        low, high = pos[:, 2].min(), pos[:, 2].max()
        where = f"z = {low:.4g}" if low == high else f"{low:.4g} <= z <= {high:.4g}"
        note += f": those at {where} (a slab through the nodes nearest the middle plane), seen along z"
    return pos, rows[:, dim:dim + y.shape[1]], rows[:, dim + y.shape[1]:], note


def sample_picture(path: Path, name: str, layout: Any, y: np.ndarray | None, pred: np.ndarray, gathered: bool,
                   full: tuple[Any, ...] | None, fields: list[tuple[str, slice]], ctx: Any,
                   view: tuple[float, float, float, float] | None = None, cloud: bool = False) -> str | None:
    """``PRED/<sample>.png`` on rank 0; every rank takes part in gathering the drawn nodes, and the
    branch taken depends only on what all ranks know (``gathered``, the mesh's size and dimension).
    ``y`` None: no known targets, the prediction alone is drawn. ``cloud``: a point cloud or
    surface, drawn by :func:`plot_cloud` (``view`` does not apply)."""
    dim = layout.pos_owned.shape[1]
    if y is None:
        y = np.zeros((len(pred), 0))
    if cloud:
        take = cloud_rows(layout.owned_ids, layout.num_nodes)
        rows = gather_rows(np.concatenate([layout.pos_owned[take], y[take], pred[take]], axis=1), None, ctx.device)
        if rows is None:
            return None
        pos, truth, values = rows[:, :dim], rows[:, dim:dim + y.shape[1]], rows[:, dim + y.shape[1]:]
        known = truth.shape[1] > 0
        note = (f"{len(rows):,} of {layout.num_nodes:,} points" + (", seen from three sides" if dim == 3 else ""))
        return _drawn(path, name, "point", lambda: plot_cloud(
            path, f"{name}: {'truth, prediction, error' if known else 'prediction'}", pos, truth if known else None,
            values, fields, note), len(pos))
    if gathered and dim == 2 and layout.num_nodes <= PLOT_MAX_NODES:
        if full is None:
            return None
        pos, truth, values, tri = full
        note = f"{layout.num_nodes:,} nodes"
    else:
        taken = gather_plot_rows(layout, plot_rows(layout.pos_owned, layout.num_nodes, None, ctx.device), y, pred,
                                 ctx)
        if taken is None:
            return None
        pos, truth, values, note = taken
        tri = None
    known = truth is not None and truth.shape[1] > 0
    return _drawn(path, name, "node", lambda: plot_sample(
        path, f"{name}: {'truth, prediction, error' if known else 'prediction'}", pos, truth if known else None,
        values, fields, tri, note, view), len(pos))


def _drawn(path: Path, name: str, what: str, draw: Any, count: int) -> str | None:
    """``path``'s name once ``draw()`` has drawn it (True; False: no matplotlib), else None with a
    note: a picture that cannot be drawn never fails the prediction (only rank 0 is here: no
    collective). ``count``: the points to draw, ``what`` they are called."""
    try:
        if not count:
            raise ValueError(f"no {what} to draw")
        ok = draw()
    except Exception as err:  # noqa: BLE001 - anything matplotlib raises
        print(f"meshshard predict: note: no picture of {name} ({type(err).__name__}: {err}); the files and metrics "
              "are written", file=sys.stderr, flush=True)
        return None
    if not ok:
        print("meshshard predict: note: matplotlib is not installed, so no pictures (pip install matplotlib)",
              flush=True)
    return path.name if ok else None


def animation_steps(last: int, most: int = ANIMATION_MAX_FRAMES) -> list[int]:
    """The steps ``0 .. last`` an animation shows: all of them, or ``most`` spread evenly (the
    first and the last included)."""
    if last < 0:
        return []
    return sorted({int(v) for v in np.linspace(0, last, min(most, last + 1)).round()})


def _scalars(values: np.ndarray, fields: list[tuple[str, slice]]) -> np.ndarray:
    """``(n, len(fields))`` float32: each field's value, or its magnitude for a vector field."""
    cols = [np.linalg.norm(values[:, sl], axis=1) if sl.stop - sl.start > 1 else values[:, sl.start]
            for _, sl in fields]
    return np.stack(cols, axis=1).astype(np.float32) if cols else np.zeros((len(values), 0), np.float32)


class RolloutFrames:
    """What rank 0 keeps of a rollout for its animation: the drawn nodes' positions (and the mesh's
    triangles, 2-D) and, per frame, each field's truth and prediction (magnitudes of vectors)."""

    def __init__(self, fields: list[tuple[str, slice]]) -> None:
        self.fields = fields
        self.pos: np.ndarray | None = None
        self.triangles: np.ndarray | None = None
        self.note = ""
        self.frames: list[tuple[int, float, np.ndarray, np.ndarray]] = []  # (step, time, truth, pred)

    def add(self, step: int, time: float, pos: np.ndarray, truth: np.ndarray, pred: np.ndarray,
            triangles: np.ndarray | None, note: str) -> None:
        """Keep one frame (the positions and triangles of the first)."""
        if self.pos is None:
            self.pos, self.triangles, self.note = np.asarray(pos), triangles, note
        self.frames.append((step, time, _scalars(truth, self.fields), _scalars(pred, self.fields)))


def rollout_animation(path: Path, title: str, kept: RolloutFrames, fps: float = 8.0) -> bool:
    """``PRED/<trajectory>.gif``: truth, prediction and error side by side, one row per state field,
    one frame per kept step, the colour ranges fixed over the whole rollout (so the frames compare);
    False without matplotlib or Pillow."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.animation import PillowWriter
    except ImportError:
        return False
    if kept.pos is None or not kept.frames:
        raise ValueError("no frame to draw")
    pos, fields = kept.pos, kept.fields
    truth = np.stack([f[2] for f in kept.frames])  # (frames, n, fields)
    pred = np.stack([f[3] for f in kept.frames])
    err = pred - truth
    fig, axes = plt.subplots(len(fields), 3, figsize=(13.8, 3.6 * len(fields)), dpi=80, squeeze=False)
    try:
        tri = _triangulation(pos, kept.triangles)
        arts = []
        for row, (name, sl) in enumerate(fields):
            label = f"|{name}|" if sl.stop - sl.start > 1 else name
            lo = float(min(np.nanmin(truth[..., row]), np.nanmin(pred[..., row])))
            hi = float(max(np.nanmax(truth[..., row]), np.nanmax(pred[..., row])))
            lim = max(float(np.nanmax(np.abs(err[..., row]))), 1e-30)
            panels = ((truth, "truth", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (pred, "prediction", {"vmin": lo, "vmax": hi, "cmap": "viridis"}),
                      (err, "error (prediction - truth)", {"vmin": -lim, "vmax": lim, "cmap": "RdBu_r"}))
            for col, (values, what, kw) in enumerate(panels):
                ax = axes[row, col]
                first = values[0, :, row]
                if tri is not None:
                    art = ax.tripcolor(tri, first, shading="gouraud", **kw)
                else:
                    art = ax.scatter(pos[:, 0], pos[:, 1], c=first, s=max(0.3, 3000 / max(len(first), 1)),
                                     linewidths=0, **kw)
                arts.append((art, values, row))
                ax.set_aspect("equal")
                ax.set_title(f"{label}: {what}", fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
                fig.colorbar(art, ax=ax, shrink=0.8)
        heading = fig.suptitle("", fontsize=10)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        writer = PillowWriter(fps=fps)
        with writer.saving(fig, str(path), dpi=80):
            for i, (step, time, _, _) in enumerate(kept.frames):
                for art, values, row in arts:
                    art.set_array(values[i, :, row])
                heading.set_text(f"{title}: step {step}, t = {time:.6g}\n{kept.note}")
                writer.grab_frame()
    finally:
        plt.close(fig)
    return True
