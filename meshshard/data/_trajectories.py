"""Trajectory datasets (``meshshard dataset SOURCES --state NAMES``): what a transient task
trains its one-step map on, in the dataset format of :mod:`meshshard.data._dataset`.

Sources (:func:`trajectory_steps`), one trajectory each: a ``.pvd`` collection (steps ordered by
their ``timestep``), an ``.xdmf`` time series (meshio's ``TimeSeriesReader``; its order and
times), or a folder of numbered files (``u_0001.vtu``, foamToVTK's ``case_100.vtm``; a case
folder stands for its ``VTK/``) ordered by the number, timed by a ``.series`` file naming exactly
them, else by the number. Times must increase.

One trajectory is one sample of the dataset: one mesh (trajectories may have different meshes:
the many-meshes machinery, partitions included, applies unchanged), the state at every step
along a time axis, the static inputs and the node classes. The sample folder holds::

    samples/00000/
    ├── state.npy        (T, N, F_state) the dynamic fields at every step, unnormalised
    ├── inputs.npy       (N, F_in) the static fields (F_in may be 0), from the first step
    └── node_type.npy    (N,) int64 class id of every node

A rank reads ``state[t, owned_ids]`` from the memory map: the rows of one step are contiguous,
so a step costs O(shard), never O(N T).

``dataset.json`` is the dataset format's (no ``targets.npy``), with these keys more:
``"task": "transient"``; ``time_stride`` S (the target of step t is the state at step t + S);
``state`` / ``state_channels`` the dynamic fields; ``targets`` / ``target_channels`` the same
fields and channels, since the model's output is the change of each over the stride;
``node_types`` (``source``: what the classes came from, and ``classes``: ``id``, ``name`` where
known, ``boundary``, and ``count``, the nodes of the class over every trajectory); and per sample
``num_steps`` T and ``times``. Of the six-node triangle mesh of the dataset format's example, two
trajectories ``a`` and ``b`` of three steps at times 0, 0.5, 1, a static input ``c`` (1 in ``a``,
2 in ``b``), the state ``T = c * t * x`` at step ``t`` and node class 1 where ``x == 0``, ``b``
for validation, written by ``write_trajectories(DIR, [Trajectory(name, points, [("triangle",
triangles)], [0.0, 0.5, 1.0], [(c * t * x)[:, None] for t in range(3)], np.full((6, 1), c),
(x == 0).astype(int)) for name, c in (("a", 1.0), ("b", 2.0))], ["a", "b"], state_fields=[{"name":
"T", "components": 1}], input_fields=[{"name": "c", "components": 1}], node_type_source="field
'node_type'", val_samples=["b"])``::

    {
      "format": "meshshard-dataset",
      "format_version": 2,
      "task": "transient",
      "kind": "one-mesh",
      "num_samples": 2,
      "dtype": "float32",
      "time_stride": 1,
      "inputs": [{"name": "c", "components": 1}],
      "targets": [{"name": "T", "components": 1}],
      "state": [{"name": "T", "components": 1}],
      "input_channels": ["c"],
      "target_channels": ["T"],
      "state_channels": ["T"],
      "edge_channels": ["dpos[0]", "dpos[1]", "|dpos|"],
      "split": {"train": [0], "val": [1]},
      "node_types": {"source": "field 'node_type'",
                     "classes": [{"id": 0, "name": "interior", "boundary": false, "count": 8},
                                 {"id": 1, "name": null, "boundary": true, "count": 4}]},
      "normalisation": {
        "rule": "(value - mean) / scale, scale = std or 1 where std == 0",
        "inputs": {"mean": [1.0], "std": [0.0], "scale": [1.0], "count": 6},
        "targets": {"mean": [1.0], "std": [0.816496580927726], "scale": [0.816496580927726], "count": 12},
        "state": {"mean": [1.0], "std": [1.3333333333333333], "scale": [1.3333333333333333], "count": 18},
        "edges": {"mean": [0.0, 0.0, 1.0920474583051323],
                  "std": [0.816496580927726, 0.7453559924999299, 0.17220502615058225],
                  "scale": [0.816496580927726, 0.7453559924999299, 0.17220502615058225], "count": 18}
      },
      "meshes": [
        {"folder": "meshes/00000", "num_nodes": 6, "pos_dim": 2, "num_edges": 18, "cells": {"triangle": 4},
         "sha256": "9333b48d40f2189652b07a391c52195193be1435eb1462481f6ab53c8d3e5c63"}
      ],
      "samples": [
        {"name": "a", "mesh": 0, "folder": "samples/00000", "source": null, "num_steps": 3, "times": [0.0, 0.5, 1.0]},
        {"name": "b", "mesh": 0, "folder": "samples/00001", "source": null, "num_steps": 3, "times": [0.0, 0.5, 1.0]}
      ]
    }

``normalisation`` holds, over the **training** trajectories: ``inputs`` (the static fields, each
trajectory's nodes once), ``state`` (every node at every step), ``targets`` (the change
``state[t + S] - state[t]`` over every pair of steps S apart: what the model predicts,
normalised) and ``edges`` (each trajectory's mesh once). The rule is the dataset's
(``(value - mean) / scale``, held channels scaled by 1).

Node classes. ``node_type.npy`` holds class ids; the one-hot input of a node is the position of
its id in ``node_types.classes`` (ascending ids). They come from

- a point field (``--node-type FIELD``): integer values >= 0, taken from each trajectory's first
  step; the classes are the values found, unnamed (``"name": null``) but class 0, "interior";
- else the boundary tags the files carry: the named sets of nodes (``point_sets``: the patches of
  a foamToVTK ``.vtm``, Abaqus node sets) and of cells of a lower dimension than the mesh's
  (``cell_sets``: gmsh physical groups, meshio cell sets). Class 0 is ``interior`` (the nodes on
  none), then one class per set name, numbered in the order first met; a node on several sets
  takes the first in its file's order;
- else none: every node is class 0, ``"source": null``.

Boundary classes: by default every class but 0 (``--interior-classes`` names others that are
predicted too, such as an outflow). The state of boundary nodes is prescribed during a rollout and
left out of the loss.

Public names, by the module that defines them: this one, :data:`TASK` and
:func:`is_trajectory_dataset`; :mod:`meshshard.data._trajectory_steps`, :func:`trajectory_steps`
(the steps of a source); :mod:`meshshard.data._trajectory_build`, :func:`build_trajectories`
(``meshshard dataset --state``); :mod:`meshshard.data._trajectory_writer`,
:func:`write_trajectories` (any iterable of :class:`Trajectory`);
:mod:`meshshard.data._trajectory_reader`, :func:`open_trajectories` -> :class:`Trajectories` (one
rank's rows of a step, static inputs and node classes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TASK", "is_trajectory_dataset", "check_increasing"]

#: The value of ``dataset.json``'s ``"task"`` for a trajectory dataset.
TASK = "transient"


def is_trajectory_dataset(meta: Mapping[str, Any]) -> bool:
    """Whether a dataset's metadata is a trajectory dataset's (``"task": "transient"``)."""
    return meta.get("task") == TASK


def check_increasing(times: Sequence[float], labels: Sequence[str], where: Path) -> None:
    """Refuse times that are not finite or do not increase from step to step (one line naming the step)."""
    t = np.asarray(times, dtype=np.float64)
    if not np.isfinite(t).all():
        i = int(np.flatnonzero(~np.isfinite(t))[0])
        raise ValueError(f"{where}: Expected finite times (got {t[i]} at {labels[i]})")
    bad = np.flatnonzero(np.diff(t) <= 0)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{where}: Expected times that increase from step to step (got t={t[i + 1]:g} at "
                         f"{labels[i + 1]} after t={t[i]:g} at {labels[i]})")
