"""``ShardConv`` over the constructor flags that change each supported layer's math, and the PyG
version check.

The adapters re-derive normalisations from PyG's internals, so the defaults are not enough: every
class in :data:`SUPPORTED` is built over a table of its flags (improved, add_self_loops, normalize,
aggr, heads, edge_dim, K, normalization...), with and without edge inputs, and each combination either
equals the same layer on the whole graph (3 METIS ranks of ../shared/data/sfepy/big.mesh, SfePy,
BSD-3-Clause, float64, 1e-10: output, input gradient, edge-input gradient, every parameter gradient
summed over the ranks) or is refused at ``ShardConv`` construction with a one-line ``TypeError``
that the table expects. All combinations run inside one ``run_ranks`` call.
"""

from __future__ import annotations

import copy
import itertools
import re

import pytest
import torch
from torch import nn

from meshshard import ShardGraph, ShardTensor, edge_features
from meshshard.nn import ShardConv
from meshshard.nn._pyg import SUPPORTED
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._ranks import all_sum
from tests._tolerance import assert_close

pyg = pytest.importorskip("torch_geometric.nn")

MESH = "sfepy/big.mesh"
F_IN, F_OUT, F_EDGE = 5, 4, 3
DT = torch.float64
CACHED = r"cached=True keeps the first graph's"


def _grid(**options: list) -> list[dict]:
    """Every combination of the options (a cartesian product), as keyword dictionaries."""
    keys = list(options)
    return [dict(zip(keys, values)) for values in itertools.product(*(options[k] for k in keys))]


def _mlp(*sizes: int) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _softmax_learn() -> object:
    from torch_geometric.nn.aggr import SoftmaxAggregation

    return SoftmaxAggregation(learn=True)


# aggregations to try where a layer takes ``aggr``: names, a list (MultiAggregation), a learnable softmax
AGGRS = ["add", "mean", "max", "softmax", ["mean", "max"], _softmax_learn]


def _cases() -> list[tuple[str, dict, str | None, str | None]]:
    """(class name, constructor flags, edge input None/"weight"/"attr", expected refusal or None)."""
    out: list[tuple[str, dict, str | None, str | None]] = []

    def add(name: str, grid: list[dict], edges: tuple = (None,), refuse=lambda kw: None) -> None:
        for kw in grid:
            for edge in edges:
                out.append((name, kw, edge, refuse(kw)))

    add("GCNConv", [kw for kw in _grid(improved=[False, True], add_self_loops=[None, False, True],
                                       normalize=[True, False], bias=[True, False], cached=[False, True])
                    if not (kw["add_self_loops"] and not kw["normalize"])],
        ("weight", None), lambda kw: CACHED if kw["cached"] else None)
    add("GCNConv", _grid(aggr=["mean", "max"], improved=[True]), ("weight", None))
    decomposed = lambda kw: r"decomposed_layers=2\): PyG's decomposed propagate cannot split"  # noqa: E731
    for name in SUPPORTED:  # MessagePassing's own flag
        if name not in ("GINConv", "GINEConv", "EdgeConv", "PointNetConv", "APPNP", "PNAConv"):
            add(name, [{"decomposed_layers": 2, **({"K": 2} if name == "ChebConv" else {})}], refuse=decomposed)
    add("GraphConv", _grid(aggr=["add", "mean", "max", "softmax", _softmax_learn], bias=[True, False]), ("weight", None))
    add("SAGEConv", _grid(aggr=AGGRS, project=[False, True]))
    add("SAGEConv", _grid(normalize=[False, True], root_weight=[True, False], bias=[True, False]))
    add("GINConv", _grid(eps=[0.0, 0.3], train_eps=[False, True]))
    add("GINEConv", _grid(eps=[0.0, 0.3], train_eps=[False, True], edge_dim=[F_EDGE]), ("attr",))
    for name, extra in (("GATConv", {}), ("GATv2Conv", {"share_weights": [False, True]})):
        add(name, _grid(heads=[1, 2], concat=[True, False], add_self_loops=[True, False], **extra))
        add(name, _grid(edge_dim=[F_EDGE], fill_value=["mean", 0.5, "add", "max"], heads=[2]), ("attr",))
        add(name, _grid(residual=[True], bias=[True, False], heads=[2], concat=[True, False], negative_slope=[0.1]))
    add("TransformerConv", _grid(heads=[1, 2], concat=[True, False], beta=[False, True], root_weight=[True, False]))
    add("TransformerConv", _grid(edge_dim=[F_EDGE], beta=[False, True], bias=[True, False], heads=[2]), ("attr",))
    add("EdgeConv", _grid(aggr=["max", "mean", "add", ["mean", "max"], _softmax_learn]))
    add("GENConv", _grid(aggr=["softmax", "powermean", "add", "mean", "max"], learn_t=[True], learn_p=[True],
                         msg_norm=[False, True]))
    add("GENConv", _grid(edge_dim=[F_EDGE], learn_msg_scale=[True], msg_norm=[True], norm=["batch", "layer", None],
                         num_layers=[1, 2], bias=[True]), ("attr",))
    add("ResGatedGraphConv", _grid(root_weight=[True, False], bias=[True, False]))
    add("ResGatedGraphConv", _grid(edge_dim=[F_EDGE], act=[nn.Tanh()]), ("attr",))
    add("LEConv", _grid(bias=[True, False]), ("weight", None))
    add("GeneralConv", _grid(skip_linear=[False, True], directed_msg=[True, False], heads=[1, 2],
                             aggr=["add", "mean", "max"]))
    add("GeneralConv", _grid(in_edge_channels=[F_EDGE], attention=[True], attention_type=["additive", "dot_product"],
                             l2_normalize=[False, True], heads=[2], bias=[True, False]), ("attr",))
    add("PointNetConv", _grid(add_self_loops=[True, False], local_nn=[True, None], global_nn=[True, None]))
    add("ChebConv", _grid(K=[1, 2, 3], normalization=["sym", "rw", None], bias=[True, False]), ("weight", None))
    add("TAGConv", _grid(K=[0, 1, 3], normalize=[True, False], bias=[True, False]), ("weight", None))
    add("SGConv", _grid(K=[1, 2], add_self_loops=[True, False], bias=[True, False], cached=[False, True]),
        ("weight", None), lambda kw: CACHED if kw["cached"] else None)
    add("APPNP", _grid(K=[1, 3], alpha=[0.1, 0.5], add_self_loops=[True, False], normalize=[True, False],
                       cached=[False, True]),
        ("weight", None), lambda kw: CACHED if kw["cached"] else None)
    add("PNAConv", _grid(towers=[1, 2], divide_input=[False, True], edge_dim=[F_EDGE], train_norm=[False, True]),
        ("attr",))
    add("PNAConv", _grid(towers=[1, 2], train_norm=[False, True]))
    add("PNAConv", _grid(aggregators=[["sum", "var"], ["mean", "min", "max", "std"]], pre_layers=[2], post_layers=[2],
                         scalers=[["identity", "linear", "inverse_linear"]]))
    return out


def _build(name: str, kw: dict, deg: torch.Tensor) -> tuple[nn.Module, int]:
    """The layer and the width of its input rows."""
    kw = {k: (v() if callable(v) and not isinstance(v, nn.Module) else v) for k, v in kw.items()}
    cls = getattr(pyg, name)
    if name in ("GINConv", "GINEConv"):
        return cls(_mlp(F_IN, 8, F_OUT), **kw), F_IN
    if name == "EdgeConv":
        return cls(_mlp(2 * F_IN, 8, F_OUT), **kw), F_IN
    if name == "PointNetConv":  # 2-D positions: messages of F_IN + 2
        local = _mlp(F_IN + 2, 8, 8) if kw.pop("local_nn") else None
        glob = _mlp(F_IN + 2 if local is None else 8, F_OUT) if kw.pop("global_nn") else None
        return cls(local, glob, **kw), F_IN
    if name == "APPNP":
        return cls(**kw), F_IN
    if name == "PNAConv":  # towers divide the output (and the input with divide_input)
        kw.setdefault("aggregators", ["mean", "min", "max", "std"])
        kw.setdefault("scalers", ["identity", "amplification", "attenuation"])
        towers = kw.get("towers", 1)
        return cls(F_IN + 1, F_OUT * towers, deg=deg, **kw), F_IN + 1
    return cls(F_IN, F_OUT, **kw), F_IN


def _grad(t: torch.Tensor) -> torch.Tensor:
    return t.grad if t.grad is not None else torch.zeros_like(t)


class _Inputs:
    def __init__(self, rank: int, world: int, mesh: str = MESH) -> None:
        case = mesh_case(mesh, world)
        g = torch.Generator().manual_seed(3)
        self.edge_index = torch.as_tensor(case.edge_index)
        self.pos = torch.as_tensor(case.pos, dtype=DT)[:, :2]
        n = len(self.pos)
        self.x = torch.randn(n, 2 * F_IN + 2, generator=g, dtype=DT)
        self.w = torch.randn(n, 2 * F_OUT, generator=g, dtype=DT)
        self.edge = {
            "attr": edge_features(self.pos, self.edge_index)[:, :F_EDGE],
            "weight": 0.5 + torch.rand(self.edge_index.shape[1], generator=g, dtype=DT),
        }
        self.graph = ShardGraph.from_partition(case.parts[rank], dtype=DT)
        self.own = self.graph.spec.global_ids
        self.deg = torch.bincount(torch.bincount(self.edge_index[1], minlength=n))


def _check(inp: _Inputs, what: str, layer: nn.Module, f_in: int, edge: str | None, shard: ShardConv | None = None) -> None:
    """One layer on the whole graph and through ShardConv (of a copy) on this rank's shard, every gradient."""
    shard = ShardConv(copy.deepcopy(layer)) if shard is None else shard
    pos = type(layer).__name__ == "PointNetConv"
    x_full = inp.x[:, :f_in]
    e_full = None if edge is None else inp.edge[edge]

    x = x_full.clone().requires_grad_()
    e = None if e_full is None else e_full.clone().requires_grad_()
    args = (x, inp.pos, inp.edge_index) if pos else (x, inp.edge_index)
    y_ref = layer(*args) if e is None else layer(*args, e)
    (y_ref * inp.w[:, : y_ref.shape[1]]).sum().backward()

    graph = inp.graph
    xs = ShardTensor.from_local(x_full[inp.own].clone().requires_grad_(), graph.spec)
    es = None if e_full is None else e_full[graph.global_edge_ids].clone().requires_grad_()
    y = shard(xs, graph, es)
    (y * ShardTensor.from_local(inp.w[inp.own, : y.shape[1]], graph.spec)).sum().backward()

    assert_close(y.to_local().detach(), y_ref.detach()[inp.own], DT, f"{what}: output")
    assert_close(_grad(xs.to_local()) if xs.grad is None else xs.grad.to_local(), x.grad[inp.own], DT, f"{what}: input grad")
    if e is not None:
        grad = torch.zeros_like(e).index_add_(0, graph.global_edge_ids, _grad(es))
        assert_close(all_sum(grad), _grad(e), DT, f"{what}: edge input grad")
    for (name, p), p_ref in zip(shard.layer.named_parameters(), layer.parameters()):
        assert_close(all_sum(_grad(p)), _grad(p_ref), DT, f"{what}: grad of {name}")


def _label(name: str, kw: dict, edge: str | None) -> str:
    flags = ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in kw.items())
    return f"{name}({flags}){'' if edge is None else ' + edge ' + edge}"


def _matrix(rank: int, world: int, names: tuple[str, ...]) -> dict:
    """Every case of the table for the classes ``names``: the failures (text), counts run / refused."""
    inp = _Inputs(rank, world)
    failures, ran, refused = [], 0, 0
    for i, (name, kw, edge, refusal) in enumerate(_cases()):
        if name not in names:
            continue
        what = _label(name, kw, edge)
        torch.manual_seed(100 + i)
        layer, f_in = _build(name, kw, inp.deg)
        layer = layer.to(DT)
        try:
            shard = ShardConv(copy.deepcopy(layer))
        except TypeError as err:
            if refusal is None or not re.search(refusal, str(err)) or "\n" in str(err):
                failures.append(f"{what}: refused unexpectedly: {err}")
            refused += 1
            continue
        if refusal is not None:
            failures.append(f"{what}: accepted, expected the refusal {refusal!r}")
            continue
        try:
            _check(inp, what, layer, f_in, edge, shard)  # every collective runs before the comparisons
        except AssertionError as err:
            failures.append(str(err).splitlines()[0] + " " + " ".join(str(err).split()[-12:]))
        ran += 1
    return {"failures": failures, "ran": ran, "refused": refused}


GROUPS = {
    "gcn and khop": ("GCNConv", "ChebConv", "TAGConv", "SGConv", "APPNP"),
    "bipartite, pointnet, halo": tuple(n for n in SUPPORTED if SUPPORTED[n] not in ("gcn", "khop")),
}


def test_the_table_covers_every_supported_class() -> None:
    assert {name for name, *_ in _cases()} == set(SUPPORTED)


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
def test_every_flag_combination_is_exact_on_3_ranks_or_refused(group: str) -> None:
    results = run_ranks(_matrix, 3, GROUPS[group], timeout=300)
    failures = sorted({f for r in results for f in r["failures"]})
    assert not failures, f"{len(failures)} combinations wrong on shards:\n" + "\n".join(failures)
    assert results[0]["ran"] > 0


def _gcn_improved(rank: int, world: int) -> list[str]:
    """GCNConv(improved=True) on the real tet mesh of issue 27, with and without edge weights."""
    inp = _Inputs(rank, world, "sfepy/piezo_mesh_micro.vtk")
    failures = []
    for kw, edge in (({"improved": True}, None), ({"improved": True}, "weight"), ({}, None)):
        torch.manual_seed(1)
        layer = pyg.GCNConv(F_IN, 6, **kw).to(DT)
        try:
            _check(inp, _label("GCNConv", kw, edge), layer, F_IN, edge)
        except AssertionError as err:
            failures.append(str(err).splitlines()[0])
    return failures


@pytest.mark.slow
def test_gcn_improved_without_edge_weights_is_exact_on_a_tet_mesh() -> None:
    """Issue 27: PyG fills the self-loops with 2 only when edge weights are given; the adapter filled
    them with 2 always, 0.24-0.27 off on every rank without edge weights."""
    assert run_ranks(_gcn_improved, 3, timeout=120) == [[]] * 3


def test_the_recorded_fingerprints_are_the_installed_pyg() -> None:
    """If this fails after a PyG upgrade: run the flag matrix on it; when it passes, paste what
    ``pyg_fingerprints()`` prints over ``PYG_VERIFIED`` in meshshard/nn/_pyg.py."""
    import torch_geometric

    from meshshard.nn._pyg import PYG_VERIFIED, pyg_fingerprints

    version, recorded = PYG_VERIFIED
    assert set(recorded) == set(SUPPORTED), "every supported class needs a recorded fingerprint"
    found = {name: _fingerprint(getattr(pyg, name)) for name in SUPPORTED}
    changed = sorted(name for name in SUPPORTED if found[name] != recorded[name])
    assert not changed, (
        f"torch-geometric {torch_geometric.__version__} differs from the verified {version} in {changed}; "
        f"once the flag matrix passes on it, record:\n{pyg_fingerprints()}"
    )


def _fingerprint(cls: type) -> str:
    from meshshard.nn._pyg import _fingerprint as fingerprint

    return fingerprint(cls)


def test_a_layer_whose_pyg_code_changed_is_refused_naming_the_version_and_the_class(monkeypatch) -> None:
    import torch_geometric

    layer = pyg.GCNConv(3, 2)
    ShardConv(layer)

    def message(self, x_j, edge_weight):  # a "new release" that drops the edge weights
        return x_j

    monkeypatch.setattr(pyg.GCNConv, "message", message)
    version = re.escape(torch_geometric.__version__)
    with pytest.raises(TypeError, match=rf"^ShardConv refuses GCNConv: its code in torch-geometric {version} \(constructor, forward, message, message_and_aggregate or the helpers .* differs from torch-geometric 2\.8\.1's, .* `MESHSHARD_PYG_CHECKED=1 meshshard selftest --model FILE\.py:NAME`, then declare the layer checked: ShardConv\(layer, checked=True\)$"):
        ShardConv(layer)
    assert ShardConv(layer, checked=True).mode == "gcn"  # declared checked: runs
    monkeypatch.setenv("MESHSHARD_PYG_CHECKED", "1")  # every layer, as for the selftest
    assert ShardConv(layer).mode == "gcn"
    monkeypatch.delenv("MESHSHARD_PYG_CHECKED")
    monkeypatch.undo()

    def gcn_norm(*args, **kwargs):  # a helper the adapter re-derives changed
        raise AssertionError

    monkeypatch.setattr(torch_geometric.nn.conv.gcn_conv, "gcn_norm", gcn_norm)
    with pytest.raises(TypeError, match=r"^ShardConv refuses GCNConv: its code .* differs"):
        ShardConv(layer)
    ShardConv(pyg.SAGEConv(3, 2))  # other modes do not rely on it
    monkeypatch.undo()

    layer = pyg.SAGEConv(3, 2)
    init = pyg.SAGEConv.__init__

    def with_a_new_flag(self, in_channels, out_channels, aggr="mean", new_flag=False, **kwargs):
        init(self, in_channels, out_channels, aggr, **kwargs)

    monkeypatch.setattr(pyg.SAGEConv, "__init__", with_a_new_flag)  # a new constructor parameter
    with pytest.raises(TypeError, match=r"^ShardConv refuses SAGEConv: its code .* differs"):
        ShardConv(layer)


def test_an_unrecorded_or_unreadable_class_is_refused(monkeypatch) -> None:
    from meshshard.nn import _pyg

    monkeypatch.setattr(_pyg, "PYG_VERIFIED", ("2.8.1", {}))
    with pytest.raises(TypeError, match=r"^ShardConv refuses SAGEConv: no fingerprint of its code is recorded \(ShardConv was verified on torch-geometric 2\.8\.1\); check"):
        ShardConv(pyg.SAGEConv(3, 2))
    monkeypatch.undo()
    layer = pyg.GraphConv(3, 2)
    exec("def message(self, x_j, edge_weight):\n    return x_j", namespace := {})  # no source file
    monkeypatch.setattr(pyg.GraphConv, "message", namespace["message"])
    with pytest.raises(TypeError, match=r"^ShardConv refuses GraphConv: the source of its code in torch-geometric \S+ cannot be read"):
        ShardConv(layer)


def test_flags_the_adapters_cannot_honour_are_refused_on_the_instance() -> None:
    for layer in (pyg.GCNConv(3, 2, cached=True), pyg.SGConv(3, 2, cached=True), pyg.APPNP(2, 0.1, cached=True)):
        with pytest.raises(TypeError, match=rf"^ShardConv refuses {type(layer).__name__}\(cached=True\): cached=True keeps the first graph's [^\n]*use cached=False$"):
            ShardConv(layer)
    layer = pyg.GCNConv(3, 2)
    ShardConv(layer)
    layer.cached = True  # set after construction: still seen
    with pytest.raises(TypeError, match=r"GCNConv\(cached=True\)"):
        ShardConv(layer)
    with pytest.raises(TypeError, match=r"^ShardConv refuses SAGEConv\(decomposed_layers=2\): PyG's decomposed propagate"):
        ShardConv(pyg.SAGEConv(3, 2, decomposed_layers=2))
