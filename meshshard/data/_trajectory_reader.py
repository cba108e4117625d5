"""Reading a trajectory dataset (format: :mod:`meshshard.data._trajectories`): one rank's rows of a
step, its static inputs and node classes, from memory maps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ._dataset import METADATA_FILE
from ._reader import Dataset, open_dataset
from ._trajectories import is_trajectory_dataset

__all__ = ["Trajectories", "open_trajectories"]


class Trajectories:
    """A trajectory dataset opened for reading, one rank's rows at a time (memory maps).

    Attributes:
        dataset: The :class:`~meshshard.partition.Dataset` (meshes, split, normalisation).
        num_trajectories, names, time_stride, state_channels, input_channels.
        classes: ``node_types.classes``; ``class_ids`` ``(K,)`` int64 in one-hot order;
        boundary ``(K,)`` bool, per class.
    """

    def __init__(self, data: str | os.PathLike[str] | Dataset) -> None:
        self.dataset = data if isinstance(data, Dataset) else open_dataset(data)
        meta = self.dataset.meta
        if not is_trajectory_dataset(meta):
            raise ValueError(f"{self.dataset.path}: not a trajectory dataset (made without --state)")
        try:
            self.time_stride = int(meta["time_stride"])
            self.state_channels: list[str] = list(meta["state_channels"])
            self.classes: list[dict[str, Any]] = list(meta["node_types"]["classes"])
            self.class_ids = np.array([int(c["id"]) for c in self.classes], dtype=np.int64)
            self.boundary = np.array([bool(c["boundary"]) for c in self.classes], dtype=bool)
            steps = [int(s["num_steps"]) for s in meta["samples"]]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{self.dataset.path}: Expected the keys of a trajectory dataset (missing or malformed "
                             f"{err})") from None
        if self.time_stride < 1 or any(t <= self.time_stride for t in steps) or np.any(np.diff(self.class_ids) <= 0):
            raise ValueError(f"{self.dataset.path}: inconsistent trajectory metadata (stride, steps or classes)")
        self._steps = steps
        self.num_trajectories = len(steps)
        self.names = [str(s["name"]) for s in meta["samples"]]
        self.input_channels = self.dataset.input_channels

    def num_steps(self, k: int) -> int:
        """T, the steps of trajectory ``k``."""
        return self._steps[self.dataset.sample_index(k)]

    def num_pairs(self, k: int) -> int:
        """The (input, target) pairs of trajectory ``k``: steps ``t`` with ``t + S < T``."""
        return self.num_steps(k) - self.time_stride

    def times(self, k: int) -> np.ndarray:
        """``(T,)`` the times of trajectory ``k``'s steps."""
        return np.asarray(self.dataset.meta["samples"][self.dataset.sample_index(k)]["times"], dtype=np.float64)

    def _file(self, k: int, name: str) -> Path:
        return self.dataset.path / "samples" / f"{self.dataset.sample_index(k):05d}" / name

    def state_array(self, k: int) -> np.ndarray:
        """``(T, N, F_state)`` memory map of trajectory ``k``'s states (nothing read yet)."""
        n, f = self.dataset.num_nodes(k), len(self.state_channels)
        a = self._load(self._file(k, "state.npy"))
        if a.shape != (self.num_steps(k), n, f) or a.dtype.kind != "f":
            raise ValueError(f"{self._file(k, 'state.npy')}: Expected a float array of shape "
                             f"({self.num_steps(k)}, {n}, {f}) (got {a.dtype} {a.shape})")
        return a

    def _load(self, file: Path) -> np.ndarray:
        try:
            return self.dataset.load_npy(file, "r")
        except FileNotFoundError:
            raise ValueError(f"{file}: missing (the dataset folder is incomplete)") from None
        except (ValueError, OSError) as err:
            raise ValueError(str(err) if str(err).startswith(str(file)) else f"{file}: not a readable .npy file "
                             f"({err})") from None

    def state(self, k: int, t: int, node_ids: np.ndarray) -> np.ndarray:
        """``(n, F_state)`` float64: the state of ``node_ids`` (global ids) at step ``t`` of trajectory ``k``."""
        if not 0 <= int(t) < self.num_steps(k):
            raise ValueError(f"Expected a step in [0, {self.num_steps(k)}) of trajectory {k} (got {t})")
        return np.asarray(self.state_array(k)[int(t)][np.asarray(node_ids, dtype=np.int64)], dtype=np.float64)

    def inputs(self, k: int, node_ids: np.ndarray) -> np.ndarray:
        """``(n, F_in)`` float64: the static inputs of ``node_ids`` in trajectory ``k``."""
        file, n = self._file(k, "inputs.npy"), self.dataset.num_nodes(k)
        a = self._load(file)
        if a.shape != (n, len(self.input_channels)) or a.dtype.kind != "f":
            raise ValueError(f"{file}: Expected a float array of shape ({n}, {len(self.input_channels)}) (got "
                             f"{a.dtype} {a.shape})")
        return np.asarray(a[np.asarray(node_ids, dtype=np.int64)], dtype=np.float64)

    def node_type(self, k: int, node_ids: np.ndarray) -> np.ndarray:
        """``(n,)`` int64: the class ids of ``node_ids`` in trajectory ``k``."""
        file, n = self._file(k, "node_type.npy"), self.dataset.num_nodes(k)
        a = self._load(file)
        if a.shape != (n,) or a.dtype.kind not in "iu":
            raise ValueError(f"{file}: Expected an integer array of shape ({n},) (got {a.dtype} {a.shape})")
        ids = np.asarray(a[np.asarray(node_ids, dtype=np.int64)], dtype=np.int64)
        if ids.size and not np.isin(ids, self.class_ids).all():
            raise ValueError(f"{file}: holds a class not in {METADATA_FILE}'s node_types (damaged or edited)")
        return ids

    def class_index(self, ids: np.ndarray) -> np.ndarray:
        """Class ids to their one-hot position (the index in :attr:`classes`)."""
        return np.searchsorted(self.class_ids, np.asarray(ids, dtype=np.int64))

    def __repr__(self) -> str:
        return (f"Trajectories({str(self.dataset.path)!r}, {self.num_trajectories} trajectories, stride "
                f"{self.time_stride}, state={self.state_channels}, classes={self.class_ids.tolist()})")


def open_trajectories(path: str | os.PathLike[str] | Dataset) -> Trajectories:
    """Open a trajectory dataset folder (reads ``dataset.json``; arrays are memory-mapped on use)."""
    return Trajectories(path)
