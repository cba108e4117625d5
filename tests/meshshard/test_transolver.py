"""Transolver's physics attention on shards against one process on the whole mesh, on 1-4 gloo ranks.

Mesh: ../shared/data/sfepy/big.mesh (2-D triangles, 2,885 nodes, SfePy, BSD-3-Clause; a generated
stand-in when the data is missing), split by METIS into uneven shards, and the "special" layout of
tests/_meshes.py (a rank with no ghosts; an empty rank from 3 ranks on). The output, the input
gradient and every parameter gradient (summed over the ranks) equal the whole-mesh model with the
same weights: 1e-10 elementwise relative in float64, 1e-5 normwise relative in float32 (or twice
the float32 reference's own error against float64 where larger: the loss, see ``_close``). Each layer
makes one ``sum_of_parts`` (all-reduce) forward and one backward, of ``H * S * (D + 1)`` values.
MeshGraphNet with ``global_attention`` is checked the same way on 3 ranks, in 1-hop and k-hop mode.
One spawn per world size runs every check.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from meshshard import ShardGraph, ShardSpec, ShardTensor, edge_features
from meshshard.comm import count_collectives
from meshshard.nn import DomainParallel, MeshGraphNet, PhysicsAttention, Transolver, TransolverBlock
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._tolerance import assert_close, assert_close_float32_normwise

MESH = "sfepy/big.mesh"
WIDTH, HEADS, SLICES, LAYERS = 12, 3, 5, 2


def _transolver(dtype: torch.dtype, learn_temperature: bool = True) -> Transolver:
    torch.manual_seed(5)
    return Transolver(4, 2, WIDTH, LAYERS, HEADS, SLICES, mlp_ratio=2, learn_temperature=learn_temperature).to(dtype)


def _inputs(case, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Features: the position and two random channels per node; loss weights."""
    g = torch.Generator().manual_seed(11)
    pos = torch.as_tensor(case.pos, dtype=torch.float64)
    pos = (pos - pos.mean(0)) / pos.std(0)
    x = torch.cat([pos, torch.randn(case.num_nodes, 2, generator=g, dtype=torch.float64)], 1)
    return x.to(dtype), torch.randn(case.num_nodes, 2, generator=g, dtype=torch.float64).to(dtype)


def _check_transolver(rank: int, world: int, layout: str, dtype: torch.dtype, learn_temperature: bool) -> None:
    case = mesh_case(MESH, world, layout)
    x_full, w_full = _inputs(case, dtype)
    ref = _transolver(dtype, learn_temperature)
    model = copy.deepcopy(ref)
    xr = x_full.clone().requires_grad_()
    with count_collectives() as log:
        y_ref = ref(xr)  # a whole sample inside a process group: nothing sent
        (y_ref * w_full).sum().backward()
    assert log.count("sum_of_parts") == 0, log
    truth = copy.deepcopy(ref).double()  # the float64 value of the float32 reference (see _close)
    xt = x_full.double().clone().requires_grad_()
    y_t = truth(xt)
    (y_t * w_full.double()).sum().backward()

    spec = ShardSpec.from_partition(case.parts[rank])
    own = spec.global_ids
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
    with count_collectives() as log:
        y = model(x)
        loss = (y * ShardTensor.from_local(w_full[own], spec)).sum()
        loss.backward()
    assert (log.count("sum_of_parts", "forward"), log.count("sum_of_parts", "backward")) == (LAYERS, LAYERS), log
    values = HEADS * SLICES * (WIDTH // HEADS + 1)
    sent = LAYERS * values * x_full.element_size() if world > 1 else 0
    assert (log.bytes_sent("sum_of_parts", "forward"), log.bytes_sent("sum_of_parts", "backward")) == (sent, sent), log.calls

    what = f"R={world} {layout} {dtype} learn_temperature={learn_temperature}"
    assert isinstance(y, ShardTensor) and y.spec == spec and y.shape == (spec.num_owned, 2)
    # float32 normwise: the loss, a sum of ~6k products of both signs, is ill-conditioned enough that
    # the float32 reference is itself 1e-5 off
    assert_close_float32_normwise(loss.detach(), (y_ref * w_full).sum().detach(), dtype, f"loss {what}", (y_t * w_full.double()).sum().detach())
    assert_close_float32_normwise(y.to_local().detach(), y_ref.detach()[own], dtype, f"output {what}", y_t.detach()[own])
    assert_close_float32_normwise(x.grad.to_local(), xr.grad[own], dtype, f"input grad {what}", xt.grad[own])
    for (name, p), p_ref, p_t in zip(model.named_parameters(), ref.parameters(), truth.parameters(), strict=True):
        grad = p.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(grad)  # replicated parameters: the domain group sums the ranks' parts
        assert_close_float32_normwise(grad, p_ref.grad, dtype, f"grad of {name} {what}", p_t.grad)
    assert model.state_dict().keys() == ref.state_dict().keys()


def _check_domain_parallel(rank: int, world: int) -> None:
    """DomainParallel sums the attention's parameter gradients like any other: none of them is
    mistaken for a parameter used only on replicated values (the loss is one, through ShardTensor.sum)."""
    case = mesh_case(MESH, world, "metis")
    x_full, w_full = _inputs(case, torch.float64)
    ref = _transolver(torch.float64)
    (ref(x_full) * w_full).sum().backward()
    model = DomainParallel(copy.deepcopy(ref))
    spec = ShardSpec.from_partition(case.parts[rank])
    own = spec.global_ids
    (model(ShardTensor.from_local(x_full[own], spec)) * ShardTensor.from_local(w_full[own], spec)).sum().backward()
    for (name, p), p_ref in zip(model.module.named_parameters(), ref.parameters(), strict=True):
        assert_close(p.grad, p_ref.grad, torch.float64, f"DomainParallel grad of {name} R={world}")


def _meshgraphnet(every: int) -> MeshGraphNet:
    torch.manual_seed(2)
    return MeshGraphNet(4, 3, 2, latent_size=WIDTH, hidden_layers=1, message_passing_steps=3, global_attention=every,
                        attention_heads=HEADS, attention_slices=SLICES).to(torch.float64)


def _check_meshgraphnet(rank: int, world: int, halo_hops: int, every: int) -> None:
    """MeshGraphNet with an attention block after every ``every`` steps, 1-hop and k-hop shards."""
    case = mesh_case(MESH, world, "metis", halo_hops)
    x_full, w_full = _inputs(case, torch.float64)
    pos = torch.as_tensor(case.pos, dtype=torch.float64)
    edge_index = torch.as_tensor(case.edge_index)
    ref = _meshgraphnet(every)
    model = copy.deepcopy(ref)
    xr = x_full.clone().requires_grad_()
    y_ref = ref(xr, edge_index, edge_features(pos, edge_index))
    (y_ref * w_full).sum().backward()

    graph = ShardGraph.from_partition(case.parts[rank], dtype=torch.float64)
    own = graph.spec.global_ids
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), graph.spec)
    with count_collectives() as log:
        y = model(x, graph, edge_features(graph.pos, graph.edge_index))
        (y * ShardTensor.from_local(w_full[own], graph.spec)).sum().backward()
    blocks = 3 // every
    assert (log.count("sum_of_parts", "forward"), log.count("sum_of_parts", "backward")) == (blocks, blocks), log
    what = f"MeshGraphNet global_attention={every} R={world} hops={halo_hops}"
    assert_close(y.to_local().detach(), y_ref.detach()[own], torch.float64, f"output {what}")
    assert_close(x.grad.to_local(), xr.grad[own], torch.float64, f"input grad {what}")
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters(), strict=True):
        grad = p.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(grad)
        assert_close(grad, p_ref.grad, torch.float64, f"grad of {name} {what}")


def _battery(rank: int, world: int) -> str:
    torch.set_num_threads(1)
    _check_transolver(rank, world, "metis", torch.float64, True)
    _check_transolver(rank, world, "metis", torch.float32, False)
    _check_transolver(rank, world, "special", torch.float64, True)  # R >= 3: rank 1 holds no rows
    if world > 1:
        _check_domain_parallel(rank, world)
    if world == 3:
        _check_meshgraphnet(rank, world, halo_hops=1, every=1)
        _check_meshgraphnet(rank, world, halo_hops=3, every=2)
    return "ok"


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sharded_transolver_equals_whole_mesh(world: int) -> None:
    assert run_ranks(_battery, world, timeout=240) == ["ok"] * world


def test_special_layout_has_an_empty_rank() -> None:
    """The layout the battery relies on for 'a rank holding zero rows'."""
    assert mesh_case(MESH, 3, "special").parts[1].owned_ids.size == 0


def _naive_physics_attention(layer: PhysicsAttention, x: torch.Tensor) -> torch.Tensor:
    """The paper's formulas, one head and one slice at a time."""
    out = []
    d = layer.head_dim
    for h in range(layer.heads):
        logits = x @ layer.slice_logits.weight[h * layer.slices : (h + 1) * layer.slices].T
        logits = logits + layer.slice_logits.bias[h * layer.slices : (h + 1) * layer.slices]
        w = torch.softmax(logits / layer.log_temperature[h].exp(), dim=1)  # (N, S)
        f = x @ layer.features.weight[h * d : (h + 1) * d].T + layer.features.bias[h * d : (h + 1) * d]  # (N, D)
        z = torch.stack([(w[:, s : s + 1] * f).sum(0) / (w[:, s].sum() + layer.eps) for s in range(layer.slices)])
        wq, wk, wv = layer.qkv.weight.split(d)
        q, k, v = z @ wq.T, z @ wk.T, z @ wv.T
        attended = torch.softmax(q @ k.T / d**0.5, dim=1) @ v
        out.append(w @ attended)
    return torch.cat(out, 1) @ layer.out.weight.T + layer.out.bias


def test_physics_attention_is_the_papers_formula() -> None:
    torch.manual_seed(0)
    layer = PhysicsAttention(8, heads=2, slices=3, head_dim=5, temperature=0.7).double()
    x = torch.randn(40, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x), _naive_physics_attention(layer, x), rtol=1e-12, atol=1e-12)
    assert layer(x[:0]).shape == (0, 8)


def test_fixed_temperature_is_a_buffer_and_the_state_dict_is_the_same() -> None:
    learned, fixed = PhysicsAttention(8, 2, 3), PhysicsAttention(8, 2, 3, learn_temperature=False)
    assert "log_temperature" in dict(learned.named_parameters())
    assert "log_temperature" not in dict(fixed.named_parameters())
    assert learned.state_dict().keys() == fixed.state_dict().keys()


def test_meshgraphnet_without_global_attention_is_unchanged() -> None:
    torch.manual_seed(0)
    plain = MeshGraphNet(4, 3, 2, latent_size=8, hidden_layers=1, message_passing_steps=4)
    torch.manual_seed(0)
    explicit = MeshGraphNet(4, 3, 2, latent_size=8, hidden_layers=1, message_passing_steps=4, global_attention=0)
    assert plain.attention is None and list(plain.state_dict()) == list(explicit.state_dict())
    assert not any(k.startswith("attention") for k in plain.state_dict())
    with_attention = MeshGraphNet(4, 3, 2, latent_size=8, hidden_layers=1, message_passing_steps=4, global_attention=2,
                                  attention_heads=2, attention_slices=3)
    assert len(with_attention.attention) == 2
    assert {k for k in with_attention.state_dict() if not k.startswith("attention.")} == set(plain.state_dict())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PhysicsAttention(10, heads=3), r"Expected 'width' \(10\) to be a multiple of 'heads' \(3\)"),
        (lambda: PhysicsAttention(8, slices=0), r"Expected 'slices' to be a positive integer \(got 0\)"),
        (lambda: PhysicsAttention(8, temperature=0.0), r"Expected 'temperature' to be a positive number \(got 0.0\)"),
        (lambda: TransolverBlock(8, 2, 3, mlp_ratio=-1), r"Expected 'mlp_ratio' to be a non-negative integer"),
        (lambda: Transolver(3, 1, width=8, layers=0), r"Expected 'layers' to be a positive integer \(got 0\)"),
        (lambda: MeshGraphNet(4, 3, 2, message_passing_steps=3, global_attention=4),
         r"Expected 'global_attention' to be 0 \(off\) or a number of steps in \[1, 3\] \(got 4\)"),
    ],
)
def test_bad_arguments_name_the_argument(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_one_sample_at_a_time() -> None:
    model = Transolver(3, 1, width=8, layers=1, heads=2, slices=3)
    with pytest.raises(ValueError, match=r"Transolver takes one sample, x of shape \(N, 3\) \(got 3 dimensions\); run "
                                         r"the samples of a batch one at a time"):
        model(torch.zeros(2, 10, 3))
    with pytest.raises(ValueError, match=r"Expected 'x' to have 3 features \(got 4\)"):
        model(torch.zeros(10, 4))
    with pytest.raises(TypeError, match=r"Expected 'x' to be a torch.Tensor or a ShardTensor \(got list\)"):
        model([[0.0, 0.0, 0.0]])


def test_autocast_sums_slices_in_float32() -> None:
    """Under autocast (bfloat16 here, on the CPU) the slice sums over every point run in float32,
    and the model stays within bfloat16's rounding of float32."""
    from meshshard.nn._transolver import _slice_sums

    torch.manual_seed(0)
    w, f = torch.rand(3000, 2, 4).bfloat16(), torch.randn(3000, 2, 5).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sums = _slice_sums(w, f)
    assert sums.dtype == torch.float32
    torch.testing.assert_close(sums, _slice_sums(w.float(), f.float()), rtol=1e-6, atol=1e-4)
    model = Transolver(4, 2, width=16, layers=2, heads=4, slices=8)
    x = torch.randn(500, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    assert y.dtype == torch.bfloat16
    error = ((y.float() - model(x)).norm() / model(x).norm()).item()
    assert error < 3e-2, error
