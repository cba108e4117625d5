"""The process group's plain calls (sums, maxima, broadcasts, gathers, barriers, one rank's error on
every rank, shutdown) on 1 and 3 gloo ranks, on the world, a group of one and a group of two; in a
world of one without a process group; and the process-wide seams (debug switch, replicated-result
counter, recording a collective).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from meshshard import comm
from tests._dist import run_ranks


def _check_world(rank: int, world: int) -> None:
    total = sum(range(world))
    assert comm.is_distributed() and comm.backend_name() == "gloo"
    assert comm.group_ranks() == list(range(world))
    x = torch.tensor([float(rank), -float(rank)], dtype=torch.float64)
    assert comm.all_reduce_sum(x) is x and x.tolist() == [total, -total]
    m = torch.tensor([rank, -rank])
    assert comm.all_reduce_max(m) is m and m.tolist() == [world - 1, 0]
    a = torch.full((3,), float(rank + 1))
    comm.all_reduce_sum(a, async_op=True).wait()
    assert a.tolist() == [total + world] * 3
    f = torch.full((2,), float(rank + 1))
    assert torch.equal(comm.all_reduce_sum(f, async_op=True).get_future().wait()[0], torch.full((2,), float(total + world)))
    b = torch.full((2,), float(rank))
    assert comm.broadcast_tensor(b, src=world - 1) is b and b.tolist() == [world - 1.0] * 2
    stacked = comm.all_gather_stacked(torch.tensor([rank, 10 * rank]))
    assert stacked.tolist() == [[r, 10 * r] for r in range(world)]
    assert comm.all_gather_objects({"rank": rank}) == [{"rank": r} for r in range(world)]
    comm.barrier()
    assert comm.agree_on_first_error(None) is None
    # every rank from 1 on has a problem: every rank gets rank 1's, named
    expected = "rank 1: bad output on 1" if world > 1 else None
    assert comm.agree_on_first_error(f"bad output on {rank}" if rank >= 1 else None) == expected


def _check_group_of_one(rank: int, world: int) -> None:
    singles = [dist.new_group([r]) for r in range(world)]  # collective: every rank makes every group
    mine = singles[rank]
    assert comm.group_ranks(mine) == [rank] and comm.backend_name(mine) == "gloo"
    x = torch.tensor([rank + 0.5])
    assert comm.all_reduce_sum(x, group=mine).tolist() == [rank + 0.5]
    assert comm.all_reduce_max(x, group=mine).tolist() == [rank + 0.5]
    assert comm.all_reduce_sum(x, group=mine, async_op=True).wait()
    assert comm.broadcast_tensor(x, src=rank, group=mine).tolist() == [rank + 0.5]
    assert comm.all_gather_stacked(x, group=mine).tolist() == [[rank + 0.5]]
    assert comm.all_gather_objects(rank, group=mine) == [rank]
    comm.barrier(mine)
    assert comm.agree_on_first_error("my own problem", mine) == f"rank {rank}: my own problem"
    assert comm.agree_on_first_error(None, mine) is None


def _check_group_of_two(rank: int, world: int) -> None:
    """Global ranks 1 and 2 of 3: ``src`` and the rank named in a problem are global ranks."""
    rest = dist.new_group([0])
    pair = dist.new_group([1, 2])
    if rank == 0:
        assert comm.group_ranks(rest) == [0]
        return
    assert comm.group_ranks(pair) == [1, 2]
    x = torch.tensor([float(rank)])
    assert comm.all_reduce_sum(x, group=pair).tolist() == [3.0]
    assert comm.all_reduce_max(torch.tensor([rank]), group=pair).tolist() == [2]
    assert comm.broadcast_tensor(torch.tensor([float(rank)]), src=2, group=pair).tolist() == [2.0]
    assert comm.all_gather_stacked(torch.tensor([rank]), group=pair).tolist() == [[1], [2]]
    assert comm.all_gather_objects(f"r{rank}", group=pair) == ["r1", "r2"]
    comm.barrier(pair)
    assert comm.agree_on_first_error("late" if rank == 2 else None, pair) == "rank 2: late"


def _check_device_mesh(rank: int, world: int) -> None:
    whole = comm.torch_device_mesh(None)
    assert whole.mesh_dim_names == ("domain", "data") and whole.mesh.tolist() == [[r] for r in range(world)]
    data = comm.torch_device_mesh(comm.init_device_mesh_2d(1))  # pure data parallelism: one row, the data group
    assert data.mesh.tolist() == [list(range(world))]


def _battery(rank: int, world: int) -> str:
    _check_world(rank, world)
    _check_group_of_one(rank, world)
    if world == 3:
        _check_group_of_two(rank, world)
    _check_device_mesh(rank, world)
    return "ok"


@pytest.mark.parametrize("world", [1, 3])
def test_plain_calls_on_the_world_and_its_groups(world: int) -> None:
    assert run_ranks(_battery, world) == ["ok"] * world


def test_a_world_of_one_needs_no_process_group() -> None:
    assert not dist.is_initialized()
    assert not comm.is_distributed() and comm.backend_name() is None and comm.group_ranks() == [0]
    x = torch.tensor([1.5, -2.0])
    assert comm.all_reduce_sum(x) is x and x.tolist() == [1.5, -2.0]
    assert comm.all_reduce_max(x) is x and x.tolist() == [1.5, -2.0]
    work = comm.all_reduce_sum(x, async_op=True)
    assert work.wait() and work.is_completed() and work.get_future().wait()[0] is x
    assert comm.broadcast_tensor(x, src=0) is x and x.tolist() == [1.5, -2.0]
    stacked = comm.all_gather_stacked(x)
    assert stacked.tolist() == [[1.5, -2.0]] and stacked.data_ptr() != x.data_ptr()
    assert comm.all_gather_objects({"a": 1}) == [{"a": 1}]
    comm.barrier()
    assert comm.agree_on_first_error("my problem") == "my problem" and comm.agree_on_first_error(None) is None
    comm.shutdown()  # nothing to shut down
    assert not dist.is_initialized()


def test_shutdown_destroys_the_default_group() -> None:
    assert not dist.is_initialized()
    with tempfile.TemporaryDirectory(prefix="meshshard-comm.shutdown-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rendezvous')}", rank=0, world_size=1)
        try:
            assert comm.is_distributed() and comm.backend_name() == "gloo"
            comm.shutdown()
            assert not dist.is_initialized() and not comm.is_distributed()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def test_debug_switch_reads_what_set_debug_set() -> None:
    before = comm.debug_enabled()
    try:
        comm.set_debug(True)
        assert comm.debug_enabled() is True
        comm.set_debug(False)
        assert comm.debug_enabled() is False
    finally:
        comm.set_debug(before)


def test_replicated_results_count_global_reductions() -> None:
    start = comm.replicated_results()
    comm.note_replicated_result()
    assert comm.replicated_results() == start + 1
    comm.sum_to_replicated(torch.ones(3))  # counts itself
    assert comm.replicated_results() == start + 2


def test_record_collective_adds_to_every_open_log() -> None:
    call = comm.CollectiveCall("my_reduction", "backward", 8, 8, 2)
    comm.record_collective(call)  # no log open: nothing happens
    with comm.count_collectives() as outer, comm.count_collectives() as inner:
        comm.record_collective(call)
    for log in (outer, inner):
        assert log.count("my_reduction", "backward") == 1 and log.bytes_sent() == 8


def test_debug_switch_follows_the_environment_until_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read at each call, not at import: a rank forked from a fork server gets its environment later."""
    from meshshard.comm import _collectives

    monkeypatch.setattr(_collectives, "_debug", None)
    monkeypatch.setenv("MESHSHARD_DEBUG", "1")
    assert comm.debug_enabled() is True
    monkeypatch.setenv("MESHSHARD_DEBUG", "0")
    assert comm.debug_enabled() is False
    comm.set_debug(True)
    assert comm.debug_enabled() is True
