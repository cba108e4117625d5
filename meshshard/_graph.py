"""``ShardGraph``: what a sharded layer needs to know about its rank's part of the graph.

Built once from a loaded partition (``meshshard.partition.load_partition``) and reused by every
layer and every step: the row layout and halo plan (a :class:`ShardSpec`), the local edges, the
coordinates of owned and ghost nodes, and, for a k-hop partition, the hop distance of each node.

Shapes: ``N_own`` owned nodes, ``N_local = N_own + N_ghost``, ``E_local`` local edges, ``D``
coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    """

    spec: ShardSpec
    edge_index: Tensor
    num_owned_edges: int
    halo_hops: int
    node_hops: Tensor
    pos: Tensor | None
    global_edge_ids: Tensor

    @classmethod
    def from_partition(cls, partition: Any, group: Any = None, *, device: Any = None, dtype: torch.dtype = torch.float32) -> ShardGraph:
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

    def to(self, device: Any) -> ShardGraph:
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


def edge_features(pos: Tensor, edge_index: Tensor) -> Tensor:
    """The usual MeshGraphNet edge input: ``[pos_src - pos_dst, |pos_src - pos_dst|]``.

    Shapes:
        pos: ``(N, D)``; edge_index: ``(2, E)``; result: ``(E, D + 1)``.
    """
    rel = pos.index_select(0, edge_index[0]) - pos.index_select(0, edge_index[1])
    return torch.cat([rel, rel.norm(dim=1, keepdim=True)], dim=1)
