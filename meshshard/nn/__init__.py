"""Sharded neural-network layers: the same module runs on a whole graph and on a shard.

- :class:`MeshGraphNet` (with :class:`MLP`, :class:`ProcessorBlock`): message passing on meshes;
- :func:`ball_query`, :class:`BallQueryPlan`, :class:`BallQueryAttention`: point-cloud attention
  over deterministic radius neighbourhoods, with geometric halos on shards; :class:`BallAttentionNet`,
  a model of such blocks, and its :class:`PlanCache` (each point set's plans built once);
- :class:`Transolver` (with :class:`TransolverBlock`, :class:`PhysicsAttention`): global attention
  over every point of a sample through learned slices, one all-reduce per layer;
- :class:`GridConv`, :class:`GridPool`, :class:`GridUpsample`, :func:`shard_grid_layers`: the
  ``torch.nn`` convolutions, pools and upsampling on a :class:`~meshshard.GridTensor`;
- :class:`ShardConv`, :class:`ShardNorm`: PyTorch Geometric message-passing layers and per-graph
  normalisations, exact on a ``ShardGraph``;
- :class:`DomainParallel`: replicated-parameter gradients reduced during backward (domain sum, data
  mean), and the DDP / FSDP2 recipes (:func:`ddp_comm_hook`, :func:`fully_shard_data_parallel`).
"""

from __future__ import annotations

from ._attention import BallQueryAttention
from ._ball_halo import BallQueryPlan
from ._ball_query import BallQueryResult, ball_query
from ._data_parallel import ddp_comm_hook, fsdp_device_mesh, fully_shard_data_parallel
from ._grid_layers import GridConv, GridPool, GridUpsample, shard_grid_layers
from ._meshgraphnet import MLP, MeshGraphNet, ProcessorBlock
from ._parallel import DomainParallel
from ._plan_cache import PlanCache
from ._point_models import BallAttentionNet
from ._pyg import ShardConv, ShardNorm
from ._transolver import PhysicsAttention, Transolver, TransolverBlock

__all__ = ["MLP", "MeshGraphNet", "ProcessorBlock", "ball_query", "BallQueryResult", "BallQueryPlan",
           "BallQueryAttention", "BallAttentionNet", "PlanCache",
           "GridConv", "GridPool", "GridUpsample", "shard_grid_layers", "ShardConv", "ShardNorm",
           "DomainParallel", "ddp_comm_hook", "fsdp_device_mesh", "fully_shard_data_parallel",
           "PhysicsAttention", "Transolver", "TransolverBlock"]
