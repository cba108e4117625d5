"""How :class:`~meshshard.nn.ShardConv` runs each mode on a shard (``HANDLERS``: mode -> runner).

``_pyg.py`` decides whether a PyG layer can be made exact and in which mode (its module docstring
says what each mode does and why it is exact); the runners here do it:

- ``"bipartite"`` / ``"pointnet"``: the layer called on ``(owned + ghost rows, owned rows)`` over the
  owned edges, its node-wise modules (GINConv's ``nn``...) run on a ``ShardTensor`` for global batch
  statistics, batch statistics over edges refused in training;
- ``"gcn"`` / ``"khop"``: the layer's math re-derived with degrees of the whole graph
  (:func:`_gcn_norm`, :func:`_cheb_norm`, a global ``lambda_max``), one exchange per hop;
- ``"halo"``: the layer on the owned + ghost rows, the owned rows of its output kept.

Each runner takes ``(layer, x, graph, edge_attr, kwargs)`` and returns the owned rows ``(N_own, F)``.

Shapes: ``N_own`` owned nodes, ``N_local = N_own + N_ghost``, ``E_own`` owned edges, ``F`` features.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .._graph import ShardGraph
from .._tensor import ShardTensor
from .._tensor_functions import RowsUseReplicated

__all__ = ["HANDLERS"]


def _pairs(kwargs: dict) -> dict:
    """ShardTensor keyword arguments (``pos``...) -> ``(local rows, owned rows)`` pairs."""
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, ShardTensor):
            local = v.with_halo()
            v = (local, local[: v.shape[0]])
        out[k] = v
    return out


class _OnShards(nn.Module):
    """Runs ``module`` on the owned rows as a ShardTensor (global batch statistics), returns rows."""

    def __init__(self, module: nn.Module, spec: Any) -> None:
        super().__init__()
        self.module = module
        self.spec = spec

    def forward(self, rows: Tensor) -> Tensor:
        return self.module(ShardTensor(rows, self.spec)).to_local()


# node-wise modules a layer applies to its aggregated rows / edge-wise ones it applies to messages
_NODE_MODULES = {"GENConv": ("mlp",), "GINConv": ("nn",), "GINEConv": ("nn",), "PointNetConv": ("global_nn",)}
_EDGE_MODULES = {"EdgeConv": ("nn",), "PointNetConv": ("local_nn",)}


def _node_modules_on_shards(layer: nn.Module, spec: Any) -> list[tuple[str, nn.Module]]:
    """Swap the node-wise modules a layer applies after aggregation for their sharded runs, so that
    a BatchNorm inside them sees every node; refuse batch statistics over edges in training."""
    name = type(layer).__name__
    for attr in _EDGE_MODULES.get(name, ()):
        module = getattr(layer, attr, None)
        if layer.training and module is not None and any(_batch_statistics(m) for m in module.modules()):
            raise TypeError(
                f"ShardConv cannot make {name} exact in training: its {attr} normalises over the batch of edges, "
                "which spans ranks; use LayerNorm there, or eval mode"
            )
    swapped = []
    for attr in _NODE_MODULES.get(name, ()):
        module = getattr(layer, attr, None)
        if module is not None:
            swapped.append((attr, module))
            layer._modules[attr] = _OnShards(module, spec)
    return swapped


def _batch_statistics(module: nn.Module) -> bool:
    return (
        isinstance(module, nn.modules.batchnorm._NormBase)
        or type(module).__name__ in ("BatchNorm", "GraphNorm", "InstanceNorm")
    )


def _call(layer: nn.Module, *args: Any, swap: list | None = None, **kwargs: Any) -> Tensor:
    try:
        return layer(*args, **kwargs)
    finally:
        for attr, module in swap or []:
            layer._modules[attr] = module


# --- the handlers ----------------------------------------------------------------------------------


def _bipartite(layer: nn.Module, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor | None, kwargs: dict) -> Tensor:
    local = x.with_halo()
    args = () if edge_attr is None else (edge_attr,)
    swap = _node_modules_on_shards(layer, graph.spec)
    return _call(layer, (local, local[: graph.num_owned]), graph.owned_edge_index, *args, swap=swap, **_pairs(kwargs))


def _pointnet(layer: nn.Module, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor | None, kwargs: dict) -> Tensor:
    if edge_attr is not None:
        raise TypeError(
            "ShardConv: PointNetConv takes positions, not edge attributes: "
            "pass pos= (a ShardTensor) or none (graph.pos)"
        )
    pos = kwargs.pop("pos", None)
    if pos is None:
        if graph.pos is None:
            raise ValueError("Expected 'pos' (a ShardTensor) for PointNetConv: the graph has no coordinates")
        pos = (graph.pos, graph.pos[: graph.num_owned])
    elif isinstance(pos, ShardTensor):
        pos = _pairs({"pos": pos})["pos"]
    else:
        raise TypeError(f"Expected 'pos' to be a ShardTensor (got {type(pos).__name__})")
    local = x.with_halo()
    swap = _node_modules_on_shards(layer, graph.spec)
    return _call(layer, (local, local[: graph.num_owned]), pos, graph.owned_edge_index, swap=swap, **kwargs)


def _halo(layer: nn.Module, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor | None, kwargs: dict) -> Tensor:
    args = () if edge_attr is None else (edge_attr,)
    kwargs = {k: v[0] if isinstance(v, tuple) else v for k, v in _pairs(kwargs).items()}
    return layer(x.with_halo(), graph.owned_edge_index, *args, **kwargs)[: graph.num_owned]


def _gcn(layer: Any, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor | None, kwargs: dict) -> Tensor:
    edge_weight = kwargs.pop("edge_weight", edge_attr)
    _no_extra("GCNConv", kwargs)
    local = x.with_halo()
    if not layer.normalize:
        return layer(local, graph.owned_edge_index, edge_weight)[: graph.num_owned]
    # PyG's gcn_norm fills the added self-loops with 2 (improved) only when there are edge weights:
    # without them, add_remaining_self_loops returns no weights and every edge, loops included, gets 1
    fill = 2.0 if layer.improved and edge_weight is not None else 1.0
    edge_index, weight = _gcn_norm(graph, edge_weight, layer.add_self_loops, fill, x.dtype)
    layer.normalize = False
    try:
        return layer(local, edge_index, weight)[: graph.num_owned]
    finally:
        layer.normalize = True


def _khop(layer: Any, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor | None, kwargs: dict) -> Tensor:
    name = type(layer).__name__
    edge_weight = kwargs.pop("edge_weight", edge_attr)
    if name == "ChebConv":
        lambda_max = kwargs.pop("lambda_max", None)
        if kwargs.pop("batch", None) is not None:
            raise TypeError("ShardConv: ChebConv with 'batch' (several graphs) is not supported on shards")
        _no_extra(name, kwargs)
        edge_index, weight = _cheb_norm(graph, edge_weight, layer.normalization, lambda_max, x.dtype)
        return _cheb(layer, x.to_local(), graph, edge_index, weight)
    _no_extra(name, kwargs)
    if getattr(layer, "normalize", True):  # SGConv always normalises; TAGConv adds no self-loops
        loops = name != "TAGConv" and layer.add_self_loops
        edge_index, weight = _gcn_norm(graph, edge_weight, loops, 1.0, x.dtype)
    else:
        edge_index, weight = graph.owned_edge_index, edge_weight
    own = x.to_local()
    hop = lambda h: _propagate(layer, graph, edge_index, h, edge_weight=weight)  # noqa: E731
    if name == "TAGConv":
        out = layer.lins[0](own)
        for lin in layer.lins[1:]:
            own = hop(own)
            out = out + lin(own)
        return out if layer.bias is None else out + layer.bias
    if name == "SGConv":
        for _ in range(layer.K):
            own = hop(own)
        return layer.lin(own)
    h = own  # APPNP
    for _ in range(layer.K):
        w = weight
        if layer.dropout > 0 and layer.training:
            w = torch.nn.functional.dropout(weight, p=layer.dropout)
        own = _propagate(layer, graph, edge_index, own, edge_weight=w) * (1 - layer.alpha) + layer.alpha * h
    return own


def _cheb(layer: Any, own: Tensor, graph: ShardGraph, edge_index: Tensor, norm: Tensor) -> Tensor:
    tx0, tx1 = own, own
    out = layer.lins[0](tx0)
    if len(layer.lins) > 1:
        tx1 = _propagate(layer, graph, edge_index, own, norm=norm)
        out = out + layer.lins[1](tx1)
    for lin in layer.lins[2:]:
        tx2 = 2.0 * _propagate(layer, graph, edge_index, tx1, norm=norm) - tx0
        out = out + lin(tx2)
        tx0, tx1 = tx1, tx2
    return out if layer.bias is None else out + layer.bias


def _propagate(layer: Any, graph: ShardGraph, edge_index: Tensor, own: Tensor, **weights: Any) -> Tensor:
    """One hop: owned rows -> (one exchange) -> aggregate over the owned edges at owned nodes."""
    local = graph._exchange_ghosts(own)
    return layer.propagate(edge_index, x=(local, own), size=(local.shape[0], own.shape[0]), **weights)


def _no_extra(name: str, kwargs: dict) -> None:
    if kwargs:
        raise TypeError(f"ShardConv: unexpected arguments for {name} on shards: {sorted(kwargs)}")


# --- normalisations with global degrees ------------------------------------------------------------


def _gcn_norm(
    graph: ShardGraph, edge_weight: Tensor | None, add_loops: bool, fill: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``gcn_norm`` of the whole graph, restricted to the owned edges (plus owned self-loops).

    In-degrees of owned nodes are local (a rank stores every edge into its nodes); the sources'
    come from their owners by one exchange, cached on the graph when there are no edge weights.
    """
    from torch_geometric.utils import add_remaining_self_loops

    n_own = graph.num_owned
    edge_index = graph.owned_edge_index
    key = ("gcn_norm", add_loops, fill, dtype, edge_index.device)
    if edge_weight is None and key in graph._cache:
        return graph._cache[key]
    weight = edge_weight if edge_weight is not None else torch.ones(
        edge_index.shape[1], dtype=dtype, device=edge_index.device
    )
    if add_loops:
        edge_index, weight = add_remaining_self_loops(edge_index, weight, fill, n_own)
    src, dst = edge_index
    deg_own = torch.zeros(n_own, dtype=weight.dtype, device=weight.device).index_add(0, dst, weight)
    deg = graph._exchange_ghosts(deg_own[:, None])[:, 0]
    inv = deg.pow(-0.5)
    inv = inv.masked_fill(inv == float("inf"), 0.0)
    result = (edge_index, inv[src] * weight * inv[dst])
    if edge_weight is None:
        graph._cache[key] = result
    return result


def _cheb_norm(
    graph: ShardGraph, edge_weight: Tensor | None, normalization: str | None, lambda_max: Any, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """ChebConv's scaled Laplacian ``2 L / lambda_max - I`` on the owned edges and owned nodes.

    ``get_laplacian`` uses out-degrees (sums over each edge's source): the ranks storing a node's
    outgoing edges send their part back to its owner, which then sends the total to its ghosts.
    """
    edge_index = graph.owned_edge_index
    src, dst = edge_index
    n_own = graph.num_owned
    weight = edge_weight if edge_weight is not None else torch.ones(src.shape[0], dtype=dtype, device=src.device)
    per_source = torch.zeros(graph.num_local, dtype=weight.dtype, device=weight.device).index_add(0, src, weight)
    halo = graph.spec.halo  # ghosts' parts go back to their owners
    deg_own = halo.sum_to_owners(per_source[:, None])[:, 0] if halo is not None else per_source[:n_own]
    if normalization is None:
        edge_w, loop_w = -weight, deg_own
    elif normalization == "sym":
        inv = graph._exchange_ghosts(deg_own[:, None])[:, 0].pow(-0.5)
        inv = inv.masked_fill(inv == float("inf"), 0.0)
        edge_w, loop_w = -(inv[src] * weight * inv[dst]), torch.ones(n_own, dtype=weight.dtype, device=weight.device)
    else:
        inv = 1.0 / graph._exchange_ghosts(deg_own[:, None])[:, 0]
        inv = inv.masked_fill(inv == float("inf"), 0.0)
        edge_w, loop_w = -(inv[src] * weight), torch.ones(n_own, dtype=weight.dtype, device=weight.device)
    if lambda_max is None:
        lambda_max = 2.0 * _global_max(graph, torch.cat([edge_w, loop_w]), dtype)
    elif not isinstance(lambda_max, Tensor):
        lambda_max = torch.tensor(lambda_max, dtype=weight.dtype, device=weight.device)
    loops = torch.arange(n_own, device=src.device)
    edge_index = torch.cat([edge_index, torch.stack([loops, loops])], dim=1)
    norm = 2.0 * torch.cat([edge_w, loop_w]) / lambda_max
    norm = norm.masked_fill(norm == float("inf"), 0.0)
    return edge_index, norm - torch.cat([torch.zeros_like(edge_w), torch.ones_like(loop_w)])


def _global_max(graph: ShardGraph, values: Tensor, dtype: torch.dtype) -> Tensor:
    """``values.max()`` over every rank, differentiable like torch's: the gradient is shared evenly
    by the entries equal to the maximum (on every rank). Communication: three small ``all_reduce``
    forward, one backward (every rank uses the maximum on its own rows: their gradients are summed)."""
    from meshshard.comm import all_reduce_max, sum_to_replicated

    top = (
        values.detach().max().reshape(1).double().cpu()
        if values.numel()
        else torch.tensor([float("-inf")], dtype=torch.float64)
    )
    if graph.spec.world_size > 1:  # and a process group: without one, all_reduce_max sends nothing
        all_reduce_max(top, group=graph.spec.group)
    ties = (values.detach() == top.to(values)).to(values.dtype)
    group = graph.spec.group
    top = sum_to_replicated((values * ties).sum(), group=group) / sum_to_replicated(ties.sum(), group=group)
    # each rank scales its own rows by the maximum: the gradients reaching it are parts, summed backward
    return RowsUseReplicated.apply(top, group) if graph.spec.world_size > 1 else top


#: mode -> runner: the owned rows of the layer's whole-graph output (see the module docstring).
HANDLERS: dict[str, Callable[..., Tensor]] = {
    "bipartite": _bipartite, "pointnet": _pointnet, "gcn": _gcn, "khop": _khop, "halo": _halo,
}
