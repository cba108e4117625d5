"""``meshshard plot``: a picture of a partition (matplotlib, Agg, imported only here)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._format import load_partition, read_metadata
from ._json_io import naming_write_errors

__all__ = ["plot_partition"]

#: Points drawn at most (a regular subsample of the nodes beyond this).
MAX_POINTS = 200_000


def plot_partition(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                   max_points: int = MAX_POINTS) -> Path:
    """Scatter the nodes coloured by owning rank, ghosts (halo nodes) outlined in black.

    3-D inputs get a 3-D view (unless flat in z). Needs coordinates in the partition.

    The picture is written to a temporary file beside ``out``, then renamed over it.

    Raises:
        ValueError: no coordinates. ImportError: matplotlib is missing. OSError: the picture
        cannot be written (``out`` is then as it was).
    """
    meta = read_metadata(path)
    if not meta.get("pos_dim"):
        raise ValueError(f"{path}: the partition has no coordinates to plot (a METIS graph file has none; "
                         f"meshshard info {path} describes it)")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'meshshard[plot]'") from None
    n = meta["num_nodes"]
    pos = np.empty((n, meta["pos_dim"]))
    owner = np.empty(n, dtype=np.int64)
    is_ghost = np.zeros(n, dtype=bool)
    for rank in range(meta["num_parts"]):
        p = load_partition(path, rank)
        pos[p.owned_ids] = p.pos[:p.num_owned]
        owner[p.owned_ids] = rank
        is_ghost[p.ghost_ids] = True
    keep = np.arange(0, n, max(1, -(-n // max_points)))
    pos, owner, is_ghost = pos[keep], owner[keep], is_ghost[keep]
    three_d = pos.shape[1] == 3 and np.ptp(pos[:, 2]) > 0
    fig = Figure(figsize=(8, 7), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(projection="3d" if three_d else None)
    coords = pos.T if three_d else pos[:, :2].T
    size = float(np.clip(4e4 / len(pos), 0.5, 30))
    cmap = "tab20" if meta["num_parts"] <= 20 else "turbo"
    ax.scatter(*coords, c=owner, cmap=cmap, vmin=0, vmax=max(meta["num_parts"] - 1, 1), s=size,
               linewidths=0)
    ax.scatter(*coords[:, is_ghost], facecolors="none", edgecolors="black", s=size * 2.5,
               linewidths=0.4, label="ghost (halo) nodes")
    if not three_d:
        ax.set_aspect("equal")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{meta['num_parts']} parts ({meta['method']}), edge cut {meta['edge_cut']:,}, "
                 f"imbalance {meta['imbalance']:.3f}, halo {meta['halo_fraction']:.1%}"
                 + (f", {len(keep):,} of {n:,} nodes shown" if len(keep) < n else ""),
                 fontsize=9)
    out = Path(out)
    # drawn beside --out and renamed over it: a failed write never leaves a truncated picture there
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with naming_write_errors(out):
            fig.savefig(tmp, format=out.suffix[1:].lower() or "png")
            os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
