"""ShardTensor against the single-process computation on the whole tensor, on 1-4 gloo ranks.

Partitions of real meshes (../shared/data/sfepy/big.mesh, 2-D, SfePy, BSD-3-Clause; a generated
triangle mesh when that is missing, see tests/_meshes.py) by METIS, and
a layout with an empty rank and a rank without ghosts. Every check compares forward values and
gradients with the whole-tensor computation: 1e-10 relative in float64, 1e-5 in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshshard import ShardSpec, ShardTensor, register_rowwise
from meshshard.comm import count_collectives
from tests._dist import run_ranks
from tests._meshes import mesh_case
from tests._tolerance import assert_close

MESH = "sfepy/big.mesh"


def _global(n: int, shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _l2g(p) -> torch.Tensor:
    return torch.as_tensor(p.local_to_global)


def _check_with_halo(case, rank, dtype):
    world = len(case.parts)
    spec = ShardSpec.from_partition(case.parts[rank])
    x_full = _global(case.num_nodes, (3, 2), 1, dtype)
    x = ShardTensor.from_local(x_full[spec.global_ids].clone().requires_grad_(), spec)
    with count_collectives() as log:
        halo = x.with_halo()
        w = _global(case.num_nodes, (3, 2), 2, dtype)[_l2g(case.parts[rank])] * (rank + 1)
        (halo * w).sum().backward()
    assert (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward")) == (1, 1), log
    assert log.count() == 2, log
    assert_close(halo.detach(), x_full[_l2g(case.parts[rank])], dtype, "with_halo forward", scale=1.0, cast=True)
    # the single-process computation: L = sum_r <X[l2g_r], W[l2g_r] (r + 1)>
    x_ref = x_full.double().clone().requires_grad_()
    w_full = _global(case.num_nodes, (3, 2), 2, torch.float64)
    sum(((x_ref[_l2g(p)] * w_full[_l2g(p)] * (r + 1)).sum() for r, p in enumerate(case.parts))).backward()
    assert_close(x.grad.to_local(), x_ref.grad[spec.global_ids], dtype, "with_halo grad", scale=1.0, cast=True)
    assert world == spec.world_size


def _check_gathers(case, rank, dtype):
    world = len(case.parts)
    spec = ShardSpec.from_partition(case.parts[rank])
    n = case.num_nodes
    x_full = _global(n, (4,), 3, dtype)
    w = _global(n, (4,), 4, dtype)
    own = spec.global_ids

    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
    full = x.full_tensor()
    assert_close(full.detach(), x_full, dtype, "full_tensor forward", scale=1.0, cast=True)
    (full * w).sum().backward()  # the same replicated loss on every rank
    assert_close(x.grad.to_local(), w[own], dtype, "full_tensor grad", scale=1.0, cast=True)

    dst = world - 1
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
    out = x.gather(dst)
    if rank == dst:
        assert_close(out.detach(), x_full, dtype, "gather forward", scale=1.0, cast=True)
        (out * w).sum().backward()
    else:
        assert out.shape[0] == 0
        out.sum().backward()
    assert_close(x.grad.to_local(), w[own], dtype, "gather grad", scale=1.0, cast=True)

    src = 0
    full_src = x_full.clone().requires_grad_() if rank == src else None
    y = ShardTensor.scatter_tensor(full_src, spec, src=src)
    assert_close(y.to_local().detach(), x_full[own], dtype, "scatter_tensor forward", scale=1.0, cast=True)
    (y.to_local() * w[own]).sum().backward()
    if rank == src:
        assert_close(full_src.grad, w, dtype, "scatter_tensor grad", scale=1.0, cast=True)

    # chunked (how data arrives) -> METIS layout -> chunked, one exchange each way
    chunked = ShardSpec.chunked(n)
    lo = sum(chunked.owned_counts[:rank])
    c = ShardTensor.from_local(x_full[lo : lo + chunked.num_owned].clone().requires_grad_(), chunked)
    with count_collectives() as log:
        m = c.redistribute(spec)
    assert_close(m.to_local().detach(), x_full[own], dtype, "redistribute forward", scale=1.0, cast=True)
    with count_collectives() as log:
        back = m.redistribute(chunked)
        (back.to_local() * w[lo : lo + chunked.num_owned]).sum().backward()
    assert (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward")) == (1, 2), log
    assert_close(back.to_local().detach(), x_full[lo : lo + chunked.num_owned], dtype, "redistribute round trip", scale=1.0, cast=True)
    assert_close(c.grad.to_local(), w[lo : lo + chunked.num_owned], dtype, "redistribute grad", scale=1.0, cast=True)


def _check_reductions_and_training_loss(case, rank, dtype):
    spec = ShardSpec.from_partition(case.parts[rank])
    n = case.num_nodes
    x_full = _global(n, (5,), 5, dtype)
    target_full = _global(n, (3,), 6, dtype)
    own = spec.global_ids
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3).to(dtype)
    norm = torch.nn.LayerNorm(6).to(dtype)
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)

    assert_close(x.sum().detach(), x_full.sum(), dtype, "sum()", scale=1.0, cast=True)
    assert_close(x.sum(0).detach(), x_full.sum(0), dtype, "sum(0)", scale=1.0, cast=True)
    assert_close(x.mean().detach(), x_full.mean(), dtype, "mean()", scale=1.0, cast=True)
    assert_close(x.mean(0).detach(), x_full.mean(0), dtype, "mean(0)", scale=1.0, cast=True)
    assert_close(x.sum(1).to_local().detach(), x_full[own].sum(1), dtype, "row-wise sum(1)", scale=1.0, cast=True)

    # a training loss from row-wise ops and a global mean
    h = torch.relu(lin(x)) * 2.0 - 0.5
    h = norm(torch.cat([h, -h / 3], dim=1))
    loss = ((F.linear(h, torch.eye(3, 6, dtype=dtype)) - ShardTensor.from_local(target_full[own], spec)) ** 2).mean()
    loss.backward()
    grads = [p.grad.clone() for p in (*lin.parameters(), *norm.parameters())]
    for g in grads:  # parameters are replicated: their gradients add up over the ranks
        if dist.is_initialized():
            dist.all_reduce(g)

    lin_ref, norm_ref = _copy(lin), _copy(norm)
    xr = x_full.clone().requires_grad_()
    hr = torch.relu(lin_ref(xr)) * 2.0 - 0.5
    hr = norm_ref(torch.cat([hr, -hr / 3], dim=1))
    loss_ref = ((F.linear(hr, torch.eye(3, 6, dtype=dtype)) - target_full) ** 2).mean()
    loss_ref.backward()
    assert_close(loss.detach(), loss_ref.detach(), dtype, "training loss", scale=1.0, cast=True)
    assert_close(x.grad.to_local(), xr.grad[own], dtype, "input grad", scale=1.0, cast=True)
    for g, p in zip(grads, (*lin_ref.parameters(), *norm_ref.parameters())):
        assert_close(g, p.grad, dtype, "parameter grad", scale=1.0, cast=True)


def _copy(module):
    import copy

    return copy.deepcopy(module)


def _check_dtensor(case, rank):
    from torch.distributed.tensor import Shard

    spec = ShardSpec.from_partition(case.parts[rank])
    n = case.num_nodes
    x_full = _global(n, (2,), 7, torch.float64)
    x = ShardTensor.from_local(x_full[spec.global_ids].clone().requires_grad_(), spec)
    with pytest.raises(ValueError, match=r"DTensor's Shard\(0\) holds torch.chunk-sized contiguous rows"):
        x.to_dtensor()
    dt = x.redistribute(ShardSpec.chunked(n)).to_dtensor()
    assert dt.placements == (Shard(0),) and tuple(dt.shape) == (n, 2)
    assert_close(dt.full_tensor().detach(), x_full, torch.float64, "to_dtensor", scale=1.0, cast=True)
    back = ShardTensor.from_dtensor(dt, spec)
    assert_close(back.to_local().detach(), x_full[spec.global_ids], torch.float64, "from_dtensor", scale=1.0, cast=True)
    (back.to_local() * 3).sum().backward()
    assert_close(x.grad.to_local(), torch.full_like(x_full[spec.global_ids], 3.0), torch.float64, "dtensor round-trip grad", scale=1.0, cast=True)
    rep = ShardTensor.from_dtensor(x.to_dtensor("replicate"), spec)
    assert_close(rep.to_local().detach(), x_full[spec.global_ids], torch.float64, "replicate round trip", scale=1.0, cast=True)


def _check_errors(case, rank):
    spec = ShardSpec.from_partition(case.parts[rank])
    with pytest.raises(ValueError, match=rf"Expected 'local' to have spec.num_owned = {spec.num_owned} rows on rank {rank} \(got {spec.num_owned + 1} rows\)"):
        ShardTensor.from_local(torch.zeros(spec.num_owned + 1, 2), spec)
    other = ShardSpec.chunked(spec.num_nodes)
    a = ShardTensor.from_local(torch.zeros(spec.num_owned, 2), spec)
    b = ShardTensor.from_local(torch.zeros(other.num_owned, 2), other)
    if spec.world_size > 1:
        with pytest.raises(ValueError, match=r"ShardTensors of different layouts mixed"):
            a + b
    with pytest.raises(TypeError, match=r"index_select is not a row-wise operation .* use with_halo\(\)"):
        torch.index_select(a, 0, torch.tensor([0]))
    with pytest.raises(TypeError, match=r"use ShardTensor.sum\(\)"):
        torch.sum(a)
    with pytest.raises(ValueError, match=r"has no halo plan"):
        b.with_halo()
    with pytest.raises(TypeError, match=r"torch.cat along the node dimension changes the layout"):
        torch.cat([a, a], dim=0)
    with pytest.raises(TypeError, match=r"linear: only the input may be a ShardTensor"):
        F.linear(torch.zeros(3, 2), a)


@register_rowwise
def _swish(t):
    return t * torch.sigmoid(1.5 * t)


# every row-wise operation: the same code runs on a ShardTensor and on the whole tensor
_W = torch.randn(6, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
_ROWWISE = {
    "matmul by a weight": lambda t: (t @ _W) + torch.matmul(t, _W[:, 0]).unsqueeze(1) + t.matmul(_W),
    "comparisons": lambda t: torch.where(t > 0, t, 0.5 * t) + (t >= 0.1).double() * t + (t < -0.2).double()
    + torch.gt(t, 0.3).double() + torch.le(t, 0.0).double() * t + (t == t).double() + torch.ne(t, 0.5).double(),
    "logic": lambda t: torch.logical_and(t > 0, t < 1).double() * t + torch.logical_not(t > 0).double()
    + ((t > 0) & (t < 1) | (t < -1)).double() + torch.logical_or(t > 2, t < -2).double() + torch.logical_xor(t > 0, t > 1).double(),
    "rounding": lambda t: torch.sign(t) * t.abs() + torch.floor(t) + t.ceil() + torch.round(3 * t) / 3 + t.sign(),
    "finite": lambda t: torch.where(torch.isfinite(t) & ~torch.isnan(t) & ~t.isinf(), t, 0.0),
    "dropout (eval, p=0)": lambda t: F.dropout(t, 0.5, training=False) + torch.nn.Dropout(0.0)(t) + F.dropout(t, 0.0),
    "softmax": lambda t: F.softmax(t, dim=-1) + F.log_softmax(t, -1) + F.normalize(t, dim=-1) + t.softmax(1) + torch.softmax(t, dim=1),
    "feature sums": lambda t: t.sum(dim=1) + t.mean(-1) + t.norm(dim=-1) + t.amax(-1) + torch.logsumexp(t, -1) + t.sum((1,)),
    "feature keepdim": lambda t: t / t.sum(dim=-1, keepdim=True).abs() + t.mean(1, keepdim=True),
    "feature max": lambda t: t.max(dim=1).values + torch.min(t, dim=-1)[0],
    "indexing": lambda t: torch.cat([t[:, :3], t[..., 0:1], t[:, [5, 1]], t[..., -1][:, None]], dim=1),
    "reshaping": lambda t: t.view(t.shape[0], 2, 3).sum(-1) + t.reshape(-1, 3, 2).flatten(1)[:, :2] + t.unsqueeze(-1).squeeze(-1)[:, 1:3],
    "permute": lambda t: t.view(t.shape[0], 2, 3).transpose(1, 2).permute(0, 2, 1).reshape(t.shape[0], 6),
    "methods": lambda t: t.relu() + t.clone().sigmoid() + t.tanh() + t.exp() / 10 + t.to(torch.float64) + t.float().double() + t.clamp(-1, 1),
    "register_rowwise": lambda t: _swish(t) + torch.erf(t),
    # global statistics used on each rank's rows: the gradient parts are summed over the ranks
    "global statistics": lambda t: (t - t.mean(0, keepdim=True)) * t.square().sum().rsqrt() + t.sum(0) * t.mean() / 1000,
}


def _check_rowwise_ops(case, rank):
    spec = ShardSpec.from_partition(case.parts[rank])
    n, own, dt = case.num_nodes, spec.global_ids, torch.float64
    x_full = _global(n, (6,), 8, dt)
    register_rowwise(torch.erf)
    for what, op in _ROWWISE.items():
        x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
        y = op(x)
        assert isinstance(y, ShardTensor) and y.spec == spec, what
        xr = x_full.clone().requires_grad_()
        yr = op(xr)
        w = torch.randn(yr.shape, generator=torch.Generator().manual_seed(3), dtype=dt)
        (y * ShardTensor.from_local(w[own], spec)).sum().backward()
        (yr * w).sum().backward()
        assert_close(y.to_local().detach(), yr.detach()[own], dt, f"{what} forward", scale=1.0, cast=True)
        assert_close(x.grad.to_local(), xr.grad[own], dt, f"{what} grad", scale=1.0, cast=True)

    # properties and methods a model reads
    x = ShardTensor.from_local(x_full[own].clone(), spec)
    assert (x.shape, x.dtype, x.device, x.requires_grad, x.grad) == (torch.Size((spec.num_owned, 6)), dt, torch.device("cpu"), False, None)
    assert x.requires_grad_().requires_grad and not x.detach().requires_grad and x.float().dtype == torch.float32
    # a masked count and consecutive global reductions
    assert int((x > 0).sum()) == int((x_full > 0).sum())
    assert int(((x > 0) & (x < 1)).sum(0).sum()) == int(((x_full > 0) & (x_full < 1)).sum())
    loss = x.sum() * (x ** 2).mean() + x.mean(0).sum() + (x.relu().sum(dim=1) > 1).sum() * x.norm(dim=-1).mean()
    loss = loss + ((x - x.mean(0)) ** 2).mean() * x.mean(0).square().sum()  # both uses of one statistic
    xr = x_full.clone().requires_grad_()
    loss_ref = xr.sum() * (xr ** 2).mean() + xr.mean(0).sum() + (xr.relu().sum(dim=1) > 1).sum() * xr.norm(dim=-1).mean()
    loss_ref = loss_ref + ((xr - xr.mean(0)) ** 2).mean() * xr.mean(0).square().sum()
    loss.backward()
    loss_ref.backward()
    assert_close(loss.detach(), loss_ref.detach(), dt, "consecutive reductions", scale=1.0, cast=True)
    assert_close(x.grad.to_local(), xr.grad[own], dt, "consecutive reductions grad", scale=1.0, cast=True)
    # dropout in training: each rank's own mask; kept entries scaled by 1 / (1 - p)
    torch.manual_seed(rank)
    d = torch.nn.Dropout(0.5)(x).to_local()
    assert torch.all((d == 0) | torch.isclose(d, 2 * x.to_local()))

    # what mixes rows is still refused, naming what to use
    with pytest.raises(TypeError, match=r"indexing the node dimension \(0\) of a ShardTensor \(got \[0, ...\]\) .* x.to_local\(\)\[...\]"):
        x[0]
    with pytest.raises(TypeError, match=r"indexing the node dimension .* \(got \[Tensor, ...\]\)"):
        x[x.to_local()[:, 0] > 0]
    with pytest.raises(TypeError, match=r"view to \(\d+,\) would change the node dimension .* keep dimension 0"):
        x.view(-1)
    with pytest.raises(TypeError, match=r"matmul is not a row-wise operation .* use x @ W with the ShardTensor x on the left"):
        torch.ones(2, spec.num_owned, dtype=dt) @ x
    with pytest.raises(TypeError, match=r"softmax over the node dimension \(0\) mixes rows .* use a feature dimension"):
        F.softmax(x, dim=0)
    with pytest.raises(TypeError, match=r"norm over every dimension mixes rows .* is exact on shards inside meshshard.nn.ShardNorm\)$"):
        x.norm()
    with pytest.raises(TypeError, match=r"flatten would move or merge the node dimension"):
        x.flatten()
    with pytest.raises(TypeError, match=r"index_select is not a row-wise operation .* use with_halo\(\)"):
        x.index_select(0, torch.tensor([0]))
    with pytest.raises(TypeError, match=r"the truth value of a ShardTensor is ambiguous"):
        bool(x > 0)


def _check_batch_norm(case, rank):
    """BatchNorm1d in training: statistics over every node of every rank, running stats included."""
    spec = ShardSpec.from_partition(case.parts[rank])
    x_full = _global(case.num_nodes, (4,), 9, torch.float64)
    torch.manual_seed(0)
    bn_ref = torch.nn.BatchNorm1d(4).double()
    bn = _copy(bn_ref)
    w = _global(case.num_nodes, (4,), 10, torch.float64)
    for _ in range(2):
        x = ShardTensor.from_local(x_full[spec.global_ids].clone().requires_grad_(), spec)
        xr = x_full.clone().requires_grad_()
        (bn(x) * ShardTensor.from_local(w[spec.global_ids], spec)).sum().backward()
        (bn_ref(xr) * w).sum().backward()
    assert_close(x.grad.to_local(), xr.grad[spec.global_ids], torch.float64, "batch_norm input grad", scale=1.0, cast=True)
    for name in ("running_mean", "running_var"):
        assert_close(getattr(bn, name), getattr(bn_ref, name), torch.float64, f"batch_norm {name}", scale=1.0, cast=True)
    for p, p_ref in zip(bn.parameters(), bn_ref.parameters()):
        g = p.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(g)
        assert_close(g, p_ref.grad, torch.float64, "batch_norm parameter grad", scale=1.0, cast=True)


def _battery(rank: int, world: int, layout: str) -> str:
    case = mesh_case(MESH, world, layout)
    for dtype in (torch.float64, torch.float32):
        _check_with_halo(case, rank, dtype)
        _check_gathers(case, rank, dtype)
        _check_reductions_and_training_loss(case, rank, dtype)
    _check_dtensor(case, rank)
    _check_errors(case, rank)
    _check_rowwise_ops(case, rank)
    _check_batch_norm(case, rank)
    return "ok"


LAYOUTS = ("metis", "special")


def _batteries(rank: int, world: int, layouts: tuple[str, ...]) -> str:
    """:func:`_battery` for each layout in turn, in one process group; a failure names its layout."""
    for layout in layouts:
        try:
            _battery(rank, world, layout)
        except Exception as err:
            raise AssertionError(f"layout {layout!r}: {err}") from err
    return "ok"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_tensor_matches_whole_tensor(world: int) -> None:
    """Every layout on one spawn of ``world`` ranks (a spawn costs seconds; the checks, less)."""
    for layout in LAYOUTS:
        mesh_case(MESH, world, layout)  # fails here, not in the ranks, if the mesh cannot be built
    assert run_ranks(_batteries, world, LAYOUTS, timeout=180) == ["ok"] * world


def test_spec_needs_a_partition_of_the_group_size() -> None:
    case = mesh_case(MESH, 2)
    with pytest.raises(ValueError, match=r"Expected a partition into 1 part for a group of 1 rank \(got 2 parts\); run one "
                                         r"process per part: torchrun --nproc-per-node 2 SCRIPT"):
        ShardSpec.from_partition(case.parts[0])


def test_spec_equality_means_same_layout() -> None:
    a = ShardSpec.from_partition(mesh_case(MESH, 1).parts[0])
    assert a == ShardSpec.from_partition(mesh_case(MESH, 1).parts[0])
    assert a != ShardSpec.from_counts([a.num_nodes]) and hash(a) == hash(ShardSpec.from_partition(mesh_case(MESH, 1).parts[0]))
    n = mesh_case(MESH, 1).num_nodes  # 2885 on the real mesh; its stand-in has fewer
    assert repr(a).startswith(f"ShardSpec(rank=0/1, owned={n}/{n}, ghosts=0")


def test_splitting_stacking_and_like_along_features_are_row_wise() -> None:
    """chunk / split / tensor_split / unbind / stack along features and zeros_like and its kin keep
    the rows (JumpingKnowledge and similar models use them); along the node dimension they are refused."""
    spec = ShardSpec.chunked(6)
    local = torch.arange(36.0).reshape(6, 6).requires_grad_()
    x = ShardTensor.from_local(local, spec)
    a, b = x.chunk(2, dim=1)
    assert isinstance(a, ShardTensor) and torch.equal(a.to_local(), local[:, :3]) and torch.equal(b.to_local(), local[:, 3:])
    assert [t.to_local().shape[1] for t in torch.split(x, [2, 4], dim=-1)] == [2, 4]
    assert [t.to_local().shape[1] for t in x.tensor_split(3, dim=1)] == [2, 2, 2]
    assert len(x.unbind(1)) == 6 and torch.equal(x.unbind(dim=1)[2].to_local(), local[:, 2])
    s = torch.stack([a, b], dim=1)
    assert isinstance(s, ShardTensor) and s.to_local().shape == (6, 2, 3)
    (s.to_local() * 2).sum().backward()
    assert torch.equal(local.grad, torch.full((6, 6), 2.0))  # the gradient flows through to the rows
    for like in (torch.zeros_like(x), torch.ones_like(x), torch.full_like(x, 3.0), torch.empty_like(x)):
        assert isinstance(like, ShardTensor) and like.to_local().shape == (6, 6) and like.spec == spec
    for refused in (lambda: x.chunk(2), lambda: torch.split(x, 3, dim=0), lambda: x.unbind(0),
                    lambda: torch.stack([x, x])):
        with pytest.raises(TypeError, match="along the node dimension"):
            refused()
