"""Plans are checked across ranks once, when they are built, and a check only one rank can make
fails every rank: each rank gets the same clear ``ValueError`` within seconds, never garbage rows,
a SIGABRT or a wait for the full collective timeout.

Each spawn below runs under a short ``run_ranks`` timeout (which also bounds every collective), so
a rank left waiting fails the test instead of hanging it.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from meshshard import ShardSpec, ShardTensor
from meshshard.comm import HaloPlan, count_collectives, scatter_v
from meshshard.partition import partition_graph
from tests._dist import run_ranks

TIMEOUT_S = 30.0  # the gloo timeout inside the ranks, and the whole spawn's limit


def _grid(side: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """A side x side grid graph (both directions of every edge) and its coordinates."""
    ids = np.arange(side * side).reshape(side, side)
    pairs = np.concatenate([np.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()]), np.stack([ids[:-1].ravel(), ids[1:].ravel()])], 1)
    pos = np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="ij"), -1).reshape(-1, 2).astype(float)
    return np.concatenate([pairs, pairs[::-1]], 1), pos


def _parts(world: int, diagonal: bool) -> list:
    """Strips of the grid across y, or across the diagonal: two partitions whose counts differ."""
    edge_index, pos = _grid()
    coord, extent = (pos.sum(1), 11) if diagonal else (pos[:, 1], 6)
    owner = np.minimum((coord * world // extent).astype(np.int64), world - 1)
    return partition_graph(edge_index, world, num_nodes=len(pos), pos=pos, parts=owner)


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _battery(rank: int, world: int) -> dict[str, str]:
    a, b = _parts(world, True), _parts(world, False)
    got: dict[str, str] = {}
    # rank 0 loads a part of another partition of the same mesh: the halo plans disagree
    got["mixed"] = _error(lambda: ShardSpec.from_partition(a[0] if rank == 0 else b[rank]))
    # one rank's part is damaged (a send index outside its owned rows): only it can tell
    bad = dataclasses.replace(b[1], send_index=b[1].send_index + 1000) if rank == 1 else b[rank]
    got["damaged"] = _error(lambda: ShardSpec.from_partition(bad))
    # one rank loads the wrong rank's part
    got["wrong rank"] = _error(lambda: ShardSpec.from_partition(b[0] if rank == world - 1 else b[rank]))
    # scatter_v: only the source sees 'x'
    x = torch.randn(world + 2, 3) if rank == 0 else None
    got["scatter_v rows"] = _error(lambda: scatter_v(x, [1] * world, src=0))
    got["scatter_v type"] = _error(lambda: scatter_v([1.0] * world if rank == 0 else None, [1] * world, src=0))
    # ShardTensor.scatter_tensor: only the source sees 'full'
    spec = ShardSpec.from_partition(b[rank])
    full = torch.randn(37, 2) if rank == world - 1 else None
    got["scatter_tensor"] = _error(lambda: ShardTensor.scatter_tensor(full, spec, src=world - 1))
    # comm.HaloPlan directly: a bad plan on one rank, learned receive counts, owned counts
    me = [0] * world
    got["from_send_counts"] = _error(lambda: HaloPlan.from_send_counts([5] if rank == 1 else [], [int(rank == 1 and q == 0) for q in range(world)], num_owned=2))
    learned = HaloPlan.from_send_counts(torch.arange(world - 1), [int(q != rank) for q in range(world)], num_owned=world)
    got["learned"] = str(learned.recv_counts == tuple(int(q != rank) for q in range(world)))
    got["owned views"] = _error(lambda: HaloPlan.build([], me, me, num_owned=rank, owned_counts=[0] * world))
    # and after all that, the group still works: a good plan is checked once, at construction
    with count_collectives() as log:
        spec = ShardSpec.from_partition(b[rank])
    got["check calls"] = str(log.count())
    x_full = torch.arange(36.0)[:, None]
    halo = ShardTensor.from_local(x_full[spec.global_ids], spec).with_halo()
    local = np.concatenate([b[rank].owned_ids, b[rank].ghost_ids])
    got["halo"] = str(torch.equal(halo, x_full[local]))
    return got


@pytest.mark.parametrize("world", [2, 3])
def test_bad_plans_fail_every_rank_with_the_same_error(world: int) -> None:
    results = run_ranks(_battery, world, timeout=TIMEOUT_S)
    expected = {
        "mixed": r"^ValueError: Expected the halo plans of all ranks to agree \(got: rank 0 expects \d+ rows from rank 1, which sends \d+",
        "damaged": r"^ValueError: Expected a valid halo plan on every rank \(got, on rank 1: Expected 'send_index' values in \[0, \d+\), the owned rows \(got min 10\d\d, max 10\d\d\)\)$",
        "wrong rank": rf"^ValueError: Expected a valid halo plan on every rank \(got, on rank {world - 1}: Expected the part of rank {world - 1} \(got the part of rank 0\)\)$",
        "scatter_v rows": rf"^ValueError: Expected 'x' on src to have sum\(counts\) = {world} rows along dim 0 \(got {world + 2}\) \(on rank 0\)$",
        "scatter_v type": r"^TypeError: Expected 'x' to be a torch.Tensor \(got list\) \(on rank 0\)$",
        "scatter_tensor": rf"^ValueError: Expected 'full' on rank {world - 1} to have 36 rows \(got \(37, 2\)\)",
        "from_send_counts": r"^ValueError: Expected a valid halo plan on every rank \(got, on rank 1: Expected 'send_index' values in \[0, 2\), the owned rows \(got min 5, max 5\)\)$",
        "learned": r"^True$",
        "owned views": r"^ValueError: Expected the halo plans of all ranks to agree \(got: rank 0 has owned_counts \[0, 0.*\], but the ranks own \[0, 1.*\]; rank 1 has",
    }
    for rank, got in enumerate(results):
        for what, pattern in expected.items():
            assert re.search(pattern, got[what]), (rank, what, got[what])
            assert got[what] == results[0][what], (rank, what, "every rank raises the same error")
        assert got["check calls"] == "1", (rank, "one small collective per plan")
        assert got["halo"] == "True", rank


def test_one_halo_plan_type_and_one_exchange_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """ShardSpec and BallQueryPlan hold the same HaloPlan type, and with-halo goes through
    append_halo (ghosts only through indexed_all_to_all_v) for both, in a world of one too."""
    import meshshard.comm._halo as halo_module
    from meshshard.comm import HaloPlan
    from meshshard.nn import BallQueryPlan

    calls: list[str] = []
    for name in ("append_halo", "indexed_all_to_all_v"):
        real = getattr(halo_module, name)
        monkeypatch.setattr(halo_module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    (part,) = _parts(1, False)
    spec = ShardSpec.from_partition(part)
    plan = BallQueryPlan.build(torch.as_tensor(part.pos), 1.5, 4, spec)
    assert isinstance(spec.halo, HaloPlan) and isinstance(plan.halo, HaloPlan)
    assert calls == ["indexed_all_to_all_v"]  # the plan's one exchange of ids and coordinates
    x = torch.randn(spec.num_owned, 2, dtype=torch.float64, requires_grad=True)
    ShardTensor.from_local(x, spec).with_halo().sum().backward()
    assert plan.with_halo(x).shape == x.shape and plan.exchange(x).shape == (0, 2)
    assert calls == ["indexed_all_to_all_v", "append_halo", "append_halo", "indexed_all_to_all_v"]
    assert torch.equal(x.grad, torch.ones_like(x))


def test_a_spec_from_something_else_than_a_partition() -> None:
    with pytest.raises(TypeError, match=r"on rank 0: Expected a meshshard.partition.Partition \(got dict: 'dict' object has no attribute"):
        ShardSpec.from_partition({"rank": 0})
