"""The interface every task implements (see :mod:`meshshard.tasks`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._reader import DatasetReader, LocalSample

__all__ = ["Task"]


class Task:
    """What a workload says to the training loop and the prediction writer.

    The defaults read a sample as inputs and targets of one mesh (:class:`DatasetReader`); a
    subclass overrides what its workload does otherwise.
    """

    #: The name a run records and :func:`meshshard.tasks.get_task` takes.
    name: ClassVar[str] = ""
    #: Whether ``meshshard predict --rollout`` can apply the task's steps (``rollout_input``,
    #: ``rollout_update``): a task of trajectories.
    rolls_out: ClassVar[bool] = False

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        #: The run's settings (``asdict(TrainConfig)`` or a checkpoint's config): what a task reads
        #: of them (the seed, ``noise_std``) it reads here.
        self.config: dict[str, Any] = dict(config or {})

    def model_sizes(self, dataset: Any) -> tuple[int, int, int]:
        """``(node inputs, edge inputs, node outputs)`` of the model for ``dataset``: its input,
        edge and target channels."""
        return len(dataset.input_channels), len(dataset.edge_channels), len(dataset.target_channels)

    def check_dataset(self, dataset: Any) -> None:
        """Raise a one-line ``ValueError`` when the task cannot train on ``dataset`` (an open
        :class:`~meshshard.partition.Dataset`). Runs before any rank starts, and on every rank."""

    def reader(self, dataset: Any, partition: str | os.PathLike[str], domain_rank: int, group: Any, *,
               device: Any = None, dtype: torch.dtype = torch.float32, **options: Any) -> DatasetReader:
        """This rank's reader of ``dataset`` on its part ``domain_rank`` of ``partition``
        (``options``: those of :class:`DatasetReader`)."""
        return DatasetReader(dataset, partition, domain_rank, group, device=device, dtype=dtype, **options)

    def batch(self, reader: DatasetReader, sample: int, step: int) -> LocalSample:
        """What the model sees of ``sample`` at training ``step`` on this rank (a task that adds
        training noise does it here, as a function of the step and the global node ids)."""
        return reader.sample(sample)

    def loss(self, pred: Any, batch: LocalSample, apply: Any = None) -> Tensor:
        """The loss of one sample: a mean over every node of the mesh, the same on every rank.
        ``apply(x)``: the model on the sample's graph, for a task that applies it again (a rollout
        unrolled in training); the training loop passes it, validation does not."""
        raise NotImplementedError(f"the task {self.name!r} defines no loss")

    def output_fields(self, dataset: Any, run_config: dict[str, Any]) -> list[dict[str, Any]]:
        """The fields a prediction writes, ``[{"name", "components"}]``, in the model's output order."""
        raise NotImplementedError(f"the task {self.name!r} defines no output fields")
