"""``steady``: one mesh and its fields per sample, inputs to targets.

A steady CFD solution or a FEM load case: each sample of the dataset is a mesh with input fields
(geometry, material, boundary values) and target fields (the solution). The model maps the inputs
at every node to the targets at every node; the loss is the mean squared error of the normalised
targets over every node of the mesh (with ``loss_weight``, ``train --loss-weight NAME=W``, the rows
of named boundaries weighted: :mod:`meshshard.tasks._loss_weight`; with ``force_loss``, ``train
--force-loss NAME=W``, plus the squared error of what named boundaries integrate, their forces:
:mod:`meshshard.tasks._force_loss`); a prediction writes ``<target>_pred`` for every target field.

With ``relative_loss`` (``train --relative-loss``) each sample's mean squared error is divided by
what predicting the training mean loses on it: the same (weighted) mean of its normalised targets
squared, which with ``dataset --mean-field`` is its difference from the prior. Every case then
counts by its relative error, not by how far it lies from the training statistics: on a shape sweep
the shapes at the corners of the family, whose priors are extrapolations, no longer outweigh the
shapes inside it, which are the ones a new design resembles. The validation loss is the same ratio.
A sample equal to the training mean everywhere (nothing to learn) keeps its plain loss. On shards
the ratio is exact: numerator and denominator are global means; the denominator's all-reduce is
made once per sample, not per step.
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._base import Task
from ._force_loss import BoundaryIntegrals, check_force_loss, parse_force_loss
from ._loss_weight import BoundaryWeights, check_loss_weight, parse_loss_weight
from ._reader import DatasetReader, LocalSample

__all__ = ["SteadyFields"]


class SteadyFields(Task):
    """Inputs to targets on one mesh per sample (see the module docstring)."""

    name: ClassVar[str] = "steady"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._baselines: dict[int, Tensor] = {}  # per sample, its _baseline_loss (--relative-loss)

    def check_dataset(self, dataset: Any) -> None:
        """Refuse, in one line, a dataset of inputs only (made without ``--targets``), or of trajectories."""
        if dataset.meta.get("task") == "transient":
            raise ValueError(f"{dataset.path}: holds trajectories (made with --state), which the steady task does not "
                             "train on; make a dataset of steady samples with --inputs and --targets")
        if not dataset.target_channels:
            raise ValueError(f"{dataset.path}: has no targets (made without --targets), so there is nothing to train "
                             "on; it holds cases for meshshard predict. Train on a dataset made with --targets")
        check_loss_weight(dataset, parse_loss_weight(self.config.get("loss_weight")),
                          int(self.config.get("max_points") or 0))
        check_force_loss(dataset, parse_force_loss(self.config.get("force_loss")),
                         int(self.config.get("max_points") or 0))

    def reader(self, dataset: Any, partition: str | os.PathLike[str], domain_rank: int, group: Any, *,
               device: Any = None, dtype: torch.dtype = torch.float32, **options: Any) -> DatasetReader:
        """The default reader; with ``loss_weight`` or ``force_loss``, the dataset's boundaries are
        kept for the loss."""
        weights = parse_loss_weight(self.config.get("loss_weight"))
        self._weights = BoundaryWeights(dataset, weights) if weights else None
        forces = parse_force_loss(self.config.get("force_loss"))
        self._forces = BoundaryIntegrals(dataset, forces) if forces else None
        return super().reader(dataset, partition, domain_rank, group, device=device, dtype=dtype, **options)

    def loss(self, pred: Any, batch: LocalSample, apply: Any = None) -> Tensor:
        """Mean squared error over every node and target channel (``pred`` in the targets' dtype);
        with ``loss_weight``, the weighted mean (:mod:`meshshard.tasks._loss_weight`); with
        ``relative_loss``, over the same mean of the targets squared; with ``force_loss``, plus the
        boundaries' terms (:mod:`meshshard.tasks._force_loss`)."""
        diff = pred.to(batch.y.dtype) - batch.y
        loss = self._mean_squared(diff ** 2, batch)
        if self.config.get("relative_loss"):
            loss = loss / self._baseline_loss(batch)
        if not self.config.get("force_loss"):
            return loss
        forces = getattr(self, "_forces", None)
        if forces is None:
            raise ValueError("Expected the steady task's reader(...) to be made before its loss with --force-loss: "
                             "it holds the dataset's boundaries")
        term = forces.term(diff, batch.mesh, batch.owned_ids)
        return loss if term is None else loss + term

    def _baseline_loss(self, batch: LocalSample) -> Tensor:
        """What predicting the training mean loses on ``batch`` (the module docstring), 1 where that
        is 0; no gradient (the targets are data). A sample's targets are the same at every step, so
        its value is computed (one all-reduce) the first time it is seen and kept, unless
        ``max_points`` trains on another subset of its points each epoch."""
        key = None if self.config.get("max_points") else int(batch.sample)
        if key in self._baselines:
            return self._baselines[key]
        with torch.no_grad():
            zero = self._mean_squared(batch.y ** 2, batch)
        value = torch.where(zero > 0, zero, torch.ones_like(zero))
        if key is not None:
            self._baselines[key] = value
        return value

    def _mean_squared(self, err: Any, batch: LocalSample) -> Tensor:
        """The mean of ``err`` over every node and channel, weighted with ``loss_weight``."""
        if not self.config.get("loss_weight"):
            return err.mean()
        weights = getattr(self, "_weights", None)
        if weights is None:
            raise ValueError("Expected the steady task's reader(...) to be made before its weighted loss "
                             "(--loss-weight): it holds the dataset's boundaries")
        return weights.weighted_mean(err, batch.mesh, batch.owned_ids)

    def output_fields(self, dataset: Any, run_config: dict[str, Any]) -> list[dict[str, Any]]:
        """The dataset's target fields when it has targets, else those the run recorded (or, for a
        run of an older version, rebuilt from its target channels: ``u[0]``, ``u[1]`` -> ``u``, 2)."""
        if dataset is not None and dataset.target_channels:
            return [dict(f) for f in dataset.meta["targets"]]
        recorded = run_config.get("target_fields")
        if recorded:
            return [{"name": str(f["name"]), "components": int(f["components"])} for f in recorded]
        fields: list[dict[str, Any]] = []
        for channel in (run_config.get("normalisation") or {}).get("target_channels", []):
            match = re.fullmatch(r"(.+)\[(\d+)\]", channel)
            base, index = (match.group(1), int(match.group(2))) if match else (channel, -1)
            if index > 0 and fields and fields[-1]["name"] == base and fields[-1]["components"] == index:
                fields[-1]["components"] += 1
            else:
                fields.append({"name": base if index == 0 else channel, "components": 1})
        return fields
