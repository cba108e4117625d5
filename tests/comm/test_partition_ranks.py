"""The distributed partition on 1 to 4 gloo processes (``ArrayExchange``): the same files as one process,
errors raised on every process alike, and no process holding an array of the global length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshshard.partition import partition_file, read_metadata, verify_partition, write_vtkhdf
from tests._dist import run_ranks
from tests._trace import largest_array_held
from tests.partition._mixed_mesh import write_mixed_vtkhdf
from tests.partition.test_distributed import same_folders

pytest.importorskip("h5py")
TIMEOUT = 60.0


def _partition(rank: int, world: int, mesh: str, out: str, num_parts: int) -> str:
    from meshshard.comm import ArrayExchange
    from meshshard.partition import partition_distributed

    return str(partition_distributed(mesh, out, num_parts, ArrayExchange()))


def _exchange(rank: int, world: int) -> list[Any]:
    from meshshard.comm import ArrayExchange

    ex = ArrayExchange()
    chunks = [np.full((q + rank, 2), rank * 10 + q, dtype=np.uint64) for q in range(world)]
    got = ex.all_to_all(chunks)
    low = ex.all_reduce(np.array([rank, -rank], dtype=np.int64), "min")
    return [[g.tolist() for g in got], [str(g.dtype) for g in got], low.tolist(), ex.all_gather({"r": rank})]


def test_array_exchange_sends_any_dtype_by_bytes() -> None:
    world = 3
    for rank, (got, dtypes, low, gathered) in enumerate(run_ranks(_exchange, world, timeout=TIMEOUT)):
        assert got == [[[q * 10 + rank] * 2] * (rank + q) for q in range(world)]
        assert dtypes == ["uint64"] * world
        assert low == [0, -(world - 1)]
        assert gathered == [{"r": q} for q in range(world)]


def _partitions(rank: int, world: int, mesh: str, outs: list[str], counts: list[int]) -> list[str]:
    """:func:`_partition` into each of ``counts`` parts in turn, in one process group."""
    return [_partition(rank, world, mesh, out, num_parts) for out, num_parts in zip(outs, counts)]


# the part counts of one world run in one spawn of its processes (a spawn costs seconds)
@pytest.mark.parametrize("world, counts", [(1, (3,)), (2, (5,)), (3, (7,)), (4, (2, 9))])
def test_processes_write_the_one_process_files(tmp_path: Path, world: int, counts: tuple[int, ...]) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    outs = [str(tmp_path / f"dist{k}") for k in counts]
    assert run_ranks(_partitions, world, str(mesh), outs, list(counts), timeout=TIMEOUT) == [outs] * world
    for num_parts, out in zip(counts, outs):
        one = partition_file(mesh, tmp_path / f"one{num_parts}", num_parts, method="morton")
        same_folders(one, Path(out))
        assert read_metadata(out)["distributed"] == {"engine": "geometric", "processes": world}, num_parts
        assert verify_partition(out) == [], num_parts
    names = sorted(["mixed.vtkhdf", *(f"dist{k}" for k in counts), *(f"one{k}" for k in counts)])
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no staging left


def _partition_in_batches(rank: int, world: int, mesh: str, out: str, num_parts: int, batch: int) -> str:
    import meshshard.partition._dist_graph as graph
    import meshshard.partition._dist_plan as plan

    graph.BATCH = plan.BATCH = batch  # many exchanges per round, and processes with more than others
    return _partition(rank, world, mesh, out, num_parts)


@pytest.mark.parametrize("world, num_parts, batch", [(1, 4, 5), (3, 7, 3), (4, 5, 11)])
def test_edges_sent_in_small_batches_give_the_same_files(tmp_path: Path, world: int, num_parts: int,
                                                         batch: int) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    one = partition_file(mesh, tmp_path / "one", num_parts, method="morton")
    out = tmp_path / "dist"
    found = run_ranks(_partition_in_batches, world, str(mesh), str(out), num_parts, batch, timeout=TIMEOUT)
    assert found == [str(out)] * world
    same_folders(one, out)
    assert verify_partition(out) == []


def _write_fails(rank: int, world: int, mesh: str, out: str, num_parts: int) -> str:
    import meshshard.partition._dist_plan as plan
    from meshshard.comm import ArrayExchange
    from meshshard.partition import partition_distributed

    if rank == 1:  # its first part's file fails; it has more parts to build, so more rounds to go through
        def full(path: Path, arrays: Any) -> str:
            raise OSError(f"{path.name}: No space left on device")

        plan._write_npz = full
    try:
        partition_distributed(mesh, out, num_parts, ArrayExchange())
    except (ValueError, OSError) as err:
        return str(err)
    return "no error"


def test_a_failed_write_is_raised_by_all_after_the_last_round(tmp_path: Path) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    said = run_ranks(_write_fails, 3, str(mesh), str(tmp_path / "out"), 7, timeout=TIMEOUT)
    assert said == ["part-00002.npz: No space left on device"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.vtkhdf"]  # no folder, no staging left


def _refused(rank: int, world: int, mesh: str, out: str, num_parts: int, halo_hops: int) -> str:
    from meshshard.comm import ArrayExchange
    from meshshard.partition import partition_distributed

    try:
        partition_distributed(mesh, out, num_parts, ArrayExchange(), halo_hops=halo_hops)
    except ValueError as err:
        return str(err)
    return "no error"


def test_an_error_of_one_process_is_raised_by_all(tmp_path: Path) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")  # only process 0 looks at the folder
    said = run_ranks(_refused, 3, str(mesh), str(tmp_path / "taken"), 4, 1, timeout=TIMEOUT)
    assert said == [f"{tmp_path / 'taken'}: exists and is not empty (pass --force to replace it)"] * 3
    import h5py

    with h5py.File(mesh, "r+") as file:  # a bad node id in the last process's cells only
        file["VTKHDF/Connectivity"][-1] = 10**6
    said = run_ranks(_refused, 3, str(mesh), str(tmp_path / "out"), 4, 1, timeout=TIMEOUT)
    assert len(set(said)) == 1 and "node ids in [0, " in said[0], said
    assert not (tmp_path / "out").exists()


def _chain(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A random walk of ``n`` points joined by lines, ids shuffled: ``2 (n - 1)`` directed edges, so
    that a process's share of anything (nodes, edges) is far below ``n`` on 4 processes."""
    rng = np.random.default_rng(5)
    pos = np.cumsum(rng.normal(size=(n, 3)), axis=0)
    perm = rng.permutation(n)
    new_pos = np.empty_like(pos)
    new_pos[perm] = pos
    return new_pos, perm[np.stack([np.arange(n - 1), np.arange(1, n)], 1)]


def _largest_array(rank: int, world: int, mesh: str, out: str, num_parts: int) -> list[Any]:
    """Run the partition with every line of the distributed modules traced: the longest numpy array
    (largest dimension) held by a local variable, or inside a list, tuple or dataclass held by one."""
    import meshshard.partition._dist_assign as assign
    import meshshard.partition._dist_graph as graph
    import meshshard.partition._dist_plan as plan
    import meshshard.partition._distributed as top
    import meshshard.partition._exchange as exchange
    import meshshard.partition._vtkhdf as vtkhdf
    from meshshard.comm import ArrayExchange
    from meshshard.partition import partition_distributed

    return largest_array_held(lambda: partition_distributed(mesh, out, num_parts, ArrayExchange()),
                              (assign, graph, plan, top, exchange, vtkhdf))


@pytest.mark.parametrize("world", [3, 4])
def test_no_process_holds_an_array_of_the_global_length(tmp_path: Path, world: int) -> None:
    n = 3000
    pos, lines = _chain(n)
    mesh = write_vtkhdf(tmp_path / "chain.vtkhdf", pos, [("line", lines)])
    found = run_ranks(_largest_array, world, str(mesh), str(tmp_path / "out"), 2 * world + 1, timeout=TIMEOUT)
    # a process's block is n / world nodes and its edges 2 n / world; one array of the global length
    # (a part per node, a global-to-local map) would be n long
    bound = 2 * n // world + 2 * n // 10
    for length, where in found:
        assert length < bound, f"{length} >= {bound}: {where}"
    assert max(length for length, _ in found) < n
    assert verify_partition(tmp_path / "out") == []
