"""``ShardConv`` on the multi-hop halo (``meshshard/nn/_multihop.py``) against the whole graph.

Real mesh ../shared/data/sfepy/big.mesh (2-D triangles) split by METIS into uneven shards. First
the extended subgraph itself: its nodes are exactly those within ``k + 1`` hops of the owned ones
and its edges exactly those into nodes within ``k`` hops (a breadth-first search on the whole
graph, in the test only). Then every class of ``MULTIHOP`` (and layers declared ``hops=k``), in
float64 to 1e-10: the owned rows of the output, the gradients of ``x`` and of every other node input
(``x_0``, ``pos``, ``normal``), of the edge inputs (summed by global edge id over the ranks) and of
every parameter (summed over the ranks), against the layer on the whole graph; three of them in
float32 too, to 1e-5. All layers run in one spawn per world size.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from meshshard import ShardGraph, ShardTensor, edge_features
from meshshard.comm import count_collectives
from meshshard.nn import ShardConv
from meshshard.nn._multihop import MULTIHOP, _edge_parameter, multihop_halo
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._ranks import all_sum
from tests._tolerance import assert_close

pyg = pytest.importorskip("torch_geometric.nn")

MESH = "sfepy/big.mesh"
F_IN, F_OUT = 5, 4
DT = torch.float64
FLOAT32 = ("FeaStConv", "GCN2Conv", "SSGConv(K=3)")  # also checked in float32, to 1e-5


def _grad(t: torch.Tensor) -> torch.Tensor:
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _mlp(*sizes: int) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


class _Inputs:
    """The whole-graph inputs, identical on every rank, and this rank's shard."""

    def __init__(self, rank: int, world: int, layout: str = "metis", halo_hops: int = 1) -> None:
        case = mesh_case(MESH, world, layout, halo_hops)
        g = torch.Generator().manual_seed(23)
        n = case.num_nodes
        self.edge_index = torch.as_tensor(case.edge_index)
        e = self.edge_index.shape[1]
        pos = torch.as_tensor(case.pos, dtype=DT)
        self.node = {
            "x": torch.randn(n, F_IN, generator=g, dtype=DT),
            "x_0": torch.randn(n, F_IN, generator=g, dtype=DT),
            "pos": pos,
            "pos3": torch.cat([pos, torch.rand(n, 1, generator=g, dtype=DT)], 1),
            "normal": torch.nn.functional.normalize(torch.randn(n, 3, generator=g, dtype=DT), dim=1),
            "x3": torch.randn(n, 3, 4, generator=g, dtype=DT),
            "node_type": torch.randint(0, 2, (n,), generator=g),
        }
        self.edge = {
            "attr": edge_features(pos, self.edge_index),
            "weight": 0.5 + torch.rand(e, generator=g, dtype=DT),
            "type": torch.randint(0, 3, (e,), generator=g),
        }
        self.w = torch.randn(n, 16, generator=g, dtype=DT)
        self.graph = ShardGraph.from_partition(case.parts[rank], dtype=DT)
        self.own = self.graph.spec.owned_ids

    def cast(self, dtype: torch.dtype) -> _Inputs:
        """The same inputs, their floating-point tensors in ``dtype``."""
        other = copy.copy(self)
        other.node = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.node.items()}
        other.edge = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.edge.items()}
        other.w = self.w.to(dtype)
        return other


def _rgat(**kwargs) -> nn.Module:
    """RGATConv, with the parameter its reset_parameters leaves uninitialised (l2: torch.empty, PyG
    2.8.1) set, so that every rank holds the same layer."""
    layer = pyg.RGATConv(F_IN, F_OUT, num_relations=3, edge_dim=3, **kwargs)
    with torch.no_grad():
        layer.l2.fill_(1.0 / F_OUT)
    return layer


# (what, layer, x input, {parameter: node input}, {parameter: edge input}, declared hops)
def _layers(dim: int) -> list[tuple]:
    torch.manual_seed(5)
    return [
        ("AGNNConv", pyg.AGNNConv(requires_grad=True), "x", {}, {}, None),
        ("ARMAConv", pyg.ARMAConv(F_IN, F_OUT, num_stacks=2, num_layers=2), "x", {}, {"edge_weight": "weight"}, None),
        ("CGConv", pyg.CGConv(F_IN, dim=3), "x", {}, {"edge_attr": "attr"}, None),
        ("ClusterGCNConv", pyg.ClusterGCNConv(F_IN, F_OUT, diag_lambda=0.3), "x", {}, {}, None),
        ("DNAConv", pyg.DNAConv(4, heads=2), "x3", {}, {"edge_weight": "weight"}, None),
        ("EGConv", pyg.EGConv(F_IN, 8, aggregators=["symnorm", "max", "std"], num_heads=2, num_bases=2), "x", {}, {}, None),
        ("FAConv", pyg.FAConv(F_IN, eps=0.2), "x", {"x_0": "x_0"}, {}, None),
        ("FeaStConv", pyg.FeaStConv(F_IN, F_OUT, heads=2), "x", {}, {}, None),
        ("FiLMConv", pyg.FiLMConv(F_IN, F_OUT, num_relations=3), "x", {}, {"edge_type": "type"}, None),
        ("FastRGCNConv", pyg.FastRGCNConv(F_IN, F_OUT, num_relations=3), "x", {}, {"edge_type": "type"}, None),
        ("GatedGraphConv", pyg.GatedGraphConv(6, num_layers=3), "x", {}, {"edge_weight": "weight"}, None),
        ("GCN2Conv", pyg.GCN2Conv(F_IN, alpha=0.1, theta=0.5, layer=2), "x", {"x_0": "x_0"}, {"edge_weight": "weight"}, None),
        ("HEATConv", pyg.HEATConv(F_IN, F_OUT, num_node_types=2, num_edge_types=3, edge_type_emb_dim=2, edge_dim=3,
                                  edge_attr_emb_dim=2, heads=2), "x", {"node_type": "node_type"},
         {"edge_type": "type", "edge_attr": "attr"}, None),
        ("GMMConv", pyg.GMMConv(F_IN, F_OUT, dim=3, kernel_size=4), "x", {}, {"edge_attr": "attr"}, None),
        ("LGConv", pyg.LGConv(), "x", {}, {"edge_weight": "weight"}, None),
        ("MFConv", pyg.MFConv(F_IN, F_OUT, max_degree=6), "x", {}, {}, None),
        ("MixHopConv", pyg.MixHopConv(F_IN, F_OUT, powers=[0, 1, 2]), "x", {}, {"edge_weight": "weight"}, None),
        ("NNConv", pyg.NNConv(F_IN, F_OUT, _mlp(3, 8, F_IN * F_OUT), aggr="mean"), "x", {}, {"edge_attr": "attr"}, None),
        ("PDNConv", pyg.PDNConv(F_IN, F_OUT, edge_dim=3, hidden_channels=8), "x", {}, {"edge_attr": "attr"}, None),
        ("PointGNNConv", pyg.PointGNNConv(_mlp(F_IN, 8, dim), _mlp(F_IN + dim, 8, F_IN), _mlp(F_IN, 8, F_IN)), "x",
         {"pos": "pos"}, {}, None),
        ("PointTransformerConv", pyg.PointTransformerConv(F_IN, F_OUT, pos_nn=nn.Linear(dim, F_OUT)), "x",
         {"pos": "pos"}, {}, None),
        ("PPFConv", pyg.PPFConv(_mlp(F_IN + 4, 8), _mlp(8, F_OUT)), "x", {"pos": "pos3", "normal": "normal"}, {}, None),
        ("RGCNConv", pyg.RGCNConv(F_IN, F_OUT, num_relations=3, num_bases=2), "x", {}, {"edge_type": "type"}, None),
        ("RGATConv(scaled)", _rgat(num_bases=2, mod="scaled", heads=2), "x", {}, {"edge_type": "type", "edge_attr": "attr"},
         None),
        ("RGATConv(within-relation)", _rgat(attention_mechanism="within-relation", mod="f-scaled",
                                            attention_mode="multiplicative-self-attention", dim=2),
         "x", {}, {"edge_type": "type", "edge_attr": "attr"}, None),
        ("SimpleConv", pyg.SimpleConv(aggr="mean", combine_root="self_loop"), "x", {}, {"edge_weight": "weight"}, None),
        ("SSGConv(K=3)", pyg.SSGConv(F_IN, F_OUT, alpha=0.1, K=3), "x", {}, {"edge_weight": "weight"}, None),
        ("WLConvContinuous", pyg.WLConvContinuous(), "x", {}, {"edge_weight": "weight"}, None),
        # adapter classes and a user layer, declared hops=k
        ("GCNConv(hops=1)", pyg.GCNConv(F_IN, F_OUT, improved=True), "x", {}, {"edge_weight": "weight"}, 1),
        ("ChebConv(K=3, hops=3)", pyg.ChebConv(F_IN, F_OUT, K=3), "x", {}, {"edge_weight": "weight"}, 3),
        ("_TwoHopMean(hops=2)", _TwoHopMean(), "x", {}, {}, 2),
    ]


class _TwoHopMean(pyg.MessagePassing):
    """A user layer: two steps of in-degree-normalised sums (each node's own degree and its sources')."""

    def __init__(self) -> None:
        super().__init__(aggr="add")
        self.lin = nn.Linear(F_IN, F_OUT)

    def forward(self, x, edge_index):
        from torch_geometric.utils import degree

        deg = degree(edge_index[1], x.shape[0], dtype=x.dtype).clamp(min=1)
        norm = (deg[edge_index[0]] * deg[edge_index[1]]).rsqrt()
        h = self.lin(x)
        for _ in range(2):
            h = self.propagate(edge_index, x=h, norm=norm).tanh()
        return h

    def message(self, x_j, norm):
        return norm[:, None] * x_j


def _check_layer(inp: _Inputs, what: str, layer: nn.Module, x_name: str, nodes: dict, edges: dict, hops,
                 tol: float = 1e-10) -> None:
    ref = layer.to(inp.node["x"].dtype)
    shard = ShardConv(copy.deepcopy(ref), hops=hops)
    assert shard.mode == "multihop", what
    graph = inp.graph

    # the whole graph, one process
    full = {k: inp.node[v].clone() for k, v in nodes.items()}
    for v in full.values():
        v.requires_grad_(v.is_floating_point())
    x = inp.node[x_name].clone().requires_grad_()
    e_full = {k: inp.edge[v].clone() for k, v in edges.items()}
    for v in e_full.values():
        v.requires_grad_(v.is_floating_point())
    y_ref = ref(x, edge_index=inp.edge_index, **full, **e_full)
    (y_ref * inp.w[:, : y_ref.shape[1]]).sum().backward()

    # the shard: node inputs as ShardTensors, edge inputs for the local edges
    def shard_of(t):
        return ShardTensor.from_local(t[inp.own].clone().requires_grad_(t.is_floating_point()), graph.spec)

    xs, ns = shard_of(inp.node[x_name]), {k: shard_of(inp.node[v]) for k, v in nodes.items()}
    es = {k: inp.edge[v][graph.global_edge_ids].clone() for k, v in edges.items()}
    for v in es.values():
        v.requires_grad_(v.is_floating_point())
    multihop_halo(graph, shard.hops)  # built (and cached) before counting
    first = _edge_parameter(shard.layer) if edges else None  # passed positionally, as edge_attr
    args = tuple(v for k, v in es.items() if k == first)
    with count_collectives() as log:
        y = shard(xs, graph, *args, **ns, **{k: v for k, v in es.items() if k != first})
        (y * ShardTensor.from_local(inp.w[inp.own, : y.shape[1]], graph.spec)).sum().backward()
    if graph.spec.world_size > 1:  # one exchange per node and per edge tensor, each way, nothing else
        n_float = 1 + sum(1 for v in (*full.values(), *es.values()) if v.is_floating_point())
        calls = (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward"))
        assert calls == (1 + len(nodes) + len(edges), n_float), f"{what}: {log}"

    assert_close(y.to_local().detach(), y_ref.detach()[inp.own], DT, f"{what}: output", tol=tol)
    for name, (s, t) in {"x": (xs, x), **{k: (ns[k], full[k]) for k in nodes if full[k].is_floating_point()}}.items():
        assert_close(_grad(s.to_local()) if s.grad is None else s.grad.to_local(), t.grad[inp.own], DT, f"{what}: grad of {name}", tol=tol)
    for k, e in e_full.items():
        if e.is_floating_point():
            grad = torch.zeros_like(e).index_add_(0, graph.global_edge_ids, _grad(es[k]))
            assert_close(all_sum(grad), e.grad, DT, f"{what}: grad of {k}", tol=tol)
    for (name, p), p_ref in zip(shard.layer.named_parameters(), ref.parameters()):
        assert_close(all_sum(_grad(p)), _grad(p_ref), DT, f"{what}: grad of {name}", tol=tol)


def _check_halo(inp: _Inputs, hops: int) -> None:
    """The extended subgraph is the whole graph's ``hops + 1``-hop neighbourhood, by a BFS here."""
    n = inp.node["x"].shape[0]
    src, dst = inp.edge_index
    dist_ = torch.full((n,), -1)
    dist_[inp.own] = 0
    for h in range(1, hops + 2):
        frontier = torch.zeros(n, dtype=torch.bool)
        frontier[dist_ == h - 1] = True
        reached = src[frontier[dst]]
        reached = reached[dist_[reached] < 0]
        dist_[reached] = h
    halo = multihop_halo(inp.graph, hops)
    ids = halo.nodes(inp.own[:, None].to(DT))[:, 0].round().long()
    assert halo.num_owned == len(inp.own) and torch.equal(ids[: halo.num_owned], inp.own)
    assert sorted(ids.tolist()) == torch.nonzero(dist_ >= 0)[:, 0].tolist(), f"nodes of the {hops}-hop halo"
    assert torch.equal(dist_[ids], halo.node_hops), f"hops of the {hops}-hop halo"
    got = ids[halo.edge_index]
    keep = (dist_[dst] >= 0) & (dist_[dst] <= hops)
    want = inp.edge_index[:, keep]
    assert sorted(map(tuple, got.T.tolist())) == sorted(map(tuple, want.T.tolist())), f"edges of the {hops}-hop halo"
    global_ids = halo.edges(inp.graph.global_edge_ids[: inp.graph.num_owned_edges, None].to(DT))[:, 0].round().long()
    assert torch.equal(inp.edge_index[:, global_ids], got), f"edge plan of the {hops}-hop halo"


def _battery(rank: int, world: int, names: tuple[str, ...] | None, layout: str = "metis", halo_hops: int = 1) -> str:
    inp = _Inputs(rank, world, layout, halo_hops)
    for hops in (1, 3):
        _check_halo(inp, hops)
    for what, layer, x_name, nodes, edges, hops in _layers(inp.node["pos"].shape[1]):
        if names is None or what in names:
            _check_layer(inp, f"{what} R={world}", layer, x_name, nodes, edges, hops)
    single = inp.cast(torch.float32)
    for what, layer, x_name, nodes, edges, hops in _layers(inp.node["pos"].shape[1]):
        if what in FLOAT32 and (names is None or what in names):
            _check_layer(single, f"{what} float32 R={world}", layer, x_name, nodes, edges, hops, tol=1e-5)
    return "ok"


@pytest.mark.slow
def test_every_multihop_class_on_three_ranks_equals_the_whole_graph() -> None:
    mesh_case(MESH, 3)
    assert run_ranks(_battery, 3, None, timeout=300) == ["ok"] * 3


@pytest.mark.slow
@pytest.mark.parametrize(("world", "layout"), [(1, "metis"), (2, "metis"), (4, "metis"), (3, "special")])
def test_multihop_on_one_two_and_four_ranks(world: int, layout: str) -> None:
    """``special``: the mesh plus a copy owned whole by rank 0 (no ghosts); rank 1 owns nothing."""
    mesh_case(MESH, world, layout)
    assert run_ranks(_battery, world, ("FeaStConv", "SSGConv(K=3)"), layout, timeout=300) == ["ok"] * world


@pytest.mark.slow
def test_multihop_on_a_partition_with_two_hop_ghosts() -> None:
    """A ``halo_hops=2`` partition (ghosts two hops deep, redundant edges): the same extended subgraph."""
    mesh_case(MESH, 2, "metis", 2)
    assert run_ranks(_battery, 2, ("SSGConv(K=3)",), "metis", 2, timeout=300) == ["ok"] * 2


def test_every_multihop_class_is_tested_here() -> None:
    tested = {type(layer).__name__ for _, layer, *_ in _layers(2)}
    assert set(MULTIHOP) <= tested, sorted(set(MULTIHOP) - tested)


def test_multihop_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"Expected 'hops' to be a positive int, without local=True \(got 0\)"):
        ShardConv(pyg.FeaStConv(3, 2), hops=0)
    with pytest.raises(ValueError, match=r"Expected 'hops' to be a positive int"):
        ShardConv(_TwoHopMean(), hops=2, local=True)
    with pytest.raises(TypeError, match=r"aggregation LSTMAggregation depends on the order"):
        ShardConv(pyg.SAGEConv(3, 2, aggr="lstm"), hops=1)
    case = mesh_case(MESH, 1)
    graph = ShardGraph.from_partition(case.parts[0], dtype=DT)
    x = ShardTensor.from_local(torch.zeros(graph.num_owned, F_IN, dtype=DT), graph.spec)
    conv = ShardConv(pyg.CGConv(F_IN, dim=3, batch_norm=True)).to(DT)
    with pytest.raises(TypeError, match=r"CGConv exact in training on a multi-hop halo: a module inside it normalises"):
        conv(x, graph, torch.zeros(graph.num_owned_edges, 3, dtype=DT))
    conv.eval()
    assert conv(x, graph, torch.zeros(graph.num_owned_edges, 3, dtype=DT)).shape == (graph.num_owned, F_IN)
    point = ShardConv(pyg.PointTransformerConv(F_IN, F_OUT)).to(DT)
    with pytest.raises(TypeError, match=r"PointTransformerConv takes no edge input after 'edge_index'"):
        point(x, graph, torch.zeros(graph.num_owned_edges, 3, dtype=DT), pos=x[:, :3])
    with pytest.raises(TypeError, match=r"Expected 'pos' to be a ShardTensor \(a node input\) or one row per local edge"):
        point(x, graph, pos=x.to_local()[:, :3])


def test_the_recorded_multihop_fingerprints_are_the_installed_pyg() -> None:
    """The code of every MULTIHOP class is the code its hop count was verified on (PyG 2.8.1); after
    verifying a new release with this file, paste what this test prints over ``MULTIHOP_VERIFIED``."""
    from meshshard.nn._multihop import MULTIHOP_VERIFIED
    from meshshard.nn._pyg import _fingerprint

    found = {name: _fingerprint(getattr(pyg, name)) for name in MULTIHOP}
    assert set(MULTIHOP_VERIFIED) == set(MULTIHOP), "every multihop class needs a recorded fingerprint"
    changed = sorted(name for name in MULTIHOP if found[name] != MULTIHOP_VERIFIED[name])
    assert not changed, f"PyG code changed for {changed}; once this file passes on it, record: {found}"


def test_a_multihop_class_whose_pyg_code_changed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshshard.nn import _multihop

    monkeypatch.setitem(_multihop.MULTIHOP_VERIFIED, "FeaStConv", "000000000000")
    with pytest.raises(TypeError, match=r"^ShardConv refuses FeaStConv: its code in torch-geometric .* differs from"):
        ShardConv(pyg.FeaStConv(3, 2))
    assert ShardConv(pyg.FeaStConv(3, 2), checked=True).mode == "multihop"
