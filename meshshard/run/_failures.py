"""What a failed training step says, and the checks that find it: a peer rank that died (a
collective raised), the model's own error, a sample that could not be read, and non-finite data,
loss or gradients, agreed on by every rank in one all-reduce (:func:`local_flags`,
:func:`check_finite`), so that all ranks stop after the same step with the same one-line reason
and what is left to resume from."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshshard.comm import is_peer_failure

from ._checkpoint import load_checkpoint
from ._recipe import first_line, shard_hint

__all__ = ["NonFiniteLoss", "PeerFailure", "SampleReadError", "check_finite", "describe_checkpoint", "local_flags",
           "maybe_fail", "non_finite_row", "peer_failure", "step_failure"]


class PeerFailure(RuntimeError):
    """A collective failed during training: a peer rank died or stopped responding."""


def describe_checkpoint(path: Path) -> str:
    """What a failed run leaves to resume from; never raises (the failure being reported comes first)."""
    if not path.exists():
        return "none yet; rerun with --force to start over."
    try:
        return f"{path} (step {load_checkpoint(path)['step']}); rerun with --resume."
    except ValueError as err:
        return f"unusable ({err}); rerun from the start."


def peer_failure(err: Exception, where: str) -> PeerFailure:
    """The one-line error of a collective that raised during ``where`` (``step 12``, ``sample
    case-3``): a peer rank died or stopped responding, with the collective's own words after."""
    return PeerFailure(f"{where} failed: a collective raised, so a peer rank probably died or stopped responding "
                       f"({type(err).__name__}: {first_line(err)})")


def step_failure(err: Exception, where: str, ckpt_path: Path, user_model: Any, what: str = "forward or backward"
                  ) -> RuntimeError:
    """The one-line error for a step (or validation pass) that raised: a collective's failure (a
    peer died or stopped) or the model's own error, whatever its type, with a hint for a model
    whose PyG layers are not wrapped in ShardConv, and what is left to resume from."""
    first = f"{type(err).__name__}: {first_line(err)}"
    if is_peer_failure(err):
        return PeerFailure(f"{peer_failure(err, where)}. Last checkpoint: {describe_checkpoint(ckpt_path)}")
    hint = shard_hint(user_model) if user_model is not None else ""
    return RuntimeError(f"{where} failed in the model's {what} ({first}){hint}. "
                        f"Last checkpoint: {describe_checkpoint(ckpt_path)}")


def maybe_fail(rank: int, step: int) -> None:
    """Testing hook: ``MESHSHARD_FAIL_AT=RANK:STEP`` kills that rank in the middle of that step."""
    fail_at = os.environ.get("MESHSHARD_FAIL_AT")
    if fail_at and fail_at == f"{rank}:{step}":
        print(f"rank {rank}: MESHSHARD_FAIL_AT={fail_at}: dying in the middle of step {step}", file=sys.stderr,
              flush=True)
        os._exit(17)


class SampleReadError(ValueError):
    """A training sample that could not be read (a damaged or missing file of DATA): a data error
    (exit 2), never reported as the model's failure."""


class NonFiniteLoss(RuntimeError):
    """The loss or a gradient of a step is NaN or infinite: training stops before the optimizer step."""


_WHICH = ("inputs", "targets")


def non_finite_row(x: torch.Tensor, y: torch.Tensor, owned: np.ndarray, sample: int) -> tuple | None:
    """``(sample, global node, "inputs" | "targets", value)`` of this rank's first non-finite row, or None."""
    for which, t in zip(_WHICH, (x, y), strict=True):
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            i = int(bad.any(dim=1).nonzero()[0])
            return sample, int(owned[i]), which, float(t[i][bad[i]][0])
    return None


def local_flags(loss: torch.Tensor, bad_row: tuple | None, parameters: Any, *, rank: int, world: int,
                 out_of_time: bool = False) -> torch.Tensor:
    """This rank's loss, gradient flag and bad row, laid out so that one sum over the world combines them.

    ``[loss, grad_not_finite, then per rank: sample + 1, node + 1, which + 1, value, then
    out_of_time]`` in float64; a rank writes only its own four slots. ``out_of_time`` (rank 0's
    clock past ``--max-time``) reaches every rank in the same sum, so all stop after the same step.
    """
    flags = torch.zeros(3 + 4 * world, dtype=torch.float64, device=loss.device)
    flags[-1] = float(out_of_time)
    flags[0] = loss.detach().to(torch.float64)
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
        flags[1] = 1.0
    if bad_row is not None:
        sample, node, which, value = bad_row
        flags[2 + 4 * rank: 6 + 4 * rank] = torch.tensor([sample + 1, node + 1, _WHICH.index(which) + 1, value])
    return flags


def check_finite(flags: torch.Tensor, *, step: int, samples: list[int], data: str, last: str,
                  names: Sequence[str] = ()) -> float:
    """Raise on a non-finite row, loss or gradient (same verdict on every rank); else the batch loss.

    ``flags`` is the world-wide sum of every rank's :func:`local_flags`; ``names`` are the
    dataset's sample names, to name the samples in the error.
    """
    def sample_of(i: int) -> str:
        return f"{i} ({names[i]})" if 0 <= i < len(names) else str(i)

    values = flags.tolist()
    world = (len(values) - 2) // 4
    for r in range(world):
        sample, node, which, value = values[2 + 4 * r: 6 + 4 * r]
        if sample:
            raise ValueError(
                f"Expected finite training data (got {value} in the {_WHICH[int(which) - 1]} of sample "
                f"{sample_of(int(sample) - 1)} at node {int(node) - 1}, read by rank {r} at step {step}); fix the "
                f"dataset {data}"
            )
    loss = values[0] / world
    tail = (f"on sample(s) {', '.join(sample_of(i) for i in samples)}; training stopped before the optimizer step, "
            f"so no non-finite weights are saved (last checkpoint: {last}). Lower --lr or check the data.")
    if not np.isfinite(loss):
        raise NonFiniteLoss(f"step {step}: the loss is not finite ({loss}) {tail}")
    if values[1]:
        raise NonFiniteLoss(f"step {step}: a gradient is not finite (loss {loss:.6g}) {tail}")
    return loss
