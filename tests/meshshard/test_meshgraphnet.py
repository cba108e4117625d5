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


def _reference_key(mesh: str, dtype: torch.dtype, steps: int) -> str:
    return f"{mesh}|{dtype}|{steps}"


def _whole_references(meshes: tuple[str, ...]) -> dict[str, dict[str, torch.Tensor]]:
    """The single-process computations on the whole mesh that :func:`_check` compares against, made
    once in the test process (not again on every rank of every rank count: they do not depend on
    the partition): per (mesh, dtype, steps), the model's loss, output, node-input, edge-input and
    parameter gradients, and for float32 those of its float64 truth (the same weights and inputs,
    widened)."""
    out = {}
    runs = [(mesh, dtype, steps) for mesh in meshes for dtype in (torch.float64, torch.float32) for steps in (3, 2)]
    for mesh, dtype, steps in runs:
        case = mesh_case(mesh, 1)
        pos = torch.as_tensor(case.pos, dtype=dtype)
        edge_index = torch.as_tensor(case.edge_index)
        x_full, w_full = _inputs(case.num_nodes, dtype)
        ref = _model(dtype, steps, pos.shape[1] + 1)
        entry = _whole(ref, x_full, pos, edge_index, w_full, "")
        if dtype == torch.float32:
            truth = copy.deepcopy(ref).double()
            entry |= _whole(truth, x_full.double(), pos.double(), edge_index, w_full.double(), "truth ")
        out[_reference_key(mesh, dtype, steps)] = entry
    return out


def _inputs(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x_full = torch.randn(n, 4, generator=g, dtype=torch.float64).to(dtype)
    w_full = torch.randn(n, 2, generator=g, dtype=torch.float64).to(dtype)
    return x_full, w_full


def _check(mesh: str, rank: int, world: int, dtype: torch.dtype, halo_hops: int, steps: int,
           refs: dict[str, dict[str, torch.Tensor]]) -> None:
    case = mesh_case(mesh, world, "metis", halo_hops)
    x_full, w_full = _inputs(case.num_nodes, dtype)
    edge_index = torch.as_tensor(case.edge_index)
    model = _model(dtype, steps, case.pos.shape[1] + 1)
    r = refs[_reference_key(mesh, dtype, steps)]

    def truth(name: str) -> torch.Tensor | None:
        return r.get(f"truth {name}")

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
    assert_close_float32_normwise(loss.detach(), r["loss"], dtype, f"loss {what}", truth("loss"))
    t = truth("y")
    assert_close_float32_normwise(y.to_local().detach(), r["y"][own], dtype, f"output {what}",
                                  None if t is None else t[own])
    t = truth("x grad")
    assert_close_float32_normwise(x.grad.to_local(), r["x grad"][own], dtype, f"node input grad {what}",
                                  None if t is None else t[own])
    # every copy of an edge contributes to that edge's gradient: sum them by global edge id
    edge_grad = torch.zeros_like(r["edge grad"]).index_add_(0, graph.global_edge_ids, ea.grad)
    if dist.is_initialized():
        dist.all_reduce(edge_grad)
    assert_close_float32_normwise(edge_grad, r["edge grad"], dtype, f"edge input grad {what}", truth("edge grad"))
    for name, p in model.named_parameters():
        grad = p.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(grad)  # replicated parameters: the domain group sums the gradients
        assert_close_float32_normwise(grad, r[f"grad {name}"], dtype, f"grad of {name} {what}", truth(f"grad {name}"))


def _whole(model, x_full, pos, edge_index, w_full, prefix: str) -> dict[str, torch.Tensor]:
    """The single-process computation: its loss, output, gradients of the node and edge inputs and
    of every parameter, named with ``prefix``."""
    x = x_full.clone().requires_grad_()
    ea = edge_features(pos, edge_index).requires_grad_()
    y = model(x, edge_index, ea)
    loss = (y * w_full).sum()
    loss.backward()
    out = {"loss": loss.detach(), "y": y.detach(), "x grad": x.grad, "edge grad": ea.grad}
    out |= {f"grad {name}": p.grad for name, p in model.named_parameters()}
    return {prefix + k: v for k, v in out.items()}


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


def _battery(rank: int, world: int, meshes: tuple[str, ...], references: str) -> str:
    refs = torch.load(references, weights_only=True)
    for mesh in meshes:
        for dtype in (torch.float64, torch.float32):
            _check(mesh, rank, world, dtype, halo_hops=1, steps=3, refs=refs)
            _check(mesh, rank, world, dtype, halo_hops=2, steps=2, refs=refs)
    _check(meshes[-1], rank, world, torch.float64, halo_hops=3, steps=2, refs=refs)
    _check_checkpointed_shard(rank, world)
    return "ok"


@pytest.fixture(scope="module")
def whole_references(tmp_path_factory: pytest.TempPathFactory) -> str:
    """:func:`_whole_references` of :data:`MESHES` in a file every rank loads."""
    path = tmp_path_factory.mktemp("meshgraphnet") / "whole.pt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank computes (tests/_dist.py): on one rank, the same sums in the same order
    try:
        torch.save(_whole_references(MESHES), path)
    finally:
        torch.set_num_threads(threads)
    return str(path)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sharded_meshgraphnet_equals_whole_mesh(world: int, whole_references: str) -> None:
    for mesh in MESHES:
        mesh_case(mesh, world)  # skips here when the data is missing
    assert run_ranks(_battery, world, MESHES, whole_references, timeout=300) == ["ok"] * world


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
