"""Grid decompositions: layouts, halo plans against the stencil-graph partition, padding modes."""

from __future__ import annotations

import numpy as np
import pytest

from meshshard.partition import load_partition, save_partition, verify_partition
from meshshard.partition._grid import grid_graph, grid_layout, halo_windows, partition_grid, window_plan

_NP_MODE = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def test_layout_balanced_explicit_and_errors():
    lay = grid_layout((7, 5), 3)
    assert lay.proc_grid == (3, 1) and lay.splits == ((3, 2, 2), (5,))
    assert lay.owned_counts() == (15, 10, 10)
    lay = grid_layout((6, 5, 4), proc_grid=(2, 1, 2), splits=[[1, 5], None, [3, 1]])
    assert lay.box(3) == ((1, 0, 3), (6, 5, 4)) and lay.coords(3) == (1, 0, 1)
    np.testing.assert_array_equal(np.sort(np.concatenate([lay.owned_ids(r) for r in range(4)])),
                                  np.arange(120))
    parts = lay.parts()
    for r in range(4):
        np.testing.assert_array_equal(np.flatnonzero(parts == r), lay.owned_ids(r))
    with pytest.raises(ValueError, match=r"Expected 'proc_grid' \(2, 2\) to hold --parts 3"):
        grid_layout((4, 4), 3, proc_grid=(2, 2))
    with pytest.raises(ValueError, match=r"Expected 'splits\[0\]' to be 2 non-negative sizes summing to 4"):
        grid_layout((4, 4), proc_grid=(2, 1), splits=[[1, 2], None])
    with pytest.raises(ValueError, match="Expected a grid 'shape' of 1 to 3 positive sizes"):
        grid_layout((4, 0), 2)


def test_ghost_counts_by_hand():
    # 6 x 5 grid, two slabs of 3 rows: each rank's halo of width 1 is the neighbouring row.
    plans = [window_plan(lay := grid_layout((6, 5), 2), r, *halo_windows(lay, 1)) for r in range(2)]
    assert [len(p.ghost_ids) for p in plans] == [5, 5]
    np.testing.assert_array_equal(plans[0].ghost_ids, np.arange(15, 20))
    np.testing.assert_array_equal(plans[1].send_index, np.arange(5))  # rank 1's first row
    # 2 x 2 boxes of 3 x 3: an edge of 3, an edge of 3 and one corner, from three ranks.
    lay = grid_layout((6, 6), proc_grid=(2, 2))
    p = window_plan(lay, 0, *halo_windows(lay, 1))
    assert p.recv_counts.tolist() == [0, 3, 3, 1] and p.send_counts.tolist() == [0, 3, 3, 1]
    np.testing.assert_array_equal(p.ghost_ids, [3, 9, 15, 18, 19, 20, 21])
    # slabs exchange with their face neighbours only; circular padding joins the first and last.
    lay = grid_layout((8, 3), 4)
    sends = [window_plan(lay, r, *halo_windows(lay, 1)).send_counts.tolist() for r in range(4)]
    assert sends == [[0, 3, 0, 0], [3, 0, 3, 0], [0, 3, 0, 3], [0, 0, 3, 0]]
    assert window_plan(lay, 0, *halo_windows(lay, 1), "circular").send_counts.tolist() == [0, 3, 0, 3]
    # width 2 on an uneven 3-rank slab layout of 2 + 1 + 4 rows: rank 1 sees past both neighbours.
    lay = grid_layout((7, 2), proc_grid=(3, 1), splits=[[2, 1, 4], None])
    p = window_plan(lay, 1, *halo_windows(lay, 2))
    assert p.recv_counts.tolist() == [4, 0, 4] and len(p.ghost_ids) == 8


@pytest.mark.parametrize("shape,kw,width,periodic", [
    ((9, 7), {"parts": 3}, 1, False),
    ((9, 7), {"proc_grid": (2, 2), "splits": [[2, 7], [4, 3]]}, 2, False),
    ((6, 5, 4), {"proc_grid": (2, 1, 2)}, 1, False),
    ((8, 6), {"proc_grid": (2, 2)}, 1, True),
    ((9, 4), {"parts": 3}, 2, True),
    ((5, 4), {"proc_grid": (1, 2)}, 1, True),
    ((7, 5), {"proc_grid": (3, 1), "splits": [[3, 0, 4], None]}, 1, False),
])
def test_window_plan_equals_stencil_partition(shape, kw, width, periodic):
    """The plan a grid layer computes is the partition of the grid's stencil graph, plan for plan."""
    parts = partition_grid(shape, halo_width=width, periodic=periodic, **kw)
    lay = grid_layout(shape, kw.get("parts"), proc_grid=kw.get("proc_grid"), splits=kw.get("splits"))
    mode = "circular" if periodic else "zeros"
    for r, part in enumerate(parts):
        plan = window_plan(lay, r, *halo_windows(lay, width), mode)
        np.testing.assert_array_equal(part.owned_ids, lay.owned_ids(r))
        np.testing.assert_array_equal(plan.ghost_ids, part.ghost_ids)
        np.testing.assert_array_equal(plan.ghost_owner, part.ghost_owner)
        np.testing.assert_array_equal(plan.send_index, part.send_index)
        np.testing.assert_array_equal(plan.send_counts, part.send_counts)
        np.testing.assert_array_equal(plan.recv_counts, part.recv_counts)


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,kw,lo,hi", [
    ((7, 6), {"proc_grid": (3, 2), "splits": [[1, 4, 2], [2, 4]]}, (1, 2), (2, 1)),
    ((5, 4, 3), {"proc_grid": (2, 2, 1)}, (1, 1, 1), (1, 1, 1)),
    ((9,), {"parts": 4}, (2,), (0,)),
])
def test_source_index_fills_the_padded_window(mode, shape, kw, lo, hi):
    """Owned rows, ghost rows from their owners and a fill row give every rank exactly its
    window of np.pad(global array)."""
    lay = grid_layout(shape, kw.get("parts"), proc_grid=kw.get("proc_grid"), splits=kw.get("splits"))
    values = np.arange(lay.num_nodes, dtype=np.float64).reshape(shape) + 1.0
    padded = np.pad(values, list(zip(lo, hi)), mode=_NP_MODE[mode])
    boxes = [lay.box(r) for r in range(lay.num_parts)]
    starts = np.array([np.array(b[0]) - lo for b in boxes])
    stops = np.array([np.array(b[1]) + hi for b in boxes])
    plans = [window_plan(lay, r, starts, stops, mode) for r in range(lay.num_parts)]
    flat = values.reshape(-1)
    for r, plan in enumerate(plans):
        received = np.concatenate([flat[lay.owned_ids(q)][plans[q].send_index[
            plans[q].send_counts[:r].sum():plans[q].send_counts[:r + 1].sum()]]
            for q in range(lay.num_parts)])
        np.testing.assert_array_equal(received, flat[plan.ghost_ids])
        rows = np.concatenate([flat[lay.owned_ids(r)], received, [0.0]])
        window = rows[plan.source_index].reshape(plan.window_shape)
        sl = tuple(slice(a, b + low + h) for a, b, low, h in zip(boxes[r][0], boxes[r][1], lo, hi))
        np.testing.assert_array_equal(window, padded[sl])


def test_reflect_wider_than_the_grid_is_refused():
    lay = grid_layout((3, 4), 2)
    with pytest.raises(ValueError, match="Expected reflect padding narrower than the grid along axis 0"):
        window_plan(lay, 0, *halo_windows(lay, 3), "reflect")


def test_grid_graph_and_saved_partition(tmp_path):
    g = grid_graph((4, 3))
    assert g.num_nodes == 12 and g.num_edges == 2 * (3 * 3 + 4 * 2 + 2 * 3 * 2)
    assert grid_graph((3, 3, 3)).degree()[13] == 26
    assert grid_graph((4, 4), periodic=True).degree().tolist() == [8] * 16
    parts = partition_grid((10, 8), proc_grid=(2, 2), splits=[[3, 7], None], halo_width=2)
    save_partition(parts, tmp_path / "p")
    assert verify_partition(tmp_path / "p") == []
    p = load_partition(tmp_path / "p", 3)
    assert p.metadata["method"] == "grid" and p.metadata["parameters"]["splits"] == [[3, 7], [4, 4]]
    assert p.num_owned_per_part.tolist() == [12, 12, 28, 28]
    np.testing.assert_array_equal(p.pos[0], [3.0, 4.0])


def test_partition_grid_command(tmp_path, capsys):
    from meshshard.cli import main

    out = tmp_path / "g"
    assert main(["partition", "--grid", "12,10,3", "--parts", "4", "--proc-grid", "2,2,1",
                 "--halo-hops", "2", "--periodic", "--out", str(out), "-q"]) == 0
    assert verify_partition(out) == []
    p = load_partition(out, 1)
    expected = window_plan(lay := grid_layout((12, 10, 3), proc_grid=(2, 2, 1)), 1,
                           *halo_windows(lay, 2), "circular")
    np.testing.assert_array_equal(p.ghost_ids, expected.ghost_ids)
    assert p.metadata["parameters"]["periodic"] is True
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: meshshard-partition v2, input a grid of 12 x 10 x 3 points\n")
    assert main(["partition", "--grid", "12,10", "--parts", "3", "--proc-grid", "2,2",
                 "--out", str(tmp_path / "x")]) == 2
    assert "Expected 'proc_grid' (2, 2) to hold --parts 3 ranks" in capsys.readouterr().err
    assert main(["partition", "--parts", "3", "--out", str(tmp_path / "x")]) == 2
    assert "Expected an INPUT file or --grid H,W[,D]" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
