"""Argument checks shared by the collectives.

Every check here is local (no communication), so a bad argument raises on the rank that passed
it before any collective starts and no other rank is left waiting inside one. Messages name the
argument and the values, in the form ``Expected 'x' to ... (got ...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

Counts = Sequence[int] | Tensor

__all__ = ["Counts", "as_counts", "check_dim", "check_tensor", "check_index", "check_rank"]


def check_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"Expected '{name}' to be a torch.Tensor (got {type(x).__name__})")
    return x


def as_counts(name: str, counts: object, world_size: int) -> list[int]:
    """Normalise per-rank counts (list, tuple, numpy array or tensor) to a list of Python ints."""
    if isinstance(counts, Tensor):
        if counts.dim() != 1 or counts.dtype.is_floating_point or counts.dtype.is_complex:
            raise ValueError(
                f"Expected '{name}' to be a one-dimensional integer tensor "
                f"(got shape {tuple(counts.shape)}, dtype {counts.dtype})"
            )
        values = [int(v) for v in counts.tolist()]
    else:
        try:
            values = [int(v) for v in counts]  # type: ignore[union-attr]
        except TypeError:
            raise TypeError(f"Expected '{name}' to be a sequence of ints (got {type(counts).__name__})") from None
        if any(int(v) != v for v in counts):  # type: ignore[union-attr]
            raise ValueError(f"Expected '{name}' to hold whole numbers (got {list(counts)})")  # type: ignore[arg-type]
    if len(values) != world_size:
        raise ValueError(
            f"Expected '{name}' to have {world_size} entries, one per rank (got {len(values)}: {values})"
        )
    if any(v < 0 for v in values):
        raise ValueError(f"Expected '{name}' to be non-negative (got {values})")
    return values


def check_dim(dim: int, ndim: int) -> int:
    """Return ``dim`` made non-negative; a 0-d tensor has no dimension to split."""
    if ndim == 0:
        raise ValueError("Expected 'x' to have at least one dimension (got a 0-d tensor)")
    if not -ndim <= dim < ndim:
        raise ValueError(f"Expected 'dim' in [{-ndim}, {ndim}) for a {ndim}-d tensor (got {dim})")
    return dim % ndim


def check_rank(name: str, value: int, world_size: int) -> int:
    if not isinstance(value, int) or not 0 <= value < world_size:
        raise ValueError(f"Expected '{name}' to be a rank in [0, {world_size}) (got {value!r})")
    return value


def check_index(send_index: object, send_counts: list[int], num_rows: int | None, x: Tensor, dim: int) -> Tensor:
    """Check ``send_index`` against the counts, the tensor it indexes (``num_rows``; ``None`` skips
    the range check) and its device."""
    index = check_tensor("send_index", send_index)
    if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"Expected 'send_index' to be a one-dimensional int64 or int32 tensor "
            f"(got shape {tuple(index.shape)}, dtype {index.dtype})"
        )
    if index.device != x.device:
        raise ValueError(f"Expected 'send_index' on the device of 'x', {x.device} (got {index.device})")
    total = sum(send_counts)
    if index.numel() != total:
        raise ValueError(
            f"Expected 'send_index' to have sum(send_counts) = {total} entries (got {index.numel()})"
        )
    if total and num_rows is not None:
        lo, hi = int(index.min()), int(index.max())
        if lo < 0 or hi >= num_rows:
            raise ValueError(
                f"Expected 'send_index' values in [0, {num_rows}), the size of 'x' along dim {dim} "
                f"(got min {lo}, max {hi})"
            )
    return index.long()


def check_self_counts(send_counts: list[int], recv_counts: list[int], rank: int) -> None:
    """The part a rank sends itself is the part it receives from itself."""
    if send_counts[rank] != recv_counts[rank]:
        raise ValueError(
            f"Expected send_counts[{rank}] == recv_counts[{rank}] on rank {rank}, the part it keeps "
            f"(got {send_counts[rank]} and {recv_counts[rank]})"
        )


# --- a check that only one rank can make, shared with every rank -------------------------------

MESSAGE_WORDS = 48  # an error message travels as up to 8 * MESSAGE_WORDS UTF-8 bytes in int64 words
_KINDS = (ValueError, TypeError)


def encode_problem(problem: Exception | None) -> list[int]:
    """``[kind, byte length, words...]`` (``1 + 1 + MESSAGE_WORDS`` ints); ``kind`` 0 means no problem."""
    if problem is None:
        return [0] * (2 + MESSAGE_WORDS)
    data = str(problem).encode()[: 8 * MESSAGE_WORDS]
    kind = 1 + next((i for i, k in enumerate(_KINDS) if isinstance(problem, k)), 0)
    words = torch.frombuffer(bytearray(data.ljust(8 * MESSAGE_WORDS, b"\0")), dtype=torch.int64).tolist()
    return [kind, len(data), *words]


def decode_problem(row: Sequence[int]) -> Exception | None:
    """The exception :func:`encode_problem` encoded, or ``None``."""
    kind, length = int(row[0]), int(row[1])
    if kind == 0:
        return None
    data = torch.tensor([int(v) for v in row[2 : 2 + MESSAGE_WORDS]], dtype=torch.int64).numpy().tobytes()
    return _KINDS[kind - 1](data[:length].decode(errors="replace"))
