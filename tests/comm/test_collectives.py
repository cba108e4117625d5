"""Collectives against the single-process computation, on 1, 2, 3 and 4 gloo ranks.

Each world size is one spawn that runs a battery of checks (spawning costs seconds on two cores).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from meshshard.comm import (
    HaloPlan,
    all_gather_v,
    all_to_all_v,
    append_halo,
    count_collectives,
    gather_v,
    indexed_all_to_all_v,
    scatter_v,
    set_debug,
    sum_of_parts,
)
from tests._dist import RankFailure, run_ranks
from tests._tolerance import assert_close
from tests.comm._plans import make_plan, reference_indexed


def _check_indexed(rank: int, world: int, dtype: torch.dtype, seed: int) -> None:
    plan = make_plan(world, seed, dtype)
    ref_out, ref_grad = reference_indexed(plan)
    x = plan.xs[rank].clone().requires_grad_(dtype.is_floating_point)
    out = indexed_all_to_all_v(x, plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank))
    _check_equal_rows(out, ref_out[rank], f"indexed forward {dtype}")
    if dtype.is_floating_point:
        (out * plan.weights[rank]).sum().backward()
        assert_close(x.grad, ref_grad[rank].to(dtype), dtype, f"indexed grad {dtype}", scale=1.0)


def _check_equal_rows(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    # A pure copy: the forward is bit-exact in every dtype.
    assert actual.dtype == expected.dtype and torch.equal(actual, expected), f"{what}: {actual} != {expected}"


def _check_indexed_dim1(rank: int, world: int) -> None:
    plan = make_plan(world, 11, torch.float64, row=(4,))
    ref_out, ref_grad = reference_indexed(plan)
    x = plan.xs[rank].T.contiguous().requires_grad_()  # (F, N): rows along dim 1
    out = indexed_all_to_all_v(x, plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank), dim=1)
    _check_equal_rows(out.T, ref_out[rank], "dim=1 forward")
    (out.T * plan.weights[rank]).sum().backward()
    assert_close(x.grad.T, ref_grad[rank], torch.float64, "dim=1 grad", scale=1.0)


def _check_adjoint(rank: int, world: int) -> None:
    """sum over ranks <A x, y> == sum over ranks <x, A^T y>, in float64."""
    plan = make_plan(world, 23, torch.float64, row=(2, 3))
    x = plan.xs[rank].clone().requires_grad_()
    y = plan.weights[rank]
    ax = indexed_all_to_all_v(x, plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank))
    (aty,) = torch.autograd.grad(ax, x, y)
    sums = torch.stack([(ax * y).sum(), (x * aty).sum()]).detach()
    if dist.is_initialized():
        dist.all_reduce(sums)
    lhs, rhs = sums.tolist()
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), f"adjoint: {lhs} != {rhs}"


def _check_half_accumulation(rank: int, world: int) -> None:
    """300 copies of one bfloat16 entry: accumulating in bfloat16 would stop at 256.

    One-dimensional on purpose: torch's CPU ``index_add_`` already widens 2-d bfloat16 rows.
    """
    counts = [300 if q == (rank + 1) % world else 0 for q in range(world)]
    recv = [300 if r == (rank - 1) % world else 0 for r in range(world)]
    x = torch.ones(2, dtype=torch.bfloat16, requires_grad=True)
    out = indexed_all_to_all_v(x, torch.zeros(300, dtype=torch.long), counts, recv)
    out.backward(torch.ones_like(out))
    assert x.grad[0].item() == 300.0 and x.grad[1].item() == 0.0, x.grad


def _check_all_to_all_v(rank: int, world: int, dtype: torch.dtype) -> None:
    plan = make_plan(world, 5, dtype)
    # rank r sends the rows xs[r][index[r][q]] as one contiguous block per destination
    blocks = [torch.cat(plan.index[r]) for r in range(world)]
    ref_out, ref_grad = reference_indexed(plan)
    x = plan.xs[rank][blocks[rank]].clone().requires_grad_(dtype.is_floating_point)
    out = all_to_all_v(x, plan.send_counts(rank), plan.recv_counts(rank))
    _check_equal_rows(out, ref_out[rank], f"all_to_all_v forward {dtype}")
    if dtype.is_floating_point:
        (out * plan.weights[rank]).sum().backward()
        # the gradient of the gathered block, scattered back, equals the indexed reference
        grad_rows = torch.zeros_like(plan.xs[rank], dtype=torch.float64).index_add_(0, blocks[rank], x.grad.double())
        assert_close(grad_rows, ref_grad[rank], dtype, f"all_to_all_v grad {dtype}", scale=1.0)


def _check_gathers(rank: int, world: int, dtype: torch.dtype) -> None:
    plan = make_plan(world, 7, dtype, row=(2,))
    counts = [len(x) for x in plan.xs]
    full = torch.cat(plan.xs)
    w = torch.randn(full.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    own = slice(sum(counts[:rank]), sum(counts[: rank + 1]))

    x = plan.xs[rank].clone().requires_grad_(True)
    out = all_gather_v(x, counts)
    _check_equal_rows(out, full, "all_gather_v forward")
    (out * w.to(dtype)).sum().backward()  # every rank's loss uses w: the gradient is world * w
    assert_close(x.grad, (world * w[own]).to(dtype), dtype, "all_gather_v grad", scale=1.0)

    dst = world - 1
    x = plan.xs[rank].clone().requires_grad_(True)
    out = gather_v(x, counts, dst=dst)
    expected = full if rank == dst else full[:0]
    _check_equal_rows(out, expected, "gather_v forward")
    (out * (w.to(dtype) if rank == dst else w[:0].to(dtype))).sum().backward()
    assert_close(x.grad, w[own].to(dtype), dtype, "gather_v grad", scale=1.0)

    src = 0
    x_src = full.clone().requires_grad_(True) if rank == src else None
    out = scatter_v(x_src, counts, src=src)
    _check_equal_rows(out, plan.xs[rank], "scatter_v forward")
    assert out.requires_grad, "scatter_v result on every rank requires grad when src's input does"
    (out * w[own].to(dtype)).sum().backward()
    if rank == src:
        assert_close(x_src.grad, w.to(dtype), dtype, "scatter_v grad", scale=1.0)


def _check_counter(rank: int, world: int) -> None:
    plan = make_plan(world, 13)
    x = plan.xs[rank].clone().requires_grad_()
    with count_collectives() as log:
        out = indexed_all_to_all_v(x, plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank))
        assert log.count(phase="forward") == 1 and log.count(phase="backward") == 0, log
        out.sum().backward()
    assert log.count("indexed_all_to_all_v", "forward") == 1, log
    assert log.count("indexed_all_to_all_v", "backward") == 1, log
    row = 3 * 8
    sent = sum(c for q, c in enumerate(plan.send_counts(rank)) if q != rank) * row
    assert log.bytes_sent(phase="forward") == sent, (log.calls, sent)


def _check_append_halo(rank: int, world: int, dtype: torch.dtype) -> None:
    """append_halo == cat([x, indexed_all_to_all_v(x)]) for a plan with no own part, forward and grad."""
    plan = make_plan(world, 17, dtype, row=(2, 3))
    for r in range(world):
        plan.index[r][r] = plan.index[r][r][:0]
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(len(plan.xs[q]) + sum(plan.recv_counts(q)), 2, 3, generator=g, dtype=torch.float64).to(dtype) for q in range(world)]
    ghosts = torch.cat([plan.xs[r][plan.index[r][rank]] for r in range(world)])
    x = plan.xs[rank].clone().requires_grad_()
    with count_collectives() as log:
        out = append_halo(x, plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank))
        (out * weights[rank]).sum().backward()
    assert (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward")) == (1, 1), log
    _check_equal_rows(out.detach(), torch.cat([plan.xs[rank], ghosts]), f"append_halo forward {dtype}")
    # reference gradient: the owned rows' own weights plus what the ghosts' weights send back
    xs = [xr.double().clone().requires_grad_() for xr in plan.xs]
    total = sum(
        (torch.cat([xs[q], torch.cat([xs[r][plan.index[r][q]] for r in range(world)])]) * weights[q].double()).sum()
        for q in range(world)
    )
    total.backward()
    assert_close(x.grad, xs[rank].grad.to(dtype), dtype, f"append_halo grad {dtype}", scale=1.0)


def _check_sum_to_owners(rank: int, world: int, dtype: torch.dtype) -> None:
    """HaloPlan.sum_to_owners against one process (ghost rows added at the rows they came from),
    its gradient (HaloPlan.append of the weights) and, in float64, the adjoint identity with append."""
    plan = make_plan(world, 19, dtype, row=(2, 3))
    for r in range(world):
        plan.index[r][r] = plan.index[r][r][:0]
    halo = HaloPlan.from_layout(plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank), num_owned=len(plan.xs[rank]))
    g = torch.Generator().manual_seed(9)
    ys = [torch.randn(len(plan.xs[q]) + sum(plan.recv_counts(q)), 2, 3, generator=g, dtype=torch.float64) for q in range(world)]
    ws = [torch.randn(len(plan.xs[q]), 2, 3, generator=g, dtype=torch.float64) for q in range(world)]
    y = ys[rank].to(dtype).requires_grad_()
    with count_collectives() as log:
        out = halo.sum_to_owners(y)
        (out * ws[rank].to(dtype)).sum().backward()
    assert (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward")) == (1, 1), log
    expected = ys[rank][: len(plan.xs[rank])].clone()
    for q in range(world):  # rank q's ghost rows from this rank, grouped by source rank
        start = len(plan.xs[q]) + sum(plan.recv_counts(q)[:rank])
        expected.index_add_(0, plan.index[rank][q], ys[q][start : start + len(plan.index[rank][q])])
    assert_close(out.detach(), expected.to(dtype), dtype, f"sum_to_owners forward {dtype}", scale=1.0)
    assert_close(y.grad, halo.append(ws[rank].to(dtype)), dtype, f"sum_to_owners grad {dtype}", scale=1.0)
    if dtype == torch.float64:  # sum over ranks <append(x), y> == sum over ranks <x, sum_to_owners(y)>
        x = ws[rank]
        sums = torch.stack([(halo.append(x) * ys[rank]).sum(), (x * halo.sum_to_owners(ys[rank])).sum()])
        if dist.is_initialized():
            dist.all_reduce(sums)
        lhs, rhs = sums.tolist()
        assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), f"sum_to_owners adjoint: {lhs} != {rhs}"


def _check_two_exchanges_one_graph(rank: int, world: int) -> None:
    """Two exchanges with the same plan in one graph, and a third after the backward: results and
    gradients are handed out on recycled memory, so none may be written over while still held (the
    first result while the second is made, the saved results in the backward, the gradient kept from
    one backward while the next exchange runs)."""
    plan = make_plan(world, 29, torch.float64, row=(3,))
    ref_out, ref_grad = reference_indexed(plan)
    args = (plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank))
    x = plan.xs[rank].clone().requires_grad_()
    first = indexed_all_to_all_v(x, *args)
    second = indexed_all_to_all_v(2 * x, *args)  # same plan, same shapes: the same sizes asked twice
    _check_equal_rows(first.detach(), ref_out[rank], "first of two exchanges")
    _check_equal_rows(second.detach(), 2 * ref_out[rank], "second of two exchanges")
    ((first * second) * plan.weights[rank]).sum().backward()  # each saved by the other's product
    # d/dx of sum w * A x * 2 A x = 4 A^T (w * A x)
    expected = 4 * _adjoint_of(plan, rank, [plan.weights[q] * ref_out[q] for q in range(world)])
    assert_close(x.grad, expected, torch.float64, "two exchanges in one graph: grad", scale=1.0)
    kept = x.grad.clone()
    third = indexed_all_to_all_v(x, *args)  # after the backward: x.grad is held, and must stay
    (third * plan.weights[rank]).sum().backward()
    assert_close(x.grad, kept + ref_grad[rank], torch.float64, "grad accumulated over a third exchange", scale=1.0)
    halo = make_plan(world, 31, torch.float64, row=(3,))
    for r in range(world):  # a halo plan: nothing to or from the rank itself
        halo.index[r][r] = halo.index[r][r][:0]
    args = (halo.send_index(rank), halo.send_counts(rank), halo.recv_counts(rank))
    y = halo.xs[rank].clone().requires_grad_()
    both, again = append_halo(y, *args), append_halo(y, *args)
    assert torch.equal(both.detach(), again.detach()), "two append_halo results of one plan"
    (both * again).sum().backward()
    assert_close(y.grad, 2 * _append_grad(y.detach(), args), torch.float64, "two append_halo grads", scale=1.0)


def _check_halo_linear(rank: int, world: int, dtype: torch.dtype) -> None:
    """HaloPlan.linear (the GEMM into a buffer with room for the ghosts) equals append(F.linear(...)):
    forward, and the gradients of x, the weight and the bias; with and without a bias, twice in one
    graph with the same plan."""
    plan = make_plan(world, 37, dtype, row=(4,))
    for r in range(world):
        plan.index[r][r] = plan.index[r][r][:0]
    halo = HaloPlan.from_layout(plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank),
                                num_owned=len(plan.xs[rank]))
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(5, 4, generator=g, dtype=torch.float64).to(dtype)
    b0 = torch.randn(5, generator=g, dtype=torch.float64).to(dtype)
    cot = torch.randn(len(plan.xs[rank]) + halo.num_ghost, 5, generator=torch.Generator().manual_seed(rank),
                      dtype=torch.float64).to(dtype)
    grads = []
    for fused in (True, False):
        x, w, b = (t.clone().requires_grad_() for t in (plan.xs[rank], w0, b0))
        with count_collectives() as log:
            if fused:
                y, z = halo.linear(x, w, b), halo.linear(x, w)
            else:
                y, z = halo.append(torch.nn.functional.linear(x, w, b)), halo.append(torch.nn.functional.linear(x, w))
            ((y + z.tanh()) * cot).sum().backward()
        counts = (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward"))
        assert counts == (2, 2), log
        grads.append((y.detach(), z.detach(), x.grad, w.grad, b.grad))
    for what, got, expected in zip(("y", "z", "x.grad", "w.grad", "b.grad"), *grads):
        assert_close(got, expected, dtype, f"HaloPlan.linear {what} {dtype}", scale=1.0)


def _check_append_without_copies(rank: int, world: int) -> None:
    """HaloPlan.append of rows made with room for the ghosts (empty_owned) writes the ghost rows after
    them (the result views x's memory) and equals the plain path, forward and gradient, with the
    gradient fresh (a layer's) or held by the caller (which stays unchanged); a second append while
    the first result lives copies instead; writing into the result in place is refused."""
    plan = make_plan(world, 23, torch.float64, row=(2, 3))
    for r in range(world):
        plan.index[r][r] = plan.index[r][r][:0]
    halo = HaloPlan.from_layout(plan.send_index(rank), plan.send_counts(rank), plan.recv_counts(rank),
                                num_owned=len(plan.xs[rank]))
    g = torch.Generator().manual_seed(13)
    weights = torch.randn(halo.num_owned + halo.num_ghost, 2, 3, generator=g, dtype=torch.float64)
    plain = plan.xs[rank].clone().requires_grad_()
    expected = halo.append(plain)
    (expected * weights).sum().backward()
    x = halo.empty_owned(2, 3, dtype=torch.float64)
    x.copy_(plan.xs[rank])
    x.requires_grad_()

    def memory(t: torch.Tensor) -> int:  # an empty rank's x has no data_ptr of its own
        return t.untyped_storage().data_ptr()

    out = halo.append(x)
    assert memory(out) == memory(x), "append of rows with room: the result is x's memory"
    again = halo.append(x)  # `out` still shows the ghost rows: this one is a copy
    assert memory(again) != memory(x), "a second append while the first result lives"
    _check_equal_rows(out.detach(), expected.detach(), "append of rows with room")
    _check_equal_rows(again.detach(), expected.detach(), "second append of rows with room")
    with pytest.raises(RuntimeError, match="view"):
        out.mul_(2)
    (out * weights).sum().backward()
    assert_close(x.grad, plain.grad, torch.float64, "append of rows with room: grad", scale=1.0)
    x.grad = None
    held = weights.clone()
    again.backward(held)  # the caller holds the gradient: added into a copy, never into `held`
    assert torch.equal(held, weights), "a gradient held by the caller was written into"
    assert_close(x.grad, plain.grad, torch.float64, "append, gradient held by the caller", scale=1.0)
    del out, again
    assert memory(halo.append(x)) == memory(x), "the room is used again once the results are gone"


def _adjoint_of(plan: object, rank: int, grads: list[torch.Tensor]) -> torch.Tensor:
    """A^T applied to every rank's gradient of its received rows, on one process (this rank's part)."""
    xs = [xr.clone().requires_grad_() for xr in plan.xs]
    world = len(xs)
    total = sum((torch.cat([xs[r][plan.index[r][q]] for r in range(world)]) * grads[q]).sum() for q in range(world))
    total.backward()
    return xs[rank].grad


def _append_grad(y: torch.Tensor, args: tuple) -> torch.Tensor:
    """Gradient of sum(append_halo(y)^2) / 2 through one append_halo, for comparison."""
    z = y.clone().requires_grad_()
    out = append_halo(z, *args)
    (out * out.detach()).sum().backward()
    return z.grad


def _check_zero_width_and_empty(rank: int, world: int) -> None:
    # rows with no features, and a plan where nobody sends anything
    x = torch.zeros(4, 0, requires_grad=True)
    idx = torch.tensor([0, 1, 3]) if world > 1 else torch.tensor([], dtype=torch.long)
    send = [0] * world
    recv = [0] * world
    if world > 1:
        send[(rank + 1) % world] = 3
        recv[(rank - 1) % world] = 3
    out = indexed_all_to_all_v(x, idx, send, recv)
    assert out.shape == (sum(recv), 0)
    out.sum().backward()
    nothing = all_to_all_v(torch.empty(0, 5), [0] * world, [0] * world)
    assert nothing.shape == (0, 5)


def _check_sum_of_parts(rank: int, world: int) -> None:
    """The sum of the ranks' parts on every rank; its backward, the sum of the ranks' gradients, is
    the adjoint (sum over ranks <A x, y> == sum over ranks <x, A^T y>), in float64."""
    parts = [torch.randn(3, 4, generator=torch.Generator().manual_seed(40 + r), dtype=torch.float64)
             for r in range(world)]
    ys = [torch.randn(3, 4, generator=torch.Generator().manual_seed(80 + r), dtype=torch.float64)
          for r in range(world)]
    x = parts[rank][:, ::2].clone().requires_grad_()  # any layout: a strided (3, 2) view's copy
    with count_collectives() as log:
        ax = sum_of_parts(x.T)  # (2, 3), not contiguous
        (aty,) = torch.autograd.grad(ax, x, ys[rank][:2, :3])
    assert (log.count("sum_of_parts", "forward"), log.count("sum_of_parts", "backward")) == (1, 1), log
    assert log.bytes_sent(phase="forward") == (6 * 8 if world > 1 else 0), log.calls
    assert_close(ax, sum(p[:, ::2] for p in parts).T, torch.float64, "sum_of_parts forward", scale=1.0)
    assert_close(aty, sum(y[:2, :3] for y in ys).T, torch.float64, "sum_of_parts backward", scale=1.0)
    sums = torch.stack([(ax * ys[rank][:2, :3]).sum(), (x * aty).sum()]).detach()
    if dist.is_initialized():
        dist.all_reduce(sums)
    lhs, rhs = sums.tolist()
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), f"sum_of_parts adjoint: {lhs} != {rhs}"


def _battery(rank: int, world: int) -> str:
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64):
        for seed in (0, 1):
            _check_indexed(rank, world, dtype, seed)
        _check_all_to_all_v(rank, world, dtype)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        _check_gathers(rank, world, dtype)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        _check_append_halo(rank, world, dtype)
        _check_sum_to_owners(rank, world, dtype)
        _check_halo_linear(rank, world, dtype)
    _check_indexed_dim1(rank, world)
    _check_adjoint(rank, world)
    _check_half_accumulation(rank, world)
    _check_counter(rank, world)
    _check_zero_width_and_empty(rank, world)
    _check_two_exchanges_one_graph(rank, world)
    _check_append_without_copies(rank, world)
    _check_sum_of_parts(rank, world)
    return "ok"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collectives_match_single_process(world: int) -> None:
    assert run_ranks(_battery, world) == ["ok"] * world


def test_world_of_one_needs_no_process_group() -> None:
    assert not dist.is_initialized()
    _battery(0, 1)


def _bad_counts_on_one_rank(rank: int, world: int) -> None:
    x = torch.randn(4, 2)
    if rank == 1:
        indexed_all_to_all_v(x, torch.tensor([0]), [1, 0, 0], [1, 0])  # three counts in a world of two
    else:  # rank 0 goes ahead and waits inside the collective
        indexed_all_to_all_v(x, torch.tensor([0]), [0, 1], [0, 1])


def test_one_rank_raising_fails_in_seconds_not_hanging() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"Expected 'send_counts' to have 2 entries, one per rank \(got 3") as info:
        run_ranks(_bad_counts_on_one_rank, 2, timeout=120)
    assert info.value.rank == 1
    assert time.monotonic() - start < 30, "a failing rank must stop the run well before the timeout"


def _mismatched_recv_counts(rank: int, world: int) -> str:
    set_debug(True)
    x = torch.randn(3, 2)
    recv = [1, 2] if rank == 0 else [1, 1]  # rank 1 sends rank 0 one row, rank 0 expects two
    try:
        indexed_all_to_all_v(x, torch.tensor([0, 1]), [1, 1], recv)
    except ValueError as err:
        return str(err)
    return "no error"


def test_debug_mode_reports_disagreeing_counts_on_every_rank() -> None:
    messages = run_ranks(_mismatched_recv_counts, 2)
    for m in messages:
        assert "rank 0 expects 2 rows from rank 1, which sends 1" in m, m


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: indexed_all_to_all_v(x, torch.tensor([0]), [1, 0], [1]), r"Expected 'send_counts' to have 1 entries"),
        (lambda x: indexed_all_to_all_v(x, torch.tensor([0]), [-1], [-1]), r"Expected 'send_counts' to be non-negative \(got \[-1\]\)"),
        (lambda x: indexed_all_to_all_v(x, torch.tensor([0, 1]), [1], [1]), r"Expected 'send_index' to have sum\(send_counts\) = 1 entries \(got 2\)"),
        (lambda x: indexed_all_to_all_v(x, torch.tensor([7]), [1], [1]), r"values in \[0, 4\).*\(got min 7, max 7\)"),
        (lambda x: indexed_all_to_all_v(x, torch.tensor([0.0]), [1], [1]), r"Expected 'send_index' to be a one-dimensional int64"),
        (lambda x: indexed_all_to_all_v(x, torch.tensor([0]), [1], [2]), r"send_counts\[0\] == recv_counts\[0\].*\(got 1 and 2\)"),
        (lambda x: indexed_all_to_all_v(x, torch.tensor([0]), [1], [1], dim=2), r"Expected 'dim' in \[-2, 2\) for a 2-d tensor \(got 2\)"),
        (lambda x: all_to_all_v(x, [3], [3]), r"Expected 'x' to have sum\(send_counts\) = 3 rows along dim 0 \(got 4\)"),
        (lambda x: all_gather_v(x, [5]), r"Expected 'x' to have counts\[0\] = 5 rows"),
        (lambda x: gather_v(x, [4], dst=1), r"Expected 'dst' to be a rank in \[0, 1\) \(got 1\)"),
        (lambda x: scatter_v(x, [1]), r"Expected 'x' on src to have sum\(counts\) = 1 rows"),
        (lambda x: all_gather_v(x, [4.5]), r"Expected 'counts' to hold whole numbers"),
        (lambda x: append_halo(x, torch.tensor([0]), [1], [1]), r"Expected a halo plan to send nothing to its own rank"),
    ],
)
def test_argument_errors_name_the_argument_and_values(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call(torch.randn(4, 3))


def test_non_tensor_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"Expected 'x' to be a torch.Tensor \(got list\)"):
        all_to_all_v([1, 2], [2], [2])  # type: ignore[arg-type]
