"""Sharded MeshGraphNet against the single-process model on the whole mesh, on 1-4 gloo ranks.

Real meshes from ../shared/data (SfePy, BSD-3-Clause): cube_cylinder.mesh (3-D tetrahedra),
wheelset.vtk (3-D tetrahedra, legacy VTK) and big.mesh (2-D triangles), split by METIS into
uneven shards. Output, node-input gradients, edge-input gradients and every parameter gradient
(summed over ranks) equal the whole-mesh model with the same weights, in 1-hop mode (one exchange
per step) and k-hop mode (one exchange in all).

Tolerances. float64: 1e-10 relative. float32: 1e-5 normwise relative, or twice the single-process
float32 model's own error against float64 where that is larger: a parameter gradient summed over
the ~140k edges of cube_cylinder is 1.6e-5 away from its float64 value in one float32 process, and
merely permuting the edge order in one process moves it by 1.8e-5, so no float32 computation in
another summation order can agree with it to 1e-5. A wrong gradient is off by orders of magnitude.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from meshshard import ShardGraph, ShardTensor, edge_features
from meshshard.comm import count_collectives
from meshshard.nn import MeshGraphNet
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._tolerance import assert_close_float32_normwise

MESHES = ("sfepy/cube_cylinder.mesh", "sfepy/wheelset.vtk", "sfepy/big.mesh")


def _model(dtype, steps, edge_in) -> MeshGraphNet:
    torch.manual_seed(1)
    return MeshGraphNet(4, edge_in, 2, latent_size=12, hidden_layers=1, message_passing_steps=steps).to(dtype)


def _check(mesh: str, rank: int, world: int, dtype: torch.dtype, halo_hops: int, steps: int) -> None:
    case = mesh_case(mesh, world, "metis", halo_hops)
    n = case.num_nodes
    pos = torch.as_tensor(case.pos, dtype=dtype)
    edge_index = torch.as_tensor(case.edge_index)
    g = torch.Generator().manual_seed(7)
    x_full = torch.randn(n, 4, generator=g, dtype=torch.float64).to(dtype)
    w_full = torch.randn(n, 2, generator=g, dtype=torch.float64).to(dtype)

    ref = _model(dtype, steps, pos.shape[1] + 1)
    model = copy.deepcopy(ref)
    xr, ear, loss_ref, y_ref = _whole(ref, x_full, pos, edge_index, w_full)
    # the float64 truth of the float32 reference (same weights and inputs, widened)
    truth = copy.deepcopy(ref).double()
    xt, eat, loss_t, y_t = _whole(truth, x_full.double(), pos.double(), edge_index, w_full.double())

    graph = ShardGraph.from_partition(case.parts[rank], dtype=dtype)
    own = graph.spec.global_ids
    # the shard's edges are the global edges (src, dst) listed in global edge id order
    l2g = torch.cat([own, torch.as_tensor(case.parts[rank].ghost_ids)])
    assert torch.equal(l2g[graph.edge_index], edge_index[:, graph.global_edge_ids])
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), graph.spec)
    ea = edge_features(graph.pos, graph.edge_index).requires_grad_()
    with count_collectives() as log:
        y = model(x, graph, ea)
        loss = (y * ShardTensor.from_local(w_full[own], graph.spec)).sum()
        loss.backward()
    exchanges = steps if halo_hops == 1 else 1
    got = (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward"))
    assert got == (exchanges, exchanges), (halo_hops, log)

    what = f"{mesh} R={world} {dtype} hops={halo_hops}"
    assert_close_float32_normwise(loss.detach(), loss_ref.detach(), dtype, f"loss {what}", loss_t)
    assert_close_float32_normwise(y.to_local().detach(), y_ref[own], dtype, f"output {what}", y_t[own])
    assert_close_float32_normwise(x.grad.to_local(), xr.grad[own], dtype, f"node input grad {what}", xt.grad[own])
    # every copy of an edge contributes to that edge's gradient: sum them by global edge id
    edge_grad = torch.zeros_like(ear.grad).index_add_(0, graph.global_edge_ids, ea.grad)
    if dist.is_initialized():
        dist.all_reduce(edge_grad)
    assert_close_float32_normwise(edge_grad, ear.grad, dtype, f"edge input grad {what}", eat.grad)
    for (name, p), p_ref, p_t in zip(model.named_parameters(), ref.parameters(), truth.parameters()):
        grad = p.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(grad)  # replicated parameters: the domain group sums the gradients
        assert_close_float32_normwise(grad, p_ref.grad, dtype, f"grad of {name} {what}", p_t.grad)


def _whole(model, x_full, pos, edge_index, w_full):
    """The single-process computation: input and edge-input leaves, loss, output."""
    x = x_full.clone().requires_grad_()
    ea = edge_features(pos, edge_index).requires_grad_()
    y = model(x, edge_index, ea)
    loss = (y * w_full).sum()
    loss.backward()
    return x, ea, loss.detach(), y.detach()


def _check_checkpointed_shard(rank: int, world: int) -> None:
    """Checkpointed steps give the same results, and the recomputation in the backward is local:
    each step's halo exchange happens before its checkpointed block, so it is not repeated."""
    case = mesh_case("sfepy/big.mesh", world, "metis", 1)
    graph = ShardGraph.from_partition(case.parts[rank], dtype=torch.float64)
    x_full = torch.randn(case.num_nodes, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    plain = _model(torch.float64, 3, 3)
    ckpt = copy.deepcopy(plain)
    ckpt.checkpoint_steps = True
    results = []
    for model in (plain, ckpt):
        x = ShardTensor.from_local(x_full[graph.spec.global_ids].clone().requires_grad_(), graph.spec)
        with count_collectives() as log:
            y = model(x, graph, edge_features(graph.pos, graph.edge_index))
            (y * y).sum().backward()
        results.append((y.to_local().detach(), x.grad.to_local(), [p.grad for p in model.parameters()], log))
    (y0, g0, p0, log0), (y1, g1, p1, log1) = results
    assert torch.equal(y0, y1) and torch.allclose(g0, g1, rtol=1e-12, atol=1e-14)
    for a, b in zip(p0, p1):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    for log in (log0, log1):
        assert (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward")) == (3, 3), log


def _battery(rank: int, world: int, meshes: tuple[str, ...]) -> str:
    for mesh in meshes:
        for dtype in (torch.float64, torch.float32):
            _check(mesh, rank, world, dtype, halo_hops=1, steps=3)
            _check(mesh, rank, world, dtype, halo_hops=2, steps=2)
    _check(meshes[-1], rank, world, torch.float64, halo_hops=3, steps=2)
    _check_checkpointed_shard(rank, world)
    return "ok"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sharded_meshgraphnet_equals_whole_mesh(world: int) -> None:
    for mesh in MESHES:
        mesh_case(mesh, world)  # skips here when the data is missing
    assert run_ranks(_battery, world, MESHES, timeout=300) == ["ok"] * world


def test_k_hop_partition_must_cover_the_steps() -> None:
    case = mesh_case("sfepy/big.mesh", 1, "metis", 2)
    graph = ShardGraph.from_partition(case.parts[0], dtype=torch.float64)
    model = _model(torch.float64, 3, 3)
    x = ShardTensor.from_local(torch.zeros(graph.num_owned, 4, dtype=torch.float64), graph.spec)
    with pytest.raises(ValueError, match=r"halo_hops=2 covers at most 2 message-passing steps .* this model has 3"):
        model(x, graph, edge_features(graph.pos, graph.edge_index))


def test_whole_graph_input_errors() -> None:
    model = _model(torch.float32, 1, 3)
    with pytest.raises(ValueError, match=r"Expected 'edge_index' of shape \(2, E\) \(got \(3, 4\)\)"):
        model(torch.zeros(5, 4), torch.zeros(3, 4, dtype=torch.long), torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"Expected 'edge_attr' of shape \(4, F_e\), one row per edge \(got \(5, 3\)\)"):
        model(torch.zeros(5, 4), torch.zeros(2, 4, dtype=torch.long), torch.zeros(5, 3))


def test_checkpointed_steps_give_the_same_gradients() -> None:
    case = mesh_case("sfepy/big.mesh", 1)
    pos = torch.as_tensor(case.pos, dtype=torch.float64)
    ei = torch.as_tensor(case.edge_index)
    x = torch.randn(len(pos), 4, dtype=torch.float64)
    plain = _model(torch.float64, 2, 3)
    ckpt = copy.deepcopy(plain)
    ckpt.checkpoint_steps = True
    for m in (plain, ckpt):
        m(x, ei, edge_features(pos, ei)).square().sum().backward()
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)
