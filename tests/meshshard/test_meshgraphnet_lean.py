"""The lean MeshGraphNet against an independent implementation of the same equations.

``tests/meshshard/_reference_meshgraphnet.py`` is the paper's MeshGraphNet written the plain PyG
way (explicit ``[e, h_src, h_dst]`` concatenation, ``MessagePassing(aggr="add")``). meshshard's model
splits the first layers, gathers node products and recomputes its MLPs in the backward; with the
same weights, both must give the same output and every gradient (float64, 1e-12: only the
summation order differs). Swapping source and destination must be caught, so the check is run on a
mesh with direction-dependent edge features and the swap is shown to fail it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard import edge_features
from meshshard.nn import MeshGraphNet
from meshshard.partition import build_graph, read_input
from tests._meshes import DATA
from tests._tolerance import assert_close
from tests.meshshard._reference_meshgraphnet import ReferenceMeshGraphNet


def _mesh() -> tuple[torch.Tensor, torch.Tensor]:
    """A real 3-D tet mesh when ../shared/data is there, else a generated jittered tet lattice."""
    path = DATA / "sfepy" / "wheelset.vtk"
    if path.exists():
        graph = build_graph(read_input(path), "nodal")
        pos = graph.pos
        dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
        edge_index = np.stack([graph.indices, dst])
    else:
        pos, edge_index = _lattice(9)
    return torch.as_tensor(pos, dtype=torch.float64), torch.as_tensor(edge_index, dtype=torch.int64)


def _lattice(side: int) -> tuple[np.ndarray, np.ndarray]:
    """Jittered ``side^3`` points joined along the edges of a 6-tet-per-cube split (both directions)."""
    idx = np.arange(side**3).reshape(side, side, side)
    g = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3).astype(float)
    pos = g + np.random.default_rng(0).uniform(-0.2, 0.2, g.shape)
    pairs = []
    for d in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1)]:
        a = idx[: side - d[0], : side - d[1], : side - d[2]].ravel()
        b = idx[d[0] :, d[1] :, d[2] :].ravel()
        pairs.append(np.stack([a, b]))
    und = np.concatenate(pairs, axis=1)
    return pos, np.concatenate([und, und[::-1]], axis=1)


def _run(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, ea: torch.Tensor, w: torch.Tensor):
    x = x.clone().requires_grad_()
    ea = ea.clone().requires_grad_()
    y = model(x, edge_index, ea)
    (y * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return y.detach(), x.grad, ea.grad, grads


def _setup(steps: int = 3, latent: int = 16, hidden_layers: int = 2):
    pos, edge_index = _mesh()
    n = pos.shape[0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    w = torch.randn(n, 2, generator=g, dtype=torch.float64)
    ea = edge_features(pos, edge_index)
    torch.manual_seed(5)
    ours = MeshGraphNet(4, ea.shape[1], 2, latent_size=latent, hidden_layers=hidden_layers, message_passing_steps=steps).double()
    ref = ReferenceMeshGraphNet(4, ea.shape[1], 2, latent=latent, hidden_layers=hidden_layers, steps=steps).double()
    ref.load_state_dict(ours.state_dict())  # same names, same shapes: the concatenated layout
    return ours, ref, x, edge_index, ea, w


def _assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Two float64 computations of the same sums: 1e-12, relative to each element and to the largest."""
    assert_close(a, b, torch.float64, what, tol=1e-12, scale=b.abs().max().item())


@pytest.mark.parametrize("hidden_layers", [2, 0])
def test_lean_model_equals_the_pyg_reference(hidden_layers: int) -> None:
    ours, ref, x, edge_index, ea, w = _setup(hidden_layers=hidden_layers)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    y, gx, gea, grads = _run(ours, x, edge_index, ea, w)
    y_r, gx_r, gea_r, grads_r = _run(ref, x, edge_index, ea, w)
    _assert_close(y, y_r, "output")
    _assert_close(gx, gx_r, "node input grad")
    _assert_close(gea, gea_r, "edge input grad")
    for name in grads_r:
        _assert_close(grads[name], grads_r[name], f"grad of {name}")


def test_the_reference_check_catches_a_source_destination_swap() -> None:
    ours, ref, x, edge_index, ea, w = _setup(steps=2)
    y = ours(x, edge_index, ea).detach()
    swapped = ref(x, edge_index.flip(0), ea).detach()  # h_src and h_dst exchanged in the reference
    assert (y - swapped).abs().max() > 1e-3


def test_recompute_gives_bitwise_the_same_gradients() -> None:
    ours, _, x, edge_index, ea, w = _setup()
    saved = MeshGraphNet(4, ea.shape[1], 2, latent_size=16, hidden_layers=2, message_passing_steps=3, recompute=False).double()
    saved.load_state_dict(ours.state_dict())
    a, b = _run(ours, x, edge_index, ea, w), _run(saved, x, edge_index, ea, w)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    for name in a[3]:
        assert torch.equal(a[3][name], b[3][name]), name


def test_recompute_keeps_less_for_the_backward() -> None:
    """Bytes held by autograd after the forward: the lean default keeps a fraction of the saved form."""
    ours, _, x, edge_index, ea, _ = _setup()
    saved = MeshGraphNet(4, ea.shape[1], 2, latent_size=16, hidden_layers=2, message_passing_steps=3, recompute=False).double()
    ref = ReferenceMeshGraphNet(4, ea.shape[1], 2, latent=16, hidden_layers=2, steps=3).double()

    def saved_bytes(model: torch.nn.Module) -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if not isinstance(t, torch.nn.Parameter):
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x.requires_grad_(), edge_index, ea)
        return sum(seen.values())

    lean, kept, concat = saved_bytes(ours), saved_bytes(saved), saved_bytes(ref)
    assert lean < 0.35 * concat, (lean, kept, concat)
    assert kept < concat, (kept, concat)


def test_bf16_autocast_accumulates_in_float32_and_stays_close() -> None:
    ours, _, x, edge_index, ea, _ = _setup()
    ours = ours.float()
    y32 = ours(x.float(), edge_index, ea.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = ours(x.float(), edge_index, ea.float())
    error = ((y16.float() - y32).norm() / y32.norm()).item()
    assert 0 < error < 0.05, error


def _autocast_case(recompute: bool = True, half: torch.dtype = torch.bfloat16, side: int = 20):
    pos, edge_index = _lattice(side)
    pos, edge_index = torch.as_tensor(pos, dtype=torch.float32), torch.as_tensor(edge_index)
    ea = edge_features(pos, edge_index)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(len(pos), 3, generator=g), torch.randn(len(pos), 1, generator=g)
    torch.manual_seed(0)
    model = MeshGraphNet(3, 4, 1, latent_size=32, hidden_layers=2, message_passing_steps=3, recompute=recompute)

    def gradients(autocast: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        with torch.autocast("cpu", dtype=half, enabled=autocast):
            out = model(x, edge_index, ea)
        assert out.dtype == (half if autocast else torch.float32)  # the decoder's last layer
        ((out.float() - y) ** 2).mean().backward()
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        return out.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}

    return gradients


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    return max((((a[n] - b[n]).norm() / b[n].norm()).item(), n) for n in b)


def test_under_bf16_autocast_every_gradient_stays_near_float32() -> None:
    # The edge MLPs' LayerNorm gradients are sums over every edge that nearly cancel: with the
    # LayerNorm (so the edge stream and its gradient) in bfloat16 they were 92% off here; in float32
    # (FloatLayerNorm, as CUDA's autocast runs it) the worst tensor is about 2% off.
    gradients = _autocast_case()
    (_, fp32), (_, bf16) = gradients(False), gradients(True)
    worst = _worst(bf16, fp32)
    assert 0 < worst[0] < 0.1, worst


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("recompute", [True, False])
def test_under_autocast_the_fused_edge_mlps_match_autograd(monkeypatch: pytest.MonkeyPatch, recompute: bool,
                                                           half: torch.dtype) -> None:
    # Under autocast the edge MLPs run as one Function each (products in autocast's dtype, LayerNorm
    # and the edge stream in float32), like autograd under autocast up to that dtype's rounding.
    import meshshard.nn._meshgraphnet as mgn

    gradients = _autocast_case(recompute, half, side=12)  # 1,728 nodes: half precision is slow on a CPU
    fused_calls = []
    step = mgn.edge_step
    monkeypatch.setattr(mgn, "edge_step", lambda *a, **k: fused_calls.append(k["half"]) or step(*a, **k))
    out_fused, fused = gradients(True)
    assert fused_calls == [half] * 3
    monkeypatch.setattr(mgn, "_fusable", lambda mlp, x: False)
    out_autograd, autograd = gradients(True)
    assert len(fused_calls) == 3
    assert ((out_fused - out_autograd).norm() / out_autograd.norm()).item() < 1e-2
    worst = _worst(fused, autograd)
    assert worst[0] < 0.05, worst


@pytest.mark.parametrize("recompute", [True, False])
def test_per_edge_the_backward_keeps_e_and_no_message(recompute: bool) -> None:
    """Floating-point values kept for the backward on edge rows: each step's input ``e`` (``E L``)
    and its LayerNorm statistics, plus the hidden activations (``3 E L``, and as many for the edge
    encoder) without ``recompute``; never the message (``index_add_`` under autograd kept it: one
    more ``E L`` per step)."""
    ours, _, x, edge_index, ea, _ = _setup()
    ours.recompute = recompute
    for block in ours.processor:
        block.recompute = recompute
    num_edges, latent, steps = edge_index.shape[1], 16, 3
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point() and t.dim() > 0 and t.shape[0] == num_edges:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ours(x.requires_grad_(), edge_index, ea.requires_grad_())
    per_step, encoder = (latent, 0) if recompute else (4 * latent, 3 * latent)
    small = num_edges * (ea.shape[1] + 2 * (steps + 1))  # edge_attr; mean and rstd of each LayerNorm
    bound = num_edges * (steps * per_step + encoder) + small
    assert sum(seen.values()) <= bound, (sum(seen.values()), bound)


def test_edge_order_does_not_matter() -> None:
    """Edges sorted by destination (sums by segments) and shuffled (``index_add_``) give the same
    output and gradients."""
    ours, _, x, edge_index, ea, w = _setup()
    perm = torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(1))
    a = _run(ours, x, edge_index, ea, w)
    ours.zero_grad()
    b = _run(ours, x, edge_index[:, perm], ea[perm], w)
    _assert_close(a[0], b[0], "output")
    _assert_close(a[1], b[1], "node input grad")
    _assert_close(a[2][perm], b[2], "edge input grad")
    for name in a[3]:
        _assert_close(a[3][name], b[3][name], f"grad of {name}")


def _edge_latent_hooks(model: MeshGraphNet, hook) -> list:
    """Register ``hook`` on the gradient of every processor step's returned edge latent ``e``."""
    handles = []

    def on_step(_module, _inputs, outputs):
        outputs[1].register_hook(hook)

    for block in model.processor:
        handles.append(block.register_forward_hook(on_step))
    return handles


def test_the_edge_gradient_is_one_buffer_added_into_down_the_processor() -> None:
    """The gradient of ``e`` between processor steps is written in place (one buffer for the whole
    chain, no fresh (E, L) tensor per step): the hooks see one storage, and the result still
    equals the PyG reference (checked above with the same model)."""
    ours, ref, x, edge_index, ea, w = _setup(steps=4)
    seen: list[int] = []
    handles = _edge_latent_hooks(ours, lambda g: seen.append(None if g is None else g.untyped_storage().data_ptr()))
    a = _run(ours, x, edge_index, ea, w)
    for h in handles:
        h.remove()
    assert len(seen) == 4 and seen[0] is None and seen[1] is not None and len(set(seen[1:])) == 1, seen  # the last e: no gradient
    b = _run(ref, x, edge_index, ea, w)
    _assert_close(a[2], b[2], "edge input grad")
    for name in a[3]:
        _assert_close(a[3][name], b[3][name], f"grad of {name}")


def test_a_hook_that_keeps_an_edge_gradient_keeps_it_unchanged() -> None:
    """A gradient someone else holds is never written into: a hook that keeps the gradients of the
    edge latents finds them as they were when it got them, and every gradient is as without it."""
    ours, _, x, edge_index, ea, w = _setup(steps=4)
    plain = _run(ours, x, edge_index, ea, w)
    ours.zero_grad()
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    handles = _edge_latent_hooks(ours, lambda g: kept.append((g, g.clone())) if g is not None else None)
    hooked = _run(ours, x, edge_index, ea, w)
    for h in handles:
        h.remove()
    assert len(kept) == 3
    for held, copy in kept:
        assert torch.equal(held, copy)
    assert torch.equal(plain[2], hooked[2])
    for name in plain[3]:
        assert torch.equal(plain[3][name], hooked[3][name]), name


def test_a_shard_graph_counts_edges_per_destination_once() -> None:
    # MeshGraphNet sums messages by destination segments at every step; the graph counts them once.
    import dataclasses

    from meshshard import ShardGraph
    from meshshard.partition import partition_graph

    _, edge_index = _mesh()
    graph = ShardGraph.from_partition(partition_graph(edge_index.numpy(), 1)[0])
    lengths = graph.dst_lengths(graph.num_owned)
    assert torch.equal(lengths, torch.bincount(graph.edge_index[1], minlength=graph.num_owned))
    assert graph.dst_lengths(graph.num_owned) is lengths
    swapped = graph.edge_index[:, torch.randperm(graph.edge_index.shape[1], generator=torch.Generator().manual_seed(0))]
    assert dataclasses.replace(graph, edge_index=swapped, _cache={}).dst_lengths(graph.num_owned) is None
