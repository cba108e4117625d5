"""One rank's shard of a partitioned graph: :class:`Partition`.

The numbering is the one of DESIGN.md and of the format docstring in
:mod:`meshshard.partition._format`, which lists every array with its dtype and shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Partition", "PART_ARRAYS"]

#: Arrays of a part file, in the order they are written.
PART_ARRAYS: tuple[str, ...] = (
    "owned_ids",
    "ghost_ids",
    "ghost_owner",
    "node_hops",
    "edge_index",
    "global_edge_ids",
    "send_index",
    "send_counts",
    "recv_counts",
    "pos",
)


@dataclass(frozen=True, eq=False, repr=False)
class Partition:
    """Rank ``rank``'s owned nodes, ghosts, local edges and halo plan.

    Local numbering: ``0..N_own-1`` are the owned nodes in ``owned_ids`` order (ascending
    global id), ``N_own..N_local-1`` the ghosts, grouped by owning rank (ascending) and by
    ascending global id within a group.

    Args:
        rank: This shard's rank, in ``[0, num_parts)``.
        num_parts: Number of ranks ``R``.
        num_nodes: Global number of nodes ``N``.
        halo_hops: ``k``; 1 is one exchange per layer, ``k > 1`` is the k-hop halo.
        num_owned_per_part: Every rank's owned count (enough to build a ``ShardSpec`` with no
            communication).
        owned_ids: Global id of each owned node, ascending.
        ghost_ids: Global id of each ghost, in local order.
        ghost_owner: Owning rank of each ghost (non-decreasing).
        node_hops: Hop distance of each local node to the owned set: 0 owned, ``1..k`` ghosts.
        edge_index: Local directed edges, row 0 ``src``, row 1 ``dst``. The owned edges
            (``dst < N_own``) come first, in global edge id order; in k-hop mode the redundant
            copies (``dst`` a ghost within ``k - 1`` hops) follow, in global edge id order.
        global_edge_ids: Global id of each local edge (position in the global edge list sorted
            by ``(dst, src)``).
        send_index: Local owned indices to send, grouped by destination rank.
        send_counts: Rows sent to each rank (0 to itself).
        recv_counts: Rows received from each rank: ghosts owned by it (0 from itself).
        pos: Coordinates of the local nodes, when the input has them.
        metadata: The partition's metadata (the JSON of the folder; see the format docstring).

    Shapes:
        owned_ids: ``(N_own,)`` int64. ghost_ids, ghost_owner: ``(N_ghost,)`` int64.
        node_hops: ``(N_local,)`` int8, ``N_local = N_own + N_ghost``.
        edge_index: ``(2, E_local)`` int64. global_edge_ids: ``(E_local,)`` int64.
        send_index: ``(sum(send_counts),)`` int64. send_counts, recv_counts,
        num_owned_per_part: ``(R,)`` int64. pos: ``(N_local, D)`` float64.
    """

    rank: int
    num_parts: int
    num_nodes: int
    halo_hops: int
    num_owned_per_part: np.ndarray
    owned_ids: np.ndarray
    ghost_ids: np.ndarray
    ghost_owner: np.ndarray
    node_hops: np.ndarray
    edge_index: np.ndarray
    global_edge_ids: np.ndarray
    send_index: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray
    pos: np.ndarray | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_owned(self) -> int:
        return len(self.owned_ids)

    @property
    def num_ghost(self) -> int:
        return len(self.ghost_ids)

    @property
    def num_local(self) -> int:
        return self.num_owned + self.num_ghost

    @property
    def num_edges(self) -> int:
        """Local edges, redundant k-hop copies included."""
        return self.edge_index.shape[1]

    @property
    def num_owned_edges(self) -> int:
        """Edges whose ``dst`` is owned here: stored on this rank and no other."""
        return int(np.searchsorted(self.edge_index[1] >= self.num_owned, True))

    @property
    def local_to_global(self) -> np.ndarray:
        """Global id of each local node, ``(N_local,)`` int64."""
        return np.concatenate([self.owned_ids, self.ghost_ids])

    def arrays(self) -> dict[str, np.ndarray]:
        """The part file's arrays, in :data:`PART_ARRAYS` order (``pos`` only when known)."""
        out = {name: getattr(self, name) for name in PART_ARRAYS}
        if self.pos is None:
            del out["pos"]
        return out

    def __repr__(self) -> str:
        return (f"Partition(rank={self.rank}, num_parts={self.num_parts}, "
                f"num_owned={self.num_owned}, num_ghost={self.num_ghost}, "
                f"num_edges={self.num_edges}, halo_hops={self.halo_hops})")
