"""``HaloPlan`` in a world of one: its local checks and its exchange path (the checks across
ranks run in tests/meshshard/test_plan_checks.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard.comm import HaloPlan, count_collectives


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0], [1], [0]), r"Expected send_counts\[0\] = 0 on rank 0: a halo plan sends nothing to itself \(got 1\)"),
        (([], [0], [2]), r"Expected recv_counts\[0\] = 0 on rank 0: a halo plan receives nothing from itself \(got 2\)"),
        (([], [0, 0], [0]), r"Expected 'send_counts' to have 1 entries, one per rank \(got 2"),
        (([], [-1], [0]), r"Expected 'send_counts' to be non-negative"),
        (([0.5], [0], [0]), r"Expected 'send_index' to be a one-dimensional integer array \(got shape \(1,\), dtype torch.float64\)"),
        ((np.zeros((1, 1), np.int64), [0], [0]), r"Expected 'send_index' to be a one-dimensional integer array \(got shape \(1, 1\)"),
        (([0], [0], [0]), r"Expected 'send_index' to have sum\(send_counts\) = 0 entries \(got 1\)"),
    ],
)
def test_local_problems_name_the_argument(args, message) -> None:
    with pytest.raises(ValueError, match=r"^Expected a valid halo plan on every rank \(got, on rank 0: " + message):
        HaloPlan.build(*args, num_owned=3)


def test_a_caller_problem_and_owned_counts() -> None:
    with pytest.raises(TypeError, match=r"on rank 0: wrong part\)$"):
        HaloPlan.build([], [0], [0], num_owned=3, problem=TypeError("wrong part"))
    with pytest.raises(ValueError, match=r"agree \(got: rank 0 has owned_counts \[4\], but the ranks own \[3\]\)$"):
        HaloPlan.build([], [0], [0], num_owned=3, owned_counts=[4])
    with pytest.raises(ValueError, match=r"agree \(got: rank 0 has owned_counts of the wrong length\)$"):
        HaloPlan.build([], [0], [0], num_owned=3, owned_counts=[3, 0])


def test_world_of_one_plan_exchanges_nothing() -> None:
    with count_collectives() as log:
        plan = HaloPlan.build(np.zeros(0, np.int64), [0], [0], num_owned=3, owned_counts=[3])
    assert log.count("all_gather_v") == 1 and repr(plan) == "HaloPlan(rank=0/1, owned=3, sent=0, ghosts=0)"
    x = torch.randn(3, 2, requires_grad=True)
    assert torch.equal(plan.append(x), x) and plan.exchange(x).shape == (0, 2)
    assert plan.index_on("cpu") is plan.index_on(torch.device("cpu"))  # cached per device
    with pytest.raises(ValueError, match=r"Expected 'x' to have 3 rows, the owned rows of the plan \(got shape \(2, 2\)\)"):
        plan.append(x[:2])
    assert torch.equal(plan.sum_to_owners(x), x)
    with pytest.raises(ValueError, match=r"Expected 'x' to have 3 rows, the owned then the ghost rows of the plan \(got shape \(2, 2\)\)"):
        plan.sum_to_owners(x[:2])
    learned = HaloPlan.from_send_counts(torch.zeros(0, dtype=torch.int32), [0], num_owned=0)
    assert learned.recv_counts == (0,) and learned.send_index.dtype == torch.int64
