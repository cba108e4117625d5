"""The transient task: pairs, the interior-masked loss and the training noise, on shards equal to
one process; training with noise on 3 ranks equal to one process and to a whole-mesh reference
written here from the raw arrays (float64, 1e-10), the validation loss included."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.data import open_dataset
from meshshard.nn import MeshGraphNet
from meshshard.run import TrainConfig, load_checkpoint, read_log, sample_index, train
from meshshard.tasks import PairReader, TensorNormalisation, TransientTask, get_task, step_noise
from tests._dist import run_ranks
from tests._ranks import train_rank
from tests.meshshard.tasks import _trajectories

SIGMA, SEED = 0.3, 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    return _trajectories.write(tmp_path_factory.mktemp("transient"), parts=(1, 3))


def test_the_noise_is_standard_normal_and_a_function_of_each_node() -> None:
    ids = np.arange(100_000)
    z = step_noise(SEED, 3, 7, ids, 2)
    assert z.shape == (100_000, 2) and np.isfinite(z).all()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) < 0.01  # the channels are independent
    picks = np.random.default_rng(0).permutation(ids)[:5000]  # any subset, in any order: the same numbers
    np.testing.assert_array_equal(step_noise(SEED, 3, 7, picks, 2), z[picks])
    for other in ((SEED + 1, 3, 7), (SEED, 4, 7), (SEED, 3, 8)):  # the seed, the step and the sample change it
        assert np.abs(step_noise(*other, ids[:1000], 2) - z[:1000]).min() > 0


def _noisy_rows(rank: int, world: int, data: str, parts: str) -> list[tuple]:
    """Per pair: owned ids, the state input's noise, the target's change, the interior mask, the loss."""
    reader = PairReader(data, parts, rank, device="cpu", dtype=torch.float64)
    task = get_task("transient", {"noise_std": SIGMA, "seed": SEED})
    out = []
    for p in (0, 3, int(reader.train[-1])):
        clean, noisy = reader.sample(p), task.batch(reader, p, step=11)
        assert isinstance(noisy.x.to_local(), torch.Tensor) and noisy.x.shape[1] == reader.num_inputs == 2 + 1 + 2
        loss = task.loss(noisy.x[:, :2] * 0.5, noisy)  # any prediction: the masked mean of the whole mesh
        out.append((noisy.owned_ids, (noisy.x.to_local() - clean.x.to_local()).numpy(),
                    (noisy.y.to_local() - clean.y.to_local()).numpy(), noisy.interior.numpy(), float(loss)))
    return out


@pytest.mark.slow
def test_the_noise_on_three_ranks_is_the_noise_of_one_process_node_for_node(setup: dict) -> None:
    ranks = run_ranks(_noisy_rows, 3, setup["data"], setup[3], timeout=60)
    one = _noisy_rows(0, 1, setup["data"], setup[1])
    norm = open_dataset(setup["data"]).meta["normalisation"]
    ratio = np.asarray(norm["state"]["scale"]) / np.asarray(norm["targets"]["scale"])
    classes = setup["whole"][0]["classes"]
    for i, (ids, dx, dy, interior, loss) in enumerate(one):
        assert ids.tolist() == list(range(len(classes)))
        assert interior.tolist() == (classes == 0).tolist()
        assert np.abs(dx[~interior]).max() == 0 and np.abs(dx[:, 2:]).max() == 0  # boundary, inputs, one-hot: none
        assert np.abs(dx[interior, :2]).max() > 0.1
        np.testing.assert_allclose(dy, -dx[:, :2] * ratio, rtol=1e-10, atol=1e-12)  # the target corrected
        got = np.concatenate([r[i][1] for r in ranks])[np.argsort(np.concatenate([r[i][0] for r in ranks]))]
        np.testing.assert_allclose(got, dx, rtol=1e-12, atol=1e-14)
        assert all(abs(r[i][4] - loss) <= 1e-10 * abs(loss) for r in ranks)


def _reference(cfg: TrainConfig, whole: list[dict], steps: int) -> tuple[list[float], dict, list[float]]:
    """Whole-mesh training from the raw arrays: features, noise, the masked loss (summed over
    ``cfg.rollout_train`` applications, each from the state the previous one made, the boundary
    set to the truth), Adam; and the validation loss (every validation pair, one step, no noise)
    before and after."""
    data = open_dataset(cfg.data)
    stats = data.meta["normalisation"]
    (ms, ss), (mi, si), (mc, sc) = ((np.asarray(stats[w]["mean"]), np.asarray(stats[w]["scale"]))
                                    for w in ("state", "inputs", "targets"))
    graph = data.mesh(0).graph()
    ei = torch.as_tensor(graph.edge_index())
    ea = TensorNormalisation(data.normalisation, dtype=torch.float64).edge_attr(torch.as_tensor(graph.pos), ei)
    torch.manual_seed(cfg.seed)
    model = MeshGraphNet(5, 3, 2, latent_size=cfg.latent_size, hidden_layers=cfg.hidden_layers,
                         message_passing_steps=cfg.message_passing_steps).to(torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    unroll = cfg.rollout_train
    every = [(k, t) for k in range(len(whole)) for t in range(len(whole[k]["times"]) - unroll)]
    pair_ids = {kt: i for i, kt in enumerate(every)}
    train_pairs = [(k, t) for k, t in every if k in data.train]

    def pair_loss(k: int, t: int, noise: np.ndarray, applications: int) -> torch.Tensor:
        w = whole[k]
        interior = torch.as_tensor(w["classes"] == 0)
        state = torch.as_tensor(w["states"][t] + noise * (w["classes"] == 0)[:, None] * ss)
        total = torch.zeros((), dtype=torch.float64)
        for j in range(1, applications + 1):
            x = torch.cat([(state - torch.as_tensor(ms)) / torch.as_tensor(ss),
                           torch.as_tensor((w["inputs"] - mi) / si), torch.as_tensor(np.eye(2)[w["classes"]])], 1)
            out = model(x, ei, ea)
            truth = torch.as_tensor(w["states"][t + j])
            total = total + ((out - (truth - state - torch.as_tensor(mc)) / torch.as_tensor(sc)) ** 2)[interior].mean()
            state = torch.where(interior[:, None], state + out * torch.as_tensor(sc) + torch.as_tensor(mc), truth)
        return total

    def validation() -> float:
        with torch.no_grad():
            return float(np.mean([float(pair_loss(k, t, 0.0, 1)) for k, t in every if k in data.val]))

    losses, val = [], [validation()]
    for step in range(steps):
        k, t = train_pairs[sample_index(cfg.seed, step, 0, 1, len(train_pairs))]
        noise = cfg.noise_std * step_noise(cfg.seed, step, pair_ids[(k, t)], np.arange(len(whole[k]["classes"])), 2)
        loss = pair_loss(k, t, noise, unroll)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict(), [*val, validation()]


@pytest.mark.slow
@pytest.mark.parametrize("unroll", [1, 3])
def test_training_with_noise_on_three_ranks_equals_one_process(setup: dict, unroll: int) -> None:
    """Noise, and with ``--rollout-train 3`` three applications per sample, their losses summed."""
    root = setup["root"]
    cfg = TrainConfig(partition=setup[3], data=setup["data"], out=str(root / f"run3-{unroll}"), steps=2, lr=1e-2,
                      latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64",
                      noise_std=SIGMA, seed=SEED, val_every=2, rollout_train=unroll,
                      lr_schedule="constant")  # the reference's Adam at one rate; the schedules: test_controls
    sharded = run_ranks(train_rank, 3, asdict(cfg), timeout=120)[0]
    one_cfg = TrainConfig(**(asdict(cfg) | {"partition": setup[1], "out": str(root / f"run1-{unroll}")}))
    one = train(one_cfg)
    ref_losses, ref_state, ref_val = _reference(cfg, setup["whole"], 2)
    np.testing.assert_allclose(sharded, ref_losses, rtol=1e-10)
    np.testing.assert_allclose(one, ref_losses, rtol=1e-10)
    for run in (f"run3-{unroll}", f"run1-{unroll}"):
        ckpt = load_checkpoint(Path(root / run) / "checkpoint.pt")
        assert ckpt["config"]["task"] == "transient" and ckpt["config"]["noise_std"] == SIGMA
        val = [r["val_loss"] for r in read_log(root / run / "log.jsonl") if "val_loss" in r]
        np.testing.assert_allclose(val, ref_val, rtol=1e-10)  # the one-step loss of the validation pairs
        for name, value in ref_state.items():
            torch.testing.assert_close(ckpt["model"][name], value, rtol=1e-10, atol=1e-12, msg=name)


def test_the_transient_task_refuses_a_steady_dataset_and_a_bad_noise(setup: dict, tmp_path: Path) -> None:
    from meshshard.data import write_dataset
    from tests.partition.conftest import grid_triangles

    pts, tri = grid_triangles(3, 3)
    write_dataset(tmp_path / "d", [np.ones((9, 1))], [np.ones((9, 1))], pos=[pts], cells=[[("triangle", tri)]])
    with pytest.raises(ValueError, match=r"holds no trajectories \(the transient task trains on a dataset made with"):
        TransientTask().check_dataset(open_dataset(tmp_path / "d"))
    with pytest.raises(ValueError, match=r"Expected --noise-std to be 0 \(off\) or a positive number \(got -1\)"):
        TransientTask({"noise_std": -1}).check_dataset(open_dataset(setup["data"]))
    with pytest.raises(ValueError, match=r"Expected training trajectories of more than 8 steps for --rollout-train 8 "
                                         r"with stride 1 \(got 8 in run0\); lower --rollout-train"):
        TransientTask({"rollout_train": 8}).check_dataset(open_dataset(setup["data"]))


def test_train_refuses_bad_transient_options_in_one_line(setup: dict, tmp_path: Path, capsys) -> None:
    from meshshard.cli import main

    base = ["train", setup[1], "--data", setup["data"], "--out", str(tmp_path / "run"), "--steps", "1", "--quiet"]
    for extra, message in (
        (["--noise-std", "-0.1"], "Expected --noise-std to be 0 (off) or a positive number (got -0.1)"),
        (["--noise-std", "nan"], "Expected --noise-std to be 0 (off) or a positive number (got nan)"),
        (["--rollout-train", "0"], "Expected --rollout-train to be a positive integer (got 0)"),
        (["--rollout-train", "8"], "Expected training trajectories of more than 8 steps for --rollout-train 8"),
        (["--lr-schedule", "exponential", "--lr-floor", "0"],
         "Expected --lr-floor above 0 for --lr-schedule exponential (got 0.0)"),
        (["--val-rollout", "-1"], "Expected --val-rollout to be 0 (off) or a positive integer (got -1)"),
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()
