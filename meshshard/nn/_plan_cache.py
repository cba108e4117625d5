"""``PlanCache``: the ball-query plans of a point set, built once and reused across steps and epochs.

A :class:`~meshshard.nn.BallQueryPlan` (the neighbour lists and, on shards, the geometric halo)
depends only on the points' coordinates, their layout (the ``ShardSpec``), the radius and
``max_neighbors``, and costs about one forward of :class:`~meshshard.nn.BallAttentionNet` to build.
Training draws the same samples epoch after epoch, and a sample's points are those of its mesh's
shard: a ``ShardGraph`` that the :class:`~meshshard.tasks.DatasetReader` keeps, one per mesh, for
every sample on that mesh. So the plans are cached per point set, keyed by the object that holds
the points (the ``ShardGraph``: the sample's mesh on this partition) and the model's radii and
``max_neighbors``, least recently used first out, bounded by bytes.

Never stale: an entry holds a weak reference to its owner (a freed owner's entry is dropped at
once, and a later object at the same address is never taken for it), the identity of the
positions it was built from (data pointer, shape, strides, dtype, device) and their version
counter (any in-place change is a miss), and the spec. A miss rebuilds the plans.

On shards, building is collective, so the ranks of the domain group must miss together: each
lookup sums the ranks' misses (one ``all_reduce`` of one integer; none on one rank or a whole
cloud), and when any rank misses (its own bound evicted the entry, say: ranks' plans differ in
size) every rank rebuilds.

``--max-points``: each step trains on a new random subset of the points, in a new ``ShardGraph``:
its plans are built for that step and dropped with the graph; the whole samples' plans (validation)
stay.

The bound: ``max_bytes``, the tensors of the cached plans (neighbour lists, halo indices and ghost
coordinates; about ``K * 21`` bytes per point, 700 bytes at ``K = 32``; on the device of the
positions). Default: the environment variable ``MESHSHARD_PLAN_CACHE_MB`` (megabytes), else
:data:`DEFAULT_PLAN_CACHE_MB`; 0 turns caching off (every forward builds its plans, as before). A
plan larger than the bound is used and not kept.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from meshshard.comm import all_reduce_sum

__all__ = ["PlanCache", "DEFAULT_PLAN_CACHE_MB"]

#: The default bound of a model's plan cache, in megabytes (``MESHSHARD_PLAN_CACHE_MB`` overrides it).
DEFAULT_PLAN_CACHE_MB = 2048


def default_max_bytes() -> int:
    """``MESHSHARD_PLAN_CACHE_MB`` megabytes, else :data:`DEFAULT_PLAN_CACHE_MB`."""
    raw = os.environ.get("MESHSHARD_PLAN_CACHE_MB", "").strip()
    if not raw:
        return DEFAULT_PLAN_CACHE_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"Expected MESHSHARD_PLAN_CACHE_MB to be a number of megabytes >= 0 (got {raw!r})") from None
    if not mb >= 0:
        raise ValueError(f"Expected MESHSHARD_PLAN_CACHE_MB to be a number of megabytes >= 0 (got {raw!r})")
    return int(mb * (1 << 20))


def _identity(pos: Tensor) -> tuple:
    return (pos.data_ptr(), tuple(pos.shape), pos.stride(), pos.dtype, str(pos.device))


def plans_nbytes(plans: Any) -> int:
    """The bytes of the tensors of ``plans`` (a ``{radius: BallQueryPlan}``), each storage once."""
    seen: dict[tuple[int, str], int] = {}
    for plan in plans.values():
        n = plan.neighbors
        tensors = [n.index, n.mask, n.distance, getattr(n, "num_candidates", None), plan.neighbor_ids,
                   plan.ghost_ids, plan.ghost_pos, plan.send_index if plan.halo is not None else None]
        for t in tensors:
            if isinstance(t, Tensor) and t.numel():
                storage = t.untyped_storage()
                seen[(storage.data_ptr(), str(t.device))] = storage.nbytes()
    return sum(seen.values())


@dataclass
class _Entry:
    ref: weakref.ref
    pos_id: tuple
    version: int
    spec: Any
    plans: dict
    nbytes: int


class PlanCache:
    """Plans by point set, least recently used out first, at most ``max_bytes`` (see the module docstring).

    Args:
        max_bytes: the bound; ``None``: ``MESHSHARD_PLAN_CACHE_MB`` or :data:`DEFAULT_PLAN_CACHE_MB`;
            0: no caching.

    Attributes:
        hits, misses: lookups answered from the cache, and plans built (with an owner).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool) or int(max_bytes) < 0):
            raise ValueError(f"Expected 'max_bytes' to be >= 0 bytes (got {max_bytes!r})")
        self.max_bytes = default_max_bytes() if max_bytes is None else int(max_bytes)
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        """The point sets whose plans are cached."""
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The bytes the cached plans hold."""
        return sum(e.nbytes for e in self._entries.values())

    def clear(self) -> None:
        """Drop every cached plan (the next lookup of each point set builds it)."""
        self._entries.clear()

    def __repr__(self) -> str:
        return f"PlanCache(entries={len(self)}, {self.nbytes / 2**20:.1f} of {self.max_bytes / 2**20:.0f} MB)"

    def __deepcopy__(self, memo: dict) -> PlanCache:  # a copied model starts with an empty cache
        return PlanCache(self.max_bytes)

    def __getstate__(self) -> dict:  # pickled without its plans
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_bytes"])

    def get(self, owner: Any, pos: Tensor, spec: Any, key: Hashable, build: Callable[[], dict]) -> dict:
        """The plans of the points ``pos`` held by ``owner``, for ``key`` (the radii and
        ``max_neighbors``): cached, else ``build()`` (then kept when they fit the bound).

        ``owner``: a weak-referenceable object that holds the points and lives as long as they are
        meant to be reused (the ``ShardGraph``); ``None``: build, keep nothing.

        Communication: on shards (``spec`` of more than one rank), one ``all_reduce`` of one
        integer (every rank must call it), then ``build``'s when any rank misses.
        """
        if owner is None or self.max_bytes <= 0:
            return build()
        full_key = (id(owner), key)
        entry = self._entries.get(full_key)
        hit = (entry is not None and entry.ref() is owner and entry.pos_id == _identity(pos)
               and entry.version == pos._version and entry.spec == spec)
        if spec is not None and spec.world_size > 1:  # building is collective: every rank misses, or none
            misses = torch.tensor([0 if hit else 1], dtype=torch.int64, device=pos.device)
            all_reduce_sum(misses, group=spec.group)
            hit = int(misses.item()) == 0
        if hit:
            self._entries.move_to_end(full_key)
            self.hits += 1
            return entry.plans
        self._entries.pop(full_key, None)
        plans = build()
        self.misses += 1
        nbytes = plans_nbytes(plans)
        if nbytes <= self.max_bytes:
            this = weakref.ref(self)
            ref = weakref.ref(owner, lambda r, k=full_key: (c := this()) is not None and c._drop(k, r))
            self._entries[full_key] = _Entry(ref, _identity(pos), pos._version, spec, plans, nbytes)
            while self.nbytes > self.max_bytes:
                self._entries.popitem(last=False)
        return plans

    def _drop(self, key: tuple, ref: weakref.ref) -> None:  # the weak reference's callback
        """The owner of ``key`` was freed: its plans go."""
        entry = self._entries.get(key)
        if entry is not None and entry.ref is ref:
            del self._entries[key]
