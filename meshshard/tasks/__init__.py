"""Tasks: what a workload tells the one training loop and the one prediction writer.

A task is a module of its own, plugged into :func:`meshshard.run.train` and
:func:`meshshard.run.predict` by name (``TrainConfig.task``), never a branch inside them. It says

- which datasets it can train on (:meth:`Task.check_dataset`, before any rank starts);
- how one rank reads a sample (:meth:`Task.reader`, :meth:`Task.batch`): its shard of the graph,
  the model's inputs and the targets, normalised;
- the loss of a step (:meth:`Task.loss`), a mean over every node of the mesh;
- which fields a prediction writes (:meth:`Task.output_fields`).

Tasks here:

- ``steady`` (:class:`SteadyFields`, :mod:`meshshard.tasks.steady`): one mesh and its fields per
  sample; inputs to targets (a steady CFD solution, a FEM load case).

Trajectory datasets (``meshshard dataset --state``) are read one step at a time by
:class:`TrajectoryReader` (:mod:`meshshard.tasks._trajectory_reader`), for the transient task to come.

A new workload (trajectories, point clouds) is a new module beside ``steady.py`` with a
:class:`Task` subclass, registered in :data:`TASKS`. Tasks import the containers, the layers and
the lower layers (``partition``, ``comm``), never :mod:`meshshard.run` nor the commands.
"""

from __future__ import annotations

from ._base import Task
from ._reader import DatasetReader, LocalSample, Normaliser, TensorNormalisation, whole_sample
from ._trajectory_reader import LocalStep, TrajectoryReader
from .steady import SteadyFields

__all__ = ["TASKS", "DatasetReader", "LocalSample", "LocalStep", "Normaliser", "SteadyFields", "Task",
           "TensorNormalisation", "TrajectoryReader", "get_task", "whole_sample"]

#: Every task, by the name a run records (``TrainConfig.task``).
TASKS: dict[str, type[Task]] = {SteadyFields.name: SteadyFields}


def get_task(name: str) -> Task:
    """The task called ``name`` (one-line ``ValueError`` naming the tasks there are)."""
    if name not in TASKS:
        raise ValueError(f"Expected a task among {', '.join(sorted(TASKS))} (got {name!r})")
    return TASKS[name]()
