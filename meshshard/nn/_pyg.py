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

This module decides whether a layer can be made exact and in which mode (the refusals, the flags,
the PyG code the adapters were verified on); ``_pyg_modes.py`` runs each mode on a shard.

Shapes: ``N_own`` owned nodes, ``N_local = N_own + N_ghost``, ``E_own`` owned edges, ``E_local``
local edges, ``F`` features.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
from torch import Tensor, nn

from .._graph import ShardGraph
from .._tensor import ShardTensor
from ._multihop import MULTIHOP, MULTIHOP_VERIFIED, REFUSED, hops_of, run_multihop
from ._pyg_modes import HANDLERS

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
            out = HANDLERS[self.mode](self.layer, x, graph, edge_attr, kwargs)
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
