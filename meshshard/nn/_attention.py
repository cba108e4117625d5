"""``BallQueryAttention``: multi-head attention of each point over its ball-query neighbours.

One module, one ``state_dict``, for a whole cloud (plain tensors) and for a shard (``ShardTensor``
of owned rows). On a shard, the neighbours come from a :class:`BallQueryPlan` (the geometric halo);
the forward exchanges the halo rows of the features and positions once, and everything else is
local, so the result and every gradient equal those of the module on the whole cloud.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._spec import ShardSpec
from .._tensor import ShardTensor
from ._ball_chunks import CHUNK_ELEMENTS, attend_rows, chunked_ball_attention
from ._ball_halo import BallQueryPlan
from ._ball_query import check_max_neighbors, check_radius

__all__ = ["BallQueryAttention"]


class BallQueryAttention(nn.Module):
    r"""Multi-head attention of each point over its neighbours within ``radius`` (at most ``max_neighbors``).

    For point :math:`i` with neighbours :math:`\mathcal N(i)` (the ball query: nearest first, ties by
    global id; the point itself included) and heads :math:`h` of width :math:`d = \text{dim} / H`:

    .. math::
        e_{ij} = \mathrm{MLP}(p_j - p_i), \quad
        a^h_{ij} = \operatorname{softmax}_{j \in \mathcal N(i)}
        \frac{\langle q^h_i, k^h_j + e^h_{ij} \rangle}{\sqrt d}, \quad
        y_i = W_o \big\Vert_h \sum_{j \in \mathcal N(i)} a^h_{ij} (v^h_j + e^h_{ij})

    with :math:`q = W_q x`, :math:`[k, v] = W_{kv} x` and the relative-position encoding
    :math:`\mathrm{MLP}` = ``Linear(pos_dim, pos_hidden)``, GELU, ``Linear(pos_hidden, dim)``.
    Padding slots of the neighbour lists are masked out of the softmax. Positions are cast to the
    features' dtype before the relative positions are taken; the neighbour selection itself runs in
    float64 and is not differentiable, the relative-position encoding is (gradients reach ``pos``).

    Args:
        dim: input and attention width; a multiple of ``heads``.
        heads: number of heads ``H``.
        radius: ball radius (inclusive).
        max_neighbors: the most neighbours per point ``K``.
        out_dim: output width (default ``dim``).
        pos_dim: coordinates per point ``D`` (default 3).
        pos_hidden: hidden width of the position encoding (default ``dim``).
        bias: biases in the linear maps.

    Shapes:
        x: ``(N, dim)``, or a ``ShardTensor`` of owned rows ``(N_own, dim)``.
        pos: ``(N, D)`` / ``(N_own, D)`` (a tensor or a ``ShardTensor`` of the same spec).
        result: ``(N, out_dim)``, or a ``ShardTensor`` ``(N_own, out_dim)`` of ``x``'s spec.

    Memory: linear in ``N * dim``: the layer (projections included) runs in chunks of points
    (:attr:`chunk_elements`), keeps only its halo'd input for the backward, and the backward
    recomputes one chunk at a time.

    Communication (shards): one ``indexed_all_to_all_v`` forward (halo rows of ``[x, pos]``) and
    its adjoint backward; building the plan, when none is given, adds that of
    :meth:`BallQueryPlan.build` (five small collectives). Whole cloud: none.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        radius: float,
        max_neighbors: int,
        *,
        out_dim: int | None = None,
        pos_dim: int = 3,
        pos_hidden: int | None = None,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if dim < 1 or heads < 1 or dim % heads:
            raise ValueError(f"Expected 'dim' to be a positive multiple of 'heads' = {heads} (got {dim})")
        if pos_dim < 1:
            raise ValueError(f"Expected 'pos_dim' to be >= 1 (got {pos_dim})")
        self.dim, self.heads, self.pos_dim = dim, heads, pos_dim
        self.radius = check_radius(radius)
        self.max_neighbors = check_max_neighbors(max_neighbors)
        hidden = pos_hidden or dim
        kw = {"device": device, "dtype": dtype}
        self.q = nn.Linear(dim, dim, bias=bias, **kw)
        self.kv = nn.Linear(dim, 2 * dim, bias=bias, **kw)
        self.pos_mlp = nn.Sequential(nn.Linear(pos_dim, hidden, **kw), nn.GELU(), nn.Linear(hidden, dim, **kw))
        self.out = nn.Linear(dim, out_dim or dim, bias=bias, **kw)
        #: The most ``points * max_neighbors * dim`` elements one chunk of the attention holds (the
        #: forward and the recomputing backward alike); 0: one pass that keeps them all (more memory).
        self.chunk_elements = CHUNK_ELEMENTS

    def extra_repr(self) -> str:
        """The settings, for ``print(module)``."""
        return f"dim={self.dim}, heads={self.heads}, radius={self.radius}, max_neighbors={self.max_neighbors}"

    def build_plan(self, pos: Tensor | ShardTensor, spec: ShardSpec | None = None) -> BallQueryPlan:
        """The neighbours (and, on shards, the geometric halo) of ``pos`` for this module's radius and
        ``max_neighbors``: build it once per point set and pass it to every call (and every layer of
        the same radius). See :meth:`BallQueryPlan.build` for its communication."""
        return BallQueryPlan.build(pos, self.radius, self.max_neighbors, spec)

    def forward(self, x: Tensor | ShardTensor, pos: Tensor | ShardTensor, plan: BallQueryPlan | None = None) -> Any:
        """Attention of every point over its ball-query neighbours (see the class docstring).

        ``plan``: a :class:`BallQueryPlan` built once for ``pos`` (:meth:`build_plan`), reused
        across calls; built here when left out (on shards, a collective every rank must join).
        """
        spec = x.spec if isinstance(x, ShardTensor) else None
        x_local = x.to_local() if isinstance(x, ShardTensor) else x
        pos_local = self._local_pos(pos, spec)
        if not isinstance(x_local, Tensor) or x_local.dim() != 2 or x_local.shape[1] != self.dim:
            got = tuple(x_local.shape) if isinstance(x_local, Tensor) else type(x_local).__name__
            raise ValueError(f"Expected 'x' to have shape (N, {self.dim}) (got {got})")
        if pos_local.dim() != 2 or pos_local.shape != (x_local.shape[0], self.pos_dim):
            raise ValueError(
                f"Expected 'pos' to have shape ({x_local.shape[0]}, {self.pos_dim}), one row per row of 'x' "
                f"(got {tuple(pos_local.shape)})"
            )
        if plan is None:
            plan = BallQueryPlan.build(pos_local, self.radius, self.max_neighbors, spec)
        else:
            self._check_plan(plan, spec, x_local.shape[0])
        y = self._attend(x_local, pos_local.to(x_local.dtype), plan)
        return y if spec is None else ShardTensor(y, spec)

    def _local_pos(self, pos: Tensor | ShardTensor, spec: ShardSpec | None) -> Tensor:
        if isinstance(pos, ShardTensor):
            if pos.spec != spec:
                raise ValueError(f"Expected 'pos' laid out like 'x' (got {pos.spec!r} and {spec!r})")
            return pos.to_local()
        if not isinstance(pos, Tensor):
            raise TypeError(f"Expected 'pos' to be a torch.Tensor or a ShardTensor (got {type(pos).__name__})")
        return pos

    def _check_plan(self, plan: BallQueryPlan, spec: ShardSpec | None, n: int) -> None:
        if not isinstance(plan, BallQueryPlan):
            raise TypeError(f"Expected 'plan' to be a BallQueryPlan (got {type(plan).__name__})")
        if (plan.radius, plan.max_neighbors) != (self.radius, self.max_neighbors):
            raise ValueError(
                f"Expected a plan of radius={self.radius}, max_neighbors={self.max_neighbors} "
                f"(got radius={plan.radius}, max_neighbors={plan.max_neighbors})"
            )
        if (plan.spec is None) != (spec is None) or (spec is not None and plan.spec != spec) or plan.num_owned != n:
            raise ValueError(f"Expected a plan built for the layout of 'x' (got {plan!r} for {spec!r} with {n} rows)")

    def _attend(self, x: Tensor, pos: Tensor, plan: BallQueryPlan) -> Tensor:
        """The attention of the owned rows ``x`` over the plan's neighbours, in chunks of points
        (``chunk_elements``; the projections inside the Function, memory linear in points x width,
        :mod:`._ball_chunks`), or, when ``chunk_elements`` is 0, in one pass whose ``(N, K, width)``
        tensors autograd keeps for the backward (the former path, kept for comparison:
        ``bench/pointcloud.py --attention dense``)."""
        both = plan.with_halo(torch.cat([x, pos], 1))  # the one exchange: halo rows of [x, pos]
        index = plan.neighbors.index.to(x.device)
        mask = plan.neighbors.mask.to(x.device)
        first, second = self.pos_mlp[0], self.pos_mlp[2]
        if self.chunk_elements:
            weights = (self.q.weight, self.q.bias, self.kv.weight, self.kv.bias, first.weight, first.bias,
                       second.weight, second.bias, self.out.weight, self.out.bias)
            return chunked_ball_attention(both, x.shape[0], index, mask, self.heads, weights, self.chunk_elements)
        x_all, pos_all = both[:, : self.dim], both[:, self.dim :]
        params = (first.weight, first.bias, second.weight, second.bias)
        out = attend_rows(self.q(x), self.kv(x_all), pos, pos_all, index.clamp(min=0), mask, self.heads, params)
        return self.out(out)
