"""``steady``: one mesh and its fields per sample, inputs to targets.

A steady CFD solution or a FEM load case: each sample of the dataset is a mesh with input fields
(geometry, material, boundary values) and target fields (the solution). The model maps the inputs
at every node to the targets at every node; the loss is the mean squared error of the normalised
targets over every node of the mesh; a prediction writes ``<target>_pred`` for every target field.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from torch import Tensor

from ._base import Task
from ._reader import LocalSample

__all__ = ["SteadyFields"]


class SteadyFields(Task):
    """Inputs to targets on one mesh per sample (see the module docstring)."""

    name: ClassVar[str] = "steady"

    def check_dataset(self, dataset: Any) -> None:
        """Refuse, in one line, a dataset of inputs only (made without ``--targets``), or of trajectories."""
        if dataset.meta.get("task") == "transient":
            raise ValueError(f"{dataset.path}: holds trajectories (made with --state), which the steady task does not "
                             "train on; make a dataset of steady samples with --inputs and --targets")
        if not dataset.target_channels:
            raise ValueError(f"{dataset.path}: has no targets (made without --targets), so there is nothing to train "
                             "on; it holds cases for meshshard predict. Train on a dataset made with --targets")

    def loss(self, pred: Any, batch: LocalSample, apply: Any = None) -> Tensor:
        """Mean squared error over every node and target channel (``pred`` in the targets' dtype)."""
        return ((pred.to(batch.y.dtype) - batch.y) ** 2).mean()

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
