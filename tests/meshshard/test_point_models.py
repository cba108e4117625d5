"""The built-in point models on shards against one process on the whole cloud, on 1-4 gloo ranks.

``BallAttentionNet`` (two radii, taken in turn by its blocks) and ``Transolver``, each with and
without activation checkpointing, in float64: the output, the gradients of the inputs, of the
positions (ball attention: its relative-position encodings) and of every parameter (summed over
the ranks) equal those of the same model on the whole cloud to 1e-10 relative. Layouts: a uniform
cloud cut by METIS on its kNN graph (uneven parts) and by RCB, and a layout with an empty rank
(from 3 ranks on) and a rank whose region touches no other. One spawn per world size.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.distributed as dist

from meshshard import ShardSpec, ShardTensor
from meshshard.nn import BallAttentionNet, Transolver
from tests._dist import run_ranks
from tests._tolerance import assert_close
from tests.meshshard.test_ball_query_sharded import isolated_layout

RADII = [0.16, 0.25]


def _cloud(n: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _layout(name: str, world: int) -> tuple[torch.Tensor, np.ndarray]:
    """Positions and the owner of every point."""
    if name == "isolated":  # two blobs 10 apart; rank 1 owns nothing from 3 ranks on
        return isolated_layout(world, 400, 150)
    from meshshard.partition import partition_points

    pos = _cloud(500, 0)
    parts = partition_points(pos.numpy(), world, graph="knn", method=name)
    owner = np.zeros(len(pos), np.int64)
    for r, part in enumerate(parts):
        owner[np.asarray(part.owned_ids)] = r
    return pos, owner


def _model(kind: str, checkpoint: bool) -> torch.nn.Module:
    torch.manual_seed(3)
    if kind == "ball":
        return BallAttentionNet(5, 2, width=8, layers=3, heads=2, radius=RADII, max_neighbors=10, checkpoint=checkpoint)
    return Transolver(5, 2, width=8, layers=2, heads=2, slices=4, mlp_ratio=2, checkpoint=checkpoint)


def _check(rank: int, world: int, kind: str, layout: str, checkpoint: bool) -> None:
    pos_full, owner = _layout(layout, world)
    g = torch.Generator().manual_seed(7)
    x_full = torch.randn(len(pos_full), 5, generator=g, dtype=torch.float64)
    w_full = torch.randn(len(pos_full), 2, generator=g, dtype=torch.float64)
    ref = _model(kind, checkpoint).double()
    model = copy.deepcopy(ref)
    xr, pr = x_full.clone().requires_grad_(), pos_full.clone().requires_grad_()
    y_ref = ref(xr, pr) if kind == "ball" else ref(xr)
    (y_ref * w_full).sum().backward()

    own = np.nonzero(owner == rank)[0]
    spec = ShardSpec.from_counts(np.bincount(owner, minlength=world).tolist(), global_ids=own)
    x = ShardTensor.from_local(x_full[own].clone().requires_grad_(), spec)
    p = ShardTensor.from_local(pos_full[own].clone().requires_grad_(), spec)
    y = model(x, p) if kind == "ball" else model(x)
    (y * ShardTensor.from_local(w_full[own], spec)).sum().backward()

    what = f"{kind} R={world} {layout} checkpoint={checkpoint}"
    assert isinstance(y, ShardTensor) and y.spec == spec and y.shape == (len(own), 2), what
    assert_close(y.to_local().detach(), y_ref.detach()[own], torch.float64, f"output {what}")
    assert_close(x.grad.to_local(), xr.grad[own], torch.float64, f"input grad {what}")
    if kind == "ball":
        assert_close(p.grad.to_local(), pr.grad[own], torch.float64, f"position grad {what}")
    for (name, q), q_ref in zip(model.named_parameters(), ref.parameters(), strict=True):
        grad = q.grad.clone()
        if dist.is_initialized():
            dist.all_reduce(grad)  # replicated parameters: the domain group sums the ranks' parts
        assert_close(grad, q_ref.grad, torch.float64, f"grad of {name} {what}")


def _battery(rank: int, world: int) -> str:
    torch.set_num_threads(1)
    for kind in ("ball", "transolver"):
        _check(rank, world, kind, "metis", checkpoint=False)
        _check(rank, world, kind, "isolated", checkpoint=True)  # from R = 3: an empty rank
        if world in (2, 4):
            _check(rank, world, kind, "rcb", checkpoint=world == 4)
    return "ok"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_point_models_on_shards_equal_whole_cloud(world: int) -> None:
    assert run_ranks(_battery, world, timeout=240) == ["ok"] * world


def test_checkpointing_changes_nothing_on_one_process() -> None:
    """Checkpointed blocks, and blocks whose MLP is recomputed in the backward (the default), give
    the same output and gradients as kept activations, and the plans of both radii serve the
    blocks in turn."""
    pos = _cloud(300, 5).requires_grad_()
    x = torch.randn(300, 5, dtype=torch.float64)
    grads = []
    for checkpoint, recompute_mlp in ((False, False), (False, True), (True, True)):
        model = _model("ball", checkpoint).double()
        for block in model.blocks:
            block.recompute_mlp = recompute_mlp
        pos.grad = None
        model(x, pos).square().sum().backward()
        grads.append((pos.grad.clone(), [q.grad.clone() for q in model.parameters()]))
    assert [b.attention.radius for b in _model("ball", False).blocks] == [RADII[0], RADII[1], RADII[0]]
    for got, what in zip(grads[1:], ("MLP recomputed", "checkpointed")):
        assert_close(got[0], grads[0][0], torch.float64, f"position grad, {what}")
        for a, b in zip(got[1], grads[0][1], strict=True):
            assert_close(a, b, torch.float64, f"parameter grad, {what}")


def test_bad_positions_are_refused_in_one_line() -> None:
    model = _model("ball", False).double()
    with pytest.raises(ValueError, match=r"Expected 'pos' to have shape \(4, 3\)"):
        model(torch.zeros(4, 5, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64))
