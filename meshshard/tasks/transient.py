"""``transient``: trajectories (``meshshard dataset --state``), the one-step map and its rollout.

A sample is a pair ``(trajectory k, step t)`` of a training trajectory, with ``t + S`` inside it
(``S`` the dataset's stride). The model's input at a node is the normalised state at ``t``, the
normalised static inputs and the one-hot node class; its target is the normalised change of the
state over the stride, ``state[t + S] - state[t]``. Nodes of boundary classes are prescribed
during a rollout, so they are left out of the loss: the loss is the mean squared error over the
interior nodes of the whole mesh (the sum and the count reduced over the domain group, so it is
the one-process value on any number of ranks).

Training noise (``TrainConfig.noise_std``, ``--noise-std SIGMA`` in normalised units): at every
training step the state input of every interior node gets Gaussian noise ``SIGMA * z``, and the
target becomes the change from the noisy state to the true next one, so the model learns to pull
a drifting rollout back. ``z`` (:func:`step_noise`) is a pure function of (seed, step, sample,
global node id, channel): a counter-based generator (splitmix64 hashes of those integers, then
Box-Muller), so every shard draws, for its own rows, the numbers one process draws for them.

Pair ids: the pairs of every trajectory in order, ``(k, t)`` numbered ``first[k] + t``; the
training loop draws them as it draws steady samples (:attr:`PairReader.train`), and validation
reads every pair of the validation trajectories without noise (:attr:`PairReader.val`).

A rollout (``meshshard predict --rollout``) applies :meth:`TransientTask.rollout_input` and
:meth:`TransientTask.rollout_update` to each rank's owned rows: the state never leaves its shard.

Shapes: ``N_own`` owned nodes, ``F_state`` state channels, ``F_in`` static inputs, ``K`` node
classes; the model's input is ``(N_own, F_state + F_in + K)``, its output ``(N_own, F_state)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from meshshard.comm import all_reduce_sum
from meshshard.data import Dataset, Normalisation

from .._tensor import ShardTensor
from ._base import Task
from ._reader import LocalSample, TensorNormalisation
from ._trajectory_reader import TrajectoryReader

__all__ = ["LocalPair", "PairReader", "RolloutRows", "StateNormalisation", "TransientTask", "step_noise"]

# splitmix64 (Steele, Lea and Flood 2014): the increment and the two multipliers of its finaliser
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's step, element-wise on a uint64 array (arithmetic modulo 2**64)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _key(*words: int) -> np.ndarray:
    """One uint64 (a ``(1,)`` array) hashed from the integers ``words`` in order."""
    h = np.zeros(1, dtype=np.uint64)
    for w in words:
        h = _mix(h ^ np.array([int(w)], dtype=np.int64).view(np.uint64))
    return h


def step_noise(seed: int, step: int, sample: int, node_ids: np.ndarray, width: int) -> np.ndarray:
    """Standard normal numbers ``(n, width)`` float64 for the global nodes ``node_ids``: a pure
    function of (seed, step, sample, node id, channel), so any split of the nodes over ranks draws
    the same number for the same node. Two splitmix64 hashes per number give two uniforms, which
    Box-Muller turns into one normal."""
    ids = np.asarray(node_ids, dtype=np.int64).astype(np.uint64)
    counter = (ids[:, None] * np.uint64(width) + np.arange(width, dtype=np.uint64)[None, :]) * np.uint64(2)
    key = _key(seed, step, sample)
    high = _mix(key ^ _mix(counter)) >> np.uint64(11)  # 53 random bits each
    low = _mix(key ^ _mix(counter + np.uint64(1))) >> np.uint64(11)
    u1 = (high.astype(np.float64) + 1.0) * 2.0 ** -53  # (0, 1]: the logarithm is finite
    u2 = low.astype(np.float64) * 2.0 ** -53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


class StateNormalisation(TensorNormalisation):
    """A trajectory dataset's statistics as tensors: those of :class:`TensorNormalisation` (inputs,
    the change over the stride as ``targets``, edges) and the state's, ``(x - mean) / scale``.

    ``to_dict()`` adds ``"state"`` to what a checkpoint stores, so a rollout normalises the state
    with the statistics the run trained with.
    """

    def __init__(self, normalisation: Normalisation, state: Mapping[str, Any], device: Any = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(normalisation, device, dtype)
        width = len(normalisation.targets.channels)
        self.state = {key: [float(v) for v in np.atleast_1d(state[key])] for key in ("mean", "std", "scale")}
        if any(len(v) != width for v in self.state.values()):
            raise ValueError(f"Expected the state's mean, std and scale for {width} channels (got "
                             f"{[len(v) for v in self.state.values()]})")
        self._state = tuple(torch.as_tensor(np.asarray(self.state[k], dtype=np.float64), device=device).to(dtype)
                            for k in ("mean", "scale"))

    @classmethod
    def from_dict(cls, values: dict[str, Any], device: Any = None,
                  dtype: torch.dtype = torch.float32) -> StateNormalisation:
        """From :meth:`to_dict` (a transient run's checkpoint config); one line when ``state`` is missing."""
        if not isinstance(values.get("state"), Mapping):
            raise ValueError("Expected the state's statistics in the run's normalisation (a run of the transient "
                             "task stores them)")
        return cls(Normalisation.from_dict(values), values["state"], device, dtype)

    def normalise_state(self, x: Tensor) -> Tensor:
        """``(x - mean) / scale`` with the state's statistics, ``(..., F_state)``."""
        return (x - self._state[0]) / self._state[1]

    def state_scale(self) -> Tensor:
        """``(F_state,)`` the state's scale: a normalised unit in physical units."""
        return self._state[1]

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint stores: the dataset's statistics and the state's."""
        return super().to_dict() | {"state": dict(self.state)}


@dataclass(frozen=True, eq=False)
class RolloutRows:
    """What a rollout keeps of trajectory ``k`` for some rows: normalised static inputs ``(n, F_in)``,
    one-hot classes ``(n, K)``, and the boundary mask ``(n,)`` (rows prescribed, not predicted)."""

    inputs: Tensor
    one_hot: Tensor
    boundary: Tensor


@dataclass(frozen=True, eq=False)
class LocalPair(LocalSample):
    """A pair ``(trajectory, step)`` on this rank, as :class:`LocalSample` (``sample`` is the pair
    id; ``x`` the model's input, ``y`` the normalised change, noisy at a training step) and:

    Attributes:
        trajectory, step: the pair's trajectory and its first step ``t``.
        interior: ``(N_own,)`` bool, the nodes of interior classes (in the loss).
        num_interior: interior nodes of the whole mesh (every rank's, summed).
        state: ``(N_own, F_state)`` the input state in physical units (with its noise).
        later: the true states at ``t + S``, ``t + 2S``, ... ``t + U S`` (``U`` the steps unrolled
            in training, ``--rollout-train``), each ``(N_own, F_state)``, physical units.
        rows: the static rows (:class:`RolloutRows`); normaliser: the statistics applied.
    """

    trajectory: int
    step: int
    interior: Tensor
    num_interior: int
    state: Tensor
    later: tuple[Tensor, ...]
    rows: RolloutRows
    normaliser: StateNormalisation


def _features(state: Tensor, inputs: Tensor, one_hot: Tensor) -> Tensor:
    """The model's input rows: ``[normalised state, normalised static inputs, one-hot class]``."""
    return torch.cat([state, inputs, one_hot.to(state.dtype)], dim=1)


class _PairNames(Sequence[str]):
    """``trajectory@t`` of every pair id, made when asked (the loop names a sample in an error)."""

    def __init__(self, reader: PairReader) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return int(self.reader.first[-1])

    def __getitem__(self, p: Any) -> Any:
        if isinstance(p, slice):
            return [self[i] for i in range(*p.indices(len(self)))]
        k, t = self.reader.locate(int(p))
        return f"{self.reader.trajectories.names[k]}@{t}"


class PairReader(TrajectoryReader):
    """This rank's reader of a trajectory dataset's pairs: what the training loop reads through
    :class:`TransientTask` (see the module docstring).

    Args: as :class:`~meshshard.tasks.TrajectoryReader`; ``normaliser`` may be a
    :class:`StateNormalisation` (a run's), else the dataset's statistics are used. ``unroll``: the
    steps each pair looks ahead (``--rollout-train``): the pairs are the steps ``t`` with
    ``t + unroll * S`` inside the trajectory.
    """

    def __init__(self, data: str | os.PathLike[str] | Dataset, partition: str | os.PathLike[str], domain_rank: int,
                 group: Any = None, *, unroll: int = 1, **options: Any) -> None:
        super().__init__(data, partition, domain_rank, group, **options)
        self.unroll = int(unroll)
        if not isinstance(self.normaliser, StateNormalisation):
            self.normaliser = StateNormalisation(self.normaliser.normalisation,
                                                 self.dataset.meta["normalisation"]["state"], self.device, self.dtype)
        tr = self.trajectories
        pairs = np.array([max(tr.num_steps(k) - self.unroll * tr.time_stride, 0) for k in range(tr.num_trajectories)],
                         dtype=np.int64)
        #: ``(num_trajectories + 1,)`` the pair id of ``(k, 0)``; the last entry counts every pair.
        self.first = np.concatenate([[0], np.cumsum(pairs)]).astype(np.int64)
        self._interior: dict[int, int] = {}

    def _pairs_of(self, trajectories: np.ndarray) -> np.ndarray:
        return np.concatenate([np.arange(self.first[k], self.first[k + 1]) for k in np.asarray(trajectories, int)]
                              + [np.zeros(0, np.int64)]).astype(np.int64)

    @property
    def train(self) -> np.ndarray:
        """The pair ids of the training trajectories."""
        return self._pairs_of(self.dataset.train)

    @property
    def val(self) -> np.ndarray:
        """The pair ids of the validation trajectories."""
        return self._pairs_of(self.dataset.val)

    @property
    def num_inputs(self) -> int:
        """``F_state + F_in + K``: the model's input width."""
        return len(self.trajectories.state_channels) + len(self.dataset.input_channels) + self.num_classes

    @property
    def sample_names(self) -> Sequence[str]:
        """``trajectory@t`` of every pair id."""
        return _PairNames(self)

    def locate(self, p: int) -> tuple[int, int]:
        """The trajectory and step ``(k, t)`` of pair id ``p``."""
        if not 0 <= p < self.first[-1]:
            raise ValueError(f"Expected a pair id in [0, {self.first[-1]}) (got {p})")
        k = int(np.searchsorted(self.first, p, side="right")) - 1
        return k, int(p - self.first[k])

    def mean_nodes(self, samples: np.ndarray | None = None) -> float:
        """Mean node count over the trajectories of ``samples`` (pair ids; default: the training pairs)."""
        ids = self.train if samples is None else np.asarray(samples)
        if not len(ids):
            return 0.0
        traj = np.searchsorted(self.first, ids, side="right") - 1
        return float(np.mean([self.dataset.num_nodes(int(k)) for k in traj]))

    def num_interior(self, k: int, interior: Tensor) -> int:
        """Interior nodes of trajectory ``k`` over the whole mesh (one all-reduce the first time;
        every rank of the domain group asks together)."""
        if k not in self._interior:
            count = torch.tensor([int(interior.sum())], dtype=torch.int64, device=interior.device)
            self._interior[k] = int(all_reduce_sum(count, group=self.group)[0])
        return self._interior[k]

    def sample(self, s: int) -> LocalPair:
        """Pair ``s`` as it is (no noise): what validation reads."""
        return self.pair_sample(s)

    def pair_sample(self, p: int, noise_std: float = 0.0, seed: int = 0, step: int = 0) -> LocalPair:
        """Pair ``p`` on this rank; with ``noise_std`` > 0, the noise of training step ``step``
        (:func:`step_noise`, times ``noise_std`` normalised units) added to the interior nodes' state
        and taken out of their target."""
        k, t = self.locate(int(p))
        now, later, _ = self.pair(k, t)
        ahead = [later.to_local()] + [
            torch.from_numpy(self.trajectories.state(k, t + j * self.time_stride, now.owned_ids)).to(self.device,
                                                                                                   self.dtype)
            for j in range(2, self.unroll + 1)]
        interior = ~now.boundary
        state = now.state.to_local()
        if noise_std > 0:
            z = step_noise(seed, step, int(p), now.owned_ids, state.shape[1]) * float(noise_std)
            z_t = torch.from_numpy(z).to(self.device, self.dtype) * interior[:, None].to(self.dtype)
            state = state + z_t * self.normaliser.state_scale()  # physical units
        rows = RolloutRows(now.inputs.to_local(),
                           torch.nn.functional.one_hot(now.class_index, self.num_classes).to(self.dtype), now.boundary)
        x = _features(self.normaliser.normalise_state(state), rows.inputs, rows.one_hot)
        y = self.normalise_change(ahead[0] - state)
        spec = now.graph.spec
        return LocalPair(int(p), now.mesh, now.graph, ShardTensor.from_local(x, spec), ShardTensor.from_local(y, spec),
                         now.edge_attr, now.owned_ids, k, t, interior, self.num_interior(k, interior), state,
                         tuple(ahead), rows, self.normaliser)


class TransientTask(Task):
    """The one-step map of trajectories, its training noise and its rollout (see the module docstring)."""

    name: ClassVar[str] = "transient"
    #: ``meshshard predict --rollout`` applies this task's steps.
    rolls_out: ClassVar[bool] = True

    def check_dataset(self, dataset: Any) -> None:
        """Refuse, in one line, a dataset that holds no trajectories."""
        if dataset.meta.get("task") != "transient":
            raise ValueError(f"{dataset.path}: holds no trajectories (the transient task trains on a dataset made "
                             "with meshshard dataset --state)")
        if self.config.get("loss_weight"):
            raise ValueError("Expected --loss-weight only with the steady task (got --task transient, whose loss "
                             "is over the interior classes: --interior-classes chooses them)")
        if self.config.get("relative_loss"):
            raise ValueError("Expected --relative-loss only with the steady task (got --task transient, whose loss "
                             "is the one-step error over the interior classes)")
        if self.config.get("force_loss"):
            raise ValueError("Expected --force-loss only with the steady task (got --task transient, whose loss "
                             "is the one-step error over the interior classes)")
        noise = self.config.get("noise_std", 0.0)
        if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise >= 0):
            raise ValueError(f"Expected --noise-std to be 0 (off) or a positive number (got {noise!r})")
        unroll = self.config.get("rollout_train", 1)
        if not (isinstance(unroll, int) and unroll >= 1):
            raise ValueError(f"Expected --rollout-train to be a positive integer (got {unroll!r})")
        stride = int(dataset.meta.get("time_stride", 1))
        short = [(str(dataset.meta["samples"][int(k)]["name"]), int(dataset.meta["samples"][int(k)]["num_steps"]))
                 for k in dataset.train if int(dataset.meta["samples"][int(k)]["num_steps"]) <= unroll * stride]
        if short:
            raise ValueError(f"{dataset.path}: Expected training trajectories of more than {unroll * stride} steps for "
                             f"--rollout-train {unroll} with stride {stride} (got {short[0][1]} in {short[0][0]}); "
                             "lower --rollout-train")

    def model_sizes(self, dataset: Any) -> tuple[int, int, int]:
        """``(F_state + F_in + K, F_e, F_state)``."""
        classes = len(dataset.meta["node_types"]["classes"])
        state = len(dataset.meta["state_channels"])
        return state + len(dataset.input_channels) + classes, len(dataset.edge_channels), state

    def reader(self, dataset: Any, partition: str | os.PathLike[str], domain_rank: int, group: Any, *,
               device: Any = None, dtype: torch.dtype = torch.float32, **options: Any) -> PairReader:
        """This rank's :class:`PairReader`."""
        return PairReader(dataset, partition, domain_rank, group, device=device, dtype=dtype,
                          unroll=int(self.config.get("rollout_train", 1) or 1), **options)

    def batch(self, reader: Any, sample: int, step: int) -> LocalPair:
        """Pair ``sample`` with the noise of training ``step`` (none when ``noise_std`` is 0)."""
        return reader.pair_sample(sample, float(self.config.get("noise_std", 0.0)), int(self.config.get("seed", 0)),
                                  step)

    def loss(self, pred: Any, batch: Any, apply: Any = None) -> Tensor:
        """Mean squared error of the normalised change over the interior nodes of the whole mesh and
        every channel: the sum over every rank's interior rows, divided by the global count.

        With ``apply`` (the training loop's model on this graph) and ``--rollout-train U`` > 1, the
        model is applied U - 1 times more, each time from the state its previous output made (the
        boundary rows set to the truth), and the U losses are summed: the error of each predicted
        state against the true one, in the change's normalised units. Validation (no ``apply``)
        takes the first only."""
        total = self._masked(pred, batch.y, batch)
        if apply is None or len(batch.later) < 2:
            return total
        norm, state, out = batch.normaliser, batch.state, pred
        for j in range(1, len(batch.later)):
            state = self.rollout_update(norm, state, out.to_local() if isinstance(out, ShardTensor) else out,
                                        batch.rows, batch.later[j - 1])
            x = self.rollout_input(norm, state, batch.rows)
            out = apply(ShardTensor.from_local(x, batch.graph.spec) if isinstance(pred, ShardTensor) else x)
            y = norm.normalise_targets(batch.later[j] - state)
            total = total + self._masked(out, ShardTensor.from_local(y, out.spec) if isinstance(out, ShardTensor)
                                         else y, batch)
        return total

    @staticmethod
    def _masked(pred: Any, y: Any, batch: Any) -> Tensor:
        """The mean of ``(pred - y) ** 2`` over the mesh's interior nodes and every channel."""
        err = (pred.to(y.dtype) - y) ** 2
        mask = batch.interior.to(y.dtype)[:, None]
        if isinstance(err, ShardTensor):
            mask = ShardTensor.from_local(mask, err.spec)
        return (err * mask).sum() / (max(batch.num_interior, 1) * y.shape[1])

    def output_fields(self, dataset: Any, run_config: dict[str, Any]) -> list[dict[str, Any]]:
        """The state fields: the dataset's, else those the run recorded."""
        if dataset is not None and dataset.meta.get("state"):
            return [dict(f) for f in dataset.meta["state"]]
        return [{"name": str(f["name"]), "components": int(f["components"])}
                for f in run_config.get("target_fields") or []]

    # -- the rollout: row-wise steps on this rank's owned rows ------------------------------------

    def prediction_normaliser(self, run_config: Mapping[str, Any], device: Any = None,
                              dtype: torch.dtype = torch.float32) -> StateNormalisation:
        """The statistics the run trained with, the state's included."""
        return StateNormalisation.from_dict(dict(run_config.get("normalisation") or {}), device, dtype)

    def rollout_rows(self, trajectories: Any, k: int, ids: np.ndarray, normaliser: StateNormalisation,
                     device: Any = None, dtype: torch.dtype = torch.float32) -> RolloutRows:
        """The static rows ``ids`` (global ids) of trajectory ``k`` (an open
        :class:`~meshshard.partition.Trajectories`)."""
        inputs = torch.from_numpy(trajectories.inputs(k, ids)).to(device, dtype)
        index = torch.from_numpy(trajectories.class_index(trajectories.node_type(k, ids))).to(device)
        return self.static_rows(inputs, index, trajectories.boundary, normaliser)

    @staticmethod
    def static_rows(inputs: Tensor, class_index: Tensor, boundary_of_class: Any,
                    normaliser: StateNormalisation) -> RolloutRows:
        """:class:`RolloutRows` from static inputs ``(n, F_in)`` in physical units, each row's class
        position ``(n,)`` (its index among the dataset's classes) and ``(K,)`` whether each class is a
        boundary class."""
        boundary_of_class = torch.as_tensor(boundary_of_class, device=class_index.device).bool()
        one_hot = torch.nn.functional.one_hot(class_index, len(boundary_of_class)).to(inputs.dtype)
        return RolloutRows(normaliser.normalise_inputs(inputs), one_hot, boundary_of_class[class_index])

    def rollout_input(self, normaliser: StateNormalisation, state: Tensor, rows: RolloutRows) -> Tensor:
        """The model's input for the state ``(n, F_state)`` in physical units (as training builds it)."""
        return _features(normaliser.normalise_state(state), rows.inputs, rows.one_hot)

    def rollout_update(self, normaliser: StateNormalisation, state: Tensor, out: Tensor, rows: RolloutRows,
                       truth: Tensor | None) -> Tensor:
        """The next state: ``state`` plus the predicted change (de-normalised) on the interior rows;
        on the boundary rows the truth where it is known (``truth``), else the state held."""
        new = state + normaliser.denormalise_targets(out.to(state.dtype))
        prescribed = truth if truth is not None else state
        return torch.where(rows.boundary[:, None], prescribed, new)
