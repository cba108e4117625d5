"""Reading a trajectory dataset (``meshshard dataset --state``) on one rank: the state of
trajectory ``k`` at step ``t``, its static inputs and node classes, for this rank's owned rows.

Public names (stable):

- :class:`TrajectoryReader`: for a trajectory dataset, its partitions (``meshshard partition
  DATA``, unchanged) and this rank's domain rank, ``reader.step(k, t)`` returns a
  :class:`LocalStep` (the shard of the trajectory's mesh, the state of the owned rows in physical
  units, the normalised static inputs, the class ids and their one-hot positions, the boundary
  mask), and ``reader.pair(k, t)`` that step with the state at ``t + S`` and the normalised change
  (the model's target). ``normalise_state`` / ``normalise_change`` / ``denormalise_change`` apply
  the dataset's statistics.

Memory per rank is O(shard + halo) per step: ``state.npy`` is a memory map ``(T, N, F)`` and only
``state[t, owned_ids]`` is read; the mesh is read through the partition's part file, never whole.

Shapes: ``N_own`` owned nodes, ``F_state`` state channels, ``F_in`` static input channels, ``K``
node classes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from meshshard.data import Dataset, Trajectories, open_trajectories

from .._graph import ShardGraph
from .._tensor import ShardTensor
from ._reader import DatasetReader

__all__ = ["LocalStep", "TrajectoryReader"]


@dataclass(frozen=True, eq=False)
class LocalStep:
    """Step ``step`` of trajectory ``trajectory`` on this rank.

    Attributes:
        state: ``(N_own, F_state)`` the state in physical units (unnormalised).
        inputs: ``(N_own, F_in)`` the static inputs, normalised.
        node_type: ``(N_own,)`` int64 class ids; ``class_index`` their one-hot positions.
        boundary: ``(N_own,)`` bool, the nodes of boundary classes (prescribed, out of the loss).
        edge_attr: ``(E_local, F_e)`` normalised; owned_ids ``(N_own,)`` global ids.
    """

    trajectory: int
    step: int
    mesh: int
    graph: ShardGraph
    state: ShardTensor
    inputs: ShardTensor
    node_type: Tensor
    class_index: Tensor
    boundary: Tensor
    edge_attr: Tensor
    owned_ids: np.ndarray


class TrajectoryReader(DatasetReader):
    """This rank's view of a trajectory dataset and its partitions (see the module docstring).

    Args: as :class:`DatasetReader`. Raises ``ValueError`` (one line) for a dataset that is not
    a trajectory dataset, or partitions of another dataset.
    """

    def __init__(self, data: str | os.PathLike[str] | Dataset, partition: str | os.PathLike[str], domain_rank: int,
                 group: Any = None, **options: Any) -> None:
        super().__init__(data, partition, domain_rank, group, **options)
        self.trajectories: Trajectories = open_trajectories(self.dataset)
        stats = self.dataset.meta["normalisation"]["state"]

        def t(values: Any) -> Tensor:
            return torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.device).to(self.dtype)

        width = len(self.trajectories.state_channels)
        if np.shape(stats.get("mean")) != (width,) or np.shape(stats.get("scale")) != (width,):
            raise ValueError(f"{self.dataset.path}: Expected the state's mean and scale for {width} channels "
                             "in its normalisation")
        self._state = (t(stats["mean"]), t(stats["scale"]))  # scale: std, or 1 where it is 0 or held
        self._boundary = torch.as_tensor(self.trajectories.boundary, device=self.device)

    @property
    def time_stride(self) -> int:
        """S: the steps from an input state to its target."""
        return self.trajectories.time_stride

    @property
    def num_classes(self) -> int:
        """K, the node classes (the one-hot width)."""
        return len(self.trajectories.class_ids)

    def num_steps(self, k: int) -> int:
        """T, the steps of trajectory ``k``."""
        return self.trajectories.num_steps(k)

    def normalise_state(self, x: Tensor) -> Tensor:
        """``(x - mean) / scale`` with the state's statistics, ``(..., F_state)``."""
        return (x - self._state[0]) / self._state[1]

    def normalise_change(self, d: Tensor) -> Tensor:
        """``(d - mean) / scale`` with the statistics of the change over the stride (the targets')."""
        return self.normaliser.normalise_targets(d)

    def denormalise_change(self, d: Any) -> Any:
        """A predicted normalised change to physical units (a Tensor or a ShardTensor)."""
        return self.normaliser.denormalise_targets(d)

    def sample(self, s: int) -> Any:
        """Not for trajectories: use :meth:`step` or :meth:`pair`."""
        raise ValueError(f"{self.dataset.path}: a trajectory dataset is read by step (reader.step(k, t), "
                         "reader.pair(k, t)), not by sample")

    def step(self, k: int, t: int) -> LocalStep:
        """Step ``t`` of trajectory ``k`` on this rank (see :class:`LocalStep`)."""
        mesh = self.dataset.sample_mesh(k)
        graph, edge_attr, owned = self.shard(mesh)
        tr = self.trajectories
        state = torch.from_numpy(tr.state(k, t, owned)).to(self.device, self.dtype)
        inputs = self.normaliser.normalise_inputs(torch.from_numpy(tr.inputs(k, owned)).to(self.device, self.dtype))
        ids = tr.node_type(k, owned)
        index = torch.from_numpy(tr.class_index(ids)).to(self.device)
        return LocalStep(int(k), int(t), mesh, graph, ShardTensor.from_local(state, graph.spec),
                         ShardTensor.from_local(inputs, graph.spec), torch.from_numpy(ids).to(self.device), index,
                         self._boundary[index], edge_attr, owned)

    def pair(self, k: int, t: int) -> tuple[LocalStep, ShardTensor, ShardTensor]:
        """Step ``t`` of trajectory ``k``, the state at ``t + S`` (physical units) and the normalised
        change between them (the target of the one-step map), all ``(N_own, F_state)``."""
        if not 0 <= int(t) < self.trajectories.num_pairs(k):
            raise ValueError(f"Expected a step in [0, {self.trajectories.num_pairs(k)}) of trajectory {k}, one with a "
                             f"target {self.time_stride} steps later (got {t})")
        now = self.step(k, t)
        later = torch.from_numpy(self.trajectories.state(k, int(t) + self.time_stride, now.owned_ids))
        later = later.to(self.device, self.dtype)
        change = self.normalise_change(later - now.state.to_local())
        spec = now.graph.spec
        return now, ShardTensor.from_local(later, spec), ShardTensor.from_local(change, spec)
