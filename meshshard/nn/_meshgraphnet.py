"""MeshGraphNet (Pfaff et al., 2021, "Learning Mesh-Based Simulation with Graph Networks").

Encoder, processor, decoder::

    h = node_mlp_enc(x)                       e = edge_mlp_enc(edge_attr)
    for each of the `message_passing_steps` processor blocks (weights not shared):
        e' = edge_mlp([e, h[src], h[dst]])    a = sum over edges into each node of e'
        h  = h + node_mlp([h, a])             e = e + e'
    y = decoder(h)

Every MLP has ``hidden_layers`` hidden layers of width ``latent_size`` and ends in a LayerNorm,
except the decoder. Aggregation is ``index_add_`` (sum at ``dst``) in the tensors' dtype.

One module, one ``state_dict``, two inputs:

- the whole graph: ``model(x, edge_index, edge_attr)`` with plain tensors ``x (N, F)``,
  ``edge_index (2, E)``, ``edge_attr (E, F_e)``; returns ``(N, F_out)``;
- a shard: ``model(x, graph, edge_attr)`` with ``x`` a :class:`ShardTensor` of owned rows
  ``(N_own, F)``, ``graph`` a :class:`ShardGraph` and ``edge_attr (E_local, F_e)`` for its local
  edges; returns a ``ShardTensor`` ``(N_own, F_out)``. Forward and every gradient equal the
  whole-graph computation (parameter gradients once summed over the domain group).

Communication on a shard:

- 1-hop partition (``halo_hops=1``): one ``indexed_all_to_all_v`` (``with_halo``) per processor
  step, forward and backward;
- k-hop partition (``halo_hops=k >= message_passing_steps``): one ``indexed_all_to_all_v`` of the
  encoded node features before the first step, then none: each step also updates the ghosts, and
  the region where values are exact shrinks by one hop per step (redundant compute, XAeroNet style).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._graph import ShardGraph
from .._tensor import ShardTensor

__all__ = ["MLP", "MeshGraphNet", "ProcessorBlock"]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU, "tanh": nn.Tanh, "elu": nn.ELU,
}


class MLP(nn.Sequential):
    """``hidden_layers`` hidden layers of width ``hidden``, then an output layer, then LayerNorm.

    Shapes:
        input: ``(*, in_features)``; output: ``(*, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, hidden: int, hidden_layers: int, activation: str, layer_norm: bool) -> None:
        if activation not in _ACTIVATIONS:
            raise ValueError(f"Expected 'activation' in {sorted(_ACTIVATIONS)} (got {activation!r})")
        if hidden_layers < 0:
            raise ValueError(f"Expected 'hidden_layers' >= 0 (got {hidden_layers})")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(hidden_layers):
            layers += [nn.Linear(width, hidden), _ACTIVATIONS[activation]()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        if layer_norm:
            layers.append(nn.LayerNorm(out_features))
        super().__init__(*layers)


class ProcessorBlock(nn.Module):
    """One message-passing step on local rows.

    Shapes:
        h: ``(N_rows, L)`` node latents (owned + ghosts on a shard); e: ``(E, L)``; edge_index:
        ``(2, E)`` into ``h``; ``num_dst``: rows that receive messages (``N_own`` in 1-hop mode).
        Returns ``h`` updated on its first ``num_dst`` rows, and ``e``.
    """

    def __init__(self, latent: int, hidden_layers: int, activation: str) -> None:
        super().__init__()
        self.edge_mlp = MLP(3 * latent, latent, latent, hidden_layers, activation, layer_norm=True)
        self.node_mlp = MLP(2 * latent, latent, latent, hidden_layers, activation, layer_norm=True)

    def forward(self, h: Tensor, e: Tensor, edge_index: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
        src, dst = edge_index[0], edge_index[1]
        message = self.edge_mlp(torch.cat([e, h.index_select(0, src), h.index_select(0, dst)], dim=1))
        aggregate = torch.zeros(num_dst, h.shape[1], dtype=h.dtype, device=h.device).index_add_(0, dst, message)
        h_dst = h[:num_dst]
        h_dst = h_dst + self.node_mlp(torch.cat([h_dst, aggregate], dim=1))
        return h_dst, e + message


class MeshGraphNet(nn.Module):
    """Encode-process-decode graph network for mesh-based simulation.

    Args:
        node_in, edge_in, node_out: input node features, input edge features, output features.
        latent_size: width of every latent and hidden layer (paper: 128).
        hidden_layers: hidden layers per MLP (paper: 2).
        message_passing_steps: processor blocks, weights not shared (paper: 15).
        activation: ``"relu"`` (paper), ``"silu"``, ``"gelu"``, ``"tanh"`` or ``"elu"``.
        checkpoint_steps: recompute each processor block in the backward (memory for time); the
            block's halo exchange runs before it and is not repeated.

    Shapes:
        See the module docstring: whole graph ``(N, node_in) -> (N, node_out)``; shard
        ``ShardTensor (N_own, node_in) -> ShardTensor (N_own, node_out)``.
    """

    def __init__(
        self,
        node_in: int,
        edge_in: int,
        node_out: int,
        *,
        latent_size: int = 128,
        hidden_layers: int = 2,
        message_passing_steps: int = 15,
        activation: str = "relu",
        checkpoint_steps: bool = False,
    ) -> None:
        super().__init__()
        if message_passing_steps < 1:
            raise ValueError(f"Expected 'message_passing_steps' >= 1 (got {message_passing_steps})")
        self.node_encoder = MLP(node_in, latent_size, latent_size, hidden_layers, activation, layer_norm=True)
        self.edge_encoder = MLP(edge_in, latent_size, latent_size, hidden_layers, activation, layer_norm=True)
        self.processor = nn.ModuleList(
            ProcessorBlock(latent_size, hidden_layers, activation) for _ in range(message_passing_steps)
        )
        self.decoder = MLP(latent_size, node_out, latent_size, hidden_layers, activation, layer_norm=False)
        self.checkpoint_steps = checkpoint_steps

    def forward(self, x: Any, graph: Any, edge_attr: Tensor) -> Any:
        if isinstance(graph, ShardGraph):
            return self._forward_shard(x, graph, edge_attr)
        if isinstance(x, ShardTensor):
            raise TypeError("Expected a ShardGraph with a ShardTensor input (got a plain edge_index)")
        return self._forward_whole(x, graph, edge_attr)

    def _step(self, block: ProcessorBlock, h: Tensor, e: Tensor, edge_index: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
        if self.checkpoint_steps and torch.is_grad_enabled():
            return checkpoint(block, h, e, edge_index, num_dst, use_reentrant=False)
        return block(h, e, edge_index, num_dst)

    def _forward_whole(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        _check_inputs(x, edge_index, edge_attr, x.shape[0] if isinstance(x, Tensor) else None)
        h = self.node_encoder(x)
        e = self.edge_encoder(edge_attr)
        for block in self.processor:
            h, e = self._step(block, h, e, edge_index, h.shape[0])
        return self.decoder(h)

    def _forward_shard(self, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor) -> ShardTensor:
        if not isinstance(x, ShardTensor):
            raise TypeError(f"Expected 'x' to be a ShardTensor with a ShardGraph (got {type(x).__name__})")
        if x.spec != graph.spec:
            raise ValueError(f"Expected 'x' laid out by the graph's spec {graph.spec!r} (got {x.spec!r})")
        _check_inputs(x.to_local(), graph.edge_index, edge_attr, graph.num_local)
        steps = len(self.processor)
        e = self.edge_encoder(edge_attr)
        if graph.halo_hops == 1:
            h = self.node_encoder(x)
            for block in self.processor:
                h_local, e = self._step(block, h.with_halo(), e, graph.edge_index, graph.num_owned)
                h = ShardTensor(h_local, graph.spec)
            return self.decoder(h)
        if graph.halo_hops < steps:
            raise ValueError(
                f"A partition with halo_hops={graph.halo_hops} covers at most {graph.halo_hops} message-passing "
                f"steps without exchange; this model has {steps}. Partition with --halo-hops {steps} or more, "
                "or with --halo-hops 1 (one exchange per step)"
            )
        h = self.node_encoder(x).with_halo()  # the one exchange: every local row, owned and ghost
        for block in self.processor:
            h, e = self._step(block, h, e, graph.edge_index, graph.num_local)
        return self.decoder(ShardTensor(h[: graph.num_owned], graph.spec))


def _check_inputs(x: Tensor, edge_index: Tensor, edge_attr: Tensor, num_rows: int | None) -> None:
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        got = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index).__name__
        raise ValueError(f"Expected 'edge_index' of shape (2, E) (got {got})")
    if edge_attr.dim() != 2 or edge_attr.shape[0] != edge_index.shape[1]:
        raise ValueError(
            f"Expected 'edge_attr' of shape ({edge_index.shape[1]}, F_e), one row per edge (got {tuple(edge_attr.shape)})"
        )
    if x.dim() != 2:
        raise ValueError(f"Expected 'x' to be two-dimensional (N, F) (got {x.dim()} dimensions)")
