"""``ShardConv``: PyTorch Geometric layers on shards against the same layer on the whole mesh.

Real mesh ../shared/data/sfepy/big.mesh (2-D triangles, SfePy, BSD-3-Clause) split by METIS into
uneven shards on 1-4 gloo ranks; one spawn per world size runs every layer. Each check copies the
layer, runs it on the whole graph and through ``ShardConv`` on each rank's shard, and compares in
float64 to 1e-10: the owned rows of the output, the input gradient, the edge-input gradient (each
edge's gradient summed by global edge id over the ranks) and every parameter gradient (summed over
the ranks, as for replicated parameters).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from meshshard import ShardGraph, ShardTensor, edge_features
from meshshard.comm import count_collectives, sum_gradients
from meshshard.nn import ShardConv, ShardNorm
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._ranks import all_sum
from tests._tolerance import assert_close

pyg = pytest.importorskip("torch_geometric.nn")

MESH = "sfepy/big.mesh"
F_IN, F_OUT = 5, 4
DT = torch.float64


class _Inputs:
    """The whole-graph inputs, identical on every rank, and this rank's shard of them."""

    def __init__(self, rank: int, world: int, layout: str = "metis") -> None:
        case = mesh_case(MESH, world, layout)
        g = torch.Generator().manual_seed(11)
        n = case.num_nodes
        self.edge_index = torch.as_tensor(case.edge_index)
        self.pos = torch.as_tensor(case.pos, dtype=DT)
        self.x = torch.randn(n, F_IN, generator=g, dtype=DT)
        self.w = torch.randn(n, 16, generator=g, dtype=DT)
        self.edge_attr = edge_features(self.pos, self.edge_index)
        self.edge_weight = 0.5 + torch.rand(self.edge_index.shape[1], generator=g, dtype=DT)
        self.graph = ShardGraph.from_partition(case.parts[rank], dtype=DT)
        self.own = self.graph.spec.global_ids

    def edge_input(self, kind: str | None) -> torch.Tensor | None:
        return {None: None, "attr": self.edge_attr, "weight": self.edge_weight}[kind]


def _check_layer(inp: _Inputs, what: str, layer: nn.Module, edge: str | None = None, pos: bool = False) -> None:
    ref = layer
    shard = ShardConv(copy.deepcopy(layer))
    graph = inp.graph

    # the whole graph, one process
    x = inp.x.clone().requires_grad_()
    e_full = inp.edge_input(edge)
    e = None if e_full is None else e_full.clone().requires_grad_()
    args = (x, inp.pos, inp.edge_index) if pos else (x, inp.edge_index)
    y_ref = ref(*args) if e is None else ref(*args, e)
    (y_ref * inp.w[:, : y_ref.shape[1]]).sum().backward()

    # the shard
    xs = ShardTensor.from_local(inp.x[inp.own].clone().requires_grad_(), graph.spec)
    es = None if e_full is None else e_full[graph.global_edge_ids].clone().requires_grad_()
    with count_collectives() as log:
        y = shard(xs, graph, es)
        assert isinstance(y, ShardTensor) and y.spec == graph.spec, what
        (y * ShardTensor.from_local(inp.w[inp.own, : y.shape[1]], graph.spec)).sum().backward()
    if shard.mode in ("bipartite", "pointnet", "halo"):  # one halo exchange each way, nothing else
        exchanges = (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward"))
        assert exchanges == (1, 1), f"{what}: {log}"

    assert_close(y.to_local().detach(), y_ref.detach()[inp.own], DT, f"{what}: output")
    assert_close(_grad(xs.to_local()) if xs.grad is None else xs.grad.to_local(), x.grad[inp.own], DT, f"{what}: input grad")
    if e is not None:
        grad = torch.zeros_like(e).index_add_(0, graph.global_edge_ids, _grad(es))
        assert_close(all_sum(grad), e.grad, DT, f"{what}: edge input grad")
    for (name, p), p_ref in zip(shard.layer.named_parameters(), ref.parameters()):
        assert_close(all_sum(p.grad if p.grad is not None else torch.zeros_like(p)), p_ref.grad if p_ref.grad is not None else torch.zeros_like(p_ref), DT, f"{what}: grad of {name}")
    for (name, b), b_ref in zip(shard.layer.named_buffers(), ref.buffers()):
        assert_close(b.double(), b_ref.double(), DT, f"{what}: buffer {name}")


def _grad(t: torch.Tensor) -> torch.Tensor:
    """A leaf's gradient; zeros where the rank's part took no part (an empty rank)."""
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _mlp(*sizes: int) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _layers(inp: _Inputs) -> list[tuple[str, nn.Module, str | None, bool]]:
    """(what, layer, edge input, takes positions) for every layer tested; seeded, so every rank agrees."""
    torch.manual_seed(5)
    deg = _whole_degree_histogram(inp)
    return [
        ("GCNConv", pyg.GCNConv(F_IN, F_OUT), None, False),
        ("GCNConv(add_self_loops=False)", pyg.GCNConv(F_IN, F_OUT, add_self_loops=False), None, False),
        ("GCNConv(improved) + edge weights", pyg.GCNConv(F_IN, F_OUT, improved=True), "weight", False),
        ("GraphConv + edge weights", pyg.GraphConv(F_IN, F_OUT), "weight", False),
        ("SAGEConv(mean)", pyg.SAGEConv(F_IN, F_OUT), None, False),
        ("SAGEConv(max)", pyg.SAGEConv(F_IN, F_OUT, aggr="max"), None, False),
        ("GINConv", pyg.GINConv(_mlp(F_IN, 8, F_OUT), train_eps=True), None, False),
        ("GINEConv", pyg.GINEConv(_mlp(F_IN, 8, F_OUT), train_eps=True, edge_dim=3), "attr", False),
        ("GATConv", pyg.GATConv(F_IN, F_OUT, heads=2), None, False),
        ("GATConv(edge_dim)", pyg.GATConv(F_IN, F_OUT, heads=2, edge_dim=3, concat=False), "attr", False),
        ("GATv2Conv(edge_dim)", pyg.GATv2Conv(F_IN, F_OUT, heads=2, edge_dim=3), "attr", False),
        ("TransformerConv(edge_dim)", pyg.TransformerConv(F_IN, F_OUT, heads=2, edge_dim=3, beta=True), "attr", False),
        ("EdgeConv(max)", pyg.EdgeConv(_mlp(2 * F_IN, 8, F_OUT), aggr="max"), None, False),
        ("PointNetConv", pyg.PointNetConv(_mlp(F_IN + 2, 8, 8), _mlp(8, F_OUT)), None, True),
        ("GENConv(softmax, learn_t, msg_norm)", pyg.GENConv(F_IN, F_OUT, aggr="softmax", learn_t=True, msg_norm=True, edge_dim=3, norm=None), "attr", False),
        ("ChebConv(K=3)", pyg.ChebConv(F_IN, F_OUT, K=3), None, False),
        ("ChebConv(K=3, rw) + edge weights", pyg.ChebConv(F_IN, F_OUT, K=3, normalization="rw"), "weight", False),
        ("TAGConv(K=2)", pyg.TAGConv(F_IN, F_OUT, K=2), None, False),
        ("SGConv(K=2)", pyg.SGConv(F_IN, F_OUT, K=2), None, False),
        ("APPNP(K=3)", pyg.APPNP(K=3, alpha=0.2), "weight", False),
        ("LEConv + edge weights", pyg.LEConv(F_IN, F_OUT), "weight", False),
        ("ResGatedGraphConv", pyg.ResGatedGraphConv(F_IN, F_OUT), None, False),
        ("GeneralConv(attention, edge_dim)", pyg.GeneralConv(F_IN, F_OUT, in_edge_channels=3, attention=True, heads=2), "attr", False),
        ("PNAConv", pyg.PNAConv(F_IN, F_OUT, ["mean", "min", "max", "std"], ["identity", "amplification", "attenuation"], deg, edge_dim=3), "attr", False),
    ]


def _whole_degree_histogram(inp: _Inputs) -> torch.Tensor:
    from torch_geometric.utils import degree

    d = degree(inp.edge_index[1], inp.x.shape[0], dtype=torch.long)
    return torch.bincount(d)


class _Model(nn.Module):
    """PyG layers with BatchNorm and an MLP (batch norm, dropout 0) between them: global statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ShardConv(pyg.GINConv(pyg.MLP([F_IN, 8, 8]), train_eps=True))  # MLP with BatchNorm
        self.norm = pyg.BatchNorm(8)
        self.mlp = pyg.MLP([8, 8, 6], norm="batch_norm", dropout=0.0)
        self.pair_norm = pyg.PairNorm(scale=2.0)
        self.conv2 = ShardConv(pyg.GENConv(6, F_OUT, aggr="softmax", learn_t=True, num_layers=2, norm="batch"))

    def forward(self, x, graph):
        h = self.norm(self.conv1(x, graph)).relu()
        return self.conv2(self.pair_norm(self.mlp(h)), graph)


def _check_model(inp: _Inputs, world: int) -> None:
    torch.manual_seed(9)
    ref = _Model().to(DT)
    model = copy.deepcopy(ref)
    for _ in range(2):  # two training steps' forward/backward: running statistics move twice
        x = inp.x.clone().requires_grad_()
        y_ref = ref(x, inp.edge_index)
        (y_ref * inp.w[:, :F_OUT]).sum().backward()
        xs = ShardTensor.from_local(inp.x[inp.own].clone().requires_grad_(), inp.graph.spec)
        y = model(xs, inp.graph)
        (y * ShardTensor.from_local(inp.w[inp.own, :F_OUT], inp.graph.spec)).sum().backward()
    what = f"GIN(MLP) + BatchNorm + MLP + PairNorm + GEN(batch norm) R={world}"
    assert_close(y.to_local().detach(), y_ref.detach()[inp.own], DT, f"{what}: output")
    assert_close(xs.grad.to_local(), x.grad[inp.own], DT, f"{what}: input grad")
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        assert_close(all_sum(p.grad), p_ref.grad, DT, f"{what}: grad of {name}")
    for (name, b), b_ref in zip(model.named_buffers(), ref.buffers()):
        assert_close(b.double(), b_ref.double(), DT, f"{what}: buffer {name}")
    assert model.state_dict().keys() == ref.state_dict().keys()
    model.eval(), ref.eval()
    assert_close(model(xs, inp.graph).to_local().detach(), ref(inp.x, inp.edge_index).detach()[inp.own], DT, f"{what}: eval output")


def _check_norms(inp: _Inputs, world: int) -> None:
    """PyG's per-graph normalisations through ShardNorm: two training passes, then eval."""
    torch.manual_seed(17)
    for ref in (pyg.GraphNorm(F_IN), pyg.InstanceNorm(F_IN, affine=True, track_running_stats=True), pyg.LayerNorm(F_IN, mode="graph")):
        ref = ref.to(DT)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        norm = ShardNorm(copy.deepcopy(ref))
        assert norm.state_dict().keys() == ref.state_dict().keys()
        what = f"ShardNorm({type(ref).__name__}) R={world}"
        for k, mode in enumerate(("train", "train", "eval")):
            ref.train(mode == "train"), norm.train(mode == "train")
            x = inp.x.clone().requires_grad_()
            none = (None, None) if k == 1 else ()  # batch=None, batch_size=None, as PyG's MLP passes them
            y_ref = ref(x, *none)
            (y_ref * inp.w[:, :F_IN]).sum().backward()
            xs = ShardTensor.from_local(inp.x[inp.own].clone().requires_grad_(), inp.graph.spec)
            y = norm(xs, *none)
            (y * ShardTensor.from_local(inp.w[inp.own, :F_IN], inp.graph.spec)).sum().backward()
            assert_close(y.to_local().detach(), y_ref.detach()[inp.own], DT, f"{what} {mode}: output")
            assert_close(_grad(xs.to_local()) if xs.grad is None else xs.grad.to_local(), x.grad[inp.own], DT, f"{what} {mode}: input grad")
        for (name, p), p_ref in zip(norm.norm.named_parameters(), ref.parameters()):
            assert_close(all_sum(p.grad), p_ref.grad, DT, f"{what}: grad of {name}")
        for (name, b), b_ref in zip(norm.norm.named_buffers(), ref.buffers()):
            assert_close(b.double(), b_ref.double(), DT, f"{what}: buffer {name}")


class _GraphSAGE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ShardConv(pyg.SAGEConv(F_IN, 16))
        self.conv2 = ShardConv(pyg.SAGEConv(16, F_OUT, aggr="max"))

    def forward(self, x, graph):
        return self.conv2(self.conv1(x, graph).relu(), graph)


def _check_training(inp: _Inputs, world: int) -> None:
    """A few Adam steps on shards equal one process: parameter gradients summed over the ranks by
    ``sum_gradients`` after the backward, or by ``DomainParallel`` during it."""
    from meshshard.nn import DomainParallel

    torch.manual_seed(13)
    ref = _GraphSAGE().to(DT)
    by_hand, wrapped = copy.deepcopy(ref), DomainParallel(copy.deepcopy(ref))
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (ref, by_hand, wrapped)]
    target = inp.w[:, :F_OUT]
    xs = ShardTensor.from_local(inp.x[inp.own], inp.graph.spec)
    ts = ShardTensor.from_local(target[inp.own], inp.graph.spec)
    for step in range(4):
        for opt in opts:
            opt.zero_grad()
        loss_ref = ((ref(inp.x, inp.edge_index) - target) ** 2).mean()
        loss_ref.backward()
        for model, opt in zip((by_hand, wrapped), opts[1:]):
            loss = ((model(xs, inp.graph) - ts) ** 2).mean()
            loss.backward()
            if model is by_hand:
                sum_gradients(model.parameters())
            assert_close(loss.detach(), loss_ref.detach(), DT, f"GraphSAGE training R={world}: loss of step {step}")
        for opt in opts:
            opt.step()
    for model in (by_hand, wrapped):
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
            assert_close(p.detach(), p_ref.detach(), DT, f"GraphSAGE training R={world}: {name} after 4 steps")


def _battery(rank: int, world: int, layout: str) -> str:
    inp = _Inputs(rank, world, layout)
    assert torch.equal(inp.graph.degree_histogram(), _whole_degree_histogram(inp))
    for what, layer, edge, pos in _layers(inp):
        _check_layer(inp, f"{what} R={world}", layer.to(DT), edge, pos)
    _check_model(inp, world)
    _check_norms(inp, world)
    _check_training(inp, world)
    return "ok"


@pytest.mark.parametrize(("world", "layout"), [(1, "metis"), (2, "metis"), (3, "metis"), (4, "metis"), (3, "special")])
def test_pyg_layers_on_shards_equal_the_whole_graph(world: int, layout: str) -> None:
    """``special``: the mesh plus a copy owned whole by rank 0 (no ghosts); rank 1 owns nothing."""
    mesh_case(MESH, world, layout)  # skips here when the data is missing
    assert run_ranks(_battery, world, layout, timeout=300) == ["ok"] * world


class _MyConv(pyg.MessagePassing):
    """A user layer: sum of incoming source rows (local: no degrees, no second hop)."""

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


class _MyGCN(pyg.GCNConv):
    pass


def test_layers_shardconv_cannot_make_exact_are_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match=r"ShardConv refuses _MyConv: _MyConv is not a layer ShardConv knows .* ShardConv\(layer, local=True\)"):
        ShardConv(_MyConv())
    with pytest.raises(TypeError, match=r"ShardConv refuses _MyGCN: _MyGCN subclasses a supported layer and may change its message"):
        ShardConv(_MyGCN(3, 2))
    with pytest.raises(TypeError, match=r"SAGEConv exact on shards: its aggregation LSTMAggregation depends on the order"):
        ShardConv(pyg.SAGEConv(3, 2, aggr="lstm"))
    with pytest.raises(TypeError, match=r"flow='target_to_source': a rank stores the edges into its nodes"):
        ShardConv(pyg.GraphConv(3, 2, flow="target_to_source"))
    with pytest.raises(TypeError, match=r"Expected 'layer' to be a torch_geometric.nn.MessagePassing layer \(got Linear\)"):
        ShardConv(nn.Linear(3, 2))
    # their own degree normalisation / a second hop: exact on the multi-hop halo (test_pyg_multihop.py)
    for layer in (pyg.ClusterGCNConv(3, 2), pyg.LGConv(), pyg.SSGConv(3, 2, alpha=0.1), pyg.FAConv(3)):
        assert ShardConv(layer).mode == "multihop"


def test_shardconv_keeps_the_layer_state_dict_and_runs_on_a_whole_graph() -> None:
    torch.manual_seed(0)
    layer = pyg.SAGEConv(3, 2)
    wrapped = ShardConv(layer)
    assert wrapped.layer is layer and wrapped.state_dict().keys() == layer.state_dict().keys()
    model = nn.Sequential(ShardConv(pyg.SAGEConv(3, 2)))
    plain = nn.Sequential(pyg.SAGEConv(3, 2))
    assert model.state_dict().keys() == plain.state_dict().keys()
    model.load_state_dict(plain.state_dict())
    x, ei = torch.randn(4, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    torch.testing.assert_close(model[0](x, ei), plain[0](x, ei))
    ShardConv(_MyConv(), local=True)  # declared local: accepted


def test_shardconv_argument_errors() -> None:
    case = mesh_case(MESH, 1)
    graph = ShardGraph.from_partition(case.parts[0], dtype=DT)
    x = ShardTensor.from_local(torch.zeros(graph.num_owned, 3, dtype=DT), graph.spec)
    conv = ShardConv(pyg.GATConv(3, 2, edge_dim=2)).to(DT)
    with pytest.raises(TypeError, match=r"Expected 'x' to be a ShardTensor on a ShardGraph \(got Tensor\)"):
        conv(x.to_local(), graph)
    with pytest.raises(ValueError, match=r"Expected 'edge_attr' to have one row per local edge \(\d+\) or per owned edge \(\d+\) \(got shape \(3, 2\)\)"):
        conv(x, graph, torch.zeros(3, 2, dtype=DT))
    with pytest.raises(TypeError, match=r"return_attention_weights is not supported on shards"):
        conv(x, graph, return_attention_weights=True)
    edge = ShardConv(pyg.EdgeConv(nn.Sequential(nn.Linear(6, 2), nn.BatchNorm1d(2)))).to(DT)
    with pytest.raises(TypeError, match=r"EdgeConv exact in training: its nn normalises over the batch of edges"):
        edge(x, graph)
