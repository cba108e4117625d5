"""Channel statistics and normalisation: what training divides by, taken over the training split.

Per channel, the count, mean and population std (:class:`ChannelStats`), taken streaming, one
sample at a time, by Chan et al.'s pairwise update in float64 (:class:`Running`); a channel whose
spread is round-off against its field's magnitude is *held* (:func:`held_channels`,
:data:`HOLD_RELATIVE`). :class:`Normalisation` is the three of a dataset (inputs, targets, edge
features) with the targets' offset of a mean field. What ``dataset.json`` stores of them is the
format's (:mod:`meshshard.data._dataset`); the writers (:mod:`meshshard.data._writer`, the
trajectories' and the mean field's) take them with this module, which sits below all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from meshshard.partition import listed

if TYPE_CHECKING:
    from meshshard.partition import Graph

__all__ = ["HOLD_RELATIVE", "NORMALISATION_RULE", "OFFSET_RULE", "Running", "ChannelStats", "Normalisation",
           "held_channels", "held_note", "edge_moments"]

#: The rule ``dataset.json`` records beside the statistics: what training applies.
NORMALISATION_RULE = "(value - mean) / scale, scale = std or 1 where std == 0"
#: The rule of a dataset with ``--mean-field``: the targets' offset is subtracted first.
OFFSET_RULE = ("(value - mean) / scale, scale = std or 1 where std == 0; targets: (value - inputs[target_offset] - "
               "mean) / scale")
#: A channel whose std is at most this fraction of its field's magnitude is held as a constant.
HOLD_RELATIVE = 1e-6


class Running:
    """Per-channel count, mean and sum of squared deviations (float64), merged pairwise."""

    def __init__(self, width: int) -> None:
        self.n = 0
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def add(self, x: np.ndarray, times: int = 1) -> None:
        """Merge the rows of ``x`` (``(n, width)``), counted ``times`` times."""
        if len(x) == 0 or times == 0:
            return
        x = np.asarray(x, dtype=np.float64)
        n_b = len(x) * times
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by stats()
            mean_b = x.mean(axis=0)
            m2_b = ((x - mean_b) ** 2).sum(axis=0) * times
        self.merge(n_b, mean_b, m2_b)

    def merge(self, n_b: int, mean_b: np.ndarray, m2_b: np.ndarray) -> None:
        if n_b == 0:  # nothing to merge (a mesh without edges)
            return
        n = self.n + n_b
        with np.errstate(over="ignore", invalid="ignore"):
            delta = mean_b - self.mean
            self.mean = self.mean + delta * (n_b / n)
            self.m2 = self.m2 + m2_b + delta**2 * (self.n * n_b / n)
        self.n = n

    def stats(self, channels: Sequence[str]) -> ChannelStats:
        """The channels' statistics; ``ValueError`` naming a channel whose mean or std overflowed
        float64 (values finite one by one, but spread beyond what float64 holds)."""
        with np.errstate(over="ignore", invalid="ignore"):
            std = np.sqrt(self.m2 / self.n) if self.n else np.zeros_like(self.mean)
        mean = self.mean if self.n else np.zeros_like(self.mean)
        bad = ~(np.isfinite(mean) & np.isfinite(std))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"Expected finite training statistics of channel {channels[j]!r} (got mean {mean[j]:g}, "
                             f"std {std[j]:g}): its values span more than float64 can hold; rescale the field")
        return ChannelStats(tuple(channels), mean, std, int(self.n), held_channels(channels, mean, std))


def held_channels(channels: Sequence[str], mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """``(F,)`` bool: the channels whose spread is round-off, at most :data:`HOLD_RELATIVE` of
    their field's magnitude (the components ``u[0]``, ``u[1]``, ... of a field share it: the
    largest ``sqrt(mean^2 + std^2)`` among them)."""
    size = np.sqrt(np.asarray(mean, dtype=np.float64) ** 2 + np.asarray(std, dtype=np.float64) ** 2)
    field = [c.rsplit("[", 1)[0] if c.endswith("]") else c for c in channels]
    largest: dict[str, float] = {}  # one pass over the channels (100k parameters or components: linear)
    for f, v in zip(field, size.tolist(), strict=True):
        largest[f] = max(largest.get(f, -math.inf), v)
    magnitude = np.array([largest[f] for f in field], dtype=np.float64) if field else size
    return (np.asarray(std) > 0) & (np.asarray(std) <= HOLD_RELATIVE * magnitude)


@dataclass(frozen=True, eq=False)
class ChannelStats:
    """Per-channel mean and population std over ``count`` rows; ``scale`` is what divides.

    Shapes:
        mean, std, scale: ``(F,)`` float64.
    """

    channels: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    count: int
    held: np.ndarray | None = None  # (F,) bool: spread of round-off, held as a constant (scale 1)

    @property
    def scale(self) -> np.ndarray:
        """What divides: ``std``, or 1 where it is 0 or the channel is held."""
        held = self.held if self.held is not None else np.zeros(len(self.std), dtype=bool)
        return np.where((self.std > 0) & ~held, self.std, 1.0)

    @property
    def output_scale(self) -> np.ndarray:
        """What multiplies a model's output: ``scale``, and 0 for a held or constant channel (``std``
        0), which is predicted as its ``mean``: the model's output there is not a field, and would
        only add error."""
        held = self.held if self.held is not None else np.zeros(len(self.std), dtype=bool)
        return np.where(held | (self.std == 0), 0.0, self.scale)

    def normalise(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.scale

    def denormalise(self, x: np.ndarray) -> np.ndarray:
        """A model's output in units: ``x * scale + mean``, the constant ``mean`` on a held channel."""
        return x * self.output_scale + self.mean

    def to_dict(self) -> dict[str, Any]:
        out = {"mean": self.mean.tolist(), "std": self.std.tolist(), "scale": self.scale.tolist(),
               "count": self.count}
        if self.held is not None and self.held.any():
            out["held"] = self.held.tolist()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], channels: Sequence[str]) -> ChannelStats:
        mean, std = np.asarray(d["mean"], dtype=np.float64), np.asarray(d["std"], dtype=np.float64)
        if mean.shape != (len(channels),) or std.shape != mean.shape:
            raise ValueError(f"Expected {len(channels)} means and stds (got {mean.shape}, {std.shape})")
        held = np.asarray(d.get("held", [False] * len(channels)), dtype=bool)
        if held.shape != mean.shape:
            raise ValueError(f"Expected {len(channels)} held flags (got {held.shape})")
        return cls(tuple(channels), mean, std, int(d["count"]), held)


@dataclass(frozen=True, eq=False)
class Normalisation:
    """The statistics training applies: inputs, targets and edge features.

    One concept in two forms: this one (numpy, what ``dataset.json`` and a checkpoint store), and
    the same statistics as tensors on a device, ``meshshard.tasks.TensorNormalisation(norm,
    device, dtype)`` (formerly ``Normaliser``), which training and prediction apply. The tensor
    form lives above this layer, since ``meshshard.partition`` never imports torch.
    """

    inputs: ChannelStats
    targets: ChannelStats
    edges: ChannelStats
    #: Per target channel, the input channel (raw, before normalisation) subtracted from it first:
    #: the training cases' mean field of ``--mean-field`` (:mod:`meshshard.data._mean_field`).
    target_offset: tuple[int, ...] | None = None
    #: The SHA-256 of the mean field that offset holds (the dataset's ``mean_field.sha256``), so
    #: that a run predicts only on cases given the very mean field it trained with.
    offset_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to normalise and de-normalise, JSON-ready (stored in checkpoints)."""
        out = {"rule": NORMALISATION_RULE,
               "input_channels": list(self.inputs.channels),
               "target_channels": list(self.targets.channels),
               "edge_channels": list(self.edges.channels),
               "inputs": self.inputs.to_dict(), "targets": self.targets.to_dict(),
               "edges": self.edges.to_dict()}
        if self.target_offset is not None:
            out["rule"] = OFFSET_RULE
            out["target_offset"] = list(self.target_offset)
            if self.offset_sha256 is not None:
                out["offset_sha256"] = self.offset_sha256
        return out

    def offset(self, inputs: np.ndarray) -> np.ndarray | float:
        """What is subtracted from the targets before ``targets.normalise`` and added back after
        ``targets.denormalise``: the offset input channels of the raw ``inputs`` ``(..., F_in)``,
        or 0 without an offset."""
        if self.target_offset is None:
            return 0.0
        return np.asarray(inputs, dtype=np.float64)[..., list(self.target_offset)]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], input_channels: Sequence[str] | None = None,
                  target_channels: Sequence[str] | None = None,
                  edge_channels: Sequence[str] | None = None) -> Normalisation:
        """From :meth:`to_dict`'s output, or a dataset's ``normalisation`` plus its channels."""
        ic = input_channels if input_channels is not None else d["input_channels"]
        tc = target_channels if target_channels is not None else d["target_channels"]
        ec = edge_channels if edge_channels is not None else d["edge_channels"]
        offset = d.get("target_offset")
        if offset is not None:
            offset = tuple(int(j) for j in offset)
            if len(offset) != len(tc) or any(not 0 <= j < len(ic) for j in offset):
                raise ValueError(f"Expected a target_offset of {len(tc)} input channel indices in [0, {len(ic)}) "
                                 f"(got {list(offset)})")
        return cls(ChannelStats.from_dict(d["inputs"], ic), ChannelStats.from_dict(d["targets"], tc),
                   ChannelStats.from_dict(d["edges"], ec), offset,
                   None if d.get("offset_sha256") is None else str(d["offset_sha256"]))


def edge_moments(graph: Graph, pos: np.ndarray, chunk: int = 1 << 21) -> Running:
    """Moments of ``[pos[src] - pos[dst], |.|]`` over the graph's directed edges, in chunks."""
    run = Running(pos.shape[1] + 1)
    indptr, indices = graph.indptr, graph.indices
    n = graph.num_nodes
    start = 0
    while start < n:
        stop = int(np.searchsorted(indptr, indptr[start] + chunk, side="right"))
        stop = min(max(stop - 1, start + 1), n)
        lo, hi = int(indptr[start]), int(indptr[stop])
        dst = np.repeat(np.arange(start, stop), np.diff(indptr[start:stop + 1]))
        rel = pos[indices[lo:hi]] - pos[dst]
        run.add(np.concatenate([rel, np.linalg.norm(rel, axis=1, keepdims=True)], axis=1))
        start = stop
    return run


def held_note(meta: Mapping[str, Any]) -> str | None:
    """The note on a dataset's channels held as constants (their spread is round-off), or None."""
    said = []
    for part in ("inputs", "targets"):
        stats = meta["normalisation"].get(part) or {}
        channels = meta.get(f"{part[:-1]}_channels") or []
        for i, flag in enumerate(stats.get("held") or []):
            if flag:
                name = channels[i] if i < len(channels) else f"{part} channel {i}"
                said.append(f"{name} (std {stats['std'][i]:.3g} about {stats['mean'][i]:.3g})")
    if not said:
        return None
    return (f"{listed(said)} {'is' if len(said) == 1 else 'are'} held as constant: the spread is round-off against "
            "the field's magnitude (as the w of a 2-D velocity), so it is not scaled up into noise the model would "
            "be asked to fit")
