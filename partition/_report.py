"""Human-readable summaries of a partition's metadata (``meshshard partition`` and ``info``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["print_summary"]

#: Parts listed one per row; beyond this the first and last few are shown.
MAX_ROWS = 32


def _rows(parts: list[Mapping[str, Any]]) -> list[Mapping[str, Any] | None]:
    """The parts to list, ``None`` standing for the ones left out."""
    if len(parts) <= MAX_ROWS:
        return list(parts)
    half = MAX_ROWS // 2
    return [*parts[:half], None, *parts[-half:]]


def print_summary(meta: Mapping[str, Any], seconds: Mapping[str, float] | None = None,
                  peak_mb: Mapping[str, float] | None = None, file: IO[str] | None = None
                  ) -> None:
    """Print a table of parts (owned, ghosts, edges, sends) and the totals.

    Args:
        meta: The partition's metadata.
        seconds: Wall time of each pipeline step, when known.
        peak_mb: Peak resident memory (MiB) during each step, when known.
        file: Where to print (default: stdout).
    """
    from rich.console import Console
    from rich.table import Table

    from ._text import plural

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    table = Table(title=f"{plural(meta['num_parts'], 'part')}, {meta['method']} on the "
                        f"{meta.get('graph')} graph, halo_hops={meta['halo_hops']}")
    for name in ("part", "owned", "ghosts", "edges", "sent rows"):
        table.add_column(name, justify="right")
    for part in _rows(meta["parts"]):
        if part is None:
            table.add_row("...", "", "", "", "")
            continue
        table.add_row(str(part["part"]), f"{part['num_owned']:,}", f"{part['num_ghost']:,}",
                      f"{part['num_edges']:,}", f"{part['num_send']:,}")
    console.print(table)
    cut = f"{meta['edge_cut']:,}"
    refinement = meta.get("refinement")
    if refinement:
        cut = (f"{refinement['edge_cut_before']:,} -> {cut} after refinement "
               f"({refinement['moved']:,} nodes moved)")
    lines = [
        f"nodes {meta['num_nodes']:,}   directed edges {meta['num_edges']:,}",
        f"edge cut {cut}",
        f"imbalance {meta['imbalance']:.4f} (max/mean owned)   "
        f"load imbalance {meta.get('load_imbalance', meta['imbalance']):.4f}",
        f"halo fraction {meta['halo_fraction']:.4f} (ghosts / nodes)",
    ]
    ghosts = meta.get("radius_ghosts")
    if meta.get("halo_radius") and isinstance(ghosts, list) and ghosts:
        lines.append(f"halo radius {meta['halo_radius']:g} (--radius: the largest ball radius of a model): "
                     f"{min(ghosts):,} to {max(ghosts):,} points of other parts within it per part")
    choice = meta.get("metis")
    if choice:
        tried = ", ".join(f"{c['variant']} {c['edge_cut']:,}" for c in choice["candidates"])
        lines.append(f"METIS {choice['variant']} kept (seed {choice['seed']}, ncuts "
                     f"{choice['ncuts']}; cuts: {tried})")
    if seconds:
        total = sum(seconds.values())
        steps = "  ".join(f"{name} {t:.2f}s" for name, t in seconds.items())
        lines.append(f"time {total:.2f}s: {steps}")
    if peak_mb:
        steps = "  ".join(f"{name} {mb:,.0f}" for name, mb in peak_mb.items())
        lines.append(f"peak memory {max(peak_mb.values()):,.0f} MiB: {steps}")
    for line in lines:
        console.print(line)
