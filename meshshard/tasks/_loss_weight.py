"""``meshshard train --loss-weight NAME=W[,NAME=W]``: a loss that weights the rows of named
boundaries.

Each node has a weight: the largest ``W`` among the weighted boundaries it lies on (a corner of two),
1 on none. The loss is the weighted mean

    sum_i w_i |e_i|^2 / (F * sum_i w_i)

over every node ``i`` of the mesh and the ``F`` target channels (``e_i`` the normalised error of
node ``i``); with every weight 1 it is the plain mean squared error. On shards, each rank sums
``w_i |e_i|^2`` over its owned rows and the sum over the ranks is the one all-reduce of
:meth:`~meshshard.ShardTensor.sum`; the denominator ``sum_i w_i`` is the same number on every
rank, counted from the dataset's boundary node lists (a boundary is a small part of a mesh, read
whole once per mesh), so it costs no communication and the loss and every gradient equal the
single-process computation.

A boundary is named as ``meshshard info DATA`` lists it (a ``.vtm``'s patches, node sets, gmsh
physical groups, ``surface`` for a surface sample); a name on none of the dataset's meshes is
refused in one line before any rank starts, listing the names there are. A mesh without a named
boundary weighs its nodes 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BoundaryWeights", "check_loss_weight", "parse_loss_weight"]


def parse_loss_weight(value: str | Sequence[str] | Mapping[str, Any] | None) -> dict[str, float]:
    """``{name: W}`` from ``"walls=10,inlet=2"``, a list of such strings (the flag repeated) or a
    table (a recipe's ``loss_weight = {walls = 10.0}``); every ``W`` a finite number above 0.
    One-line ``ValueError`` otherwise."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        items = [value] if isinstance(value, str) else list(value)
        pairs = []
        for item in items:
            for part in str(item).split(","):
                name, eq, weight = part.partition("=")
                if not eq or not name.strip():
                    raise ValueError(f"Expected --loss-weight as NAME=W[,NAME=W] (got {str(item)!r})")
                pairs.append((name.strip(), weight.strip()))
    out: dict[str, float] = {}
    for name, weight in pairs:
        try:
            w = float(weight) if not isinstance(weight, bool) else math.nan
        except (TypeError, ValueError):
            w = math.nan
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"Expected --loss-weight {name}=W with W a positive number (got {weight!r})")
        if name in out and out[name] != w:
            raise ValueError(f"Expected --loss-weight to weigh {name} once (got {out[name]:g} and {w:g})")
        out[name] = w
    return out


def _dataset_boundaries(dataset: Any) -> list[str]:
    """Every boundary name of the dataset's meshes, in first-seen order."""
    names: dict[str, None] = {}
    for m in range(len(dataset.meta["meshes"])):
        names.update(dict.fromkeys(dataset.boundary_names(m)))
    return list(names)


def check_loss_weight(dataset: Any, weights: Mapping[str, float], max_points: int = 0) -> None:
    """Refuse, in one line, a weighted name that is a boundary of none of ``dataset``'s meshes, and
    weights with ``max_points`` (a random subset of the points, whose weights the dataset does not count)."""
    if not weights:
        return
    if max_points:
        raise ValueError(f"Expected --loss-weight without --max-points (got --max-points {max_points}): the "
                         "weighted mean is over every node of a sample")
    known = _dataset_boundaries(dataset)
    unknown = [name for name in weights if name not in known]
    if unknown:
        there = (", ".join(known) if known else "none: they come from a .vtm's patches, a file's node sets or gmsh "
                 "physical groups")
        raise ValueError(f"{dataset.path}: Expected --loss-weight to name boundaries of the dataset (got "
                         f"{', '.join(unknown)}; its boundaries are {there})")


class BoundaryWeights:
    """Each owned node's loss weight, and the sum of the weights over the whole mesh, per mesh of a
    dataset (see the module docstring). ``local(mesh, owned_ids)`` is cached per mesh: a rank's
    owned ids of a mesh never change."""

    def __init__(self, dataset: Any, weights: Mapping[str, float]) -> None:
        self.dataset = dataset
        self.weights = dict(weights)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}

    def _ids(self, mesh: int, name: str) -> np.ndarray:
        stored = [str(b["name"]) for b in self.dataset.meta["meshes"][mesh].get("boundaries", [])]
        if name not in stored:  # "surface": every point of a surface sample
            return np.arange(int(self.dataset.meta["meshes"][mesh]["num_nodes"]), dtype=np.int64)
        return np.asarray(self.dataset.boundary(mesh, name)[0], dtype=np.int64)

    def local(self, mesh: int, owned_ids: np.ndarray) -> tuple[np.ndarray, float]:
        """``(w, total)``: ``(N_own,)`` float64 the weights of ``owned_ids`` (sorted global ids),
        and the sum of every node's weight on mesh ``mesh``."""
        owned = np.asarray(owned_ids, dtype=np.int64)
        if mesh in self._cache and np.array_equal(self._cache[mesh][0], owned):
            return self._cache[mesh][1:]
        n = int(self.dataset.meta["meshes"][mesh]["num_nodes"])
        names = [name for name in self.weights if name in self.dataset.boundary_names(mesh)]
        if names:
            ids = np.concatenate([self._ids(mesh, name) for name in names])
            ws = np.concatenate([np.full(len(self._ids(mesh, name)), self.weights[name]) for name in names])
            order = np.lexsort((-ws, ids))  # by id, the largest weight first
            ids, ws = ids[order], ws[order]
            first = np.ones(len(ids), dtype=bool)
            first[1:] = ids[1:] != ids[:-1]
            ids, ws = ids[first], ws[first]
        else:
            ids, ws = np.zeros(0, dtype=np.int64), np.zeros(0)
        total = float(n - len(ids) + ws.sum())
        w = np.ones(len(owned))
        if len(ids) and len(owned):
            at = np.minimum(np.searchsorted(ids, owned), len(ids) - 1)
            hit = ids[at] == owned
            w[hit] = ws[at[hit]]
        self._cache[mesh] = (owned, w, total)
        return w, total
