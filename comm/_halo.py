"""``HaloPlan``: the one halo-plan type, checked across ranks once, with one exchange path.

A halo plan says which owned rows each rank sends to which other rank, so that the rows every rank
receives are exactly its ghost (or halo) rows in local order:

- ``send_index``: ``(sum(send_counts),)`` int64, owned rows, grouped by destination rank;
- ``send_counts``, ``recv_counts``: ``R`` ints each, nothing to or from the rank itself;
- ``num_owned``: the rows of the tensors it indexes.

The graph halo of a partition (``ShardSpec``) and the geometric halo of a point cloud
(``BallQueryPlan``) are both a ``HaloPlan``, and every exchange goes through it:
:meth:`HaloPlan.append` (owned rows followed by the ghost rows, :func:`append_halo`) or
:meth:`HaloPlan.exchange` (the ghost rows only, :func:`indexed_all_to_all_v`), :meth:`HaloPlan.linear`
(a linear layer's output written into a buffer with room for the ghost rows, then appended), and the reverse
way, :meth:`HaloPlan.sum_to_owners` (ghost rows added back into their owners' rows: the backward of
``append`` run forward).

Checked once, when built, never per exchange. :meth:`HaloPlan.build` checks the plan locally, then
every rank shares its counts (and any local problem) in one small ``all_gather_v`` of one row of
``O(R)`` ints; every rank then checks that ``recv_counts[q]`` on rank ``r`` equals
``send_counts[r]`` on rank ``q``, and all raise the same ``ValueError`` when anything is wrong, so
no rank is left waiting and no exchange ever runs with counts that disagree (which returns
uninitialised rows or aborts the process inside the backend). :meth:`HaloPlan.from_send_counts`
learns ``recv_counts`` from the other ranks instead (consistent by construction), with the same
sharing of local problems. Both are collective: every rank of ``group`` must call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._collectives import (
    _HaloPass,
    all_gather_v,
    all_to_all_v,
    communication_device,
    group_rank_and_size,
    indexed_all_to_all_v,
)
from ._halo_linear import linear_with_halo
from ._halo_room import append_halo, empty_with_room
from ._validate import MESSAGE_WORDS, as_counts, decode_problem, encode_problem

__all__ = ["HaloPlan"]

_PROBLEM = 2 + MESSAGE_WORDS  # width of an encoded problem
_MAX_LISTED = 4  # disagreements named in one error message


@dataclass(frozen=True, eq=False, repr=False)
class HaloPlan:
    """Which owned rows go to which rank so that every rank receives its ghost rows in local order.

    Build it with :meth:`build` (all three arrays known, checked across ranks),
    :meth:`from_send_counts` (receive counts learned from the other ranks) or :meth:`from_layout`
    (every rank derived its plan from the same global layout: checked locally only).

    Attributes:
        send_index: owned rows to send, grouped by destination rank (CPU; see :meth:`index_on`).
        send_counts, recv_counts: rows sent to and received from each rank.
        num_owned: rows of the tensors the plan indexes.
        rank: this rank in ``group``.
        group: the process group (``None``: the default group, or a world of one).

    Shapes:
        send_index: ``(sum(send_counts),)`` int64; send_counts, recv_counts: ``R`` ints each.
    """

    send_index: Tensor
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    num_owned: int
    rank: int
    group: Any = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        send_index: Any,
        send_counts: Any,
        recv_counts: Any,
        *,
        num_owned: int,
        group: Any = None,
        owned_counts: Sequence[int] | None = None,
        problem: Exception | None = None,
    ) -> HaloPlan:
        """The plan, after checking it on this rank and against every other rank's.

        Args:
            send_index, send_counts, recv_counts: the plan (numpy arrays, tensors or sequences).
            num_owned: rows of the tensors the plan indexes (``send_index`` must lie below it).
            group: the process group.
            owned_counts: every rank's owned row count as this rank knows it; when given, every
                rank's list must equal the ranks' ``num_owned``.
            problem: a problem the caller found on this rank, raised on every rank.

        Communication: one ``all_gather_v`` of one row of ``3 R + 51`` int64 per rank (every rank
        of ``group`` must call it).

        Raises:
            ValueError, TypeError: on every rank at once, when any rank's plan is invalid (the
                message names the rank and the problem) or the ranks' counts disagree (the message
                names the first few pairs).
        """
        rank, world = group_rank_and_size(group)
        plan = None
        if problem is None:
            try:
                plan = cls.from_layout(send_index, send_counts, recv_counts, num_owned=num_owned, group=group)
            except (TypeError, ValueError) as err:
                problem = err
        _agree_across_ranks(plan, problem, owned_counts, world, group)
        assert plan is not None  # every rank raised otherwise
        return plan

    @classmethod
    def from_send_counts(cls, send_index: Any, send_counts: Any, *, num_owned: int, group: Any = None) -> HaloPlan:
        """The plan whose ``recv_counts`` are what the other ranks send this rank.

        Consistent by construction; a local problem (bad counts or indices) is raised on every rank.

        Communication: one ``all_to_all_v`` of ``R`` rows of ``51`` int64 (every rank of ``group``
        must call it).
        """
        rank, world = group_rank_and_size(group)
        try:
            index, sc = _check_sends(send_index, send_counts, num_owned, rank, world)
            problem = None
        except (TypeError, ValueError) as err:
            index, sc, problem = torch.zeros(0, dtype=torch.int64), [0] * world, err
        rows = torch.tensor([[c, *encode_problem(problem)] for c in sc], dtype=torch.int64)
        with torch.no_grad():
            got = all_to_all_v(rows.to(communication_device(group)), [1] * world, [1] * world, group=group).cpu()
        for q in range(world):
            found = decode_problem(got[q, 1:].tolist())
            if found is not None:
                raise type(found)(f"Expected a valid halo plan on every rank (got, on rank {q}: {found})")
        return cls(index, tuple(sc), tuple(got[:, 0].tolist()), int(num_owned), rank, group)

    @classmethod
    def from_layout(
        cls, send_index: Any, send_counts: Any, recv_counts: Any, *, num_owned: int, group: Any = None
    ) -> HaloPlan:
        """A plan every rank derived from the same global description (a grid layout, say), so
        consistent across ranks by construction: checked on this rank only, no communication.

        Raises:
            ValueError, TypeError: on this rank, for the local problems :meth:`build` names.
        """
        rank, world = group_rank_and_size(group)
        index, sc = _check_sends(send_index, send_counts, num_owned, rank, world)
        rc = as_counts("recv_counts", recv_counts, world)
        if rc[rank]:
            raise ValueError(
                f"Expected recv_counts[{rank}] = 0 on rank {rank}: a halo plan receives nothing from itself "
                f"(got {rc[rank]})"
            )
        return cls(index, tuple(sc), tuple(rc), int(num_owned), rank, group)

    # --- what it says ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.send_counts)

    @property
    def num_ghost(self) -> int:
        return sum(self.recv_counts)

    @property
    def num_sent(self) -> int:
        return sum(self.send_counts)

    def index_on(self, device: torch.device | str) -> Tensor:
        """``send_index`` on ``device`` (copied once per device, then cached)."""
        device = torch.device(device)
        if device not in self._cache:
            self._cache[device] = self.send_index.to(device)
        return self._cache[device]

    def __repr__(self) -> str:
        return (
            f"HaloPlan(rank={self.rank}/{self.world_size}, owned={self.num_owned}, sent={self.num_sent}, "
            f"ghosts={self.num_ghost})"
        )

    # --- the one exchange path --------------------------------------------------------------------

    def append(self, x: Tensor) -> Tensor:
        """``x`` (owned rows) followed by the ghost rows, differentiable.

        Shapes:
            x: ``(N_own, ...)``; result: ``(N_own + N_ghost, ...)``.

        Communication: one ``indexed_all_to_all_v`` forward, one backward (:func:`append_halo`: no
        copy of the owned rows' gradient, nor of the owned rows when ``x`` came from :meth:`empty_owned`).
        """
        self._check_rows(x)
        return append_halo(
            x, self.index_on(x.device), self.send_counts, self.recv_counts, group=self.group, check_index=False
        )

    def empty_owned(self, *rest: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Tensor:
        """An uninitialised ``(N_own, *rest)`` tensor on storage with room for the ghost rows: owned
        rows written into it (``torch.mm(a, b, out=rows)``, ``rows.copy_(y)``) are not copied again by
        :meth:`append`, whose exchange writes only the ghost rows after them (and which copies as
        before once anything else holds the storage: a former result, a view).

        Shapes:
            result: ``(N_own, *rest)``, on a storage of ``(N_own + N_ghost, *rest)``.
        """
        return empty_with_room(self.num_owned, self.num_ghost, rest, dtype, torch.device(device))

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``self.append(F.linear(x, weight, bias))`` with no copy of the owned rows: the GEMM writes
        them into a buffer with room for the ghost rows, the exchange fills only those, and the
        backward sends back and reduces only their gradients (:mod:`meshshard.comm._halo_linear`).
        For a layer whose first step is linear (MeshGraphNet's source products).

        Shapes:
            x: ``(N_own, F)``; weight: ``(H, F)``; bias: ``(H,)``; result: ``(N_own + N_ghost, H)``.

        Communication: one ``indexed_all_to_all_v`` forward, one backward.
        """
        self._check_rows(x)
        return linear_with_halo(x, weight, bias, self.index_on(x.device), list(self.send_counts),
                                list(self.recv_counts), self.rank, self.group)

    def exchange(self, x: Tensor) -> Tensor:
        """The ghost rows of ``x`` (owned rows), differentiable.

        Shapes:
            x: ``(N_own, ...)``; result: ``(N_ghost, ...)``.

        Communication: one ``indexed_all_to_all_v`` forward, one backward (the adjoint: the ghost
        rows' gradients return to their owners and accumulate there).
        """
        self._check_rows(x)
        return indexed_all_to_all_v(
            x, self.index_on(x.device), self.send_counts, self.recv_counts, group=self.group, check_index=False
        )

    def sum_to_owners(self, x: Tensor) -> Tensor:
        """The adjoint of :meth:`append`: the owned rows of ``x`` plus its ghost rows, sent back to
        their owners and added at the rows they came from (an owned row sent to several ranks gets
        all their parts), differentiable. For sums that other ranks hold parts of: the out-degrees
        of nodes whose outgoing edges are stored on other ranks, say.

        Shapes:
            x: ``(N_own + N_ghost, ...)``; result: ``(N_own, ...)``.

        Communication: one ``indexed_all_to_all_v`` forward (the reverse exchange, the one
        :meth:`append` runs backward) and one backward (the exchange :meth:`append` runs forward).
        """
        self._check_rows(x, self.num_owned + self.num_ghost, "the owned then the ghost rows")
        index = self.index_on(x.device)
        return _HaloPass.apply(x, index, list(self.send_counts), list(self.recv_counts), self.rank, self.group, True)

    def _check_rows(self, x: Tensor, rows: int | None = None, what: str = "the owned rows") -> None:
        rows = self.num_owned if rows is None else rows
        if not isinstance(x, Tensor):
            raise TypeError(f"Expected 'x' to be a torch.Tensor (got {type(x).__name__})")
        if x.dim() == 0 or x.shape[0] != rows:
            raise ValueError(f"Expected 'x' to have {rows} rows, {what} of the plan (got shape {tuple(x.shape)})")


def _check_sends(send_index: Any, send_counts: Any, num_owned: int, rank: int, world: int) -> tuple[Tensor, list[int]]:
    """``send_index`` as a CPU int64 tensor and ``send_counts`` as ints, checked locally."""
    sc = as_counts("send_counts", send_counts, world)
    if sc[rank]:
        raise ValueError(
            f"Expected send_counts[{rank}] = 0 on rank {rank}: a halo plan sends nothing to itself (got {sc[rank]})"
        )
    if isinstance(send_index, Tensor):
        index = send_index.detach().cpu()
    else:
        index = torch.as_tensor(np.asarray(send_index))
    if index.dim() == 1 and index.numel() == 0:
        index = index.to(torch.int64)  # an empty list reads as float64
    if index.dim() != 1 or index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise ValueError(
            f"Expected 'send_index' to be a one-dimensional integer array "
            f"(got shape {tuple(index.shape)}, dtype {index.dtype})"
        )
    index = index.to(torch.int64)
    if index.numel() != sum(sc):
        raise ValueError(f"Expected 'send_index' to have sum(send_counts) = {sum(sc)} entries (got {index.numel()})")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_owned):
        raise ValueError(
            f"Expected 'send_index' values in [0, {num_owned}), the owned rows "
            f"(got min {int(index.min())}, max {int(index.max())})"
        )
    return index, sc


def _agree_across_ranks(
    plan: HaloPlan | None, problem: Exception | None, owned_counts: Sequence[int] | None, world: int, group: Any
) -> None:
    """Every rank shares its counts (or its problem); every rank raises the same error, if any."""
    if plan is None or problem is not None:
        row = encode_problem(problem) + [0] * (1 + 3 * world)
    else:
        view = [int(c) for c in owned_counts] if owned_counts is not None else [-1] * world
        if len(view) != world:
            view = [-2] * world  # named below: a list of the wrong length
        row = encode_problem(None) + [plan.num_owned, *plan.send_counts, *plan.recv_counts, *view]
    with torch.no_grad():
        mine = torch.tensor([row], dtype=torch.int64, device=communication_device(group))
        rows = all_gather_v(mine, [1] * world, group=group).cpu()
    for r in range(world):
        found = decode_problem(rows[r, :_PROBLEM].tolist())
        if found is not None:
            raise type(found)(f"Expected a valid halo plan on every rank (got, on rank {r}: {found})")
    owned = rows[:, _PROBLEM]
    sends = rows[:, _PROBLEM + 1 : _PROBLEM + 1 + world]  # sends[q, r]: rows q sends to r
    recvs = rows[:, _PROBLEM + 1 + world : _PROBLEM + 1 + 2 * world]  # recvs[r, q]: rows r expects from q
    views = rows[:, _PROBLEM + 1 + 2 * world :]
    problems = [
        f"rank {r} expects {int(recvs[r, q])} rows from rank {q}, which sends {int(sends[q, r])}"
        for r, q in torch.nonzero(recvs != sends.T).tolist()
    ]
    for r in range(world):
        if int(views[r, 0]) == -2:
            problems.append(f"rank {r} has owned_counts of the wrong length")
        elif int(views[r, 0]) >= 0 and not torch.equal(views[r], owned):
            problems.append(f"rank {r} has owned_counts {views[r].tolist()}, but the ranks own {owned.tolist()}")
    if problems:
        more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise ValueError(
            f"Expected the halo plans of all ranks to agree (got: {'; '.join(problems[:_MAX_LISTED])}{more})"
        )
