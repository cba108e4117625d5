"""Models for ``check_model_exact`` and ``meshshard selftest --model``: one exact, two wrong on shards.

Named as ``--model tests/meshshard/run/_exactness_models.py:NAME`` (each a ``NAME(node_in, edge_in,
node_out)`` as ``meshshard train --model`` calls it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing
from torch_geometric.utils import degree

from meshshard import ShardTensor
from meshshard.nn import MeshGraphNet, ShardConv


class GcnThenMeshGraphNet(nn.Module):
    """Exact: a GCN layer (its source degrees supplied by ShardConv), a BatchNorm (global
    statistics on a ShardTensor), then a small MeshGraphNet reading the edge features."""

    def __init__(self, node_in: int, edge_in: int, node_out: int, hidden: int = 8) -> None:
        super().__init__()
        self.conv = ShardConv(GCNConv(node_in, hidden))
        self.norm = nn.BatchNorm1d(hidden)
        self.mgn = MeshGraphNet(hidden, edge_in, node_out, latent_size=hidden, hidden_layers=1,
                                message_passing_steps=2)

    def forward(self, x, graph, edge_attr):
        return self.mgn(self.norm(self.conv(x, graph)).relu(), graph, edge_attr)


class LocallyCentred(nn.Module):
    """Wrong on shards: subtracts the mean of the rank's own rows, where one process subtracts the
    mean of every node."""

    def __init__(self, node_in: int, edge_in: int, node_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(node_in, node_out)

    def forward(self, x, graph, edge_attr):
        if isinstance(x, ShardTensor):
            rows = x.to_local()
            return ShardTensor.from_local(self.lin(rows - rows.mean(0)), x.spec)
        return self.lin(x - x.mean(0))


class SourceDegreeConv(MessagePassing):
    """Each message divided by its source's out-degree: not local (a ghost source's edges are on
    other ranks), so declaring it ``ShardConv(..., local=True)`` is a mistake."""

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr="add")
        self.lin = nn.Linear(channels_in, channels_out)

    def forward(self, x, edge_index):
        h = self.lin(x)
        out_degree = degree(edge_index[0], h.shape[0], dtype=h.dtype).clamp_min(1)
        return self.propagate(edge_index, x=h / out_degree[:, None])


class DeclaredLocal(nn.Module):
    """``ShardConv(SourceDegreeConv(...), local=True)``: runs on shards without an error, and is wrong."""

    def __init__(self, node_in: int, edge_in: int, node_out: int) -> None:
        super().__init__()
        self.conv = ShardConv(SourceDegreeConv(node_in, node_out), local=True)

    def forward(self, x, graph, edge_attr):
        return self.conv(x, graph)


def exact(node_in: int, edge_in: int, node_out: int, hidden: int = 8) -> nn.Module:
    """The exact model, as a function with a keyword (``--model-args '{"hidden": 6}'``)."""
    return GcnThenMeshGraphNet(node_in, edge_in, node_out, hidden)


def not_a_module(node_in: int, edge_in: int, node_out: int) -> object:
    return torch.zeros(node_in)


class OneColumnTooMany(nn.Module):
    """Returns ``node_out + 1`` columns."""

    def __init__(self, node_in: int, edge_in: int, node_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(node_in, node_out + 1)

    def forward(self, x, graph, edge_attr):
        return self.lin(x)


class Broken(OneColumnTooMany):
    """Its forward fails."""

    def forward(self, x, graph, edge_attr):
        return self.lin(edge_attr)
