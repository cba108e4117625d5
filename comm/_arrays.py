"""numpy arrays across ranks: counts, sums, maxima, rows gathered on one rank, a distributed
directory. What prediction and reporting need besides the differentiable collectives; every call
is vectorised and none holds O(N) rows per rank.

With no process group (a world of one), each returns its input (or the lookup of this rank's own rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ._collectives import all_gather_v, all_to_all_v, gather_v, group_rank_and_size

__all__ = ["directory_lookup", "exchange_counts", "gather_rows", "max_across", "sum_across"]




def exchange_counts(send_counts: np.ndarray, group: Any, device: Any) -> np.ndarray:
    """How many rows each rank will send this one, given what this one sends each (``(R,)`` both)."""
    world = len(send_counts)
    t = torch.as_tensor(send_counts, dtype=torch.int64, device=device)
    return all_to_all_v(t, [1] * world, [1] * world, group=group).cpu().numpy()


def directory_lookup(owned_ids: np.ndarray, owned_values: np.ndarray, want: np.ndarray, num_nodes: int,
                     group: Any, device: Any) -> np.ndarray:
    """The values of any nodes ``want`` (global ids), given each rank's owned values.

    Node ``g`` is kept by rank ``g * R // N``: owners push their rows there, then each rank asks
    the keepers of the nodes it wants. Two rounds of ``all_to_all_v``; memory O(N / R) per rank.

    Shapes:
        owned_ids ``(N_own,)`` ascending; owned_values ``(N_own, F)``; want ``(W,)``; result ``(W, F)``.
    """
    _, world = group_rank_and_size(group)
    width = owned_values.shape[1]

    def keeper(ids: np.ndarray) -> np.ndarray:
        return (ids.astype(np.int64) * world // max(num_nodes, 1)).astype(np.int64)

    def a2a(array: np.ndarray, send: np.ndarray, recv: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.ascontiguousarray(array), device=device)
        return all_to_all_v(t, send.tolist(), recv.tolist(), group=group).cpu().numpy()

    # 1. owners -> keepers (owned ids ascending, so their keepers are non-decreasing)
    send = np.bincount(keeper(owned_ids), minlength=world)
    recv = exchange_counts(send, group, device)
    kept_ids = a2a(owned_ids.astype(np.int64), send, recv)
    kept_values = a2a(owned_values.astype(np.float64).reshape(-1, width), send, recv)
    order = np.argsort(kept_ids, kind="stable")
    kept_ids, kept_values = kept_ids[order], kept_values[order]
    # 2. askers -> keepers -> askers
    by_keeper = np.argsort(keeper(want), kind="stable")
    asked = want[by_keeper].astype(np.int64)
    send = np.bincount(keeper(asked), minlength=world)
    recv = exchange_counts(send, group, device)
    questions = a2a(asked, send, recv)
    at = np.searchsorted(kept_ids, questions)
    if len(questions) and (at.max() >= len(kept_ids) or np.any(kept_ids[at] != questions)):
        raise RuntimeError("directory_lookup: a node was asked for that no rank owns (inconsistent partition)")
    answers = a2a(kept_values[at].reshape(-1, width), recv, send)
    out = np.empty((len(want), width), dtype=np.float64)
    out[by_keeper] = answers
    return out


def sum_across(values: np.ndarray, group: Any, device: Any) -> np.ndarray:
    """The element-wise sum of ``values`` over the ranks of ``group``, in float64, on every rank."""
    t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
    if dist.is_initialized():
        dist.all_reduce(t, group=group)
    return t.cpu().numpy()


def gather_rows(rows: np.ndarray, group: Any, device: Any, dst: int = 0) -> np.ndarray | None:
    """Every rank's rows ``(n_rank, F)`` concatenated on ``dst`` (``None`` elsewhere); a rank may
    send none."""
    rank, world = group_rank_and_size(group)
    if world == 1:
        return rows
    n = torch.as_tensor([len(rows)], dtype=torch.int64, device=device)
    counts = all_gather_v(n, [1] * world, group=group).cpu().tolist()
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    t = torch.as_tensor(rows[:, None] if rows.ndim == 1 else rows, device=device)
    full = gather_v(t, counts, dst=dst, group=group).cpu().numpy()
    return full if rank == dst else None


def max_across(values: Any, group: Any, device: Any) -> np.ndarray:
    """The elementwise maximum of ``values`` over the ranks (``all_reduce``; float64)."""
    t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().numpy()
