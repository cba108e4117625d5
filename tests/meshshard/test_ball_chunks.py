"""Ball attention in chunks of points (``meshshard/nn/_ball_chunks.py``) against the one-pass path.

The chunked forward and its recomputing backward give the one-pass path's output and every
gradient (features, positions, parameters): 1e-10 relative in float64 and 1e-5 in float32, on a
whole cloud with chunks of one point, of a few points and of all of them, and on 3 gloo ranks
against the whole cloud (an empty rank among them). ``gradcheck`` in float64 across several
chunks. What autograd keeps for the backward is linear in points x width (no tensor of points x
neighbours x width), which the one-pass path does keep.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from meshshard import ShardTensor
from meshshard.nn import BallAttentionNet
from meshshard.nn._attention import BallQueryAttention
from tests._dist import run_ranks
from tests._tolerance import assert_close
from tests.meshshard.test_ball_query_sharded import clustered_cloud, isolated_layout, spec_from_owner, uniform_cloud

K, DIM = 7, 8


def _module(dtype: torch.dtype, radius: float = 0.2, k: int = K, chunk: int | None = None) -> BallQueryAttention:
    torch.manual_seed(0)
    m = BallQueryAttention(DIM, 2, radius, k, out_dim=5, pos_hidden=6).to(dtype)
    if chunk is not None:
        m.chunk_elements = chunk
    return m


def _run(m: BallQueryAttention, x: torch.Tensor, pos: torch.Tensor, w: torch.Tensor) -> tuple:
    xx, pp = x.clone().requires_grad_(), pos.clone().requires_grad_()
    m.zero_grad(set_to_none=True)
    y = m(xx, pp, m.build_plan(pos))
    (y * w).sum().backward()
    return y.detach(), xx.grad, pp.grad, [p.grad for p in m.parameters()]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunks_equal_the_one_pass_path_on_a_whole_cloud(dtype: torch.dtype) -> None:
    pos = torch.cat([uniform_cloud(300, 4), uniform_cloud(20, 4)]).to(dtype)  # 20 duplicated points
    g = torch.Generator().manual_seed(1)
    x = torch.randn(320, DIM, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(320, 5, generator=g, dtype=torch.float64).to(dtype)
    dense = _module(dtype, chunk=0)
    assert dense.build_plan(pos).neighbors.num_truncated > 0
    ref = _run(dense, x, pos, w)
    for rows in (1, 13, 320):  # one point per chunk, uneven chunks, one chunk
        got = _run(_module(dtype, chunk=rows * K * DIM), x, pos, w)
        what = f"{rows} rows per chunk, {dtype}"
        for name, a, b in zip(("output", "grad x", "grad pos"), got[:3], ref[:3]):
            assert_close(a, b, dtype, f"{name}, {what}", cast=True)
        for (name, _), a, b in zip(dense.named_parameters(), got[3], ref[3], strict=True):
            assert_close(a, b, dtype, f"grad {name}, {what}", cast=True)


def test_chunks_gradcheck_in_float64() -> None:
    m = _module(torch.float64, radius=0.6, k=5, chunk=3 * 5 * DIM)  # 3 points per chunk
    x = torch.randn(16, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    pos = uniform_cloud(16, 5).requires_grad_()
    plan = m.build_plan(pos)
    assert plan.neighbors.mask.sum(1).min() > 1 and plan.neighbors.num_truncated > 0
    assert torch.autograd.gradcheck(lambda a, b: m(a, b, plan), (x, pos), fast_mode=True)
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in m.parameters())
    call = lambda *ps: torch.func.functional_call(m, dict(zip(names, ps)), (x.detach(), pos.detach(), plan))  # noqa: E731
    assert torch.autograd.gradcheck(call, params, fast_mode=True)


def _largest_saved(m: BallQueryAttention, x: torch.Tensor, pos: torch.Tensor) -> int:
    """The most elements of one tensor that autograd keeps for the backward of ``m``'s forward."""
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    plan = m.build_plan(pos)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(x.requires_grad_(), pos, plan).sum().backward()
    return max(sizes)


def test_what_the_backward_keeps_is_linear_in_points_times_width() -> None:
    n = 2000
    pos, x = uniform_cloud(n, 6), torch.randn(n, DIM, dtype=torch.float64)
    per_point_neighbours = n * K * DIM  # the size of one (points, neighbours, width) tensor
    assert _largest_saved(_module(torch.float64, 0.15, chunk=0), x.clone(), pos) >= per_point_neighbours
    chunked = _largest_saved(_module(torch.float64, 0.15, chunk=50 * K * DIM), x.clone(), pos)
    assert chunked <= n * 2 * DIM < per_point_neighbours  # at most the keys and values of every point


def test_the_model_keeps_no_hidden_activation_of_its_mlps_or_attention() -> None:
    """``BallAttentionNet``'s blocks keep, per point, at most their halo'd ``[x, pos]``: no queries,
    keys or values, no attention output and no ``(N, mlp_ratio * width)`` MLP activation; turning
    the MLP's recomputation off keeps the MLP's hidden activations (so the check can fail)."""
    n, width = 500, 8
    pos, x = uniform_cloud(n, 8), torch.randn(n, 3, dtype=torch.float64)
    for recompute, widest in ((True, width + 3), (False, 2 * width)):
        torch.manual_seed(0)
        model = BallAttentionNet(3, 1, width=width, layers=2, heads=2, radius=0.2, max_neighbors=6).double()
        for block in model.blocks:
            block.recompute_mlp = recompute
        plans = model.build_plans(pos)
        shapes: list[tuple[int, ...]] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            y = model(x, pos, plans)
        y.sum().backward()
        per_point = [s[-1] if len(s) == 2 else 0 for s in shapes if s and s[0] == n]
        assert max(per_point) == widest, f"recompute_mlp={recompute}: {sorted(set(shapes))}"


def test_chunks_under_autocast_follow_the_one_pass_path() -> None:
    pos, x = uniform_cloud(200, 7), torch.randn(200, DIM)
    w = torch.randn(200, 5)
    grads = []
    for chunk in (0, 9 * K * DIM):
        m = _module(torch.float32, chunk=chunk)
        xx = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(xx, pos.float(), m.build_plan(pos))
        (y.float() * w).sum().backward()
        grads.append((y.float().detach(), xx.grad, m.kv.weight.grad))
    for a, b in zip(grads[0], grads[1], strict=True):
        assert a.dtype == b.dtype and torch.allclose(a.float(), b.float(), rtol=5e-2, atol=5e-2)


# --- shards ---------------------------------------------------------------------------------------


def _sharded(rank: int, world: int) -> str:
    torch.set_num_threads(1)
    for dtype in (torch.float64, torch.float32):
        for (pos, owner), radius in ((isolated_layout(world, 300, 100), 0.2), ((clustered_cloud()[:500], None), 0.05)):
            if owner is None:
                owner = (torch.argsort(torch.argsort(pos[:, 0])) * world // len(pos)).numpy()  # slabs along x
            spec = spec_from_owner(owner, rank, world)
            own = spec.global_ids
            pos = pos.to(dtype)
            g = torch.Generator().manual_seed(3)
            x = torch.randn(len(pos), DIM, generator=g, dtype=torch.float64).to(dtype)
            w = torch.randn(len(pos), 5, generator=g, dtype=torch.float64).to(dtype)
            ref = _module(dtype, radius, chunk=0)
            y_ref, gx_ref, gp_ref, gparams_ref = _run(ref, x, pos, w)
            m = _module(dtype, radius, chunk=4 * K * DIM)
            xs = ShardTensor.from_local(x[own].clone().requires_grad_(), spec)
            ps = ShardTensor.from_local(pos[own].clone().requires_grad_(), spec)
            y = m(xs, ps, m.build_plan(ShardTensor.from_local(pos[own], spec)))
            (y.to_local() * w[own]).sum().backward()
            what = f"R={world} {dtype}"
            assert_close(y.to_local().detach(), y_ref[own], dtype, f"forward {what}", cast=True)
            assert_close(xs.grad.to_local(), gx_ref[own], dtype, f"grad x {what}", cast=True)
            assert_close(ps.grad.to_local(), gp_ref[own], dtype, f"grad pos {what}", cast=True)
            for (name, q), q_ref in zip(m.named_parameters(), gparams_ref, strict=True):
                grad = q.grad.clone()
                dist.all_reduce(grad)
                assert_close(grad, q_ref, dtype, f"grad {name} {what}", cast=True)
    # the model: chunked blocks on shards equal the one-pass model on the whole cloud
    pos, owner = isolated_layout(world, 300, 100)
    spec = spec_from_owner(owner, rank, world)
    own = spec.global_ids
    x = torch.randn(len(pos), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(5)
    whole = BallAttentionNet(4, 2, width=8, layers=2, heads=2, radius=0.2, max_neighbors=6).double()
    sharded = copy.deepcopy(whole)
    for block in whole.blocks:
        block.attention.chunk_elements = 0
    for block in sharded.blocks:
        block.attention.chunk_elements = 5 * 6 * 8
    y_ref = whole(x, pos)
    y = sharded(ShardTensor.from_local(x[own], spec), ShardTensor.from_local(pos[own], spec))
    assert_close(y.to_local().detach(), y_ref.detach()[own], torch.float64, f"model R={world}")
    return "ok"


def test_chunks_on_shards_equal_the_whole_cloud() -> None:
    """3 ranks: uneven parts, an empty rank (isolated layout), a rank whose region touches no other."""
    assert run_ranks(_sharded, 3, timeout=180) == ["ok"] * 3
