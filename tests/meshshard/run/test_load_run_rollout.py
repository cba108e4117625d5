"""``load_run(RUN).rollout(...)``: a transient run rolled out in your own code equals what
``predict --rollout`` writes for the same trajectory (float64, 1e-10), on the whole mesh and on 2
ranks of a METIS partition; its refusals are one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard import load_run
from meshshard.data import open_dataset
from meshshard.run import PredictConfig, TrainConfig, TransientRun, predict, train
from tests._dist import run_ranks
from tests.meshshard.run.test_rollout import _steps
from tests.meshshard.tasks import _trajectories

STEPS = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("loadroll")
    out = _trajectories.write(root, parts=(1, 2), steps=STEPS + 1)
    cfg = TrainConfig(partition=out[1], data=out["data"], out=str(root / "run"), steps=3, lr=1e-2, latent_size=8,
                      hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64", noise_std=0.05)
    train(cfg)
    predict(PredictConfig(run=cfg.out, data=out["data"], out=str(root / "pred"), rollout=True, quiet=True,
                          plots=False))
    out["run"] = cfg.out
    out["written"] = np.stack([pred for _, pred, _ in _steps(root / "pred", "run2")])  # (STEPS + 1, N, 2)
    return out


def _whole_args(setup: dict) -> dict:
    w = setup["whole"][-1]  # run2, the validation trajectory predict rolled out
    graph = open_dataset(setup["data"]).mesh(0).graph()
    return {"state0": w["states"][0], "inputs": w["inputs"], "node_type": w["classes"],
            "graph": graph.edge_index(), "pos": graph.pos, "boundary": w["states"]}


def test_a_whole_mesh_rollout_equals_predict_rollout(setup: dict) -> None:
    run = load_run(setup["run"])
    assert isinstance(run, TransientRun) and run.state_channels == ["u[0]", "u[1]"]
    assert run.class_ids == [0, 1] and run.boundary_classes == [1]
    states = run.rollout(**_whole_args(setup), steps=STEPS)
    assert states.shape == (STEPS + 1, _trajectories.NX * _trajectories.NY, 2)
    np.testing.assert_allclose(states.numpy(), setup["written"], rtol=1e-10, atol=1e-12)
    assert not np.allclose(states[-1].numpy(), states[0].numpy())  # the state moved
    # held boundary (no prescribed states): the boundary rows keep the first state's values
    held = run.rollout(**(_whole_args(setup) | {"boundary": None}), steps=2)
    edge = setup["whole"][-1]["classes"] == 1
    np.testing.assert_array_equal(held[2].numpy()[edge], setup["whole"][-1]["states"][0][edge])


def _rank(rank: int, world: int, run_dir: str, parts: str, whole: dict) -> tuple:
    from meshshard import ShardGraph, ShardTensor
    from meshshard.partition import load_partition

    part = load_partition(parts, rank)
    graph = ShardGraph.from_partition(part, dtype=torch.float64)
    ids = np.asarray(part.owned_ids)
    run = load_run(run_dir)
    states = run.rollout(ShardTensor.from_local(torch.as_tensor(whole["states"][0][ids]), graph.spec),
                         ShardTensor.from_local(torch.as_tensor(whole["inputs"][ids]), graph.spec),
                         whole["classes"][ids], graph, steps=STEPS,
                         boundary=lambda n: whole["states"][n][ids])
    return ids, states.numpy()


def test_a_rollout_on_two_ranks_equals_the_whole_mesh(setup: dict) -> None:
    for ids, states in run_ranks(_rank, 2, setup["run"], setup[2], setup["whole"][-1], timeout=120):
        assert 0 < len(ids) < _trajectories.NX * _trajectories.NY
        np.testing.assert_allclose(states, setup["written"][:, ids], rtol=1e-10, atol=1e-12)


def test_rollout_refusals_are_one_line(setup: dict) -> None:
    run = load_run(setup["run"])
    args = _whole_args(setup)
    with pytest.raises(ValueError, match=r"^Expected state0 \(N, 2\): the run's state channels u\[0\], u\[1\] "
                                         r"\(got shape \(77, 3\)\)$"):
        run.rollout(**(args | {"state0": np.zeros((77, 3))}), steps=1)
    with pytest.raises(ValueError, match=r"^Expected node_type \(77,\) of the run's class ids \[0, 1\]"):
        run.rollout(**(args | {"node_type": np.full(77, 7)}), steps=1)
    with pytest.raises(ValueError, match=r"^Expected steps to be 0 or a positive integer \(got -1\)$"):
        run.rollout(**args, steps=-1)
    with pytest.raises(ValueError, match=r"^Expected run.rollout\(state0, inputs, node_type"):
        run(args["state0"], args["graph"], args["pos"])
