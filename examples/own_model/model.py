"""A PyTorch Geometric model of your own, trained and run by ``meshshard train / predict --model``.

An encoder, ``layers`` residual blocks of GATv2 attention over the mesh edges (the edge features,
relative position and distance, enter the attention), and a decoder. The only meshshard-specific
line is the ``ShardConv`` around each PyG layer: with it the same module runs on a whole mesh
(``x``, ``edge_index``, ``edge_attr``) and on a rank's shard (``ShardTensor``, ``ShardGraph``,
``edge_attr``), with the same ``state_dict`` and, on shards, the same numbers.

``meshshard train PARTS --data DATA --out RUN --model examples/own_model/model.py:build``
calls ``build(node_in, edge_in, node_out, **model_args)`` with the dataset's channel counts.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATv2Conv

from meshshard.nn import ShardConv


class AttentionGNN(nn.Module):
    def __init__(self, node_in: int, edge_in: int, node_out: int, hidden: int = 64, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(node_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(
            ShardConv(GATv2Conv(hidden, hidden // heads, heads=heads, edge_dim=edge_in, add_self_loops=False))
            for _ in range(layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.decode = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, node_out))

    def forward(self, x, graph, edge_attr):
        """``x`` (N, node_in), ``graph`` an ``edge_index`` (2, E) or a ``ShardGraph``, ``edge_attr`` (E, edge_in)."""
        h = self.encode(x)
        for conv, norm in zip(self.convs, self.norms):
            h = h + torch.nn.functional.silu(norm(conv(h, graph, edge_attr)))
        return self.decode(h)


def build(node_in: int, edge_in: int, node_out: int, hidden: int = 64, layers: int = 4, heads: int = 4) -> AttentionGNN:
    """What ``--model examples/own_model/model.py:build`` calls; ``--model-args`` fills the keywords."""
    if hidden % heads:
        raise ValueError(f"Expected hidden to be a multiple of heads (got hidden={hidden}, heads={heads})")
    return AttentionGNN(node_in, edge_in, node_out, hidden=hidden, layers=layers, heads=heads)
