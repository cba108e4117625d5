"""``ShardConv`` and ``ShardNorm``: PyTorch Geometric layers, exact on a :class:`ShardGraph`.

``ShardConv(layer)(x, graph, edge_attr)`` runs ``layer`` (the same object, the same parameters and
``state_dict``) on one rank's shard and returns the owned rows of ``layer(x_full, edge_index,
edge_attr)`` on the whole graph, with every gradient equal too.

How. PyG's bipartite convention: the sources are the owned plus ghost rows (one halo exchange),
the destinations are the owned rows, the edges are the rank's owned edges (every edge into an owned
node is stored on its rank), so ``size = (N_local, N_own)``. Whatever a node's output depends on
beyond its incoming edges is supplied, exactly:

- ``"bipartite"`` layers (GraphConv, SAGEConv, GINConv, GINEConv, GATConv, GATv2Conv,
  TransformerConv, EdgeConv, PointNetConv, GENConv, ResGatedGraphConv, LEConv... see
  :data:`SUPPORTED`) are called as ``layer((x_local, x_own), edge_index_own, ...)``. Softmax over
  incoming edges (GAT, GATv2, Transformer, GENConv's softmax aggregation) is local to the owner of
  the destination; self-loops added by the layer are added for the owned destinations only
  (PyG adds them for ``min(size)`` nodes, and local ids ``0..N_own-1`` are the owned nodes on both
  sides). Node-wise modules a layer applies after aggregation (GINConv's and GINEConv's ``nn``,
  GENConv's ``mlp``, PointNetConv's ``global_nn``) see a :class:`ShardTensor`, so a BatchNorm in
  them uses global statistics; batch statistics over edges (a BatchNorm in EdgeConv's ``nn`` or
  PointNetConv's ``local_nn``) are refused in training.
- ``"gcn"`` (GCNConv): the symmetric normalisation needs the degree of every source, including
  ghosts. The adapter computes it (self-loops for owned destinations, owned degrees from the owned
  edges, ghost degrees by one exchange, cached on the graph when there are no edge weights) and calls
  the layer with the normalised ``edge_weight`` and ``normalize`` switched off for that call.
- ``"khop"`` (ChebConv, TAGConv, SGConv, APPNP): the layer's own propagation, run hop by hop on
  shards: one exchange per hop; the same normalisation as ``"gcn"`` (ChebConv's Laplacian uses
  out-degrees, summed back from the ranks that store the edges, and the global ``lambda_max``).
- ``"halo"`` (PNAConv, and user layers declared ``local=True``): the layer runs on all local rows
  (owned and ghost) with the owned edges; the owned rows of its output are kept. PNAConv's degree
  histogram must be the global one: :meth:`ShardGraph.degree_histogram`.
- ``"multihop"`` (the classes of :data:`~meshshard.nn._multihop.MULTIHOP`, and any layer declared
  ``hops=k``): the layer runs as on a whole graph on the rank's extended subgraph, every node
  within ``k + 1`` hops and every edge into a node within ``k`` hops (``_multihop.py``).

Refused, with a one-line reason: a MessagePassing class not in :data:`SUPPORTED` (unless declared
``local=True``: its output at a node depends only on that node's row, its incoming edges and their
source rows), subclasses of supported classes (they may override the message), ``flow =
"target_to_source"``, order-dependent aggregations (LSTM, GRU, sort, set transformer),
``return_attention_weights``, ``cached=True`` and ``decomposed_layers > 1``, and a supported class
whose code in the installed torch-geometric differs from the release the adapters were verified on
(:data:`PYG_VERIFIED`; a user who has checked the model declares it ``checked=True``).

:class:`ShardNorm` does the same for PyG's per-graph normalisations (``GraphNorm``,
``InstanceNorm``, ``LayerNorm(mode="graph")``): statistics over every node of every rank.

Dropout inside a layer (GAT attention dropout, APPNP edge dropout) draws each rank's own mask: the
same distribution as one process, not the same numbers (see ``ShardTensor`` on dropout).

Shapes: ``N_own`` owned nodes, ``N_local = N_own + N_ghost``, ``E_own`` owned edges, ``E_local``
local edges, ``F`` features.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .._graph import ShardGraph
from .._tensor import ShardTensor
from .._tensor_functions import RowsUseReplicated
from ._multihop import MULTIHOP, MULTIHOP_VERIFIED, REFUSED, hops_of, run_multihop

__all__ = ["ShardConv", "ShardNorm", "SUPPORTED", "PYG_VERIFIED", "PYG_CHECKED_ENV", "pyg_fingerprints"]

# aggregations whose result does not depend on the order of a node's incoming edges
_ORDER_FREE = {
    "SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation", "MulAggregation",
    "VarAggregation", "StdAggregation", "SoftmaxAggregation", "PowerMeanAggregation",
    "MedianAggregation", "QuantileAggregation", "MultiAggregation", "DegreeScalerAggregation",
}

_BIPARTITE = (
    "GraphConv", "SAGEConv", "GINConv", "GINEConv", "GATConv", "GATv2Conv", "TransformerConv",
    "EdgeConv", "GENConv", "ResGatedGraphConv", "LEConv", "GeneralConv",
)
#: layer class name -> how ShardConv makes it exact (see the module docstring).
SUPPORTED: dict[str, str] = {
    **{name: "bipartite" for name in _BIPARTITE},
    "PointNetConv": "pointnet",
    "GCNConv": "gcn",
    "ChebConv": "khop", "TAGConv": "khop", "SGConv": "khop", "APPNP": "khop",
    "PNAConv": "halo",
}


class ShardConv(nn.Module):
    """A PyG ``MessagePassing`` layer that runs exactly on shards (and unchanged on a whole graph).

    ``ShardConv(layer)(x, graph, edge_attr)`` equals ``layer(x_full, edge_index, edge_attr)`` on the
    whole graph, restricted to the owned rows; gradients flow to ``x``, ``edge_attr`` and the layer's
    parameters (replicated: sum their gradients over the domain group). With a plain tensor ``x`` and
    an ``edge_index`` tensor it simply calls ``layer``, so one model runs both ways. The wrapper holds
    no state of its own: its ``state_dict`` is the layer's (same keys, no prefix).

    Args:
        layer: a ``torch_geometric.nn.MessagePassing`` layer of a class in :data:`SUPPORTED`.
        local: declare a layer of another class local: its output at a node depends only on that
            node's row, its incoming edges and their source rows (no degrees of the sources, no
            global statistics, no second hop). It then runs on owned + ghost rows with the owned
            edges. Declaring a layer local that is not gives wrong results.
        hops: declare a layer's output at a node a function of its ``hops``-hop neighbourhood (the
            number of message-passing steps; degrees normalised by incoming edges are covered):
            it then runs on the multi-hop halo (mode ``"multihop"``), whatever its class. The
            classes of :data:`~meshshard.nn._multihop.MULTIHOP` run there without it.
        checked: run a supported class even where the installed torch-geometric's code for it differs
            from the release the adapter was verified on (:data:`PYG_VERIFIED`), once ``meshshard
            selftest --model FILE.py:NAME`` shows your model exact on shards with it. The environment
            variable ``MESHSHARD_PYG_CHECKED=1`` does the same for every layer (to run that selftest).

    Shapes:
        x: ``ShardTensor`` ``(N_own, F_in)`` laid out by ``graph.spec``.
        edge_attr: ``(E_local, F_e)`` or ``(E_own, F_e)`` rows for ``graph.edge_index`` (the owned
            edges come first; only they are used); for GCNConv, GraphConv, LEConv and the ``khop``
            layers the edge weight ``(E_local,)``.
        result: ``ShardTensor`` ``(N_own, F_out)``.

    Communication: one halo exchange forward and one backward per call (``khop`` layers: one per hop);
    GCNConv and ChebConv add a degree exchange (cached for GCNConv without edge weights).

    Raises:
        TypeError: at construction, for a layer that cannot be made exact, with the reason: among
            them a flag the adapter cannot honour (``cached=True``), and a supported class whose
            constructor or code in the installed torch-geometric differs from the verified release.
    """

    def __init__(self, layer: nn.Module, *, local: bool = False, hops: int | None = None,
                 checked: bool = False) -> None:
        super().__init__()
        if hops is not None and (isinstance(hops, bool) or not isinstance(hops, int) or hops < 1 or local):
            raise ValueError(f"Expected 'hops' to be a positive int, without local=True (got {hops!r})")
        mode = _mode_of(layer, local or hops is not None, checked)
        self.mode = "multihop" if hops is not None else mode
        self.hops = hops_of(layer, hops) if self.mode == "multihop" else None
        self.layer = layer
        self._register_state_dict_hook(_drop_prefix)
        self.register_load_state_dict_pre_hook(_add_prefix)

    def forward(self, x: Any, graph: Any, edge_attr: Tensor | None = None, **kwargs: Any) -> Any:
        """The wrapped layer: on a whole graph (``graph`` an ``edge_index``), exactly as PyG calls
        it; on a shard (``x`` a ``ShardTensor``, ``graph`` a ``ShardGraph``), the owned rows of
        the whole-graph result, their gradients equal too.

        Communication (shards): a halo exchange of ``x`` forward and its adjoint backward, plus
        what the layer's mode needs (see the class docstring).
        """
        if not isinstance(graph, ShardGraph):
            args = () if edge_attr is None else (edge_attr,)
            return self.layer(x, graph, *args, **kwargs)
        if not isinstance(x, ShardTensor):
            raise TypeError(f"Expected 'x' to be a ShardTensor on a ShardGraph (got {type(x).__name__})")
        if x.spec != graph.spec:
            raise ValueError(f"Expected 'x' laid out by the graph's spec {graph.spec!r} (got {x.spec!r})")
        if "return_attention_weights" in kwargs:
            raise TypeError(
                "ShardConv: return_attention_weights is not supported on shards (the weights of the owned edges only)"
            )
        edge_attr = _owned_edge_rows("edge_attr", edge_attr, graph)
        kwargs = {
            k: _owned_edge_rows(k, v, graph) if k in ("edge_weight", "edge_attr") else v for k, v in kwargs.items()
        }
        if self.mode == "multihop":
            out = run_multihop(self.layer, self.hops, x, graph, edge_attr, kwargs)
        else:
            out = _HANDLERS[self.mode](self.layer, x, graph, edge_attr, kwargs)
        return ShardTensor(out, graph.spec)

    def extra_repr(self) -> str:
        """The mode the layer runs in on shards, for ``print(module)``."""
        return f"mode={self.mode!r}" + (f", hops={self.hops}" if self.hops is not None else "")


class ShardNorm(nn.Module):
    """PyG's per-graph normalisations (``GraphNorm``, ``InstanceNorm``, ``LayerNorm(mode="graph")``)
    on a ``ShardTensor``: their statistics over every node of every rank, exactly.

    On one graph (no ``batch``), each normalises over all nodes; PyG builds a batch vector and
    scatters over it, which a ``ShardTensor`` refuses. ``ShardNorm`` computes the same formulas with
    global reductions (``InstanceNorm`` through the global ``F.batch_norm``, running statistics
    included). On a plain tensor it calls the module unchanged; its ``state_dict`` is the module's.
    ``BatchNorm`` and ``PairNorm`` need no wrapper.

    Shapes: x: ``ShardTensor`` ``(N_own, F)``; result: the same.

    Communication: two or three small ``all_reduce`` forward, as many backward.
    """

    _KINDS = ("GraphNorm", "InstanceNorm", "LayerNorm", "BatchNorm")

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        kind = type(norm).__name__
        if kind not in self._KINDS or not type(norm).__module__.startswith("torch_geometric."):
            raise TypeError(
                f"Expected 'norm' to be torch_geometric.nn GraphNorm, InstanceNorm, LayerNorm or BatchNorm (got {kind})"
            )
        if kind == "LayerNorm" and norm.mode != "graph":
            kind = "BatchNorm"  # mode="node" is row-wise: F.layer_norm runs on a ShardTensor as it is
        self.kind = kind
        self.norm = norm
        self._register_state_dict_hook(_drop_prefix)
        self.register_load_state_dict_pre_hook(_add_prefix)

    @property
    def layer(self) -> nn.Module:  # the wrapped module, for the state_dict hooks
        return self.norm

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """The wrapped normalisation; on a ``ShardTensor``, with statistics over every node of
        the graph (one all-reduce forward, one backward), equal to the whole graph's."""
        if not isinstance(x, ShardTensor) or self.kind == "BatchNorm":
            return self.norm(x, *args, **kwargs)
        if any(a is not None for a in args) or kwargs.get("batch") is not None:  # (PyG's MLP passes None, None)
            raise TypeError("ShardNorm: 'batch' (several graphs in one shard) is not supported on shards")
        m = self.norm
        if self.kind == "GraphNorm":
            # the mean meets the rows before the parameter does, so mean_scale's gradient stays each
            # rank's part (summed with the other parameters'), see ShardTensor on global statistics
            out = x - (x * 0.0 + x.mean(0, keepdim=True)) * m.mean_scale
            std = ((out * out).mean(0, keepdim=True) + m.eps).sqrt()
            return m.weight * out / std + m.bias
        if self.kind == "InstanceNorm":
            train = m.training or not m.track_running_stats
            return torch.nn.functional.batch_norm(
                x, m.running_mean, m.running_var, m.weight, m.bias, train, m.momentum, m.eps
            )
        centred = x - x.mean()
        out = centred / ((centred * centred).mean().sqrt() + m.eps)
        return out if m.weight is None or m.bias is None else out * m.weight + m.bias


# --- refusals --------------------------------------------------------------------------------------


def _mode_of(layer: nn.Module, local: bool, checked: bool = False) -> str:
    try:
        from torch_geometric.nn import MessagePassing
    except ImportError as err:  # a declared dependency, but say what is missing
        raise ImportError("ShardConv needs torch-geometric (pip install torch-geometric)") from err
    name = type(layer).__name__
    if not isinstance(layer, MessagePassing):
        raise TypeError(f"Expected 'layer' to be a torch_geometric.nn.MessagePassing layer (got {name})")
    if getattr(layer, "flow", "source_to_target") != "source_to_target":
        raise TypeError(
            f"ShardConv cannot run {name} with flow='target_to_source': a rank stores the edges into its nodes, "
            "not out of them"
        )
    _check_aggregation(name, getattr(layer, "aggr_module", None))
    known = name in SUPPORTED and type(layer).__module__.startswith("torch_geometric.")
    if known:
        _check_flags(layer)
        if not (checked or os.environ.get(PYG_CHECKED_ENV, "") == "1"):
            _check_pyg_code(type(layer))
        return SUPPORTED[name]
    if name in MULTIHOP and type(layer).__module__.startswith("torch_geometric."):
        if not (checked or os.environ.get(PYG_CHECKED_ENV, "") == "1"):
            _check_pyg_code(type(layer))
        return "multihop"
    if local:
        return "halo"
    subclass = any(base.__name__ in SUPPORTED or base.__name__ in MULTIHOP for base in type(layer).__mro__[1:])
    why = f"{name} subclasses a supported layer and may change its message" if subclass else (
        REFUSED.get(name) or f"{name} is not a layer ShardConv knows to be exact on shards")
    raise TypeError(
        f"ShardConv refuses {name}: {why}; if each node's output depends only on its own row, its "
        "incoming edges and their source rows, declare it with ShardConv(layer, local=True); if on its "
        "k-hop neighbourhood, ShardConv(layer, hops=k)"
    )


def _check_aggregation(name: str, aggr: Any) -> None:
    if aggr is None:
        return
    kind = type(aggr).__name__
    if kind not in _ORDER_FREE:
        raise TypeError(
            f"ShardConv cannot make {name} exact on shards: its aggregation {kind} depends on the order of "
            "the incoming edges (or is unknown), which differs between a shard and the whole graph"
        )
    for inner in getattr(aggr, "aggrs", []):
        _check_aggregation(name, inner)
    if getattr(aggr, "aggr", None) is not None and isinstance(aggr.aggr, nn.Module):
        _check_aggregation(name, aggr.aggr)


# --- the flags the adapters cannot honour, and the PyG code they were verified on ------------------

# flag -> (the value the adapter needs, why), for each class that has such a flag
_UNSUPPORTED_FLAGS: dict[str, dict[str, tuple[Any, str]]] = {
    name: {"cached": (False, "cached=True keeps the first graph's normalisation (SGConv: its propagated "
                      "features) in the layer, which on shards would be each rank's part; the shard graph "
                      "caches its degrees already, so use cached=False")}
    for name in ("GCNConv", "SGConv", "APPNP")
}
# MessagePassing's own, for every class
_UNSUPPORTED_FLAGS[""] = {
    "decomposed_layers": (1, "PyG's decomposed propagate cannot split the (source rows, destination rows) "
                          "pair a shard passes; use decomposed_layers=1"),
}


def _check_flags(layer: nn.Module) -> None:
    name = type(layer).__name__
    flags = {**_UNSUPPORTED_FLAGS[""], **_UNSUPPORTED_FLAGS.get(name, {})}
    for flag, (needed, why) in flags.items():
        if getattr(layer, flag, needed) != needed:
            raise TypeError(f"ShardConv refuses {name}({flag}={getattr(layer, flag)!r}): {why}")


#: The torch-geometric release the adapters were derived from and the flag matrix of
#: ``tests/meshshard/test_pyg_flags.py`` verified (every supported class over the flags that change its
#: math, exact on 3 ranks), and per class a fingerprint of what the adapter relies on: its constructor's
#: parameters and defaults, the source of its methods (``_METHODS``) and of the PyG helpers its mode
#: re-derives (``_HELPERS``). A class whose fingerprint differs in the installed release is refused.
#: Upgrading PyG: run the flag matrix on the new release; when it passes, replace the version and the
#: fingerprints below with what ``python -c "from meshshard.nn._pyg import pyg_fingerprints as f; print(f())"``
#: prints (``test_the_recorded_fingerprints_are_the_installed_pyg`` fails, naming the classes, until then).
PYG_VERIFIED: tuple[str, dict[str, str]] = ("2.8.1", {
    "GraphConv": "a075ce479d46",
    "SAGEConv": "ef2e9831a701",
    "GINConv": "d0e9c44ad8f2",
    "GINEConv": "f188a4b3d0c3",
    "GATConv": "cbf44d005fca",
    "GATv2Conv": "71dfe4d816ea",
    "TransformerConv": "4f4eb3cbb1a7",
    "EdgeConv": "45f4ea633076",
    "GENConv": "3f34e5a50ba0",
    "ResGatedGraphConv": "7e198be587f3",
    "LEConv": "e09f99cf3aa6",
    "GeneralConv": "158c4a81703f",
    "PointNetConv": "75830f6cff44",
    "GCNConv": "c62f247062cb",
    "ChebConv": "d4577cf9c1f5",
    "TAGConv": "b4e1656b7f84",
    "SGConv": "53b8a1f1099a",
    "APPNP": "f19bf9f51619",
    "PNAConv": "68549e1cb36d",
})

#: set to ``1``: every supported layer runs as if declared ``checked=True`` (see :class:`ShardConv`)
PYG_CHECKED_ENV = "MESHSHARD_PYG_CHECKED"
_METHODS = ("__init__", "forward", "message", "aggregate", "update", "message_and_aggregate", "edge_update",
            "__norm__")
_HELPERS = {
    "gcn": ("torch_geometric.nn.conv.gcn_conv.gcn_norm", "torch_geometric.utils.add_remaining_self_loops"),
    "khop": ("torch_geometric.nn.conv.gcn_conv.gcn_norm", "torch_geometric.utils.add_remaining_self_loops",
             "torch_geometric.utils.get_laplacian"),
    "bipartite": ("torch_geometric.utils.add_self_loops", "torch_geometric.utils.remove_self_loops",
                  "torch_geometric.utils.softmax"),
    "pointnet": ("torch_geometric.utils.add_self_loops", "torch_geometric.utils.remove_self_loops"),
    "halo": (),
}


def pyg_fingerprints() -> str:
    """The fingerprints of the supported classes in the installed torch-geometric, formatted as
    :data:`PYG_VERIFIED` is written (for updating it after verifying a new release)."""
    import torch_geometric
    import torch_geometric.nn as pyg

    lines = [f"PYG_VERIFIED: tuple[str, dict[str, str]] = ({torch_geometric.__version__!r}, {{"]
    lines += [f"    {name!r}: {_fingerprint(getattr(pyg, name))!r}," for name in SUPPORTED]
    return "\n".join(lines + ["})"])


def _check_pyg_code(cls: type) -> None:
    """Refuse a supported class whose code in the installed torch-geometric is not the verified one."""
    import torch_geometric

    name = cls.__name__
    version, recorded = PYG_VERIFIED
    recorded = {**recorded, **MULTIHOP_VERIFIED}
    try:
        found = _fingerprint(cls)
    except (OSError, TypeError):  # no source to read (a frozen install)
        found = "unreadable"
    if recorded.get(name) == found:
        return
    installed = torch_geometric.__version__
    code = ", ".join(["constructor"] + [m for m in _METHODS[1:] if m in cls.__dict__])
    why = (
        f"no fingerprint of its code is recorded (ShardConv was verified on torch-geometric {version})"
        if name not in recorded else
        f"the source of its code in torch-geometric {installed} cannot be read to compare it with "
        f"torch-geometric {version}'s, which ShardConv was verified on" if found == "unreadable" else
        f"its code in torch-geometric {installed} ({code} or the helpers ShardConv re-derives its math from) "
        f"differs from torch-geometric {version}'s, which ShardConv was verified on, so its math may have changed"
    )
    raise TypeError(
        f"ShardConv refuses {name}: {why}; check your model on shards with `{PYG_CHECKED_ENV}=1 meshshard "
        "selftest --model FILE.py:NAME`, then declare the layer checked: ShardConv(layer, checked=True)"
    )


def _fingerprint(cls: type) -> str:
    """12 hex digits of the sha256 of the class's constructor parameters, its own methods' source and
    the source of the helpers its mode relies on (cached while those functions stay the same)."""
    import importlib

    methods = tuple(cls.__dict__.get(m) for m in _METHODS)
    helpers = []
    for path in _HELPERS.get(SUPPORTED.get(cls.__name__, "multihop"), ()):  # a new mode: record its helpers here
        module, _, attr = path.rpartition(".")
        helpers.append((path, getattr(importlib.import_module(module), attr)))
    return _hash_code(cls, methods, tuple(helpers))


@functools.lru_cache(maxsize=128)
def _hash_code(cls: type, methods: tuple, helpers: tuple) -> str:
    import hashlib
    import inspect

    # names and defaults, not annotations (whose text differs between Python versions)
    parameters = inspect.signature(cls.__init__).parameters.values()
    parts = [" ".join(f"{p.name}={p.default!r}" for p in parameters)]
    for method, fn in zip(_METHODS, methods):
        if fn is not None:
            parts.append(f"{method}:{inspect.getsource(getattr(fn, '__func__', fn))}")
    parts += [f"{path}:{inspect.getsource(fn)}" for path, fn in helpers]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


# --- state_dict without the wrapper's prefix -------------------------------------------------------


def _drop_prefix(module: nn.Module, state: dict, prefix: str, local_metadata: Any) -> None:
    inner = "norm." if isinstance(module, ShardNorm) else "layer."
    for key in [k for k in state if k.startswith(prefix + inner)]:
        state[prefix + key[len(prefix) + len(inner):]] = state.pop(key)


def _add_prefix(module: nn.Module, state: dict, prefix: str, *args: Any) -> None:
    inner = "norm." if isinstance(module, ShardNorm) else "layer."
    names = {prefix + k for k in module.layer.state_dict()}
    for key in [k for k in state if k in names]:
        state[prefix + inner + key[len(prefix):]] = state.pop(key)


# --- inputs ----------------------------------------------------------------------------------------


def _owned_edge_rows(name: str, value: Any, graph: ShardGraph) -> Any:
    if value is None or not isinstance(value, Tensor):
        return value
    return graph.owned_edge_rows(value, name)


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


_HANDLERS: dict[str, Callable[..., Tensor]] = {
    "bipartite": _bipartite, "pointnet": _pointnet, "gcn": _gcn, "khop": _khop, "halo": _halo,
}
