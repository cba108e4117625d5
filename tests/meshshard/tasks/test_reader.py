"""The rank-local dataset reader and training on a dataset of many meshes.

Three small triangle meshes of different sizes, six samples (sample s on mesh s % 3), the last
for validation. On 1 and 3 ranks (3: uneven METIS shards), and on 2 x 1 and 2 x 2 ranks (two data-parallel
groups drawing samples on different meshes in the same step), every rank's rows and edge features equal the
whole-mesh ones, and training (float64) equals single-process training on the whole meshes, the
validation losses in log.jsonl included.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.data import open_dataset, partition_dataset, write_dataset
from meshshard.nn import MeshGraphNet
from meshshard.run import TrainConfig, load_checkpoint, sample_index
from meshshard.tasks import DatasetReader, Normaliser, whole_sample
from tests._dist import run_ranks
from tests._ranks import train_rank
from tests._warm import warm_command
from tests.partition.conftest import grid_triangles

STEPS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    meshes = [grid_triangles(8, 6), grid_triangles(7, 7), grid_triangles(9, 5)]
    pos, cells, xs, ys = [], [], [], []
    for s in range(6):
        pts, tri = meshes[s % 3]
        pts = pts * (1.0 + 0.5 * (s % 3))
        pos.append(pts)
        cells.append([("triangle", tri)])
        xs.append(np.column_stack([np.sin(3 * pts[:, 0] + s), rng.normal(size=len(pts)) * 5 + 2]))
        ys.append((np.cos(2 * pts[:, 1]) * (s + 1))[:, None])
    write_dataset(root / "data", xs, ys, pos=pos, cells=cells, input_names=["a", "b"], target_names=["c"],
                  val_samples=[5], dtype="float64")
    for parts in (1, 2, 3):
        partition_dataset(root / "data", root / f"parts-{parts}", parts)
    write_dataset(root / "other", xs[:3], ys[:3], pos=[p + 1.0 for p in pos[:3]], cells=cells[:3], dtype="float64")
    partition_dataset(root / "other", root / "other-parts", 1)
    return {"root": root, "data": str(root / "data")}


def _rows_rank(rank: int, world: int, data: str, parts: str) -> list[float]:
    import torch.distributed as dist

    reader = DatasetReader(data, parts, rank, device="cpu", dtype=torch.float64)
    worst = []
    for s in range(reader.dataset.num_samples):
        b = reader.sample(s)
        x, y, ei, ea = whole_sample(data, s, dtype=torch.float64)
        ids = torch.as_tensor(b.owned_ids)
        worst.append(float((b.x.to_local() - x[ids]).abs().max()))
        worst.append(float((b.y.to_local() - y[ids]).abs().max()))
        edges = b.graph.global_edge_ids[: b.graph.num_owned_edges]
        worst.append(float((b.edge_attr[: b.graph.num_owned_edges] - ea[edges]).abs().max()) if len(edges) else 0.0)
        assert sum(b.graph.spec.owned_counts) == reader.dataset.num_nodes(s)
    if dist.is_initialized():
        dist.barrier()
    return worst


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_reads_its_rows_and_edges_normalised(setup: dict, world: int) -> None:
    results = run_ranks(_rows_rank, world, setup["data"], str(setup["root"] / f"parts-{world}"), timeout=60)
    assert max(max(r) for r in results) == 0.0


def test_normalisation_is_the_datasets_and_round_trips(setup: dict) -> None:
    data = open_dataset(setup["data"])
    n = Normaliser.from_dict(data.normalisation.to_dict(), dtype=torch.float64)
    x, y = (torch.from_numpy(np.array(a)) for a in data.sample_arrays(0))
    stats = data.normalisation
    torch.testing.assert_close(n.normalise_inputs(x), torch.from_numpy((np.asarray(x) - stats.inputs.mean) / stats.inputs.scale))
    torch.testing.assert_close(n.denormalise_targets(n.normalise_targets(y)), y, rtol=1e-14, atol=1e-14)
    # Normalised training inputs have mean 0 and std 1 over the training split.
    stacked = torch.cat([n.normalise_inputs(torch.from_numpy(np.array(data.sample_arrays(int(s))[0]))) for s in data.train])
    torch.testing.assert_close(stacked.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(stacked.std(0, correction=0), torch.ones(2, dtype=torch.float64), atol=1e-12, rtol=0)


def _cfg(setup: dict, name: str, parts: int, data_parallel: int) -> TrainConfig:
    return TrainConfig(partition=str(setup["root"] / f"parts-{parts}"), data=setup["data"], out=str(setup["root"] / name),
                       steps=STEPS, lr=1e-2, latent_size=8, hidden_layers=1, message_passing_steps=2,
                       checkpoint_every=2, quiet=True, dtype="float64", data_parallel=data_parallel, val_every=2,
                       lr_schedule="constant")  # the reference's Adam at one rate; the schedules: test_controls


def _reference(cfg: TrainConfig) -> tuple[list[float], list[float], dict]:
    data = open_dataset(cfg.data)
    samples = {s: whole_sample(data, s, dtype=torch.float64) for s in range(data.num_samples)}
    torch.manual_seed(cfg.seed)
    model = MeshGraphNet(2, 3, 1, latent_size=cfg.latent_size, hidden_layers=cfg.hidden_layers,
                         message_passing_steps=cfg.message_passing_steps).to(torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)

    def loss_of(s: int) -> torch.Tensor:
        x, y, ei, ea = samples[s]
        return ((model(x, ei, ea) - y) ** 2).mean()

    def val() -> float:
        with torch.no_grad():
            return sum(float(loss_of(int(s))) for s in data.val) / len(data.val)

    losses, vals = [], []
    for step in range(STEPS):
        if step % cfg.val_every == 0:
            vals.append(val())
        batch = [int(data.train[sample_index(cfg.seed, step, d, cfg.data_parallel, len(data.train))])
                 for d in range(cfg.data_parallel)]
        loss = sum(loss_of(s) for s in batch) / len(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    vals.append(val())
    return losses, vals, model.state_dict()


# (2, 2) and (4, 2): data-parallel groups (of one and of two ranks) draw samples on different
# meshes in one step.
@pytest.mark.slow
@pytest.mark.parametrize(("world", "data_parallel"), [(1, 1), (2, 2), (3, 1), (4, 2)])
def test_training_on_many_meshes_equals_one_process(setup: dict, world: int, data_parallel: int) -> None:
    cfg = _cfg(setup, f"run-{world}-{data_parallel}", world // data_parallel, data_parallel)
    losses = run_ranks(train_rank, world, asdict(cfg), timeout=120)[0]
    ref_losses, ref_vals, ref_state = _reference(cfg)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    records = [json.loads(line) for line in (Path(cfg.out) / "log.jsonl").read_text().splitlines()]
    vals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    assert [s for s, _ in vals] == [0, 2, 4]
    np.testing.assert_allclose([v for _, v in vals], ref_vals, rtol=1e-10)
    ckpt = load_checkpoint(Path(cfg.out) / "checkpoint.pt")
    for name, value in ref_state.items():
        torch.testing.assert_close(ckpt["model"][name], value, rtol=1e-10, atol=1e-12, msg=name)
    norm = ckpt["config"]["normalisation"]
    assert norm == open_dataset(cfg.data).normalisation.to_dict()
    assert Normaliser.from_dict(norm).normalisation.targets.channels == ("c",)


@pytest.mark.slow
def test_a_partition_made_for_another_dataset_is_refused_at_train_time(setup: dict, tmp_path: Path) -> None:
    root = setup["root"]
    cmd = [*warm_command(), "train", str(root / "other-parts"), "--data", setup["data"],
           "--out", str(tmp_path / "run"), "--steps", "1", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "meshshard train: error: " in done.stderr and "other-parts: partition made for another dataset (mesh 0: mesh checksum " in done.stderr
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_shards_stay_loaded_within_the_cache_bounds(setup: dict) -> None:
    """By default every mesh's shard of a small sweep stays loaded (1 GiB); a byte bound below one
    shard keeps only the last; a count bound keeps that many, the least recently used dropped."""
    parts = str(setup["root"] / "parts-1")

    def kept(reader: DatasetReader) -> list[bool]:
        first = [reader.shard(m) for m in range(3)]
        return [reader.shard(m) is first[m] for m in (2, 1, 0)]  # the most recent first

    assert kept(DatasetReader(setup["data"], parts, 0, dtype=torch.float64)) == [True, True, True]
    assert kept(DatasetReader(setup["data"], parts, 0, dtype=torch.float64, cache_bytes=1)) == [True, False, False]
    assert kept(DatasetReader(setup["data"], parts, 0, dtype=torch.float64, cache_size=2)) == [True, True, False]
