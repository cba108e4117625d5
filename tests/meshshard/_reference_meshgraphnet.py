"""An independent MeshGraphNet: the paper's equations written the plain PyTorch Geometric way.

Used as the reference for ``meshshard.nn.MeshGraphNet`` on the whole graph (tests) and as the
"plain PyG" peer in ``bench/meshgraphnet_peers.py``. It shares no code with meshshard: it builds
``[e, h_src, h_dst]`` explicitly (PyG's ``x_j`` is the source, ``x_i`` the destination under the
default ``flow="source_to_target"``), sums messages with ``MessagePassing(aggr="add")`` and keeps
every activation for the backward. Parameter names match meshshard's ``state_dict``, so one
``load_state_dict`` puts the same weights in both.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing


def _mlp(width_in: int, width_out: int, hidden: int, hidden_layers: int, layer_norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(hidden_layers):
        layers += [nn.Linear(width_in if i == 0 else hidden, hidden), nn.ReLU()]
    layers.append(nn.Linear(hidden if hidden_layers else width_in, width_out))
    if layer_norm:
        layers.append(nn.LayerNorm(width_out))
    return nn.Sequential(*layers)


class ReferenceProcessor(MessagePassing):
    """``e' = edge_mlp([e, h_src, h_dst])``, ``h' = h + node_mlp([h, sum of e' at dst])``, ``e + e'``."""

    def __init__(self, latent: int, hidden_layers: int) -> None:
        super().__init__(aggr="add")
        self.edge_mlp = _mlp(3 * latent, latent, latent, hidden_layers, layer_norm=True)
        self.node_mlp = _mlp(2 * latent, latent, latent, hidden_layers, layer_norm=True)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
        message = self.edge_updater(edge_index, x=h, e=e)
        aggregate = self.propagate(edge_index, message=message, size=(h.shape[0], h.shape[0]))
        return h + self.node_mlp(torch.cat([h, aggregate], dim=1)), e + message

    def edge_update(self, x_j: Tensor, x_i: Tensor, e: Tensor) -> Tensor:  # x_j: source, x_i: destination
        return self.edge_mlp(torch.cat([e, x_j, x_i], dim=1))

    def message(self, message: Tensor) -> Tensor:
        return message


class ReferenceMeshGraphNet(nn.Module):
    """Encoder, ``steps`` processors (weights not shared), decoder; ReLU; LayerNorm but on the decoder."""

    def __init__(self, node_in: int, edge_in: int, node_out: int, latent: int = 128, hidden_layers: int = 2, steps: int = 15) -> None:
        super().__init__()
        self.node_encoder = _mlp(node_in, latent, latent, hidden_layers, layer_norm=True)
        self.edge_encoder = _mlp(edge_in, latent, latent, hidden_layers, layer_norm=True)
        self.processor = nn.ModuleList(ReferenceProcessor(latent, hidden_layers) for _ in range(steps))
        self.decoder = _mlp(latent, node_out, latent, hidden_layers, layer_norm=False)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        h, e = self.node_encoder(x), self.edge_encoder(edge_attr)
        for block in self.processor:
            h, e = block(h, edge_index, e)
        return self.decoder(h)
