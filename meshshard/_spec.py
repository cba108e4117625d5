"""``ShardSpec``: how the rows of a node-indexed tensor are laid out across the ranks of a group.

A spec is frozen. Every rank's owned count comes from the partition metadata (or is given), and
the halo plan from this rank's part file; the only communication in building one is the halo
plan's check across ranks (below). It holds:

- ``owned_counts``: ``R`` ints, the number of rows each rank owns;
- ``owned_ids``: ``(N_own,)`` int64, the global node id of each owned row on this rank
  (ascending for a partition; a contiguous range for a chunked layout), as a partition's
  ``owned_ids``; ``global_ids`` is a deprecated alias of it;
- ``halo``: the halo plan, when there is one, a :class:`meshshard.comm.HaloPlan` (``send_index``
  ``(sum(send_counts),)``, ``send_counts`` and ``recv_counts``, ``R`` each, also readable on the
  spec), whose exchange gives exactly the ghost rows in local order;
- ``group``: the process group (``None``: the default group, or a world of one).

:meth:`ShardSpec.from_partition` is the one conversion from a partition's numpy plan. It checks the
plan once, across the ranks of the group (one small ``all_gather_v``; every rank must call it):
counts that disagree between ranks, or a part that only its own rank can see is wrong, raise the
same ``ValueError`` on every rank, instead of an exchange that returns garbage or waits forever.
Specs without a halo (:meth:`ShardSpec.from_counts`, :meth:`ShardSpec.chunked`) need no
communication.

Two specs are equal when they describe the same layout: same counts, same owned global ids on this
rank, same halo plan, same partition (its metadata checksum) and same group. Equality is decided
locally from a fingerprint computed once at construction.

Plans that need every rank's global ids (``full_tensor``, ``gather``, ``scatter_tensor``,
``redistribute``) are computed on first use, with a few small collectives, and cached on the spec.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from meshshard.comm import HaloPlan, all_gather_v, all_to_all_v, communication_device, group_rank_and_size

__all__ = ["ShardSpec"]


def _digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Tensor):
            h.update(part.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(part, np.ndarray):
            h.update(np.ascontiguousarray(part).tobytes())
        else:
            h.update(repr(part).encode())
        h.update(b"|")
    return h.hexdigest()[:16]


def _partition_layout(partition: Any, rank: int, world: int) -> tuple[tuple[int, ...], Tensor]:
    """Every rank's owned count and this rank's owned global ids, checked on this rank."""
    if partition.num_parts != world:
        from meshshard.partition import plural

        hint = (f"; run one process per part: torchrun --nproc-per-node {partition.num_parts} SCRIPT"
                if world == 1 and partition.num_parts > 1 else "")
        raise ValueError(f"Expected a partition into {plural(world, 'part')} for a group of {plural(world, 'rank')} "
                         f"(got {plural(partition.num_parts, 'part')}){hint}")
    if partition.rank != rank:
        raise ValueError(f"Expected the part of rank {rank} (got the part of rank {partition.rank})")
    counts = tuple(int(c) for c in partition.num_owned_per_part)
    ids = _as_index("owned_ids", partition.owned_ids)
    if len(counts) != world or ids.numel() != counts[rank]:
        raise ValueError(
            f"Expected {world} owned counts and num_owned_per_part[{rank}] = owned ids on rank {rank} "
            f"(got {len(counts)} counts and {ids.numel()} owned ids)"
        )
    return counts, ids


def _as_index(name: str, values: Any) -> Tensor:
    t = (torch.as_tensor(np.asarray(values), dtype=torch.int64) if not isinstance(values, Tensor)
         else values.to(torch.int64))
    if t.dim() != 1:
        raise ValueError(f"Expected '{name}' to be one-dimensional (got shape {tuple(t.shape)})")
    return t.cpu()


@dataclass(frozen=True, eq=False, repr=False)
class ShardSpec:
    """The row layout of sharded node tensors, and the halo plan that fills their ghost rows.

    Build it with :meth:`from_partition`, :meth:`from_counts` or :meth:`chunked`.

    Names follow DESIGN.md's numbering: ``owned_ids`` (this rank's owned global ids, ``(N_own,)``)
    and ``num_ghost``; ``global_ids`` is a deprecated alias of ``owned_ids``.
    """

    owned_counts: tuple[int, ...]
    rank: int
    owned_ids: Tensor
    halo: HaloPlan | None = None
    group: Any = None
    source: str = "counts"
    _key: str = field(default="", compare=False)
    _cache: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        world = len(self.owned_counts)
        if any(c < 0 for c in self.owned_counts):
            raise ValueError(f"Expected 'owned_counts' to be non-negative (got {list(self.owned_counts)})")
        if not 0 <= self.rank < world:
            raise ValueError(f"Expected 'rank' in [0, {world}) (got {self.rank})")
        if self.owned_ids.numel() != self.owned_counts[self.rank]:
            raise ValueError(
                f"Expected 'owned_ids' to have owned_counts[{self.rank}] = {self.owned_counts[self.rank]} "
                f"entries (got {self.owned_ids.numel()})"
            )
        if self.halo is not None and (
            (self.halo.rank, self.halo.world_size, self.halo.num_owned) != (self.rank, world, self.num_owned)
        ):
            raise ValueError(
                f"Expected a halo plan of rank {self.rank} of {world} with {self.num_owned} owned rows "
                f"(got {self.halo!r})"
            )
        key = _digest(self.owned_counts, self.rank, self.owned_ids, self.send_index, self.send_counts,
                      self.recv_counts, id(self.group) if self.group is not None else None, self.source)
        object.__setattr__(self, "_key", key)

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_partition(cls, partition: Any, group: Any = None) -> ShardSpec:
        """The layout and halo plan of a loaded partition (``meshshard.partition.load_partition``).

        Every rank of ``group`` must call it: the plan is checked across the ranks once, here
        (one ``all_gather_v`` of one small row per rank), and never again per exchange.

        Raises:
            ValueError: on every rank at once, if any rank's partition does not have as many parts
                as the group has ranks, is not that rank's part, is damaged, or disagrees with the
                other ranks' parts (owned counts, or rows sent and expected between two ranks).
        """
        rank, world = group_rank_and_size(group)
        problem, counts, ids = None, (0,) * world, torch.zeros(0, dtype=torch.int64)
        try:
            counts, ids = _partition_layout(partition, rank, world)
        except (TypeError, ValueError) as err:
            problem = err
        except AttributeError as err:  # not a Partition: still fail every rank, not only this one
            problem = TypeError(f"Expected a meshshard.partition.Partition (got {type(partition).__name__}: {err})")
        halo = HaloPlan.build(
            partition.send_index if problem is None else [], partition.send_counts if problem is None else [0] * world,
            partition.recv_counts if problem is None else [0] * world, num_owned=len(ids), group=group,
            owned_counts=counts, problem=problem,
        )
        meta = getattr(partition, "metadata", None) or {}
        identity = json.dumps(meta.get("parts", meta), sort_keys=True, default=str) if meta else "in-memory"
        return cls(
            owned_counts=counts, rank=rank, owned_ids=ids, halo=halo, group=group,
            source="partition:" + _digest(identity),
        )

    @classmethod
    def from_counts(cls, owned_counts: Sequence[int], group: Any = None, *, owned_ids: Any = None,
                    global_ids: Any = None) -> ShardSpec:
        """A layout without a halo: rank ``r`` owns ``owned_counts[r]`` rows.

        Without ``owned_ids``, rank ``r`` owns the contiguous range of global ids that follows the
        ranks before it (how data usually arrives from a loader). ``global_ids`` is a deprecated
        alias of ``owned_ids`` (give one of them).
        """
        rank, world = group_rank_and_size(group)
        counts = tuple(int(c) for c in owned_counts)
        if len(counts) != world:
            raise ValueError(f"Expected 'owned_counts' to have {world} entries, one per rank (got {len(counts)})")
        name = "owned_ids" if global_ids is None else "global_ids"
        if owned_ids is not None and global_ids is not None:
            raise ValueError("Expected 'owned_ids' or its alias 'global_ids', not both")
        given = owned_ids if global_ids is None else global_ids
        if given is None:
            start = sum(counts[:rank])
            ids = torch.arange(start, start + counts[rank], dtype=torch.int64)
            source = "contiguous"
        else:
            ids = _as_index(name, given)
            source = "ids:" + _digest(ids)
        return cls(owned_counts=counts, rank=rank, owned_ids=ids, group=group, source=source)

    @classmethod
    def chunked(cls, num_nodes: int, group: Any = None) -> ShardSpec:
        """Contiguous rows in ``torch.chunk`` sizes: the layout of a DTensor with ``Shard(0)``."""
        _, world = group_rank_and_size(group)
        chunk = -(-num_nodes // world) if world else 0
        counts = [max(0, min(chunk, num_nodes - r * chunk)) for r in range(world)]
        return cls.from_counts(counts, group)

    # --- what it says ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.owned_counts)

    @property
    def num_nodes(self) -> int:
        return sum(self.owned_counts)

    @property
    def num_owned(self) -> int:
        return self.owned_counts[self.rank]

    @property
    def has_halo(self) -> bool:
        return self.halo is not None

    @property
    def num_ghost(self) -> int:
        """The ghost rows this rank receives in a halo exchange (``N_ghost``; 0 without a halo)."""
        return self.halo.num_ghost if self.halo is not None else 0

    @property
    def global_ids(self) -> Tensor:
        """Deprecated alias of :attr:`owned_ids` (the same tensor): this rank's owned global ids."""
        return self.owned_ids

    @property
    def send_index(self) -> Tensor | None:
        """The halo plan's owned rows to send, grouped by destination rank (``None``: no halo)."""
        return self.halo.send_index if self.halo is not None else None

    @property
    def send_counts(self) -> tuple[int, ...] | None:
        return self.halo.send_counts if self.halo is not None else None

    @property
    def recv_counts(self) -> tuple[int, ...] | None:
        return self.halo.recv_counts if self.halo is not None else None

    @property
    def is_contiguous(self) -> bool:
        """Rank ``r`` owns the ``r``-th contiguous block of global ids (chunked or counts layout)."""
        return self.source == "contiguous"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardSpec) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        halo = f", ghosts={self.num_ghost}" if self.has_halo else ", no halo"
        return (f"ShardSpec(rank={self.rank}/{self.world_size}, owned={self.num_owned}/{self.num_nodes}{halo}, "
                f"{self.source})")

    # --- cached plans -------------------------------------------------------------------------

    def _on(self, name: str, device: torch.device) -> Tensor:
        """A cached copy of an index tensor on ``device``."""
        key = (name, device)
        if key not in self._cache:
            self._cache[key] = getattr(self, name).to(device)
        return self._cache[key]

    def all_global_ids(self) -> Tensor:
        """Every rank's owned global ids, in rank order, ``(N,)`` int64 (one collective, cached)."""
        if "all_ids" not in self._cache:
            if self.is_contiguous:
                self._cache["all_ids"] = torch.arange(self.num_nodes, dtype=torch.int64)
            else:
                with torch.no_grad():
                    mine = self.owned_ids.to(communication_device(self.group))[:, None]
                    ids = all_gather_v(mine, list(self.owned_counts), group=self.group)[:, 0].cpu()
                self._cache["all_ids"] = ids
        return self._cache["all_ids"]

    def redistribute_plan(self, target: ShardSpec) -> tuple[Tensor, list[int], list[int], Tensor]:
        """The exchange that moves rows from this layout to ``target`` (cached per target).

        Returns ``(send_index, send_counts, recv_counts, gather_index)``: rows ``send_index`` go out,
        grouped by destination rank; ``received.index_select(0, gather_index)`` are then the target's
        owned rows, in the target's order.

        The plan comes from a directory: the rank owning global id ``g`` in a contiguous split of
        ``0..N-1`` learns where ``g`` sits in the target layout and tells the rank that holds ``g``
        now. Memory per rank is O(its rows), never O(N). Communication, once: four ``all_to_all_v``
        of int64 rows, and four of per-rank counts.
        """
        if target._key in self._cache:
            return self._cache[target._key]
        if target.world_size != self.world_size or target.num_nodes != self.num_nodes:
            raise ValueError(
                f"Expected a layout of the same {self.num_nodes} nodes on {self.world_size} ranks "
                f"(got {target.num_nodes} nodes on {target.world_size} ranks)"
            )
        n, world = self.num_nodes, self.world_size
        block = max(1, -(-n // world))
        lo = self.rank * block
        dev = communication_device(self.group)  # NCCL needs device tensors; results are kept on CPU
        with torch.no_grad():
            # 1. the target's rows tell the directory where they live: rank << 32 | position
            code = (target.rank << 32) + torch.arange(target.num_owned, dtype=torch.int64)
            (entries, _, _, _) = self._to_directory(torch.stack([target.owned_ids, code], 1).to(dev), block)
            table = torch.full((max(0, min(block, n - lo)),), -1, dtype=torch.int64, device=dev)
            table[entries[:, 0] - lo] = entries[:, 1]
            # 2. this layout's rows ask the directory, and the answers come back the same way
            asks, order, counts, recv = self._to_directory(self.owned_ids.to(dev)[:, None], block)
            answers = all_to_all_v(table[asks[:, 0] - lo][:, None], recv, counts, group=self.group)[:, 0]
            where = torch.empty_like(answers)
            where[order] = answers
            dest_rank, dest_pos = where >> 32, where & ((1 << 32) - 1)
            # 3. the plan: send each row to its target rank, which learns where to put it
            send_index = torch.argsort(dest_rank, stable=True)
            send_counts = torch.bincount(dest_rank, minlength=world).tolist()
            recv_counts = self._counts_sent_to_me(send_counts)
            placement = all_to_all_v(dest_pos[send_index][:, None], send_counts, recv_counts, group=self.group)[:, 0]
            gather_index = torch.empty_like(placement)
            gather_index[placement] = torch.arange(placement.numel(), dtype=torch.int64, device=dev)
        plan = (send_index.cpu(), send_counts, recv_counts, gather_index.cpu())
        self._cache[target._key] = plan
        return plan

    def _counts_sent_to_me(self, counts: list[int]) -> list[int]:
        """What each rank sends me, given what I send each rank (one small exchange)."""
        world = self.world_size
        mine = torch.tensor(counts, dtype=torch.int64, device=communication_device(self.group))[:, None]
        return all_to_all_v(mine, [1] * world, [1] * world, group=self.group)[:, 0].tolist()

    def _to_directory(self, rows: Tensor, block: int) -> tuple[Tensor, Tensor, list[int], list[int]]:
        """Send ``rows`` (column 0: a global id) to the rank owning that id's block.

        Returns what this rank received, the order rows were sent in, and the counts both ways.
        """
        owner = rows[:, 0] // block
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=self.world_size).tolist()
        recv = self._counts_sent_to_me(counts)
        return all_to_all_v(rows[order], counts, recv, group=self.group), order, counts, recv
