"""Seeded global exchange plans, identical on every rank, and their single-process references.

Every rank builds the whole plan (all ranks' inputs and index lists) from the same seed, runs the
collective on its own part, and compares with the single-process computation on the whole input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Plan:
    xs: list[Tensor]  # rank r's input rows
    index: list[list[Tensor]]  # index[r][q]: rows of xs[r] that r sends to q (duplicates allowed)
    weights: list[Tensor]  # weights[q]: cotangent for what q receives

    @property
    def world_size(self) -> int:
        return len(self.xs)

    def send_index(self, r: int) -> Tensor:
        return torch.cat(self.index[r])

    def send_counts(self, r: int) -> list[int]:
        return [len(i) for i in self.index[r]]

    def recv_counts(self, q: int) -> list[int]:
        return [len(self.index[r][q]) for r in range(self.world_size)]


def make_plan(world: int, seed: int, dtype: torch.dtype = torch.float64, row: tuple[int, ...] = (3,), max_count: int = 5) -> Plan:
    """Uneven rows per rank; rank 1 is empty when ``world >= 3``; duplicate indices; some zero counts."""
    g = torch.Generator().manual_seed(seed)
    sizes = [int(torch.randint(1, 8, (1,), generator=g)) for _ in range(world)]
    if world >= 3:
        sizes[1] = 0
    xs = [_random((n, *row), dtype, g) for n in sizes]
    index = [
        [
            torch.randint(0, max(n, 1), (int(torch.randint(0, max_count + 1, (1,), generator=g)) if n else 0,), generator=g)
            for _ in range(world)
        ]
        for n in sizes
    ]
    plan = Plan(xs, index, [])
    plan.weights = [_random((sum(plan.recv_counts(q)), *row), dtype, g) for q in range(world)]
    return plan


def _random(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g).to(dtype)


def reference_indexed(plan: Plan) -> tuple[list[Tensor], list[Tensor | None]]:
    """Outputs of every rank and the gradients of sum_q <out_q, weights_q>, on one process."""
    xs = [x.clone().requires_grad_(x.dtype.is_floating_point) for x in plan.xs]
    outs = [torch.cat([xs[r][plan.index[r][q]] for r in range(plan.world_size)]) for q in range(plan.world_size)]
    if plan.xs[0].dtype.is_floating_point:
        acc = [x.detach().double().requires_grad_() for x in xs]
        outs64 = [torch.cat([acc[r][plan.index[r][q]] for r in range(plan.world_size)]) for q in range(plan.world_size)]
        sum((o * w.double()).sum() for o, w in zip(outs64, plan.weights)).backward()
        return [o.detach() for o in outs], [a.grad for a in acc]
    return [o.detach() for o in outs], [None] * plan.world_size
