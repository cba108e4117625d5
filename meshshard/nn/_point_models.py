"""``BallAttentionNet``: a point-cloud model of ball-query attention blocks, exact on shards.

An encoder MLP of the node inputs, ``layers`` blocks, each a residual :class:`BallQueryAttention`
(pre-LayerNorm) and a residual MLP, then a decoder. The relative positions of neighbours enter
through each attention's position encoding (the inputs themselves need no coordinates). With
several ``radii`` the blocks take them in turn (block ``i`` uses ``radii[i % len(radii)]``).

One :class:`BallQueryPlan` per radius is built from the positions and reused by every block of
that radius; on shards it holds the geometric halo, built at run time for the model's radius (so
any partition is exact, whatever radius it was made for). Given the object that holds the points
(``plan_owner``: the training loop passes the sample's ``ShardGraph``), the plans are built once
per point set and kept in the model's :class:`~meshshard.nn.PlanCache` (``plan_cache``, bounded in
bytes) across steps and epochs; without it, at the start of each forward. The attention runs in
chunks of points (``BallQueryAttention.chunk_elements``), projections included, and keeps only its
halo'd input; each block's MLP is recomputed in the backward (``BallAttentionBlock.recompute_mlp``):
so memory is linear in points x width in the forward and the backward, plus one chunk's working
set (a constant: smaller ``chunk_elements`` lower the peak and cost time, ``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._tensor import ShardTensor
from ._attention import BallQueryAttention
from ._ball_halo import BallQueryPlan
from ._plan_cache import PlanCache

__all__ = ["BallAttentionNet"]


class BallAttentionBlock(nn.Module):
    """``x + attention(norm1(x), pos)``, then ``x + mlp(norm2(x))`` (pre-norm, residuals).

    Memory: the attention keeps only its halo'd input for the backward (:mod:`._ball_chunks`); the
    MLP branch ``mlp(norm2(x))`` is recomputed in the backward from its input (``recompute_mlp``,
    non-reentrant checkpointing: the same numbers), so of the block's ``(N, mlp_ratio * width)``
    hidden activations none is kept; the recomputation costs one more LayerNorm and MLP forward.

    Shapes: ``x`` ``(N_own, width)`` local rows, ``pos`` ``(N_own, D)``; the plan is the one of
    ``pos`` for this block's radius.
    """

    #: Recompute the MLP branch in the backward instead of keeping its activations.
    recompute_mlp = True

    def __init__(self, width: int, heads: int, radius: float, max_neighbors: int, mlp_ratio: int, pos_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = BallQueryAttention(width, heads, radius, max_neighbors, pos_dim=pos_dim)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(self, x: Tensor, pos: Tensor, plan: BallQueryPlan) -> Tensor:
        """The block on local rows with the plan of their positions."""
        x = x + self.attention._attend(self.norm1(x), pos, plan)
        if self.recompute_mlp and torch.is_grad_enabled():
            return x + checkpoint(self._mlp, x, use_reentrant=False, preserve_rng_state=False)
        return x + self._mlp(x)

    def _mlp(self, x: Tensor) -> Tensor:
        return self.mlp(self.norm2(x))


class BallAttentionNet(nn.Module):
    """Encoder, ``layers`` ball-query attention blocks (one or more radii), decoder.

    Args:
        in_channels, out_channels: features per point in and out.
        width: the latent width (a multiple of ``heads``).
        layers: blocks, weights not shared.
        heads: attention heads per block.
        radius: the ball radius, or a list of radii the blocks take in turn.
        max_neighbors: the most neighbours per point in a ball (nearest first, ties by global id).
        mlp_ratio: each block's MLP hidden width over ``width``.
        pos_dim: coordinates per point.
        checkpoint: recompute each block in the backward instead of keeping its activations
            (activation checkpointing; the same result and gradients, less memory).

    Shapes:
        whole cloud: ``x`` ``(N, in_channels)``, ``pos`` ``(N, pos_dim)`` -> ``(N, out_channels)``;
        shard: ``ShardTensor`` ``(N_own, in_channels)`` and the owned positions (a ``ShardTensor``
        of the same spec, or a tensor ``(N_own, pos_dim)``) -> ``ShardTensor (N_own, out_channels)``.

    Attributes:
        plan_cache: the :class:`PlanCache` of :meth:`forward`'s ``plan_owner`` (not in the
            ``state_dict``; ``PlanCache(0)`` turns it off).

    Communication (shards): per forward, one :meth:`BallQueryPlan.build` per radius (five small
    collectives each), or with ``plan_owner`` one ``all_reduce`` of one integer and the builds
    only on a cache miss; per block one ``indexed_all_to_all_v`` of the halo rows of ``[x, pos]``
    forward and its adjoint backward. Whole cloud: none. Result and every gradient equal the
    single-process model's (parameter gradients once summed over the domain group).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int = 64,
        layers: int = 4,
        heads: int = 4,
        radius: float | Sequence[float] = 0.1,
        max_neighbors: int = 32,
        *,
        mlp_ratio: int = 2,
        pos_dim: int = 3,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        radii = [float(r) for r in radius] if isinstance(radius, (list, tuple)) else [float(radius)]
        if not radii:
            raise ValueError("Expected 'radius' to be a positive number or a non-empty list of them (got [])")
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("width", width),
                            ("layers", layers), ("heads", heads), ("mlp_ratio", mlp_ratio), ("pos_dim", pos_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Expected '{name}' to be a positive integer (got {value!r})")
        self.in_channels, self.pos_dim, self.radii = in_channels, pos_dim, radii
        self.max_neighbors, self.checkpoint = max_neighbors, bool(checkpoint)
        self.encoder = nn.Sequential(nn.Linear(in_channels, width), nn.GELU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(
            BallAttentionBlock(width, heads, radii[i % len(radii)], max_neighbors, mlp_ratio, pos_dim)
            for i in range(layers)
        )
        self.decoder = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, out_channels))
        self.plan_cache = PlanCache()

    def build_plans(self, pos: Any, spec: Any = None) -> dict[float, BallQueryPlan]:
        """The neighbours (and on shards the geometric halo) of ``pos`` for each of the model's radii,
        ``{radius: BallQueryPlan}``: what :meth:`forward` builds when it is given none. Build them
        once for a cloud whose points do not move and pass them to every forward (on shards a
        collective every rank joins; ``spec``: the layout of the owned rows ``pos``)."""
        pos_local = pos.to_local() if isinstance(pos, ShardTensor) else pos
        return {r: BallQueryPlan.build(pos_local, r, self.max_neighbors, spec) for r in self.radii}

    def forward(self, x: Any, pos: Any, plans: Mapping[float, BallQueryPlan] | None = None, *,
                plan_owner: Any = None) -> Any:
        """The model on a whole cloud (tensors) or on a shard's owned rows (``ShardTensor`` ``x``);
        ``plans`` from :meth:`build_plans` for these points, else taken from :attr:`plan_cache` for
        ``plan_owner`` (an object that holds these points and lives while they are to be reused:
        a sample's ``ShardGraph``), else built here."""
        spec = x.spec if isinstance(x, ShardTensor) else None
        local = x.to_local() if spec is not None else x
        pos_local = pos.to_local() if isinstance(pos, ShardTensor) else pos
        if not isinstance(local, Tensor) or local.dim() != 2 or local.shape[1] != self.in_channels:
            got = tuple(local.shape) if isinstance(local, Tensor) else type(local).__name__
            raise ValueError(f"Expected 'x' to have shape (N, {self.in_channels}) (got {got})")
        if not isinstance(pos_local, Tensor) or tuple(pos_local.shape) != (local.shape[0], self.pos_dim):
            got = tuple(pos_local.shape) if isinstance(pos_local, Tensor) else type(pos_local).__name__
            raise ValueError(f"Expected 'pos' to have shape ({local.shape[0]}, {self.pos_dim}), one row per row of "
                             f"'x' (got {got})")
        if plans is None:
            key = (tuple(self.radii), self.max_neighbors)
            plans = self.plan_cache.get(plan_owner, pos_local, spec, key, lambda: self.build_plans(pos_local, spec))
        elif set(plans) != set(self.radii):
            raise ValueError(f"Expected plans for the radii {self.radii} (got {sorted(plans)})")
        h = self.encoder(local)
        p = pos_local.to(h.dtype)
        for block in self.blocks:
            plan = plans[block.attention.radius]
            if self.checkpoint and torch.is_grad_enabled():
                h = checkpoint(block, h, p, plan, use_reentrant=False)
            else:
                h = block(h, p, plan)
        y = self.decoder(h)
        return y if spec is None else ShardTensor(y, spec)
