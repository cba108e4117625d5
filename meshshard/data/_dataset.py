"""The on-disk dataset format, version 2 (``FORMAT_VERSION``): its constants, channel names, mesh
checksum and metadata, in one module (the reader, the writer and the statistics build on it).

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
    │       ├── surface-area.npy     (N_m, 3) float64 area vectors, for a surface in 3-D
    │       └── surface-point-area.npy  (N_m,) float64 each point's area, likewise ("point_area")
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
"wall_distance", "components": 1, "patches": ["lowerWall", "upperWall"]}``, as do those of ``--wall-normal``
(``wall_offset`` and ``wall_normal``, ``D`` channels each) and ``--signed-distance`` (``signed_distance``, one
channel; :mod:`meshshard.data._wall_geometry`); one of ``--boundary-classes``
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
``"mean_field": {"of", "method", "k", "left_out", "samples", "sha256"}`` (``--mean-field``,
:mod:`meshshard.data._mean_field`, :mod:`meshshard.data._prior`) says the last input fields,
``<target>_mean`` (marked ``"mean_of"``), hold each sample's prior: the training samples' node-wise
mean of the targets (``"method": "mean"``; written before knn and many meshes existed without
``method`` and ``left_out``, which then read as ``"mean"`` and ``"none"``), or the nearest cases'
(``"knn:K"``, with ``"k"``), mapped onto the sample's mesh, a training sample's leaving out
``"left_out"``: ``"none"``, ``"sample"`` (itself) or ``"mesh"`` (every case on its mesh); and
``normalisation.target_offset`` (with ``offset_sha256``, the prior's checksum) that the targets
are normalised as their difference from it. A surface in 3-D
(faces, no 3-D cells) has ``"surface_area"`` (its total area; ``"planar": true``
when every point has the same z, a 2-D mesh written in 3-D) and
``meshes/{m:05d}/surface-area.npy``: per point, the lumped area vector of the faces around it
(:meth:`Dataset.surface_area`); a dataset written since issue 37 also has ``"point_area": true``
and ``surface-point-area.npy``: per point, its share of the faces' areas (each face's split equally
among its corners; area-weighted errors, :meth:`Dataset.point_areas`, one rank's rows).
``"max_points": N`` (``--max-points``) asks training of a point model to draw a
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

Public names (stable; ``meshshard.data`` re-exports them), by the module that defines them:

- this one: :func:`read_dataset_metadata`, :func:`dump_metadata`, :func:`is_dataset`,
  :func:`mesh_checksum`, :func:`channel_names`, :func:`edge_channel_names` and the constants;
- :mod:`meshshard.data._writer`: :func:`write_dataset` (numpy arrays),
  :func:`write_dataset_from_pyg` (PyG ``Data`` list), and :func:`write_samples` (any iterable of
  :class:`Sample`, used by ``meshshard dataset``); :mod:`meshshard.data._split`:
  :func:`split_samples`; :mod:`meshshard.data._folder_guard`: :func:`check_dataset_output`;
- :mod:`meshshard.data._reader`: :func:`open_dataset` -> :class:`Dataset`: ``meta`` (the JSON
  above), ``kind``, ``train`` / ``val``, ``input_channels`` / ``target_channels`` /
  ``edge_channels``, ``normalisation``, ``sample_mesh(s)``, ``num_nodes(s)``, ``rows(s,
  node_ids)`` (unnormalised, float64), ``sample_arrays(s)`` (the memory maps), ``mesh(m)`` ->
  :class:`Mesh` (``points``, ``cells`` by type, ``edge_index``, ``sha256``, ``graph()``: for
  partitioning and for writing predictions);
- :mod:`meshshard.data._statistics`: :class:`ChannelStats`, :class:`Normalisation` (``to_dict`` /
  ``from_dict``: what a checkpoint stores), :func:`held_channels`, :data:`HOLD_RELATIVE`;
- :mod:`meshshard.data._dataset_partitions`: :func:`partition_dataset`,
  :func:`check_partition_matches` (PARTS belongs to DATA, else one line),
  :func:`dataset_partition_folder` (the partition folder of mesh ``m``),
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshshard.partition.files import dumps_json, naming_write_errors, read_json

if TYPE_CHECKING:
    from meshshard.partition import Cells

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "KINDS",
    "PARTITIONS_FORMAT",
    "PARTITIONS_FILE",
    "read_dataset_metadata",
    "dump_metadata",
    "is_dataset",
    "mesh_checksum",
    "channel_names",
    "edge_channel_names",
]

FORMAT_NAME = "meshshard-dataset"
FORMAT_VERSION = 2
METADATA_FILE = "dataset.json"
KINDS = ("one-mesh", "many-meshes")
PARTITIONS_FORMAT = "meshshard-dataset-partitions"
PARTITIONS_FILE = "partitions.json"

#: The boundary name of a surface sample's every point (``predict --boundary surface``).
SURFACE = "surface"
#: What a cell type may be named (it becomes part of a file name, ``cells-<type>.npy``).
CELL_TYPE = re.compile(r"^[A-Za-z0-9_]+$")


# ---------------------------------------------------------------------------------------------
# Fields, channels, checksums


def channel_names(fields: Sequence[Mapping[str, Any]]) -> list[str]:
    """``[{"name": "T", "components": 1}, {"name": "u", "components": 2}]`` -> ``T, u[0], u[1]``."""
    out: list[str] = []
    for f in fields:
        k = int(f["components"])
        out.extend([f["name"]] if k == 1 else [f"{f['name']}[{i}]" for i in range(k)])
    return out


def edge_channel_names(pos_dim: int) -> list[str]:
    """The edge channels of ``pos_dim``-D points: ``dpos[0]``... (``pos[src] - pos[dst]``), then ``|dpos|``."""
    return [f"dpos[{i}]" for i in range(pos_dim)] + ["|dpos|"]


def mesh_checksum(points: np.ndarray, cells: Cells = (), edge_index: np.ndarray | None = None) -> str:
    """SHA-256 of a mesh as the dataset stores it (points float64, connectivity int64); memory maps
    of the stored files are read in slices, never whole."""
    digest = hashlib.sha256(b"meshshard-mesh-v1")

    def add(tag: bytes, array: np.ndarray) -> None:
        digest.update(tag + b"\0" + np.asarray(array.shape, dtype=np.int64).tobytes())
        step = max(1, (1 << 24) // max(1, array[:1].nbytes))  # in slices of ~16 MB: a memory map streams
        for lo in range(0, len(array), step):
            digest.update(np.ascontiguousarray(array[lo:lo + step]).tobytes())

    add(b"points", np.asarray(points, dtype=np.float64))
    for cell_type, conn in cells:
        add(b"cells:" + cell_type.encode(), np.asarray(conn, dtype=np.int64))
    if edge_index is not None:
        add(b"edge_index", np.asarray(edge_index, dtype=np.int64))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Files and metadata


def save_npy(path: Path, array: np.ndarray) -> None:
    """Write one array of the format: ``.npy``, never pickled (its folder made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming_write_errors(path), open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


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


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder with a ``dataset.json`` (of any format: read to be sure)."""
    return (Path(path) / METADATA_FILE).is_file()


def read_dataset_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``dataset.json`` of a folder, after checking the format name, version and structure."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder")
    file = folder / METADATA_FILE
    if not file.is_file():
        raise ValueError(f"{folder}: not a dataset folder (no {METADATA_FILE}; make one with meshshard dataset)")
    meta = read_json(file)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{file}: Expected format {FORMAT_NAME!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: Expected dataset format version {FORMAT_VERSION} (got "
                         f"{meta.get('format_version')!r}); re-create it with meshshard dataset")
    try:
        samples, meshes = meta["samples"], meta["meshes"]
        ok = (meta["kind"] in KINDS and len(samples) == meta["num_samples"] and meshes
              and all(s["folder"] == f"samples/{i:05d}" and 0 <= s["mesh"] < len(meshes) for i, s in enumerate(samples))
              and all(m["folder"] == f"meshes/{i:05d}" and all(CELL_TYPE.match(t) for t in m["cells"])
                      for i, m in enumerate(meshes))
              and sorted(meta["split"]["train"] + meta["split"]["val"]) == list(range(len(samples))))
    except (KeyError, TypeError) as err:
        raise ValueError(f"{file}: Expected the keys of the dataset format (missing or malformed {err})") from None
    if not ok:
        raise ValueError(f"{file}: inconsistent dataset metadata (kind, samples, meshes or split)")
    return meta
