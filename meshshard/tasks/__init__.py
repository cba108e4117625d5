"""Tasks: what a workload tells the one training loop and the one prediction writer.

A task is a module of its own, plugged into :func:`meshshard.run.train` and
:func:`meshshard.run.predict` by name (``TrainConfig.task``), never a branch inside them. It says

- which datasets it can train on (:meth:`Task.check_dataset`, before any rank starts);
- how one rank reads a sample (:meth:`Task.reader`, :meth:`Task.batch`): its shard of the graph,
  the model's inputs and the targets, normalised;
- the loss of a step (:meth:`Task.loss`), a mean over every node of the mesh (the steady task's
  weighted by named boundaries with ``--loss-weight``: :mod:`meshshard.tasks._loss_weight`, and with
  ``--force-loss`` plus the error of named boundaries' forces: :mod:`meshshard.tasks._force_loss`);
- which fields a prediction writes (:meth:`Task.output_fields`).

Tasks here:

- ``steady`` (:class:`SteadyFields`, :mod:`meshshard.tasks.steady`): one mesh and its fields per
  sample; inputs to targets (a steady CFD solution, a FEM load case).

- ``transient`` (:class:`TransientTask`, :mod:`meshshard.tasks.transient`): trajectories
  (``meshshard dataset --state``); the one-step map from the state at ``t`` to its change over the
  stride, with training noise, and the rollout's steps. Read one step at a time by
  :class:`TrajectoryReader` (:mod:`meshshard.tasks._trajectory_reader`).

A run records its task; a run made with ``TrainConfig.task`` left empty takes its dataset's
(:func:`dataset_task`: ``dataset.json``'s ``"task"``, else ``steady``).

A new workload (trajectories, point clouds) is a new module beside ``steady.py`` with a
:class:`Task` subclass, registered in :data:`TASKS`. Tasks import the containers, the layers and
the lower layers (``partition``, ``comm``), never :mod:`meshshard.run` nor the commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import Task
from ._force_loss import BoundaryIntegrals, check_force_loss, parse_force_loss
from ._loss_weight import BoundaryWeights, check_loss_weight, describe_weighted, parse_loss_weight
from ._reader import DatasetReader, LocalSample, Normaliser, TensorNormalisation, whole_sample
from ._trajectory_reader import LocalStep, TrajectoryReader
from .steady import SteadyFields
from .transient import LocalPair, PairReader, TransientTask, step_noise

__all__ = ["TASKS", "BoundaryIntegrals", "BoundaryWeights", "DatasetReader", "LocalPair", "LocalSample", "LocalStep",
           "Normaliser", "PairReader", "SteadyFields", "Task", "TensorNormalisation", "TrajectoryReader",
           "TransientTask", "check_force_loss", "check_loss_weight", "dataset_task", "describe_weighted", "get_task",
           "parse_force_loss", "parse_loss_weight", "step_noise", "whole_sample"]

#: Every task, by the name a run records (``TrainConfig.task``).
TASKS: dict[str, type[Task]] = {SteadyFields.name: SteadyFields, TransientTask.name: TransientTask}


def dataset_task(dataset: Any) -> str:
    """The task a dataset is made for: its ``dataset.json``'s ``"task"`` (``transient`` for
    trajectories), else ``steady``."""
    return str(dataset.meta.get("task") or SteadyFields.name)


def get_task(name: str, config: Mapping[str, Any] | None = None) -> Task:
    """The task called ``name``, configured by the run's settings ``config`` (one-line
    ``ValueError`` naming the tasks there are)."""
    if name not in TASKS:
        raise ValueError(f"Expected a task among {', '.join(sorted(TASKS))} (got {name!r})")
    return TASKS[name](config)
