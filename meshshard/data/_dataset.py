"""The on-disk dataset format, version 2 (``FORMAT_VERSION``), and its reader and writer.

A dataset is what training and prediction read: per sample, input and target fields at the
nodes of a mesh, plus the mesh itself (so that predictions can be written back onto it) and the
normalisation statistics of the training split. numpy ``.npy`` files and one JSON file, nothing
pickled. Two kinds, detected when the dataset is written:

- ``"one-mesh"``: every sample has the same points and cells (one graph, one partition);
- ``"many-meshes"``: samples have their own meshes (one partition per distinct mesh; samples
  whose meshes are identical share one).

Folder layout::

    DATA/
    ├── dataset.json                 format, kind, fields, split, normalisation, meshes, samples
    ├── meshes/
    │   └── 00000/                   one folder per distinct mesh, meshes/{m:05d}/
    │       ├── points.npy           (N_m, D) float64 coordinates
    │       ├── cells-triangle.npy   (C, k) int64, one file per meshio cell type ...
    │       ├── edge_index.npy       ... or (2, E) int64 edges: a graph given without cells, or built
    │       │                        from the points (the mesh's "graph" entry, see below)
    │       └── surface-area.npy     (N_m, 3) float64 area vectors, for a surface in 3-D
    └── samples/
        ├── 00000/                   one folder per sample, samples/{s:05d}/
        │   ├── inputs.npy           (N_m, F_in) float32 (or float64: ``dtype``), unnormalised
        │   └── targets.npy          (N_m, F_out), unnormalised
        └── ...

Every ``.npy`` is read with ``np.load(mmap_mode="r", allow_pickle=False)``: a rank reads only its
own rows of a sample (``inputs[owned_ids]``), so memory per rank is O(shard + halo), never O(N).
Paths are never read from the JSON: ``meshes/{m:05d}`` and ``samples/{s:05d}`` follow from the
indices (the ``folder`` entries are checked against them), so no entry can point outside DATA.

Fields and channels. ``inputs`` and ``targets`` list fields in channel order, each with its
component count: a scalar field is one channel named after it, a vector field ``u`` with 3
components is the channels ``u[0]``, ``u[1]``, ``u[2]``, a single component selected as ``u[1]``
is one channel ``u[1]``. The reserved name ``pos`` is the node coordinates (``D`` channels
``pos[0]``...). Edge channels are those of ``meshshard.edge_features``: ``dpos[i]`` the
components of ``pos[src] - pos[dst]``, then ``|dpos|`` its length, over every directed edge of
the mesh's nodal graph (both directions of every cell edge).

Optional keys, written only when used. An input field of ``meshshard dataset --wall-distance``
(``wall_distance``, one channel) lists the boundaries it measures to: ``{"name":
"wall_distance", "components": 1, "patches": ["lowerWall", "upperWall"]}``; one of ``--boundary-classes``
(``node_type``, one-hot) its classes: ``{"name": "node_type", "components": 3, "classes": ["interior",
"inlet", "wall"]}``. ``"collapsed_2d":
true`` says the meshes are the lower planes of one-cell-thick 3-D meshes (``--collapse-2d``), so
new cases to predict on must be read the same way. A mesh's ``"boundaries"`` (written when its
file names boundaries: a ``.vtm``'s patches, node sets, gmsh physical groups) lists them in name
order, ``[{"name", "num_nodes", "area"}]``; boundary ``k`` is stored as
``meshes/{m:05d}/boundary-{k:03d}.npy`` (sorted node ids) and ``boundary-{k:03d}-area.npy`` (the
area vector each node stands for, :mod:`meshshard.data._surface`). A mesh whose graph was built
from its points (``meshshard dataset --graph``; a point cloud's by default, see
:mod:`meshshard.partition._points`) records the rule, ``"graph": {"rule": "knn", "k": 8,
"symmetric": true}`` or ``{"rule": "radius", "radius": R}``, and stores the edges as
``edge_index.npy`` beside any cells (the cells are kept for writing predictions, the edges are the
graph; the mesh checksum covers both), and the dataset records the rule as ``"graph": "knn:8"``.
``"mean_field": {"of", "samples", "sha256"}`` (``--mean-field``, :mod:`meshshard.data._mean_field`)
says the last input fields, ``<target>_mean`` (marked ``"mean_of"``), hold the training samples'
node-wise mean of the targets, and ``normalisation.target_offset`` (with ``offset_sha256``, the
mean field's checksum) that the targets are normalised as their difference from it. A surface in 3-D
(faces, no 3-D cells) has ``"surface_area"`` (its total area; ``"planar": true``
when every point has the same z, a 2-D mesh written in 3-D) and
``meshes/{m:05d}/surface-area.npy``: per point, the lumped area vector of the faces around it
(:meth:`Dataset.surface_area`). ``"max_points": N`` (``--max-points``) asks training of a point model to draw a
random subset of about ``N`` points of a sample per epoch (``train --max-points`` overrides it). None of
these changes how the samples are read.

Inputs only. A dataset made without targets (``meshshard dataset`` without ``--targets``,
``write_dataset(targets=None)``) holds new cases to predict on: ``targets`` and
``target_channels`` are empty, every ``targets.npy`` is ``(N_m, 0)``, the split has no
validation samples unless asked for. ``meshshard train`` refuses it; ``meshshard predict`` writes
the predicted fields alone.

Normalisation. ``normalisation.inputs`` / ``targets`` / ``edges`` hold, per channel, the
``mean`` and population ``std`` over every node (every directed edge) of every **training**
sample, and ``scale``: ``std``, or ``1.0`` where ``std`` is 0 or round-off. A channel whose spread
is below :data:`HOLD_RELATIVE` of its field's magnitude (``sqrt(mean^2 + std^2)`` of the largest
component: the w of a 2-D velocity that a solver writes as +-1e-15) is *held*: listed in ``held``
(written only when some channel is), scaled by 1, so its round-off stays round-off instead of
becoming O(1) noise the model would be asked to fit. What training applies is
``(value - mean) / scale`` and nothing else; prediction applies ``value * scale + mean`` to the
model's output, except on a target channel that is held or constant over the training split
(``std`` 0): that one is predicted as its ``mean``, since the model's output there is not a field
(its few hundredths would be the whole error of a 2-D velocity's w). ``count`` is the number of rows
the statistics were taken over. They are
computed streaming, one sample at a time (Chan et al.'s pairwise update, float64).

Mesh checksum. ``meshes[m].sha256`` is the SHA-256 of the mesh as stored (:func:`mesh_checksum`:
the points as float64, then every cell block's type and int64 connectivity, or the edge_index,
each preceded by its shape). A partition of the dataset records it as its ``input.sha256``
(``input.kind == "dataset"``); :func:`check_partition_matches` compares it and the node count.

``dataset.json`` of the example below: the six-node triangle mesh ::

    3 --- 4 --- 5
    | \\   | \\   |
    0 --- 1 --- 2       triangles (0, 1, 4), (0, 4, 3), (1, 2, 5), (1, 5, 4)

with points ``(x, y) = (i % 3, i // 3)`` and three samples, one input ``T`` (``T = s * x`` for
sample ``s``) and one 2-component target ``u`` (``u = (y, s)``), the last sample for
validation, written by ``write_dataset(DIR, inputs, targets, pos=points, cells=[("triangle",
triangles)], input_names=["T"], target_names=[("u", 2)], sample_names=["a", "b", "c"],
val_samples=[2])``::

    {
      "format": "meshshard-dataset",
      "format_version": 2,
      "kind": "one-mesh",
      "num_samples": 3,
      "dtype": "float32",
      "inputs": [{"name": "T", "components": 1}],
      "targets": [{"name": "u", "components": 2}],
      "input_channels": ["T"],
      "target_channels": ["u[0]", "u[1]"],
      "edge_channels": ["dpos[0]", "dpos[1]", "|dpos|"],
      "split": {"train": [0, 1], "val": [2]},
      "normalisation": {
        "rule": "(value - mean) / scale, scale = std or 1 where std == 0",
        "inputs": {"mean": [0.5], "std": [0.7637626158259734], "scale": [0.7637626158259734], "count": 12},
        "targets": {"mean": [0.5, 0.5], "std": [0.5, 0.5], "scale": [0.5, 0.5], "count": 12},
        "edges": {"mean": [0.0, 0.0, 1.0920474583051323],
                  "std": [0.816496580927726, 0.7453559924999299, 0.17220502615058225],
                  "scale": [0.816496580927726, 0.7453559924999299, 0.17220502615058225], "count": 36}
      },
      "meshes": [
        {"folder": "meshes/00000", "num_nodes": 6, "pos_dim": 2, "num_edges": 18, "cells": {"triangle": 4},
         "sha256": "9333b48d40f2189652b07a391c52195193be1435eb1462481f6ab53c8d3e5c63"}
      ],
      "samples": [
        {"name": "a", "mesh": 0, "folder": "samples/00000", "source": null},
        {"name": "b", "mesh": 0, "folder": "samples/00001", "source": null},
        {"name": "c", "mesh": 0, "folder": "samples/00002", "source": null}
      ]
    }

``source`` is the file a sample was read from (by ``meshshard dataset``), relative to nothing:
just its name as given, for the user's information.

Partitions of a dataset (``meshshard partition DATA --parts K --out PARTS``): for a one-mesh
dataset, PARTS is an ordinary partition folder (:mod:`meshshard.partition._format`); for a
many-meshes dataset it is a folder of them::

    PARTS/
    ├── partitions.json      {"format": "meshshard-dataset-partitions", "format_version": 1,
    │                         "num_parts": K, "meshes": [{"mesh": 0, "folder": "mesh-00000",
    │                         "num_nodes": N_0, "sha256": <mesh checksum>}, ...]}
    ├── mesh-00000/          the partition of meshes/00000 (partition.json, part-*.npz)
    └── ...

Public names (stable; ``meshshard.partition`` re-exports them):

- :func:`write_dataset` (numpy arrays), :func:`write_dataset_from_pyg` (PyG ``Data`` list), and
  :func:`write_samples` (any iterable of :class:`Sample`, used by ``meshshard dataset``);
- :func:`open_dataset` -> :class:`Dataset`: ``meta`` (the JSON above), ``kind``, ``train`` /
  ``val``, ``input_channels`` / ``target_channels`` / ``edge_channels``, ``normalisation``,
  ``sample_mesh(s)``, ``num_nodes(s)``, ``rows(s, node_ids)`` (unnormalised, float64),
  ``sample_arrays(s)`` (the memory maps), ``mesh(m)`` -> :class:`Mesh` (``points``, ``cells`` by
  type, ``edge_index``, ``sha256``, ``graph()``: for partitioning and for writing predictions);
- :class:`ChannelStats`, :class:`Normalisation` (``to_dict`` / ``from_dict``: what a checkpoint
  stores);
- :func:`mesh_checksum`, :func:`is_dataset`, :func:`check_partition_matches` (PARTS belongs to
  DATA, else one line), :func:`dataset_partition_folder` (the partition folder of mesh ``m``),
  :func:`read_partitions_metadata`.

The torch side (normalised owned rows as tensors, de-normalisation of predictions) is
``meshshard._data``.

Trajectory datasets (``"task": "transient"``, ``state.npy`` and ``node_type.npy`` per sample) add
to this format what :mod:`meshshard.data._trajectories` documents.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshshard.partition import MAX_LISTED, listed, plural  # noqa: F401 - also imported from here
from meshshard.partition.files import (
    Refusals,
    check_destination,
    dumps_json,
    is_lock_file,
    naming_write_errors,
    read_json,
    write_text_file,
)

if TYPE_CHECKING:  # imported where used: a training rank reading samples needs no scipy
    from meshshard.partition import Cells, Graph

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "KINDS",
    "PARTITIONS_FORMAT",
    "PARTITIONS_FILE",
    "Sample",
    "Mesh",
    "ChannelStats",
    "Normalisation",
    "Dataset",
    "write_dataset",
    "write_dataset_from_pyg",
    "write_samples",
    "open_dataset",
    "read_dataset_metadata",
    "read_partitions_metadata",
    "dump_metadata",
    "is_dataset",
    "mesh_checksum",
    "channel_names",
    "split_samples",
    "check_dataset_output",
    "check_partition_matches",
    "dataset_partition_folder",
]

FORMAT_NAME = "meshshard-dataset"
FORMAT_VERSION = 2
METADATA_FILE = "dataset.json"
KINDS = ("one-mesh", "many-meshes")
PARTITIONS_FORMAT = "meshshard-dataset-partitions"
PARTITIONS_FILE = "partitions.json"
NORMALISATION_RULE = "(value - mean) / scale, scale = std or 1 where std == 0"
#: The rule of a dataset with ``--mean-field``: the targets' offset is subtracted first.
OFFSET_RULE = ("(value - mean) / scale, scale = std or 1 where std == 0; targets: (value - inputs[target_offset] - "
               "mean) / scale")
#: A channel whose std is at most this fraction of its field's magnitude is held as a constant.
HOLD_RELATIVE = 1e-6

#: The boundary name of a surface sample's every point (``predict --boundary surface``).
SURFACE = "surface"
_CELL_TYPE = re.compile(r"^[A-Za-z0-9_]+$")
_OUR_FILE = re.compile(
    r"^(dataset\.json|meshes/\d{5}/(points|edge_index|cells-[A-Za-z0-9_]+|boundary-\d{3}(-area)?|surface-area)\.npy|"
    r"samples/\d{5}/(inputs|targets|state|node_type)\.npy)$")
_OUR_DIR = re.compile(r"^(meshes|samples)(/\d{5})?$")

FieldSpec = "str | tuple[str, int]"


# ---------------------------------------------------------------------------------------------
# Fields, channels, checksums


def channel_names(fields: Sequence[Mapping[str, Any]]) -> list[str]:
    """``[{"name": "T", "components": 1}, {"name": "u", "components": 2}]`` -> ``T, u[0], u[1]``."""
    out: list[str] = []
    for f in fields:
        k = int(f["components"])
        out.extend([f["name"]] if k == 1 else [f"{f['name']}[{i}]" for i in range(k)])
    return out


def _fields(names: Sequence[Any] | None, width: int, default: str, what: str) -> list[dict[str, Any]]:
    """Field records from names (``"T"`` one channel, ``("u", 3)`` three) for ``width`` channels."""
    if names is None:
        return [{"name": default, "components": width}]
    fields = []
    for item in names:
        name, k = (item, 1) if isinstance(item, str) else (str(item[0]), int(item[1]))
        if not name or k < 1:
            raise ValueError(f"Expected '{what}' entries of a name or (name, components >= 1) (got {item!r})")
        fields.append({"name": name, "components": k})
    total = sum(f["components"] for f in fields)
    if total != width:
        raise ValueError(f"Expected '{what}' to name {plural(width, 'channel')} (got {total}: {channel_names(fields)})")
    return fields


def mesh_checksum(points: np.ndarray, cells: Cells = (), edge_index: np.ndarray | None = None) -> str:
    """SHA-256 of a mesh as the dataset stores it (points float64, connectivity int64)."""
    digest = hashlib.sha256(b"meshshard-mesh-v1")

    def add(tag: bytes, array: np.ndarray) -> None:
        digest.update(tag + b"\0" + np.asarray(array.shape, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(array).tobytes())

    add(b"points", np.asarray(points, dtype=np.float64))
    for cell_type, conn in cells:
        add(b"cells:" + cell_type.encode(), np.asarray(conn, dtype=np.int64))
    if edge_index is not None:
        add(b"edge_index", np.asarray(edge_index, dtype=np.int64))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Statistics


class _Running:
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
    magnitude = np.array([max(size[j] for j in range(len(field)) if field[j] == f) for f in field]) if field else size
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


def edge_channel_names(pos_dim: int) -> list[str]:
    return [f"dpos[{i}]" for i in range(pos_dim)] + ["|dpos|"]


def _edge_moments(graph: Graph, pos: np.ndarray, chunk: int = 1 << 21) -> _Running:
    """Moments of ``[pos[src] - pos[dst], |.|]`` over the graph's directed edges, in chunks."""
    run = _Running(pos.shape[1] + 1)
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


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True, eq=False)
class Sample:
    """One sample to write: its mesh and its fields (unnormalised).

    Shapes:
        pos: ``(N, D)``. cells: blocks ``(C_b, k_b)``. edge_index: ``(2, E)``.
        inputs: ``(N, F_in)``. targets: ``(N, F_out)``.
    """

    name: str
    pos: np.ndarray
    inputs: np.ndarray
    targets: np.ndarray
    cells: Cells = ()
    edge_index: np.ndarray | None = None
    source: str | None = None
    boundaries: Mapping[str, np.ndarray] | None = None
    graph: Mapping[str, Any] | None = None  # how edge_index was made from the points (--graph), if it was


def split_samples(names: Sequence[str], val_fraction: float | None = None,
                  val_samples: Sequence[int | str] | None = None) -> tuple[list[int], list[int]]:
    """(train, val) sample indices: the given ``val_samples`` (indices or names), or
    ``round(val_fraction * S)`` samples (at least one when the fraction is positive and S >= 2)
    drawn by a fixed permutation (seed 0); at least one sample is always left for training."""
    s = len(names)
    if val_samples is not None and val_fraction is not None:
        raise ValueError("Expected --val-fraction or --val-samples, not both")
    if val_samples is not None:
        by_name = {n: i for i, n in enumerate(names)}
        val = set()
        for item in val_samples:
            text = str(item).strip()
            if text in by_name:
                val.add(by_name[text])
            elif text.lstrip("-").isdigit() and 0 <= int(text) < s:
                val.add(int(text))
            else:
                raise ValueError(f"Expected --val-samples to name samples (indices 0..{s - 1} or names "
                                 f"such as {', '.join(list(names)[:3])}) (got {text!r})")
    else:
        f = 0.2 if val_fraction is None else float(val_fraction)
        if not 0.0 <= f < 1.0:
            raise ValueError(f"Expected --val-fraction in [0, 1) (got {f})")
        k = int(round(f * s))
        if f > 0 and s >= 2:
            k = max(k, 1)
        k = min(k, s - 1)
        val = set(np.random.default_rng(0).permutation(s)[:k].tolist()) if k > 0 else set()
    train = [i for i in range(s) if i not in val]
    if not train:
        raise ValueError("Expected at least one training sample (got "
                         f"{'the only sample' if s == 1 else f'all {s} samples'} for validation)")
    return train, sorted(val)


def _is_ours(out: Path) -> str | None:
    """None when ``out`` holds a dataset and only our files; otherwise why not."""
    meta = out / METADATA_FILE
    try:
        if read_json(meta).get("format") != FORMAT_NAME:
            return f"{METADATA_FILE} is not a {FORMAT_NAME} file"
    except (OSError, ValueError, AttributeError):
        return f"no readable {METADATA_FILE}"
    for path in out.rglob("*"):
        rel = path.relative_to(out).as_posix()
        if is_lock_file(path):  # left by a killed command: ours
            continue
        if path.is_symlink():
            return f"it holds a link ({rel})"
        if path.is_dir() and not _OUR_DIR.match(rel) or path.is_file() and not _OUR_FILE.match(rel):
            return f"it holds {rel}, which meshshard did not write"
    return None


#: A dataset folder's words for :func:`check_destination`'s refusals.
_REFUSALS = Refusals(
    current="{out}: refusing to write a dataset over the current folder or a parent of it",
    holds_input="{out}: refusing to write a dataset over a folder holding the source {input}",
    link="{out}: exists and is not a folder",
    not_empty="{out}: exists and is not empty (pass --force to replace a dataset folder)")


def _check_is_dataset(out: Path) -> None:
    """Raise unless ``out`` holds a dataset and only our files (what ``--force`` may replace)."""
    why = _is_ours(out)
    if why is not None:
        raise ValueError(f"{out}: is not a meshshard dataset folder ({why}); refusing to replace it, even with --force")


def check_dataset_output(out: str | os.PathLike[str], force: bool,
                         sources: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Raise unless ``out`` may be written: absent, an empty folder, or with ``force`` a dataset
    folder holding only our files; never ``.``, a parent of the current folder, or a folder that
    is or contains a source (:func:`check_destination`, which first puts back what an interrupted
    replace set aside)."""
    check_destination(out, force=force, is_ours=_check_is_dataset, inputs=sources, refusals=_REFUSALS)
    return Path(out)


def _save_npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming_write_errors(path), open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def _check_sample(sample: Sample, index: int, in_width: int | None,
                  out_width: int | None) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """Shapes, ids and finiteness of one sample; returns its float64 points and merged cells."""
    where = sample.source or f"sample {index} ({sample.name!r})"
    pos = np.asarray(sample.pos, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] not in (1, 2, 3) or len(pos) == 0:
        raise ValueError(f"{where}: Expected points of shape (N, 2) or (N, 3), N >= 1 (got {pos.shape})")
    n = len(pos)
    bad = ~np.isfinite(pos).all(axis=1)
    if bad.any():
        raise ValueError(f"{where}: Expected finite coordinates (got NaN or inf at node {int(np.flatnonzero(bad)[0])})")
    for what, array, width in (("inputs", sample.inputs, in_width), ("targets", sample.targets, out_width)):
        a = np.asarray(array)
        if a.ndim != 2 or a.shape[0] != n or (width is not None and a.shape[1] != width):
            want = f"({n}, {width if width is not None else 'F'})"
            raise ValueError(f"{where}: Expected {what} of shape {want}, one row per node (got {a.shape})")
    merged: dict[str, list[np.ndarray]] = {}
    for cell_type, conn in sample.cells:
        conn = np.asarray(conn)
        if not _CELL_TYPE.match(str(cell_type)):
            raise ValueError(f"{where}: Expected a cell type of letters, digits and '_' (got {cell_type!r})")
        if conn.ndim != 2 or not np.issubdtype(conn.dtype, np.integer) or (
                conn.size and (conn.min() < 0 or conn.max() >= n)):
            raise ValueError(f"{where}: Expected {cell_type} cells of shape (C, k) with node ids in [0, {n}) "
                             f"(got shape {conn.shape}, dtype {conn.dtype})")
        merged.setdefault(str(cell_type), []).append(conn.astype(np.int64))
    cells = [(t, np.concatenate(c) if len(c) > 1 else c[0]) for t, c in merged.items()]
    if not cells and sample.edge_index is None:
        raise ValueError(f"{where}: Expected cells or an edge_index (got neither; a point cloud's: "
                         "meshshard.partition.point_graph(pos, parse_graph_rule('knn:8')))")
    return pos, cells


def _stored(array: np.ndarray, dtype: np.dtype, channels: Sequence[str], where: str, name: str) -> np.ndarray:
    """``array`` (finite float64) cast to the stored ``dtype``; a value beyond its range (1e300
    in float32), which the cast turns into an infinity, is refused naming the sample and field."""
    with np.errstate(over="ignore"):  # refused below, naming the value
        stored = array.astype(dtype)
    bad = ~np.isfinite(stored)
    if bad.any():
        node, ch = (int(v[0]) for v in np.nonzero(bad))
        raise ValueError(f"{where}: Expected the values of field {channels[ch]!r} of sample {name!r} to fit {dtype} "
                         f"(got {array[node, ch]:g} at node {node}, beyond {dtype}'s largest magnitude "
                         f"{float(np.finfo(dtype).max):.2g}; {plural(int(bad.sum()), 'such value')} in all)")
    return stored


def _check_finite(array: np.ndarray, channels: Sequence[str], where: str, name: str) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        node, ch = (int(v[0]) for v in np.nonzero(bad))
        value = array[node, ch]
        raise ValueError(f"{where}: Expected finite values in field {channels[ch]!r} of sample {name!r} "
                         f"(got {value} at node {node}; {plural(int(bad.sum()), 'non-finite value')} in all)")


def write_samples(
    out: str | os.PathLike[str],
    samples: Iterable[Sample],
    names: Sequence[str],
    *,
    input_fields: Sequence[Mapping[str, Any]],
    target_fields: Sequence[Mapping[str, Any]],
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    sources: Sequence[str | os.PathLike[str]] = (),
    progress: Callable[[int], None] | None = None,
    parameters: Mapping[str, Any] | None = None,
    target_scales: Mapping[str, str] | None = None,
    collapsed_2d: bool = False,
    max_points: int | None = None,
    mean_field: bool | tuple[np.ndarray, list[dict[str, Any]], str, str] = False,
) -> Path:
    """Write a dataset folder from ``samples``, consumed one at a time (never all in memory).

    Args:
        out: The folder to create (written to a temporary folder beside it, renamed at the end;
            nothing is left behind on error).
        samples: The samples, in order; ``names[i]`` must be ``samples[i].name``.
        names: Every sample's name, known up front (the split is drawn from them).
        input_fields, target_fields: ``[{"name", "components"}]`` in channel order.
        val_fraction, val_samples: The validation split, see :func:`split_samples`.
        dtype: ``"float32"`` or ``"float64"`` for the stored fields.
        force: Replace an existing dataset folder (only one, see :func:`check_dataset_output`).
        sources: Input paths ``out`` must not contain.
        progress: Called with 1 after each sample.
        parameters: Per-sample parameters, ``{"names": [...], "values": [[...] per sample]}``,
            recorded in ``dataset.json``; the samples carry them as input channels already (the
            input fields marked ``"parameter": true``).
        target_scales: ``{field: expression of the parameters}``: the samples' targets are
            divided by it already (non-dimensional); recorded so that predictions are multiplied
            back (:meth:`Dataset.target_factors`).
        collapsed_2d: The meshes are the lower planes of one-cell-thick 3-D meshes
            (``--collapse-2d``): recorded as ``"collapsed_2d": true``.
        max_points: Training's points per sample and epoch (``--max-points``): recorded as
            ``"max_points"``.
        mean_field: ``True``: the training samples' mean field as input channels, and the targets'
            offset (``--mean-field``, :mod:`meshshard.data._mean_field`); or another dataset's,
            :func:`~meshshard.data._mean_field.mean_field_of` (``--mean-field-from``).

    Returns:
        The dataset folder.
    """
    out = check_dataset_output(out, force, sources)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"Expected dtype float32 or float64 (got {dtype!r})")
    if not names:
        raise ValueError("Expected at least one sample (got none)")
    if len(set(names)) != len(names):
        raise ValueError("Expected distinct sample names")
    train, val = split_samples(names, val_fraction, val_samples)
    train_set = set(train)
    in_ch, out_ch = channel_names(input_fields), channel_names(target_fields)
    with atomic_folder(out) as tmp:
        meta = _write_all(tmp, samples, names, train_set, in_ch, out_ch, np.dtype(dtype), progress)
        meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": meta.pop("kind"),
                "num_samples": len(names), "dtype": dtype,
                "inputs": [dict(f) for f in input_fields], "targets": [dict(f) for f in target_fields],
                "input_channels": in_ch, "target_channels": out_ch,
                "edge_channels": meta.pop("edge_channels"),
                "split": {"train": train, "val": val}, **meta}
        if parameters is not None:
            meta["parameters"] = {"names": list(parameters["names"]),
                                  "values": [[float(v) for v in row] for row in parameters["values"]]}
        if target_scales:
            meta["target_scales"] = dict(target_scales)
        if collapsed_2d:
            meta["collapsed_2d"] = True
        rules = [m["graph"] for m in meta["meshes"] if "graph" in m]
        if rules:
            from meshshard.partition import GraphRule

            meta["graph"] = str(GraphRule(rules[0]["rule"], rules[0].get("k"), rules[0].get("radius")))
        if max_points is not None:
            meta["max_points"] = int(max_points)
        if mean_field is not False:
            from ._mean_field import add_mean_field

            add_mean_field(tmp, meta, train, np.dtype(dtype), None if mean_field is True else mean_field)
        write_text_file(tmp / METADATA_FILE, dump_metadata(meta))
    return out


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """Yield an empty staging folder beside ``out`` to fill; on success it replaces ``out``
    (whose safety the caller checked), on any error it is removed and the old ``out`` kept
    (:func:`meshshard.partition._safe_io.staged_folder`). What a killed run left beside ``out``
    is tidied, or put back, first."""
    from meshshard.partition.files import recover_interrupted, staged_folder

    recover_interrupted(out)
    with staged_folder(out) as staging:
        yield staging


def _read_json(file: Path) -> Any:
    return read_json(file)


def _write_all(tmp: Path, samples: Iterable[Sample], names: Sequence[str], train: set[int],
               in_ch: list[str], out_ch: list[str], dtype: np.dtype,
               progress: Callable[[int], None] | None) -> dict[str, Any]:
    """Stream the samples into ``tmp``; return the metadata entries that depend on them."""
    meshes: list[dict[str, Any]] = []
    mesh_of: dict[str, int] = {}
    edge_runs: list[_Running] = []
    train_uses: list[int] = []
    run_in, run_out = _Running(len(in_ch)), _Running(len(out_ch))
    entries = []
    count = 0
    for i, sample in enumerate(samples):
        if i >= len(names) or sample.name != names[i]:
            raise ValueError(f"Expected sample {i} to be named {names[i] if i < len(names) else None!r} "
                             f"(got {sample.name!r})")
        pos, cells = _check_sample(sample, i, len(in_ch), len(out_ch))
        where = sample.source or f"sample {i}"
        inputs = np.asarray(sample.inputs, dtype=np.float64)
        targets = np.asarray(sample.targets, dtype=np.float64)
        _check_finite(inputs, in_ch, where, sample.name)
        _check_finite(targets, out_ch, where, sample.name)
        ei = None if sample.edge_index is None else np.asarray(sample.edge_index, dtype=np.int64)
        if cells and sample.graph is None:
            ei = None  # the cells' edges are the graph
        digest = mesh_checksum(pos, cells, ei)
        if digest not in mesh_of:
            if meshes and meshes[0]["pos_dim"] != pos.shape[1]:
                raise ValueError(f"{where}: Expected {meshes[0]['pos_dim']}-D points like the first sample "
                                 f"(got {pos.shape[1]}-D)")
            mesh_of[digest] = len(meshes)
            from meshshard.partition import Graph, nodal_graph

            graph = Graph.from_edge_index(ei, len(pos)) if ei is not None else nodal_graph(cells, len(pos))
            folder = tmp / "meshes" / f"{len(meshes):05d}"
            _save_npy(folder / "points.npy", pos)
            for cell_type, conn in cells:
                _save_npy(folder / f"cells-{cell_type}.npy", conn)
            if ei is not None:
                _save_npy(folder / "edge_index.npy", ei)
            meshes.append({"folder": f"meshes/{len(meshes):05d}", "num_nodes": len(pos),
                           "pos_dim": pos.shape[1], "num_edges": graph.num_edges,
                           "cells": {t: len(c) for t, c in cells}, "sha256": digest}
                          | ({"graph": dict(sample.graph)} if sample.graph is not None and ei is not None else {})
                          | _write_boundaries(folder, sample.boundaries, pos, cells, where)
                          | _write_surface_area(folder, pos, cells))
            edge_runs.append(_edge_moments(graph, pos))
            train_uses.append(0)
        m = mesh_of[digest]
        if meshes[m]["num_edges"] == 0:
            who = sample.source or f"sample {i} ({sample.name!r})"
            raise ValueError(f"{who}: Expected a mesh with edges (got {plural(len(pos), 'node')} and no edge); "
                             "a graph network cannot learn on a mesh without edges")
        folder = tmp / "samples" / f"{i:05d}"
        _save_npy(folder / "inputs.npy", _stored(inputs, dtype, in_ch, where, sample.name))
        _save_npy(folder / "targets.npy", _stored(targets, dtype, out_ch, where, sample.name))
        if i in train:
            run_in.add(inputs)
            run_out.add(targets)
            train_uses[m] += 1
        entries.append({"name": sample.name, "mesh": m, "folder": f"samples/{i:05d}", "source": sample.source})
        count += 1
        if progress is not None:
            progress(1)
    if count != len(names):
        raise ValueError(f"Expected {len(names)} samples (got {count})")
    edge_ch = edge_channel_names(meshes[0]["pos_dim"])
    run_edges = _Running(len(edge_ch))
    for run, uses in zip(edge_runs, train_uses):
        if uses:
            run_edges.merge(run.n * uses, run.mean, run.m2 * uses)
    norm = {"rule": NORMALISATION_RULE, "inputs": run_in.stats(in_ch).to_dict(),
            "targets": run_out.stats(out_ch).to_dict(), "edges": run_edges.stats(edge_ch).to_dict()}
    return {"kind": KINDS[0] if len(meshes) == 1 else KINDS[1], "edge_channels": edge_ch,
            "normalisation": norm, "meshes": meshes, "samples": entries}


def _write_surface_area(folder: Path, pos: np.ndarray, cells: Cells) -> dict[str, Any]:
    """Store a surface's per-point area vectors (``surface-area.npy``, :mod:`meshshard.partition._points`);
    the mesh's ``"surface_area"`` entry (the total area), or nothing for another mesh."""
    from ._clouds import surface_faces, surface_fields

    faces = surface_faces(pos, cells)
    if not faces:
        return {}
    _, area, vectors = surface_fields(pos, faces)
    _save_npy(folder / "surface-area.npy", vectors)
    planar = bool(len(pos)) and float(np.ptp(pos[:, 2])) == 0.0  # a 2-D mesh written with a constant z
    return {"surface_area": float(area.sum()), **({"planar": True} if planar else {})}


def _write_boundaries(folder: Path, boundaries: Mapping[str, np.ndarray] | None, pos: np.ndarray,
                      cells: Cells, where: str) -> dict[str, Any]:
    """Store a mesh's named boundaries (``boundary-{k:03d}.npy``: sorted node ids;
    ``boundary-{k:03d}-area.npy``: their area vectors); the ``"boundaries"`` entry of the mesh."""
    if not boundaries:
        return {}
    from ._surface import boundary_area_vectors

    entries = []
    for k, (name, ids) in enumerate(sorted(boundaries.items())):
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        if len(ids) and (ids[0] < 0 or ids[-1] >= len(pos)):
            raise ValueError(f"{where}: Expected the nodes of boundary {name!r} in [0, {len(pos)}) "
                             f"(got {ids[0] if ids[0] < 0 else ids[-1]})")
        area = boundary_area_vectors(pos, cells, ids)
        _save_npy(folder / f"boundary-{k:03d}.npy", ids)
        _save_npy(folder / f"boundary-{k:03d}-area.npy", area)
        entries.append({"name": str(name), "num_nodes": len(ids),
                        "area": float(np.linalg.norm(area, axis=1).sum())})
    return {"boundaries": entries}


def dump_metadata(meta: Mapping[str, Any]) -> str:
    """``dataset.json``'s text: two-space indent, one line per field, statistic, mesh and sample."""
    def block(key: str, items: Sequence[Any], indent: str = "  ") -> str:
        lines = ",\n".join(f"{indent}  {dumps_json(v)}" for v in items)
        return f'{indent}"{key}": [\n{lines}\n{indent}]'

    parts = []
    for key, value in meta.items():
        if key in ("meshes", "samples"):
            parts.append(block(key, value))
        elif key == "normalisation":
            inner = ",\n".join(f'    "{k}": {dumps_json(v)}' for k, v in value.items())
            parts.append(f'  "normalisation": {{\n{inner}\n  }}')
        else:
            parts.append(f'  "{key}": {dumps_json(value)}')
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _as_numpy(x: Any) -> np.ndarray:
    """numpy from numpy, lists or torch tensors (duck-typed: this layer never imports torch)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def write_dataset(
    out: str | os.PathLike[str],
    inputs: Any,
    targets: Any = None,
    *,
    pos: Any,
    cells: Any = None,
    edge_index: Any = None,
    input_names: Sequence[Any] | None = None,
    target_names: Sequence[Any] | None = None,
    sample_names: Sequence[str] | None = None,
    val_fraction: float | None = None,
    val_samples: Sequence[int | str] | None = None,
    dtype: str = "float32",
    force: bool = False,
    boundaries: Any = None,
    mean_field: bool = False,
) -> Path:
    """Write a dataset folder from numpy arrays (or torch tensors; see the module docstring).

    One mesh: ``pos`` an ``(N, D)`` array, ``cells`` (``[(type, conn)]`` or ``{type: conn}``) or
    ``edge_index``, and ``inputs`` / ``targets`` ``(S, N, F)`` arrays (or lists of ``(N, F)``).
    Many meshes: ``pos``, ``cells`` / ``edge_index``, ``inputs`` and ``targets`` all lists with
    one entry per sample. ``targets=None``: inputs only (zero target channels, no validation split
    unless asked), cases for ``meshshard predict`` to predict on; ``meshshard train`` refuses it.

    Args:
        input_names, target_names: Fields in channel order, each a name (one channel) or
            ``(name, components)``; default one field ``x`` / ``y`` with every channel.
        sample_names: Default ``"00000"``, ``"00001"``, ...
        val_fraction, val_samples: See :func:`split_samples` (default: 20 % for validation).
        dtype: Stored precision of the fields.
        boundaries: Named boundaries, ``{name: node ids}`` (one per sample with many meshes), kept
            with each mesh with the area their nodes stand for (``meshshard predict --boundary``).
        mean_field: The training samples' mean of the targets as inputs, the targets learnt as the
            difference from it (one mesh; ``meshshard dataset --mean-field``).

    Shapes:
        pos: ``(N, D)``. inputs: ``(S, N, F_in)``. targets: ``(S, N, F_out)``.
        cells: ``(C_b, k_b)`` per type. edge_index: ``(2, E)``.
    """
    ins = [_as_numpy(a) for a in inputs]
    s = len(ins)
    if targets is None:
        if target_names:
            raise ValueError("Expected targets with target_names (got target_names but no targets)")
        outs = [np.zeros((len(a), 0)) for a in ins]
        target_names = []
        if val_fraction is None and val_samples is None:
            val_fraction = 0.0  # cases to predict on: nothing to validate against
    else:
        outs = [_as_numpy(a) for a in targets]
    if len(outs) != s:
        raise ValueError(f"Expected as many targets as inputs (got {len(outs)} and {s})")
    many = isinstance(pos, (list, tuple))
    if many and len(pos) != s:
        raise ValueError(f"Expected one 'pos' per sample (got {len(pos)} for {plural(s, 'sample')})")

    def per_sample(value: Any, i: int) -> Any:
        return value[i] if many and value is not None else value

    def cell_list(value: Any) -> list[tuple[str, np.ndarray]]:
        if value is None:
            return []
        items = value.items() if isinstance(value, Mapping) else value
        return [(str(t), _as_numpy(c)) for t, c in items]

    names = list(sample_names) if sample_names is not None else [f"{i:05d}" for i in range(s)]
    if len(names) != s:
        raise ValueError(f"Expected {s} sample names (got {len(names)})")
    f_in = ins[0].shape[1] if s and ins[0].ndim == 2 else 0
    f_out = outs[0].shape[1] if s and outs[0].ndim == 2 else 0
    samples = (Sample(names[i], _as_numpy(per_sample(pos, i)), ins[i], outs[i],
                      cells=cell_list(per_sample(cells, i)),
                      edge_index=None if per_sample(edge_index, i) is None else _as_numpy(per_sample(edge_index, i)),
                      boundaries=per_sample(boundaries, i))
               for i in range(s))
    return write_samples(out, samples, names, input_fields=_fields(input_names, f_in, "x", "input_names"),
                         target_fields=_fields(target_names, f_out, "y", "target_names"),
                         val_fraction=val_fraction, val_samples=val_samples, dtype=dtype, force=force,
                         mean_field=mean_field)


def write_dataset_from_pyg(
    out: str | os.PathLike[str],
    data_list: Sequence[Any],
    *,
    input_names: Sequence[Any] | None = None,
    target_names: Sequence[Any] | None = None,
    **options: Any,
) -> Path:
    """Write a dataset folder from PyG ``Data`` objects (read by duck typing: no torch import).

    Each ``Data`` needs ``x`` ``(N, F_in)``, ``y`` ``(N, F_out)``, ``pos`` ``(N, D)`` and either
    ``edge_index`` ``(2, E)``, ``face`` ``(3 or 4, C)`` (triangles or tetrahedra) or ``cells``
    (``[(type, conn)]``). Without ``y`` on any of them: a dataset of inputs only (new cases for
    ``meshshard predict``). ``options`` as for :func:`write_dataset`.
    """
    with_y = sum(getattr(data, "y", None) is not None for data in data_list)
    if 0 < with_y < len(data_list):
        raise ValueError(f"Expected 'y' on every Data or on none (got it on {with_y} of {len(data_list)})")
    pos, cells, edges, xs, ys = [], [], [], [], []
    for i, data in enumerate(data_list):
        for attr in ("x", "pos"):
            if getattr(data, attr, None) is None:
                raise ValueError(f"Expected data_list[{i}] to have '{attr}' (got none)")
        pos.append(_as_numpy(data.pos))
        xs.append(_as_numpy(data.x).reshape(len(pos[-1]), -1))
        if with_y:
            ys.append(_as_numpy(data.y).reshape(len(pos[-1]), -1))
        face = getattr(data, "face", None)
        own = getattr(data, "cells", None)
        if own is not None:
            cells.append([(str(t), _as_numpy(c)) for t, c in own])
            edges.append(None)
        elif face is not None:
            face = _as_numpy(face)
            cells.append([({3: "triangle", 4: "tetra"}.get(face.shape[0], "face"), face.T)])
            edges.append(None)
        elif getattr(data, "edge_index", None) is not None:
            cells.append(None)
            edges.append(_as_numpy(data.edge_index))
        else:
            raise ValueError(f"Expected data_list[{i}] to have 'edge_index', 'face' or 'cells' (got none)")
    return write_dataset(out, xs, ys if with_y else None, pos=pos, cells=cells, edge_index=edges,
                         input_names=input_names, target_names=target_names, **options)


# ---------------------------------------------------------------------------------------------
# Reading


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder with a ``dataset.json`` (of any format: read to be sure)."""
    return (Path(path) / METADATA_FILE).is_file()


@dataclass(frozen=True, eq=False)
class Mesh:
    """One stored mesh. Shapes: points ``(N, D)``; cells ``(C_b, k_b)`` per type; edge_index ``(2, E)``."""

    points: np.ndarray
    cells: list[tuple[str, np.ndarray]]
    edge_index: np.ndarray | None
    sha256: str

    @property
    def num_nodes(self) -> int:
        return len(self.points)

    def graph(self) -> Graph:
        """The nodal graph training uses (edges of the cells, or the stored edge_index)."""
        from meshshard.partition import Graph, nodal_graph

        if self.edge_index is None:
            return nodal_graph(self.cells, self.num_nodes, pos=self.points)
        return Graph.from_edge_index(self.edge_index, self.num_nodes, pos=self.points)


class Dataset:
    """A dataset folder opened for reading; only ``dataset.json`` is read up front.

    Attributes:
        path: The folder. meta: ``dataset.json``. kind: ``"one-mesh"`` or ``"many-meshes"``.
        num_samples, train, val: ``train`` / ``val`` sample indices (int64 arrays).
        input_channels, target_channels, edge_channels: channel names.
        normalisation: The :class:`Normalisation` of the training split.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.meta = read_dataset_metadata(self.path)
        m = self.meta
        self.kind: str = m["kind"]
        self.num_samples: int = m["num_samples"]
        self.train = np.asarray(m["split"]["train"], dtype=np.int64)
        self.val = np.asarray(m["split"]["val"], dtype=np.int64)
        self.input_channels: list[str] = m["input_channels"]
        self.target_channels: list[str] = m["target_channels"]
        self.edge_channels: list[str] = m["edge_channels"]
        self.normalisation = Normalisation.from_dict(m["normalisation"], self.input_channels,
                                                     self.target_channels, self.edge_channels)

    @property
    def num_meshes(self) -> int:
        return len(self.meta["meshes"])

    def sample_mesh(self, sample: int) -> int:
        """Index of the mesh sample ``sample`` lives on."""
        return int(self.meta["samples"][self._sample(sample)]["mesh"])

    def num_nodes(self, sample: int) -> int:
        """The node count of sample ``sample``'s mesh."""
        return int(self.meta["meshes"][self.sample_mesh(sample)]["num_nodes"])

    def _sample(self, sample: int) -> int:
        if not 0 <= int(sample) < self.num_samples:
            raise ValueError(f"Expected a sample in [0, {self.num_samples}) (got {sample})")
        return int(sample)

    def _load(self, file: Path, mmap_mode: str | None) -> np.ndarray:
        """``np.load`` of a file of this folder: never a link (it could point anywhere) or a special
        file (a FIFO would block the reader)."""
        if file.is_symlink() or (file.exists() and not file.is_file()):
            raise ValueError(f"{file}: not a regular file of the dataset folder (a link or a special file); "
                             "refusing to read it")
        return np.load(file, mmap_mode=mmap_mode, allow_pickle=False)

    def _array(self, file: Path, rows: int, width: int | None) -> np.ndarray:
        try:
            a = self._load(file, "r")
        except FileNotFoundError:
            raise ValueError(f"{file}: missing (the dataset folder is incomplete)") from None
        except (ValueError, OSError) as err:
            raise ValueError(f"{file}: not a readable .npy file ({err})") from None
        if a.ndim != 2 or a.shape[0] != rows or (width is not None and a.shape[1] != width) or a.dtype.kind != "f":
            raise ValueError(f"{file}: Expected a float array of shape ({rows}, {width}) (got {a.dtype} {a.shape})")
        return a

    def sample_arrays(self, sample: int) -> tuple[np.ndarray, np.ndarray]:
        """Memory maps of a sample's inputs ``(N, F_in)`` and targets ``(N, F_out)`` (nothing read yet)."""
        s = self._sample(sample)
        folder = self.path / "samples" / f"{s:05d}"
        n = self.num_nodes(s)
        return (self._array(folder / "inputs.npy", n, len(self.input_channels)),
                self._array(folder / "targets.npy", n, len(self.target_channels)))

    def rows(self, sample: int, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unnormalised inputs and targets of ``node_ids`` (global ids) only, float64.

        Shapes:
            node_ids: ``(n,)``. Returns ``(n, F_in)`` and ``(n, F_out)``.
        """
        inputs, targets = self.sample_arrays(sample)
        ids = np.asarray(node_ids, dtype=np.int64)
        return np.asarray(inputs[ids], dtype=np.float64), np.asarray(targets[ids], dtype=np.float64)

    def parameters(self, sample: int) -> dict[str, float]:
        """Sample ``sample``'s parameters (``--params``), by name; empty without a table."""
        table = self.meta.get("parameters") or {"names": [], "values": []}
        row = table["values"][self._sample(sample)] if table["names"] else []
        return {str(n): float(v) for n, v in zip(table["names"], row)}

    def target_factors(self, sample: int, scales: Mapping[str, str] | None = None,
                       fields: Sequence[Mapping[str, Any]] | None = None) -> np.ndarray:
        """``(F_out,)``: what sample ``sample``'s targets (stored, or predicted) are multiplied by to
        be in physical units: each field's ``scales`` expression (default: this dataset's
        ``target_scales``) evaluated on the sample's parameters, 1 for a field without one.
        ``fields``: the target fields, ``[{"name", "components"}]`` (default: this dataset's)."""
        from ._expressions import evaluate_expression

        scales = (self.meta.get("target_scales") or {}) if scales is None else scales
        fields = self.meta["targets"] if fields is None else fields
        values = self.parameters(sample) if scales else {}
        factors: list[float] = []
        for f in fields:
            expression = scales.get(str(f["name"]))
            factor = evaluate_expression(expression, values) if expression else 1.0
            factors += [factor] * int(f["components"])
        return np.asarray(factors, dtype=np.float64)

    def mesh_folder(self, index: int) -> Path:
        """The folder of mesh ``index`` (``meshes/NNNNN``), the one place its path is made."""
        if not 0 <= index < self.num_meshes:
            raise ValueError(f"Expected a mesh in [0, {self.num_meshes}) (got {index})")
        return self.path / "meshes" / f"{index:05d}"

    def mesh_points(self, index: int) -> np.ndarray:
        """The coordinates of mesh ``index``, ``(N, D)``, as a read-only memory map (read the rows
        you need: a rank writing its piece never reads the whole mesh)."""
        entry = self.meta["meshes"][index]
        return self._array(self.mesh_folder(index) / "points.npy", entry["num_nodes"], entry["pos_dim"])

    def mesh_cells(self, index: int, cell_type: str) -> np.ndarray:
        """The cells of one type of mesh ``index``, ``(C, k)`` node ids, as a read-only memory map
        (a regular file inside the folder, never a link; check the ids of what you read)."""
        return self._load(self.mesh_folder(index) / f"cells-{cell_type}.npy", "r")

    def boundary_names(self, index: int) -> list[str]:
        """The named boundaries stored with mesh ``index`` (patches, node sets, gmsh groups), and
        ``"surface"`` for a surface in 3-D (every point, :meth:`boundary_rows`)."""
        entry = self.meta["meshes"][index]
        names = [str(b["name"]) for b in entry.get("boundaries", [])]
        return names + ([SURFACE] if "surface_area" in entry and SURFACE not in names else [])

    def boundary_rows(self, index: int, name: str, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of the nodes ``node_ids`` (sorted global ids, a rank's own), which lie on boundary
        ``name`` (their positions in ``node_ids``) and the area vector of each, out of the fluid.
        ``"surface"`` is every point of a surface sample, its area vector the faces' (wound out of
        the body, into the fluid) turned around; only the rows asked for are read.

        Shapes:
            node_ids ``(n,)`` -> ``(m,)`` int64 positions, ``(m, D)``.
        """
        ids = np.asarray(node_ids, dtype=np.int64)
        entry = self.meta["meshes"][index]
        stored = [str(b["name"]) for b in entry.get("boundaries", [])]
        if name == SURFACE and name not in stored and "surface_area" in entry:
            file = self.mesh_folder(index) / "surface-area.npy"
            vectors = self._load(file, "r")
            if vectors.shape != (entry["num_nodes"], 3):
                raise ValueError(f"{file}: damaged (Expected ({entry['num_nodes']}, 3), got {vectors.shape})")
            return np.arange(len(ids), dtype=np.int64), -np.asarray(vectors[ids], dtype=np.float64)
        on, area = self.boundary(index, name)
        if not len(on) or not len(ids):
            return np.zeros(0, dtype=np.int64), np.zeros((0, entry["pos_dim"]))
        at = np.minimum(np.searchsorted(on, ids), len(on) - 1)
        hit = on[at] == ids
        return np.flatnonzero(hit), area[at[hit]]

    def boundary(self, index: int, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Boundary ``name`` of mesh ``index``: its sorted node ids ``(n,)`` and the area vector
        each stands for ``(n, D)`` (out of the mesh; :mod:`meshshard.data._surface`). A
        boundary is a small part of a mesh, so both are read whole."""
        names = self.boundary_names(index)
        if name not in names:
            raise ValueError(f"{self.path}: Expected a named boundary of mesh {index} (got {name!r}; it has "
                             + (", ".join(names) if names else "none: they come from a .vtm's patches, a file's "
                                "node sets or gmsh physical groups") + ")")
        k = names.index(name)
        entry = self.meta["meshes"][index]
        folder = self.mesh_folder(index)
        try:
            ids = np.asarray(self._load(folder / f"boundary-{k:03d}.npy", None))
            area = np.asarray(self._load(folder / f"boundary-{k:03d}-area.npy", None))
        except (OSError, ValueError) as err:
            raise ValueError(f"{folder}: boundary {name!r} unreadable ({err})") from None
        n = int(entry["boundaries"][k]["num_nodes"])
        if (ids.shape != (n,) or ids.dtype.kind != "i" or area.shape != (n, entry["pos_dim"])
                or (n and (ids.min() < 0 or ids.max() >= entry["num_nodes"] or (np.diff(ids) <= 0).any()))):
            raise ValueError(f"{folder}: boundary {name!r} is damaged (Expected {n} sorted node ids in "
                             f"[0, {entry['num_nodes']}) and their ({n}, {entry['pos_dim']}) area vectors)")
        return ids.astype(np.int64), area.astype(np.float64)

    def surface_area(self, index: int) -> np.ndarray | None:
        """The area vector of each point of mesh ``index`` when it is a surface in 3-D, ``(N, 3)``
        (length: the point's lumped area; direction: its normal by the faces' winding), else None."""
        entry = self.meta["meshes"][index]
        if "surface_area" not in entry:
            return None
        file = self.mesh_folder(index) / "surface-area.npy"
        try:
            vectors = np.asarray(self._load(file, None))
        except (OSError, ValueError) as err:
            raise ValueError(f"{file}: unreadable ({err})") from None
        if vectors.shape != (entry["num_nodes"], 3) or vectors.dtype.kind != "f":
            raise ValueError(f"{file}: damaged (Expected a float array of shape ({entry['num_nodes']}, 3), got "
                             f"{vectors.dtype} {vectors.shape})")
        return vectors.astype(np.float64)

    def mesh(self, index: int) -> Mesh:
        """The stored mesh ``index`` (whole: for partitioning and for writing predictions)."""
        if not 0 <= index < self.num_meshes:
            raise ValueError(f"Expected a mesh in [0, {self.num_meshes}) (got {index})")
        entry = self.meta["meshes"][index]
        folder = self.mesh_folder(index)
        points = np.array(self._array(folder / "points.npy", entry["num_nodes"], entry["pos_dim"]))
        cells = []
        try:
            for cell_type in entry["cells"]:
                cells.append((cell_type, self._load(folder / f"cells-{cell_type}.npy", None)))
            edge_index = self._load(folder / "edge_index.npy", None) if not cells or "graph" in entry else None
        except (OSError, ValueError) as err:
            raise ValueError(str(err) if str(err).startswith(str(folder)) else f"{folder}: a mesh file is not readable "
                             f"({err})") from None
        n = len(points)
        for name, ids in [(f"cells-{t}.npy", c) for t, c in cells] + [("edge_index.npy", edge_index)]:
            if ids is None:
                continue
            if ids.ndim != 2 or ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= n)):
                raise ValueError(f"{folder / name}: Expected integer node ids in [0, {n}) in a 2-D array "
                                 f"(got {ids.dtype} {ids.shape}"
                                 f"{f', ids {ids.min()}..{ids.max()}' if ids.size and ids.dtype.kind in 'iu' else ''})")
        if mesh_checksum(points, cells, edge_index) != entry["sha256"]:
            raise ValueError(f"{folder}: the mesh's files differ from the checksum in {METADATA_FILE} "
                             "(damaged or edited); make the dataset again")
        return Mesh(points, cells, edge_index, entry["sha256"])

    def __repr__(self) -> str:
        return (f"Dataset({str(self.path)!r}, kind={self.kind!r}, samples={self.num_samples} "
                f"(train {len(self.train)}, val {len(self.val)}), inputs={self.input_channels}, "
                f"targets={self.target_channels})")


def read_dataset_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``dataset.json`` of a folder, after checking the format name, version and structure."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder")
    file = folder / METADATA_FILE
    if not file.is_file():
        raise ValueError(f"{folder}: not a dataset folder (no {METADATA_FILE}; make one with meshshard dataset)")
    meta = _read_json(file)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{file}: Expected format {FORMAT_NAME!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: Expected dataset format version {FORMAT_VERSION} (got "
                         f"{meta.get('format_version')!r}); re-create it with meshshard dataset")
    try:
        samples, meshes = meta["samples"], meta["meshes"]
        ok = (meta["kind"] in KINDS and len(samples) == meta["num_samples"] and meshes
              and all(s["folder"] == f"samples/{i:05d}" and 0 <= s["mesh"] < len(meshes) for i, s in enumerate(samples))
              and all(m["folder"] == f"meshes/{i:05d}" and all(_CELL_TYPE.match(t) for t in m["cells"])
                      for i, m in enumerate(meshes))
              and sorted(meta["split"]["train"] + meta["split"]["val"]) == list(range(len(samples))))
    except (KeyError, TypeError) as err:
        raise ValueError(f"{file}: Expected the keys of the dataset format (missing or malformed {err})") from None
    if not ok:
        raise ValueError(f"{file}: inconsistent dataset metadata (kind, samples, meshes or split)")
    return meta


def open_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Open a dataset folder (reads ``dataset.json`` only; arrays are memory-mapped on use)."""
    return Dataset(path)


# ---------------------------------------------------------------------------------------------
# Partitions of a dataset


def dataset_partition_folder(parts: str | os.PathLike[str], mesh: int) -> Path:
    """The partition folder of mesh ``mesh`` inside PARTS (PARTS itself for a one-mesh dataset)."""
    parts = Path(parts)
    if (parts / PARTITIONS_FILE).is_file():
        return parts / f"mesh-{mesh:05d}"
    return parts


def read_partitions_metadata(parts: str | os.PathLike[str]) -> dict[str, Any]:
    """The partitions of a dataset, as ``{"num_parts", "meshes": [{"mesh", "num_nodes", "sha256"}]}``,
    from a ``partitions.json`` folder or a single partition folder."""
    from meshshard.partition import read_metadata

    parts = Path(parts)
    file = parts / PARTITIONS_FILE
    if file.is_file():
        meta = _read_json(file)
        if not isinstance(meta, dict) or meta.get("format") != PARTITIONS_FORMAT or meta.get("format_version") != 1:
            raise ValueError(f"{file}: Expected format {PARTITIONS_FORMAT!r} version 1")
        for i, m in enumerate(meta.get("meshes", [])):
            if m.get("mesh") != i or m.get("folder") != f"mesh-{i:05d}":
                raise ValueError(f"{file}: Expected meshes in order with folders mesh-00000, ...")
        return meta
    meta = read_metadata(parts)
    source = meta.get("input", {})
    return {"format": None, "num_parts": meta["num_parts"],
            "meshes": [{"mesh": 0, "folder": ".", "num_nodes": meta["num_nodes"],
                        "sha256": source.get("sha256") if source.get("kind") == "dataset" else None}],
            **({"halo_radius": meta["halo_radius"]} if "halo_radius" in meta else {})}


def check_partition_matches(dataset: Dataset | str | os.PathLike[str], parts: str | os.PathLike[str],
                            hint: str | None = None) -> dict[str, Any]:
    """Raise a one-line ``ValueError`` unless PARTS was made from this dataset's meshes (node
    counts and mesh checksums); return PARTS' metadata (see :func:`read_partitions_metadata`).

    The error ends with ``hint``; by default, how to partition the dataset into a new folder (never
    over PARTS, which may be another dataset's partition that something still needs)."""
    data = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    meta = read_partitions_metadata(parts)
    mine = data.meta["meshes"]
    theirs = meta["meshes"]
    if hint is None:
        hint = (f"partition it into a new folder: meshshard partition {data.path} --parts {meta['num_parts']} "
                "--out NEW_PARTS")
    if len(theirs) != len(mine):
        raise ValueError(f"{parts}: partition made for another dataset ({plural(len(theirs), 'mesh', 'meshes')}; "
                         f"{data.path} has {len(mine)}); {hint}")
    for i, (a, b) in enumerate(zip(theirs, mine)):
        if a["num_nodes"] != b["num_nodes"] or a["sha256"] != b["sha256"]:
            why = (f"{a['num_nodes']} nodes vs {b['num_nodes']}" if a["num_nodes"] != b["num_nodes"] else
                   "not made from a dataset" if a["sha256"] is None else
                   f"mesh checksum {str(a['sha256'])[:12]} vs {b['sha256'][:12]}")
            raise ValueError(f"{parts}: partition made for another dataset (mesh {i}: {why} in {data.path}); {hint}")
    return meta


def iter_meshes(data: Dataset) -> Iterator[tuple[int, Mesh]]:
    for m in range(data.num_meshes):
        yield m, data.mesh(m)
