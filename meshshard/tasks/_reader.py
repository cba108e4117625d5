"""Reading a dataset (``meshshard dataset``'s folder) on one rank, as training and prediction
need it: owned rows only, normalised, as tensors.

Public names (stable):

- :class:`DatasetReader`: for a dataset folder, its partitions (``meshshard partition DATA``) and
  this rank's domain rank, ``reader.sample(s)`` returns a :class:`LocalSample`: the
  :class:`~meshshard.ShardGraph` of the sample's mesh (loaded when a sample on that mesh is first
  drawn, then cached), the normalised inputs and targets of this rank's owned nodes as
  :class:`~meshshard.ShardTensor`, and the normalised edge features of the local edges.
  Construction checks that the partitions belong to the dataset (one line, ``ValueError``).
- :class:`TensorNormalisation`: a dataset's :class:`~meshshard.partition.Normalisation` (the
  numpy statistics of ``dataset.json``) as tensors on one device and dtype, with
  ``normalise_inputs``, ``normalise_targets``, ``normalise_edges``, ``edge_attr`` (a graph's edge
  features, normalised) and ``denormalise_targets``; built from a ``Normalisation`` or from
  ``checkpoint["config"]["normalisation"]`` (:meth:`TensorNormalisation.from_dict`), which
  training stores, so prediction de-normalises with the statistics the model was trained with.
  ``Normaliser`` is its former name, kept as an alias (the same class).
- :func:`whole_sample`: one sample on the whole mesh, normalised (single-process prediction and
  the reference computations of the tests).

Memory per rank is O(shard + halo): the sample files are memory maps and only the rows of
``owned_ids`` are read; the mesh is read through the partition's part file, never whole.

Shapes: ``N_own`` owned nodes, ``E_local`` local edges, ``F_in`` / ``F_out`` input / target
channels, ``F_e = D + 1`` edge channels.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from meshshard.data import (
    Dataset,
    Normalisation,
    check_partition_matches,
    dataset_partition_folder,
    open_dataset,
    partition_of_mesh,
)
from meshshard.partition import load_partition

from .._graph import ShardGraph, edge_features
from .._tensor import ShardTensor

__all__ = ["DatasetReader", "LocalSample", "Normaliser", "TensorNormalisation", "whole_sample"]


class TensorNormalisation:
    """A :class:`~meshshard.partition.Normalisation` as tensors: ``(value - mean) / scale`` for
    inputs, targets and edge features, and its inverse for predicted targets, on one device and
    dtype.

    One concept in two forms: ``Normalisation`` (``meshshard.partition``, numpy, what
    ``dataset.json`` and a checkpoint store; ``partition`` never imports torch) and this class,
    the same statistics as tensors (``.normalisation`` is the numpy form it was made from,
    ``to_dict()`` its stored form). ``Normaliser`` is an alias of this class, its former name.

    Shapes:
        inputs ``(..., F_in)``, targets ``(..., F_out)``, edges ``(..., F_e)``.
    """

    def __init__(self, normalisation: Normalisation, device: Any = None, dtype: torch.dtype = torch.float32) -> None:
        self.normalisation = normalisation

        def t(a: np.ndarray) -> Tensor:
            return torch.as_tensor(np.asarray(a, dtype=np.float64), device=device).to(dtype)

        n = normalisation
        self._in = (t(n.inputs.mean), t(n.inputs.scale))
        self._out = (t(n.targets.mean), t(n.targets.scale))
        self._out_scale = t(n.targets.output_scale)  # 0 on a held channel: predicted as its constant
        self._edge = (t(n.edges.mean), t(n.edges.scale))
        self._offset = (None if n.target_offset is None
                        else torch.as_tensor(list(n.target_offset), dtype=torch.long, device=device))

    @classmethod
    def from_dict(cls, values: dict[str, Any], device: Any = None,
                  dtype: torch.dtype = torch.float32) -> TensorNormalisation:
        """From ``Normalisation.to_dict()`` (what a checkpoint's config stores)."""
        return cls(Normalisation.from_dict(values), device, dtype)

    def normalise_inputs(self, x: Tensor) -> Tensor:
        """``(x - mean) / scale`` with the inputs' statistics, ``(..., F_in)``."""
        return (x - self._in[0]) / self._in[1]

    def _offset_of(self, x: Any) -> Any:
        """The targets' offset, the input channels ``target_offset`` of the raw inputs ``x``
        (``--mean-field``), or 0 without one."""
        if self._offset is None:
            return 0.0
        if x is None:
            raise ValueError("Expected the raw inputs: the targets are learnt as the difference from the input "
                             f"channels {self.normalisation.target_offset} (the dataset's --mean-field)")
        return x.index_select(-1, self._offset)

    def normalise_targets(self, y: Tensor, x: Tensor | None = None) -> Tensor:
        """``(y - offset - mean) / scale`` with the targets' statistics, ``(..., F_out)``; ``x``:
        the raw inputs ``(..., F_in)``, needed (and only read) when the targets have an offset."""
        return (y - self._offset_of(x) - self._out[0]) / self._out[1]

    def normalise_edges(self, e: Tensor) -> Tensor:
        """``(e - mean) / scale`` with the edge features' statistics, ``(..., F_e)``."""
        return (e - self._edge[0]) / self._edge[1]

    def edge_attr(self, pos: Tensor, edge_index: Tensor) -> Tensor:
        """The normalised edge features of a graph (:func:`meshshard.edge_features` of its
        coordinates): the one place where a model's edge inputs are made, for a shard
        (``graph.pos``, ``graph.edge_index``) and for a whole mesh alike. ``(E, F_e)``."""
        return self.normalise_edges(edge_features(pos, edge_index))

    def denormalise_targets(self, y: Any, x: Any = None) -> Any:
        """Model output to physical units: ``y * scale + mean + offset`` (a Tensor or a
        ShardTensor; ``x`` the raw inputs of the same kind, needed when the targets have an
        offset). A held channel (round-off, ``ChannelStats.held``) is its constant ``mean (+
        offset)``: the model's output there is ignored."""
        if isinstance(y, ShardTensor):
            local = None if x is None else (x.to_local() if isinstance(x, ShardTensor) else x)
            return ShardTensor.from_local(self.denormalise_targets(y.to_local(), local), y.spec)
        return y * self._out_scale + self._out[0] + self._offset_of(x)

    def to_dict(self) -> dict[str, Any]:
        """The statistics as plain values (``Normalisation.to_dict()``: what a checkpoint stores)."""
        return self.normalisation.to_dict()


#: The former name of :class:`TensorNormalisation`, kept as an alias (the same class).
Normaliser = TensorNormalisation


@dataclass(frozen=True, eq=False)
class LocalSample:
    """One sample on this rank. x, y: owned rows ``(N_own, F_in)`` / ``(N_own, F_out)``,
    normalised; edge_attr ``(E_local, F_e)``, normalised; owned_ids ``(N_own,)`` global ids;
    mesh: the index of the sample's mesh in the dataset (``dataset.sample_mesh(sample)``)."""

    sample: int
    mesh: int
    graph: ShardGraph
    x: ShardTensor
    y: ShardTensor
    edge_attr: Tensor
    owned_ids: np.ndarray


class DatasetReader:
    """This rank's view of a dataset and its partitions (see the module docstring).

    Args:
        data: Dataset folder (or an open :class:`~meshshard.partition.Dataset`).
        partition: ``meshshard partition DATA`` output: a partition folder (one-mesh dataset)
            or a folder of them (many meshes).
        domain_rank: This rank's part.
        group: The domain process group (``None``: the default group, or none at all).
        device, dtype: Of every tensor returned.
        cache_size: At most this many meshes' shards stay loaded (default: no count), and
        cache_bytes: at most about this many bytes of them (default 1 GiB; the least recently used
            dropped first, the last one kept whatever its size). A sweep of many small meshes keeps
            every shard it trains on; a shard is rebuilt from its files when it was dropped.
        normaliser: The statistics to apply, a :class:`TensorNormalisation` (default: the dataset's;
            a trained run's for prediction).
        parts_meta: What ``check_partition_matches(data, partition)`` returned, when the caller
            has checked the partition already (default: checked here).

    Raises:
        ValueError: the partitions were made for another dataset, or for another number of parts
            than ``num_parts`` when it is given.
    """

    def __init__(self, data: str | os.PathLike[str] | Dataset, partition: str | os.PathLike[str], domain_rank: int,
                 group: Any = None, *, device: Any = None, dtype: torch.dtype = torch.float32,
                 cache_size: int | None = None, cache_bytes: int = 1 << 30,
                 normaliser: TensorNormalisation | None = None,
                 parts_meta: dict[str, Any] | None = None) -> None:
        self.dataset = data if isinstance(data, Dataset) else open_dataset(data)
        self.partition = partition
        self.parts_meta = parts_meta if parts_meta is not None else check_partition_matches(self.dataset, partition)
        self.num_parts: int = int(self.parts_meta["num_parts"])
        self.domain_rank, self.group, self.device, self.dtype = domain_rank, group, device, dtype
        self.normaliser = normaliser or TensorNormalisation(self.dataset.normalisation, device, dtype)
        self.cache_size = max(1, cache_size) if cache_size is not None else None
        self.cache_bytes = int(cache_bytes)
        self._shards: OrderedDict[int, tuple[ShardGraph, Tensor, np.ndarray]] = OrderedDict()
        self._shard_bytes: dict[int, int] = {}

    @property
    def train(self) -> np.ndarray:
        return self.dataset.train

    @property
    def val(self) -> np.ndarray:
        return self.dataset.val

    @property
    def sample_names(self) -> list[str]:
        """The name of every sample id the training loop draws (to name one in an error)."""
        return [str(x["name"]) for x in self.dataset.meta["samples"]]

    @property
    def num_inputs(self) -> int:
        return len(self.dataset.input_channels)

    @property
    def num_targets(self) -> int:
        return len(self.dataset.target_channels)

    @property
    def num_edge_features(self) -> int:
        return len(self.dataset.edge_channels)

    def shard(self, mesh: int) -> tuple[ShardGraph, Tensor, np.ndarray]:
        """(graph, normalised edge features, owned global ids) on this rank of the dataset's mesh
        number ``mesh`` (an index, as ``dataset.sample_mesh(s)`` returns)."""
        if mesh in self._shards:
            self._shards.move_to_end(mesh)
            return self._shards[mesh]
        folder = dataset_partition_folder(self.partition, mesh)
        part = load_partition(folder, self.domain_rank)
        if not partition_of_mesh(part.metadata.get("input", {}), self.dataset.meta["meshes"][mesh]):
            raise ValueError(f"{folder}: partition made for another dataset (its mesh checksum differs from "
                             f"mesh {mesh} of {self.dataset.path}); re-run meshshard partition")
        graph = ShardGraph.from_partition(part, self.group, device=self.device, dtype=self.dtype)
        if graph.pos is None:
            raise ValueError(f"{folder}: Expected coordinates in the partition (got none)")
        edge_attr = self.normaliser.edge_attr(graph.pos, graph.edge_index)
        shard = (graph, edge_attr, np.asarray(part.owned_ids))
        self._shards[mesh] = shard
        # what the shard holds, twice for what its graph derives and caches as it is used
        held = [graph.edge_index, graph.node_hops, graph.global_edge_ids, edge_attr,
                *([graph.pos] if graph.pos is not None else [])]
        self._shard_bytes[mesh] = 2 * sum(t.numel() * t.element_size() for t in held) + shard[2].nbytes
        while len(self._shards) > 1 and ((self.cache_size is not None and len(self._shards) > self.cache_size)
                                         or sum(self._shard_bytes.values()) > self.cache_bytes):
            dropped, _ = self._shards.popitem(last=False)
            del self._shard_bytes[dropped]
        return shard

    def sample(self, s: int) -> LocalSample:
        """Sample ``s`` on this rank: its mesh's shard and the owned rows, normalised."""
        mesh = self.dataset.sample_mesh(s)
        graph, edge_attr, owned = self.shard(mesh)
        x, y = self.dataset.rows(s, owned)
        x_raw = torch.from_numpy(x).to(self.device, self.dtype)
        x_t = self.normaliser.normalise_inputs(x_raw)
        y_t = self.normaliser.normalise_targets(torch.from_numpy(y).to(self.device, self.dtype), x_raw)
        return LocalSample(int(s), mesh, graph, ShardTensor.from_local(x_t, graph.spec),
                           ShardTensor.from_local(y_t, graph.spec), edge_attr, owned)

    def mean_nodes(self, samples: np.ndarray | None = None) -> float:
        """Mean node count over ``samples`` (default: the training split)."""
        ids = self.train if samples is None else samples
        return float(np.mean([self.dataset.num_nodes(int(s)) for s in ids])) if len(ids) else 0.0


def whole_sample(data: str | os.PathLike[str] | Dataset, s: int, *, device: Any = None,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sample ``s`` on its whole mesh, normalised, in one process.

    Returns:
        ``(x, y, edge_index, edge_attr)``: ``(N, F_in)``, ``(N, F_out)``, ``(2, E)`` global
        directed edges in global edge id order, ``(E, F_e)``.
    """
    dataset = data if isinstance(data, Dataset) else open_dataset(data)
    normaliser = TensorNormalisation(dataset.normalisation, device, dtype)
    graph = dataset.mesh(dataset.sample_mesh(s)).graph()
    edge_index = torch.as_tensor(graph.edge_index(), device=device)
    pos = torch.as_tensor(graph.pos, device=device).to(dtype)
    x, y = (torch.from_numpy(np.array(a, dtype=np.float64)).to(device, dtype) for a in dataset.sample_arrays(s))
    return (normaliser.normalise_inputs(x), normaliser.normalise_targets(y, x), edge_index,
            normaliser.edge_attr(pos, edge_index))
