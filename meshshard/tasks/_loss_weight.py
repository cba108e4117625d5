"""``meshshard train --loss-weight NAME=W[,NAME=W]``: a loss that weights the rows of named
boundaries, and with ``NAME:DISTANCE=W`` the nodes within ``DISTANCE`` of a named boundary (the
region of ``predict --near NAME:DISTANCE``, :func:`meshshard.data.nodes_near`), where the fields
that make the forces change fastest.

Each node has a weight: the largest ``W`` among the weighted boundaries it lies on (a corner of two)
and the weighted regions it lies in, 1 on none. The loss is the weighted mean

    sum_i w_i |e_i|^2 / (F * sum_i w_i)

over every node ``i`` of the mesh and the ``F`` target channels (``e_i`` the normalised error of
node ``i``); with every weight 1 it is the plain mean squared error. On shards, each rank sums
``w_i |e_i|^2`` over its owned rows and the sum over the ranks is the one all-reduce of
:meth:`~meshshard.ShardTensor.sum`; the denominator ``sum_i w_i`` is the same number on every
rank. With boundaries alone it is counted from the dataset's boundary node lists (a boundary is a
small part of a mesh, read whole once per mesh), at no communication; a region's nodes are known
only where they are owned, so with a region the ranks add their weights once per mesh (one
all-reduce, at the mesh's first loss) and keep the sum. The loss and every gradient equal the
single-process computation.

A boundary is named as ``meshshard info DATA`` lists it (a ``.vtm``'s patches, node sets, gmsh
physical groups, ``surface`` for a surface sample); a name on none of the dataset's meshes is
refused in one line before any rank starts, listing the names there are. A mesh without a named
boundary weighs its nodes 1. In a recipe, a region is a quoted key: ``loss_weight = {body = 10.0,
"body:0.1" = 3.0}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BoundaryWeights", "check_loss_weight", "describe_weighted", "parse_loss_weight"]


def _split_key(key: str) -> tuple[str, float | None]:
    """``"walls"`` -> ``("walls", None)``; ``"walls:0.1"`` -> ``("walls", 0.1)``: a boundary, or the
    region within a distance of it. One-line ``ValueError`` for a distance that is not a number >= 0."""
    name, colon, value = key.rpartition(":")
    if not colon:
        return key, None
    try:
        distance = float(value)
    except ValueError:
        distance = math.nan
    if not name.strip() or not (math.isfinite(distance) and distance >= 0):
        raise ValueError(f"Expected --loss-weight NAME:DISTANCE=W with a boundary name and a distance >= 0 "
                         f"(got {key!r})")
    return name.strip(), distance


def describe_weighted(key: str) -> str:
    """What a weighted key names, in words: ``"walls"`` -> ``"walls"``, ``"walls:0.1"`` ->
    ``"within 0.1 of walls"``."""
    name, distance = _split_key(key)
    return name if distance is None else f"within {key.rpartition(':')[2]} of {name}"


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
        boundary, distance = _split_key(name)
        if distance is not None:
            short = f"{distance:g}"
            name = f"{boundary}:{short if float(short) == distance else repr(distance)}"
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
    named = (_split_key(key)[0] for key in weights)
    unknown = list(dict.fromkeys(name for name in named if name not in known))
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
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, float | None]] = {}

    @property
    def has_regions(self) -> bool:
        """Whether a weight is a region's (``NAME:DISTANCE``): then the sum of the weights over a
        mesh takes the ranks' parts (:meth:`set_total`)."""
        return any(_split_key(name)[1] is not None for name in self.weights)

    def _ids(self, mesh: int, name: str) -> np.ndarray:
        stored = [str(b["name"]) for b in self.dataset.meta["meshes"][mesh].get("boundaries", [])]
        if name not in stored:  # "surface": every point of a surface sample
            return np.arange(int(self.dataset.meta["meshes"][mesh]["num_nodes"]), dtype=np.int64)
        return np.asarray(self.dataset.boundary(mesh, name)[0], dtype=np.int64)

    def local(self, mesh: int, owned_ids: np.ndarray) -> tuple[np.ndarray, float | None]:
        """``(w, total)``: ``(N_own,)`` float64 the weights of ``owned_ids`` (sorted global ids),
        and the sum of every node's weight on mesh ``mesh``: None with a region until
        :meth:`set_total` gave it (the ranks add their ``w``)."""
        owned = np.asarray(owned_ids, dtype=np.int64)
        if mesh in self._cache and np.array_equal(self._cache[mesh][0], owned):
            return self._cache[mesh][1:]
        n = int(self.dataset.meta["meshes"][mesh]["num_nodes"])
        present = self.dataset.boundary_names(mesh)
        keys = [(key, *_split_key(key)) for key in self.weights]
        names = [key for key, name, distance in keys if distance is None and name in present]
        if names:
            each = [self._ids(mesh, name) for name in names]
            ids = np.concatenate(each)
            ws = np.concatenate([np.full(len(i), self.weights[name]) for i, name in zip(each, names)])
            order = np.lexsort((-ws, ids))  # by id, the largest weight first
            ids, ws = ids[order], ws[order]
            first = np.ones(len(ids), dtype=bool)
            first[1:] = ids[1:] != ids[:-1]
            ids, ws = ids[first], ws[first]
        else:
            ids, ws = np.zeros(0, dtype=np.int64), np.zeros(0)
        total: float | None = float(n - len(ids) + ws.sum())
        w = np.ones(len(owned))
        if len(ids) and len(owned):
            at = np.minimum(np.searchsorted(ids, owned), len(ids) - 1)
            hit = ids[at] == owned
            w[hit] = ws[at[hit]]
        regions = [(key, name, distance) for key, name, distance in keys if distance is not None and name in present]
        if self.has_regions:
            from meshshard.data import nodes_near

            touched = np.zeros(len(owned), dtype=bool)  # on a weighted boundary or in a weighted region
            if len(ids) and len(owned):
                touched[hit] = True
            for key, name, distance in regions:
                near = nodes_near(self.dataset, mesh, owned, [name], distance)
                w[near] = np.where(touched[near], np.maximum(w[near], self.weights[key]), self.weights[key])
                touched |= near
            total = None
        self._cache[mesh] = (owned, w, total)
        return w, total

    def set_total(self, mesh: int, total: float) -> None:
        """Keep the sum of mesh ``mesh``'s weights that the ranks added (after :meth:`local`)."""
        owned, w, _ = self._cache[mesh]
        self._cache[mesh] = (owned, w, float(total))

    def weighted_mean(self, err: Any, mesh: int, owned_ids: np.ndarray) -> Any:
        """``sum_i w_i err_i / (F sum_i w_i)`` over every node of mesh ``mesh`` and the ``F``
        channels of ``err`` ``(N_own, F)``, a :class:`~meshshard.ShardTensor` (or a tensor on one
        process); with a region, the ranks first add their weights (float64, once per mesh)."""
        import torch

        from .._tensor import ShardTensor

        w, total = self.local(mesh, owned_ids)
        sharded = isinstance(err, ShardTensor)
        weight: Any = torch.as_tensor(w, device=err.device).to(err.dtype)[:, None]
        if sharded:
            weight = ShardTensor.from_local(weight, err.spec)
        if total is None:
            mine: Any = torch.as_tensor(w, device=err.device)[:, None]
            if sharded:
                mine = ShardTensor.from_local(mine, err.spec)
            with torch.no_grad():
                total = float(mine.sum())
            self.set_total(mesh, total)
        return (err * weight).sum() / (total * err.shape[1])
