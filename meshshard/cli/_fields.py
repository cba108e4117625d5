"""How the commands print a folder's fields and their statistics (``meshshard info``, ``dataset``):
shared by the dataset and trajectory commands, so neither imports the other back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["field_list", "stats_lines"]


def stats_lines(name: str, channels: list[str], stats: Mapping[str, Any]) -> list[str]:
    """The table of one group's statistics (``inputs``, ``targets``): a channel a line, mean, std, scale."""
    lines = [f"  {name:<8} {'channel':<12} {'mean':>12} {'std':>12} {'scale':>12}   ({stats['count']:,} rows)"]
    for ch, mean, std, scale in zip(channels, stats["mean"], stats["std"], stats["scale"]):
        lines.append(f"  {'':<8} {ch:<12} {mean:>12.5g} {std:>12.5g} {scale:>12.5g}")
    return lines


def field_list(fields: Sequence[Mapping[str, Any]]) -> str:
    """``T, u (3)``: field names, with the component count of vector fields."""
    return ", ".join(f["name"] if f["components"] == 1 else f"{f['name']} ({f['components']})" for f in fields)
