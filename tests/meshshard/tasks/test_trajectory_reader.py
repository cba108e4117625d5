"""The rank-local trajectory reader: on 3 ranks (uneven METIS shards of two meshes), every rank's
rows of every step and every (t, t+S) pair equal the whole arrays written; the steady task
refuses a trajectory dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.data import Trajectory, open_dataset, partition_dataset, write_trajectories
from meshshard.tasks import TrajectoryReader, get_task
from tests._dist import run_ranks
from tests.partition.conftest import grid_triangles

STRIDE = 2
STEPS = (5, 4, 6)
CLASSES = np.array([0, 1, 3])


def _whole() -> list[dict]:
    """Three trajectories (0 and 2 on one mesh, 1 on another), u of 2 channels, one static input."""
    rng = np.random.default_rng(0)
    meshes = [grid_triangles(9, 7), grid_triangles(8, 8)]
    out = []
    for k, steps in enumerate(STEPS):
        pts, tri = meshes[k % 2]
        n = len(pts)
        out.append({"pos": pts, "tri": tri, "times": np.arange(steps) * 0.1 + k,
                    "states": rng.normal(size=(steps, n, 2)) * (k + 1) + k,
                    "inputs": rng.normal(size=(n, 1)), "classes": CLASSES[rng.integers(0, 3, size=n)]})
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("trajectories")
    whole = _whole()
    trajectories = (Trajectory(f"t{k}", w["pos"], [("triangle", w["tri"])], w["times"], iter(w["states"]), w["inputs"],
                               w["classes"]) for k, w in enumerate(whole))
    write_trajectories(root / "data", trajectories, ["t0", "t1", "t2"], state_fields=[{"name": "u", "components": 2}],
                       input_fields=[{"name": "k", "components": 1}], time_stride=STRIDE, node_type_source="test",
                       interior_classes=[0, 3], val_samples=["t2"], dtype="float64")
    partition_dataset(root / "data", root / "parts", 3)
    return {"data": str(root / "data"), "parts": str(root / "parts")}


def _rank(rank: int, world: int, data: str, parts: str) -> list[float]:
    import torch.distributed as dist

    meta = open_dataset(data).meta
    norm = meta["normalisation"]
    reader = TrajectoryReader(data, parts, rank, device="cpu", dtype=torch.float64)
    assert reader.time_stride == STRIDE and reader.num_classes == 3
    worst = []
    for k, w in enumerate(_whole()):
        for t in range(reader.num_steps(k)):
            step = reader.step(k, t)
            ids = step.owned_ids
            assert sum(step.graph.spec.owned_counts) == len(w["pos"])
            worst.append(float(np.abs(step.state.to_local().numpy() - w["states"][t][ids]).max(initial=0)))
            inputs = (w["inputs"][ids] - np.asarray(norm["inputs"]["mean"])) / np.asarray(norm["inputs"]["scale"])
            worst.append(float(np.abs(step.inputs.to_local().numpy() - inputs).max(initial=0)))
            assert step.node_type.tolist() == w["classes"][ids].tolist()
            assert step.class_index.tolist() == np.searchsorted(CLASSES, w["classes"][ids]).tolist()
            assert step.boundary.tolist() == (w["classes"][ids] == 1).tolist()  # classes 0 and 3 are interior
            if t + STRIDE < reader.num_steps(k):
                now, later, change = reader.pair(k, t)
                want = (w["states"][t + STRIDE][ids] - w["states"][t][ids] - np.asarray(norm["targets"]["mean"]))
                want = want / np.asarray(norm["targets"]["scale"])
                worst.append(float(np.abs(later.to_local().numpy() - w["states"][t + STRIDE][ids]).max(initial=0)))
                worst.append(float(np.abs(change.to_local().numpy() - want).max(initial=0)))
                state = (w["states"][t][ids] - np.asarray(norm["state"]["mean"])) / np.asarray(norm["state"]["scale"])
                worst.append(float(np.abs(reader.normalise_state(now.state.to_local()).numpy() - state).max(initial=0)))
        with pytest.raises(ValueError, match=rf"Expected a step in \[0, {STEPS[k] - STRIDE}\) of trajectory {k}"):
            reader.pair(k, STEPS[k] - STRIDE)
    with pytest.raises(ValueError, match=r"read by step"):
        reader.sample(0)
    if dist.is_initialized():
        dist.barrier()
    return worst


def test_every_rank_reads_its_rows_of_every_step_and_pair(setup: dict) -> None:
    results = run_ranks(_rank, 3, setup["data"], setup["parts"], timeout=60)
    assert len(results) == 3 and max(max(r) for r in results) <= 1e-12


def test_the_statistics_are_of_the_training_trajectories(setup: dict) -> None:
    norm = open_dataset(setup["data"]).meta["normalisation"]
    train = _whole()[:2]
    change = np.concatenate([(w["states"][STRIDE:] - w["states"][:-STRIDE]).reshape(-1, 2) for w in train])
    np.testing.assert_allclose(norm["targets"]["mean"], change.mean(0), rtol=1e-10)
    np.testing.assert_allclose(norm["targets"]["std"], change.std(0), rtol=1e-10)


def test_the_steady_task_refuses_trajectories(setup: dict) -> None:
    with pytest.raises(ValueError, match=r"holds trajectories \(made with --state\), which the steady task"):
        get_task("steady").check_dataset(open_dataset(setup["data"]))


def test_a_steady_dataset_is_no_trajectory_dataset(tmp_path: Path) -> None:
    from meshshard.data import open_trajectories, write_dataset

    pts, tri = grid_triangles(3, 3)
    write_dataset(tmp_path / "d", [np.ones((9, 1))], [np.ones((9, 1))], pos=[pts], cells=[[("triangle", tri)]])
    with pytest.raises(ValueError, match=r"not a trajectory dataset \(made without --state\)"):
        open_trajectories(tmp_path / "d")
