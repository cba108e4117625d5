"""``ShardGraph``: what a sharded layer needs to know about its rank's part of the graph.

Built once from a loaded partition (``meshshard.partition.load_partition``) and reused by every
layer and every step: the row layout and halo plan (a :class:`ShardSpec`), the local edges, the
coordinates of owned and ghost nodes, and, for a k-hop partition, the hop distance of each node.

Shapes: ``N_own`` owned nodes, ``N_local = N_own + N_ghost``, ``E_local`` local edges, ``D``
coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._spec import ShardSpec

__all__ = ["ShardGraph", "edge_features"]


@dataclass(frozen=True, eq=False)
class ShardGraph:
    """One rank's shard of a graph, ready for sharded layers.

    Attributes:
        spec: layout of the owned rows and the halo plan.
        edge_index: ``(2, E_local)`` int64, local numbering; ``dst < N_own`` for the owned edges,
            which come first (``num_owned_edges``); a k-hop partition adds redundant copies of the
            edges that end at ghosts within ``k - 1`` hops.
        num_owned_edges: edges whose ``dst`` is owned; each global edge is owned by one rank.
        halo_hops: ``k`` of the partition; 1 means one exchange per message-passing step.
        node_hops: ``(N_local,)`` hop distance of each local node to the owned set (0 = owned).
        pos: ``(N_local, D)`` coordinates of owned and ghost nodes, when known.
        global_edge_ids: ``(E_local,)`` global id of each local edge.

    Global degrees (:meth:`in_degree`, :meth:`degree_histogram`) are computed on first use, with
    one exchange, and cached: every rank must ask for them together.
    """

    spec: ShardSpec
    edge_index: Tensor
    num_owned_edges: int
    halo_hops: int
    node_hops: Tensor
    pos: Tensor | None
    global_edge_ids: Tensor
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_partition(cls, partition: Any, group: Any = None, *, device: Any = None,
                       dtype: torch.dtype = torch.float32) -> ShardGraph:
        """The shard of ``partition`` (one rank's part), on ``device``; coordinates in ``dtype``."""
        spec = ShardSpec.from_partition(partition, group)
        edge_index = torch.as_tensor(np.asarray(partition.edge_index), dtype=torch.int64)
        owned_edges = int((edge_index[1] < spec.num_owned).sum())
        pos = None if partition.pos is None else torch.as_tensor(np.asarray(partition.pos)).to(dtype)
        graph = cls(
            spec=spec,
            edge_index=edge_index,
            num_owned_edges=owned_edges,
            halo_hops=int(partition.halo_hops),
            node_hops=torch.as_tensor(np.asarray(partition.node_hops), dtype=torch.int64),
            pos=pos,
            global_edge_ids=torch.as_tensor(np.asarray(partition.global_edge_ids), dtype=torch.int64),
        )
        return graph.to(device) if device is not None else graph

    @property
    def num_owned(self) -> int:
        return self.spec.num_owned

    @property
    def num_local(self) -> int:
        return self.spec.num_owned + self.spec.num_ghost

    @property
    def owned_edge_index(self) -> Tensor:
        """``(2, E_own)`` the edges that end at owned nodes (each global edge on exactly one rank)."""
        return self.edge_index[:, : self.num_owned_edges]

    def owned_edge_rows(self, value: Tensor, name: str, alternative: str = "") -> Tensor:
        """The owned edges' rows of a per-edge tensor given for the local edges (the owned come
        first) or for the owned edges alone; ``ValueError`` naming ``name`` otherwise
        (``alternative``: what else the caller takes, said first in the message)."""
        rows = value.shape[0] if value.dim() else -1
        if rows == self.edge_index.shape[1]:
            return value[: self.num_owned_edges]
        if rows == self.num_owned_edges:
            return value
        raise ValueError(f"Expected '{name}' to {alternative or 'have '}one row per local edge "
                         f"({self.edge_index.shape[1]}) or per owned edge ({self.num_owned_edges}) "
                         f"(got shape {tuple(value.shape)})")

    def in_degree(self) -> Tensor:
        """``(N_local,)`` int64: the global in-degree of every owned and ghost node.

        An owned node's incoming edges are all stored on its rank, so its in-degree is local; the
        ghosts' come from their owners. Communication: one halo exchange, the first time only.
        """
        if "in_degree" not in self._cache:
            dst = self.owned_edge_index[1]
            own = torch.bincount(dst, minlength=self.num_owned).to(torch.float64)[:, None]
            self._cache["in_degree"] = self._exchange_ghosts(own)[:, 0].round().to(torch.int64)
        return self._cache["in_degree"]

    def degree_histogram(self) -> Tensor:
        """``(D_max + 1,)`` int64, replicated: how many nodes of the whole graph have in-degree 0, 1, ...

        What ``torch_geometric.nn.PNAConv`` takes as ``deg`` (its ``get_degree_histogram`` on the
        whole graph). Communication: two small ``all_reduce`` (plus :meth:`in_degree`'s exchange).
        """
        from meshshard.comm import all_reduce_max, all_reduce_sum

        deg = self.in_degree()[: self.num_owned]
        top = torch.tensor([int(deg.max()) + 1 if deg.numel() else 0])
        grouped = self.spec.world_size > 1  # and a process group: without one, both calls send nothing
        if grouped:
            all_reduce_max(top, group=self.spec.group)
        hist = torch.bincount(deg.cpu(), minlength=int(top)).to(torch.int64)
        if grouped:
            all_reduce_sum(hist, group=self.spec.group)
        return hist

    def dst_lengths(self, num_rows: int) -> Tensor | None:
        """``(num_rows,)`` int64: how many local edges end at each of the first ``num_rows`` local
        nodes (:func:`segment_lengths` of ``edge_index[1]``; ``None`` if it is not sorted). Local,
        computed once per ``num_rows``: the layers sum messages by these segments every step."""
        key = ("dst_lengths", num_rows)
        if key not in self._cache:
            self._cache[key] = segment_lengths(self.edge_index[1], num_rows)
        return self._cache[key]

    def _exchange_ghosts(self, own: Tensor) -> Tensor:
        """``(N_own, ...)`` owned rows -> ``(N_local, ...)`` owned plus ghost rows (one exchange)."""
        spec = self.spec
        return spec.halo.append(own) if spec.halo is not None else own

    def to(self, device: Any) -> ShardGraph:
        """The same shard with its index tensors and coordinates on ``device``."""
        return ShardGraph(
            self.spec, self.edge_index.to(device), self.num_owned_edges, self.halo_hops,
            self.node_hops.to(device), None if self.pos is None else self.pos.to(device),
            self.global_edge_ids.to(device),
        )

    def __repr__(self) -> str:
        return (
            f"ShardGraph(rank={self.spec.rank}/{self.spec.world_size}, owned={self.num_owned}, "
            f"local={self.num_local}, edges={self.edge_index.shape[1]} ({self.num_owned_edges} owned), "
            f"halo_hops={self.halo_hops})"
        )


def segment_lengths(index: Tensor, num_rows: int) -> Tensor | None:
    """How many entries of ``index`` hold each row ``0..num_rows-1`` if ``index`` is sorted
    (non-decreasing) and not empty, else ``None``. Shapes: ``index (E,)`` -> ``(num_rows,)``."""
    if index.numel() == 0 or not bool((index[1:] >= index[:-1]).all()):
        return None
    lengths = torch.bincount(index, minlength=num_rows)
    return lengths if len(lengths) == num_rows else None  # an index out of range: index_add_ says so


def edge_features(pos: Tensor, edge_index: Tensor) -> Tensor:
    """The usual MeshGraphNet edge input: ``[pos_src - pos_dst, |pos_src - pos_dst|]``.

    Shapes:
        pos: ``(N, D)``; edge_index: ``(2, E)``; result: ``(E, D + 1)``.
    """
    rel = pos.index_select(0, edge_index[0]) - pos.index_select(0, edge_index[1])
    return torch.cat([rel, rel.norm(dim=1, keepdim=True)], dim=1)
