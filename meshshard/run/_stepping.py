"""The rollout's loop, shared by ``predict --rollout``, validation in training and
:meth:`meshshard.run.TrainedRun.rollout`: a state applied to the model again and again.

Everything here works on the rows of one rank (the whole mesh on one process, or a shard's owned
rows): the task turns the state into the model's input and the model's output into the next
state (:meth:`~meshshard.tasks.TransientTask.rollout_input`, ``rollout_update``), so the state
never leaves its shard. Kept apart from ``_rollout`` (which writes files and imports the
prediction code) so that the training loop can use it without importing the prediction code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["roll_states", "validation_rollout"]


def roll_states(task: Any, normaliser: Any, forward: Callable[[Any], Any], state: Any, rows: Any, count: int,
                truth_of: Callable[[int], Any]) -> Iterator[tuple[int, Any, Any]]:
    """Yield ``(n, state, truth)`` for ``n = 0 .. count``: the state after ``n`` applications of
    ``forward`` (the model on this rank's rows; ``state`` at ``n = 0`` is the one given), in
    physical units, and ``truth_of(n)``: the known state at ``n`` (a tensor on the state's device
    and dtype, or ``None`` where it is unknown), which prescribes the boundary rows of step ``n``
    (held at their previous value where it is ``None``). ``truth_of`` is called once per ``n``, in
    order, before the step is computed. Runs without gradients."""
    import torch

    for n in range(count + 1):
        truth = truth_of(n)
        if n > 0:
            with torch.no_grad():
                out = forward(task.rollout_input(normaliser, state, rows))
                state = task.rollout_update(normaliser, state, out, rows, truth)
        yield n, state, truth


def validation_rollout(task: Any, reader: Any, trajectories: list[int], steps: int,
                       forward_of: Callable[[Any], Callable[[Any], Any]]) -> tuple[float, float]:
    """This rank's share of the validation rollout error: each of ``trajectories`` (of the
    transient ``reader``'s dataset) rolled out from its state at step 0 for ``min(steps, what it
    holds)`` applications, and the squared error of every interior row, state channel and step
    ``1 ..`` in the state's normalised units. Returns ``(sum, count)`` over this rank's rows; summed
    over the ranks, ``sqrt(sum / count)`` is the rollout RMSE of the whole meshes.

    ``forward_of(batch)``: the model on the graph of ``batch`` (the trajectory's pair at step 0 on
    this rank, :meth:`PairReader.sample`), taking and returning this rank's rows. Every rank of a
    domain group rolls the same trajectories out together (the model's collectives)."""
    import torch

    tr = reader.trajectories
    stride = tr.time_stride
    total, count = 0.0, 0.0
    for k in trajectories:
        b = reader.sample(int(reader.first[k]))
        ids = b.owned_ids
        rows = task.rollout_rows(tr, k, ids, reader.normaliser, b.state.device, b.state.dtype)
        interior = (~rows.boundary).cpu().numpy()
        state0 = torch.from_numpy(tr.state(k, 0, ids)).to(b.state.device, b.state.dtype)
        count_k = min(int(steps), (tr.num_steps(k) - 1) // stride)

        def truth_of(n: int, k: int = k, ids: np.ndarray = ids, like: Any = state0) -> Any:
            return torch.from_numpy(tr.state(k, n * stride, ids)).to(like.device, like.dtype)

        scale = reader.normaliser.state_scale().to(torch.float64).cpu().numpy()
        for n, state, truth in roll_states(task, reader.normaliser, forward_of(b), state0, rows, count_k, truth_of):
            if n == 0:
                continue
            err = ((state - truth).to(torch.float64).cpu().numpy() / scale)[interior]
            total += float((err**2).sum())
            count += float(err.size)
    return total, count
