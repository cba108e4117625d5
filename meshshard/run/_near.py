"""What ``--near PATCHES:DISTANCE`` adds to ``metrics.json`` (``meshshard predict`` and ``meshshard
baseline`` alike): each target's errors over the nodes near named boundaries, where a domain-wide
figure is dominated by the far field.

A node is *near* when its distance to the nearest node of the named boundaries is at most
``DISTANCE``, in the mesh's units (:func:`meshshard.data.nodes_near`; the boundary's own nodes
are at distance 0). ``PATCHES`` is comma-separated (``walls,inlet:0.05``);
``surface`` names every point of a surface sample. Per sample, ``near`` holds the boundaries, the
distance, ``num_nodes`` (how many nodes are near) and per target field its ``rmse`` and
``rel_l2`` (``||pred - true|| / ||true||`` over those nodes, a vector field as a vector); the
summary's ``near`` holds their means over the samples.

On shards each rank measures the distance of the nodes it owns only (the boundary's points are
small and read whole on every rank) and sums its errors; one ``all_reduce`` per sample adds the
sums, so the figures equal one process's to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshshard.comm import sum_across
from meshshard.data import nodes_near

from ._boundaries import check_boundary_names

__all__ = ["NearRegion", "check_near_request", "near_mask", "near_record", "near_summary", "parse_near"]


@dataclass(frozen=True)
class NearRegion:
    """The region of ``--near``: the nodes within ``distance`` of the boundaries ``names``."""

    names: tuple[str, ...]
    distance: float

    @property
    def label(self) -> str:
        """``walls<=0.05``: the region as the tables name it."""
        return f"{','.join(self.names)}<={self.distance:g}"


def parse_near(text: str) -> NearRegion:
    """``PATCHES:DISTANCE`` (comma-separated boundary names, a finite distance >= 0); a one-line
    ``ValueError`` otherwise."""
    names, _, value = str(text).rpartition(":")
    try:
        distance = float(value)
    except ValueError:
        distance = math.nan
    picked = tuple(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
    if not picked or not math.isfinite(distance) or distance < 0:
        raise ValueError(f"Expected --near PATCHES:DISTANCE, boundary names and a distance >= 0 "
                         f"(e.g. walls:0.05; got {text!r})")
    return NearRegion(picked, distance)


def check_near_request(data: Any, near: str | None, samples: list[int]) -> NearRegion | None:
    """The region of ``--near`` (None without it); a one-line ``ValueError`` for a malformed one
    or a boundary a sample's mesh lacks. Raised on every rank before any collective."""
    if near is None:
        return None
    region = parse_near(near)
    try:
        check_boundary_names(data, region.names, None, samples)
    except ValueError as err:
        raise ValueError(str(err).replace("--boundary", "--near")) from None
    return region


def near_mask(data: Any, mesh: int, owned_ids: np.ndarray, region: NearRegion) -> np.ndarray:
    """Which of this rank's owned nodes (``owned_ids``, sorted global ids) are within the region's
    distance of its boundaries, ``(N_own,)`` bool (:func:`meshshard.data.nodes_near`: the same node
    gets the same answer on any number of ranks). No communication."""
    return nodes_near(data, mesh, owned_ids, region.names, region.distance)


def near_record(mask: np.ndarray, pred: np.ndarray, truth: np.ndarray | None, fields: list[tuple[str, slice]],
                region: NearRegion, ctx: Any) -> dict[str, Any]:
    """One sample's ``near`` entry: the errors over this rank's near rows, added over the ranks
    (one ``sum_across``, a collective every rank enters). ``truth`` None: the count alone."""
    rows = np.flatnonzero(mask)
    sums = [float(len(rows))]
    for _, sl in fields:
        if truth is None:
            sums += [0.0, 0.0]
            continue
        err = pred[rows, sl] - truth[rows, sl]
        sums += [float((err ** 2).sum()), float((truth[rows, sl] ** 2).sum())]
    total = sum_across(np.array(sums), None, ctx.device)
    count = int(round(float(total[0])))
    out: dict[str, Any] = {"boundaries": list(region.names), "distance": region.distance, "num_nodes": count,
                           "fields": {}}
    for k, (name, sl) in enumerate(fields):
        sse, sst = float(total[1 + 2 * k]), float(total[2 + 2 * k])
        known = truth is not None and count > 0 and math.isfinite(sse)
        width = sl.stop - sl.start
        out["fields"][name] = {"rmse": math.sqrt(sse / (count * width)) if known else None,
                               "rel_l2": math.sqrt(sse / sst) if known and sst > 0 else None}
    return out


def near_summary(records: list[dict[str, Any]], region: NearRegion, fields: list[tuple[str, slice]]) -> dict[str, Any]:
    """The summary's ``near``: per field the mean RMSE and relative L2 over the samples that have them."""
    entries = [r["near"] for r in records if r.get("near")]
    out: dict[str, Any] = {"boundaries": list(region.names), "distance": region.distance, "fields": {}}
    for name, _ in fields:
        out["fields"][name] = {}
        for key in ("rmse", "rel_l2"):
            known = [e["fields"][name][key] for e in entries if e["fields"][name][key] is not None]
            out["fields"][name][key] = float(np.mean(known)) if known else None
    return out
