"""``meshshard train --force-loss NAME=W[,NAME=W]``: a loss term on what a boundary integrates,
for the steady task. With a pressure target that is the error of the force on the boundary, which
a pointwise loss leaves free: errors of one sign where the wall faces the flow and of the other
where it faces away cost little per node but add up in the drag.

For each named boundary ``B`` (stored with the dataset: its node ids and the area vector ``a_i``
each node stands for, out of the mesh, :mod:`meshshard.data._surface`), the term is

    W * sum_{c,d} S_cd^2 / (F * A_B^2),    S_cd = sum_{i in B} e_ic a_id,    A_B = sum_{i in B} |a_i|

with ``e_i`` the normalised error of node ``i`` (prediction minus target, the ``F`` target
channels) and ``d`` the space dimensions: ``S_c`` is the boundary integral of channel ``c``'s
error, which for a pressure target is the error of the pressure force, and dividing by the
boundary's area makes the term the square of an area-weighted mean error, on the scale of the mean
squared error it is added to. A velocity with a no-slip wall integrates to nearly nothing there.
The loss is the mean squared error (weighted with ``--loss-weight``) plus the term of every named
boundary that the sample's mesh has.

On shards each rank sums ``e_ic a_id`` over the boundary nodes it owns, and one all-reduce of the
``(boundaries, F, D)`` sums gives ``S`` on every rank (:func:`meshshard.comm.sum_to_replicated`,
whose backward hands each rank its rows' part): the loss and every gradient equal the single
process's on the whole mesh. ``A_B`` is counted from the boundary, which every rank reads whole (a
small part of a mesh) once per mesh.

Refused in one line before any rank starts: a name that is a boundary of none of the dataset's
meshes, a boundary without area (a node set without faces), ``--max-points`` (a subset of the
points would integrate part of the boundary), and the transient task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._loss_weight import _dataset_boundaries, parse_loss_weight

__all__ = ["BoundaryIntegrals", "check_force_loss", "parse_force_loss"]


def parse_force_loss(value: str | Sequence[str] | Mapping[str, Any] | None) -> dict[str, float]:
    """``{name: W}`` from ``"body=10,flap=2"``, a list of such strings (the flag repeated) or a
    table (a recipe's ``force_loss = {body = 10.0}``); every ``W`` a finite number above 0. One-line
    ``ValueError`` otherwise, also for ``NAME:DISTANCE``: a force is a boundary's, not a region's."""
    try:
        parsed = parse_loss_weight(value)
    except ValueError as err:
        raise ValueError(str(err).replace("--loss-weight", "--force-loss")) from None
    regions = [name for name in parsed if ":" in name]
    if regions:
        raise ValueError(f"Expected --force-loss as NAME=W with boundary names (got {regions[0]}: a force is "
                         "integrated over a boundary, not a region)")
    return parsed


def check_force_loss(dataset: Any, weights: Mapping[str, float], max_points: int = 0) -> None:
    """Refuse, in one line, a name that is a boundary of none of ``dataset``'s meshes, a boundary
    with no area on a mesh (a node set without faces), and ``max_points``."""
    if not weights:
        return
    if max_points:
        raise ValueError(f"Expected --force-loss without --max-points (got --max-points {max_points}): a "
                         "boundary's integral is over all of its nodes")
    known = _dataset_boundaries(dataset)
    unknown = [name for name in weights if name not in known]
    if unknown:
        there = (", ".join(known) if known else "none: they come from a .vtm's patches, a file's node sets or gmsh "
                 "physical groups")
        raise ValueError(f"{dataset.path}: Expected --force-loss to name boundaries of the dataset (got "
                         f"{', '.join(unknown)}; its boundaries are {there})")
    for m in range(len(dataset.meta["meshes"])):
        for name in weights:
            if name in dataset.boundary_names(m) and not np.linalg.norm(dataset.boundary(m, name)[1], axis=1).sum() > 0:
                raise ValueError(f"{dataset.path}: Expected --force-loss on boundaries with faces (got {name}, which "
                                 f"has no area on mesh {m}: its nodes came without the faces between them)")


class BoundaryIntegrals:
    """Per mesh of a dataset, for each weighted boundary it has: the positions of its nodes among
    a rank's owned rows, their area vectors and the boundary's area (see the module docstring).
    ``local(mesh, owned_ids)`` is cached per mesh: a rank's owned ids of a mesh never change."""

    def __init__(self, dataset: Any, weights: Mapping[str, float]) -> None:
        self.dataset = dataset
        self.weights = dict(weights)
        self._cache: dict[int, tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, float, float]]]] = {}

    def local(self, mesh: int, owned_ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, float, float]]:
        """``[(rows, area, W, A_B)]`` per weighted boundary of mesh ``mesh``: ``rows`` ``(n,)`` the
        positions in ``owned_ids`` (sorted global ids) of the boundary's nodes this rank owns,
        ``area`` ``(n, D)`` float64 their area vectors, ``A_B`` the whole boundary's area."""
        owned = np.asarray(owned_ids, dtype=np.int64)
        if mesh in self._cache and np.array_equal(self._cache[mesh][0], owned):
            return self._cache[mesh][1]
        present = self.dataset.boundary_names(mesh)
        out = []
        for name, w in self.weights.items():
            if name not in present:
                continue
            ids, area = self.dataset.boundary(mesh, name)
            total = float(np.linalg.norm(area, axis=1).sum())
            at = np.minimum(np.searchsorted(owned, ids), max(len(owned) - 1, 0))
            hit = (owned[at] == ids) if len(owned) else np.zeros(len(ids), dtype=bool)
            out.append((at[hit], area[hit], float(w), total))
        self._cache[mesh] = (owned, out)
        return out

    def term(self, diff: Any, mesh: int, owned_ids: np.ndarray) -> Tensor | None:
        """The sum of the weighted boundaries' terms for one sample: ``diff`` the normalised error
        ``(N_own, F)`` (a :class:`~meshshard.ShardTensor`, or a tensor on one process); None when
        the mesh has none of the boundaries."""
        from .._tensor import ShardTensor

        parts = self.local(mesh, owned_ids)
        if not parts:
            return None
        local = diff.to_local() if isinstance(diff, ShardTensor) else diff
        sums = torch.stack([local.index_select(0, torch.as_tensor(rows, device=local.device)).T
                            @ torch.as_tensor(area, device=local.device, dtype=local.dtype)
                            for rows, area, _, _ in parts])  # (boundaries, F, D)
        if isinstance(diff, ShardTensor):
            from meshshard.comm import sum_to_replicated

            sums = sum_to_replicated(sums, group=diff.spec.group)
        scale = torch.as_tensor([w / (total * total * local.shape[1]) for _, _, w, total in parts],
                                device=local.device, dtype=local.dtype)
        return ((sums * sums).sum((1, 2)) * scale).sum()
