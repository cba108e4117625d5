"""Training: exact resume, data x domain parallel equal to one process, multi-node, a rank dying.

Mesh: ../shared/data/sfepy/big.mesh (2-D triangles, SfePy, BSD-3-Clause), heat-diffusion samples
simulated on it, a 2-part METIS partition. Everything runs in float64 so equality is 1e-10.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import meshio
import numpy as np
import pytest
import torch

from meshshard.data import open_dataset, partition_dataset
from meshshard.run import TrainConfig, load_checkpoint, sample_index, train
from tests._dist import RankFailure, free_port, run_ranks
from tests._examples import example_module
from tests._meshes import mesh_file
from tests._ranks import train_rank
from tests.meshshard.run._reference import whole_mesh_training

STEPS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("train")
    path = mesh_file("sfepy/big.mesh", root)  # a generated triangle mesh when ../shared/data is missing
    mesh = meshio.read(path)
    tri = np.concatenate([b.data for b in mesh.cells if b.type == "triangle"])
    heat = example_module("heat_diffusion", "simulate")
    heat.write_dataset(heat.simulate_heat(mesh.points[:, :2], tri, trajectories=3, steps=2, seed=1), root / "data")
    partition_dataset(root / "data", root / "partition", 2)
    partition_dataset(root / "data", root / "partition1", 1)
    base = TrainConfig(partition=str(root / "partition"), data=str(root / "data"), out="", steps=STEPS, lr=1e-2,
                       latent_size=8, hidden_layers=1, message_passing_steps=2, checkpoint_every=2,
                       quiet=True, dtype="float64", data_parallel=2,
                       lr_schedule="constant")  # the loop's exactness here; the schedules' in test_controls
    return {"root": root, "mesh": path, "cfg": base}


def _run(setup: dict, name: str, **changes) -> tuple[list[float], dict]:
    cfg = asdict(setup["cfg"]) | {"out": str(setup["root"] / name)} | changes
    losses = run_ranks(train_rank, 4, cfg, timeout=180)[0]
    return losses, load_checkpoint(Path(cfg["out"]) / "checkpoint.pt")


def _reference(setup: dict, data_parallel: int = 2) -> tuple[list[float], dict]:
    """Single-process training on the whole mesh with the same batches (``data_parallel`` samples per step)."""
    cfg = setup["cfg"]
    train_ids = open_dataset(cfg.data).train
    losses, state, _ = whole_mesh_training(
        cfg, STEPS, lambda step: [train_ids[sample_index(cfg.seed, step, d, data_parallel, len(train_ids))]
                                  for d in range(data_parallel)])
    return losses, state


@pytest.fixture(scope="module")
def uninterrupted(setup: dict) -> tuple[list[float], dict]:
    return _run(setup, "full")


@pytest.mark.slow
def test_data_x_domain_parallel_equals_single_process_training(setup: dict, uninterrupted) -> None:
    losses, ckpt = uninterrupted
    ref_losses, ref_state = _reference(setup)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    assert ckpt["step"] == STEPS
    for name, value in ref_state.items():
        torch.testing.assert_close(ckpt["model"][name], value, rtol=1e-10, atol=1e-12, msg=name)


def _train_twice(rank: int, world: int, cfgs: list[dict]) -> list[tuple[list[float], dict]]:
    out = []
    for cfg in cfgs:
        losses = train(TrainConfig.from_dict(cfg))
        state = load_checkpoint(Path(cfg["out"]) / "checkpoint.pt")["model"]
        out.append((losses, {k: v.numpy() for k, v in state.items()}))  # numpy: pickled by value
    return out


@pytest.mark.slow
def test_data_parallel_only_and_domain_parallel_only_equal_single_process_training(setup: dict) -> None:
    """2 ranks as 2 data-parallel ranks of one part each, then as one domain group of 2 parts."""
    base = asdict(setup["cfg"])
    cfgs = [base | {"partition": str(setup["root"] / "partition1"), "data_parallel": 2, "out": str(setup["root"] / "dp")},
            base | {"data_parallel": 1, "out": str(setup["root"] / "domain")}]
    results = run_ranks(_train_twice, 2, cfgs, timeout=240)
    for (losses, state), data_parallel in zip(results[0], (2, 1), strict=True):
        ref_losses, ref_state = _reference(setup, data_parallel)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
        for name, value in ref_state.items():
            torch.testing.assert_close(torch.from_numpy(state[name]), value, rtol=1e-10, atol=1e-12, msg=name)
    assert results[1][0][0] == results[0][0][0] and results[1][1][0] == results[0][1][0]  # every rank agrees


@pytest.mark.slow
def test_interrupted_and_resumed_run_repeats_the_uninterrupted_one(setup: dict, uninterrupted) -> None:
    _run(setup, "resumed", steps=2)
    losses, ckpt = _run(setup, "resumed", resume=True)
    assert losses == uninterrupted[0]  # bit for bit
    for name, value in uninterrupted[1]["model"].items():
        assert torch.equal(ckpt["model"][name], value), name
    log = (setup["root"] / "resumed" / "log.jsonl").read_text().splitlines()
    assert len(log) == STEPS


def _cli(setup: dict, out: str, extra: list[str]) -> list[str]:
    cfg = setup["cfg"]
    return [sys.executable, "-m", "meshshard", "train", cfg.partition, "--data", cfg.data, "--out", out,
            "--steps", str(STEPS), "--lr", str(cfg.lr), "--latent", "8", "--hidden-layers", "1", "--mp-steps", "2",
            "--every", "2", "--dtype", "float64", "--lr-schedule", cfg.lr_schedule, "--quiet", *extra]


@pytest.mark.slow
def test_two_torchrun_nodes_on_loopback_equal_one_node(setup: dict, uninterrupted) -> None:
    port = str(free_port())
    out = str(setup["root"] / "multinode")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port,
             *_cli(setup, out, ["--data-parallel", "2"])[1:]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    ckpt = load_checkpoint(Path(out) / "checkpoint.pt")
    assert ckpt["world_size"] == 4 and ckpt["losses"] == uninterrupted[0]
    for name, value in uninterrupted[1]["model"].items():
        assert torch.equal(ckpt["model"][name], value), name


@pytest.mark.slow
def test_a_rank_dying_mid_step_stops_the_others_with_a_clear_error(setup: dict) -> None:
    out = setup["root"] / "dies"
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = os.environ | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": port, "MESHSHARD_TIMEOUT": "60", "MESHSHARD_FAIL_AT": "1:3"}
        procs.append(subprocess.Popen(_cli(setup, str(out), ["--data-parallel", "1"]), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    start = time.monotonic()
    results = [p.communicate(timeout=120) for p in procs]
    assert procs[1].returncode == 17 and "dying in the middle of step 3" in results[1][1]
    assert procs[0].returncode == 1, results[0]
    assert "rank 0: step 3 failed" in results[0][1] and "rerun with --resume" in results[0][1], results[0][1]
    assert "Last checkpoint:" in results[0][1] and "(step 2)" in results[0][1], results[0][1]
    assert time.monotonic() - start < 90
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 2


def test_partition_and_world_size_must_agree(setup: dict) -> None:
    cfg = asdict(setup["cfg"]) | {"out": str(setup["root"] / "bad"), "data_parallel": 1}
    with pytest.raises(RankFailure, match=r"\nValueError: Expected a partition into 4 parts \(4 ranks / 1 data-parallel\) "
                                          r"\(got 2 parts in .*partition\); make one with meshshard partition .*data "
                                          r"--parts 4 --out NEW_PARTS\n$") as err:
        run_ranks(train_rank, 4, cfg, timeout=60)
    assert "in train\n" in err.value.details  # raised by train() itself, before any training step


def test_one_process_on_a_partition_into_parts_says_to_start_ranks(setup: dict) -> None:
    cfg = TrainConfig.from_dict(asdict(setup["cfg"]) | {"out": str(setup["root"] / "one"), "data_parallel": 1})
    with pytest.raises(ValueError, match=r"Expected a partition into 1 part \(1 rank / 1 data-parallel\) \(got 2 parts in "
                                         r".*\); train it on 2 ranks with --nproc 2, or under torchrun$"):
        train(cfg)
    assert not (setup["root"] / "one").exists()


@pytest.mark.slow
def test_kept_activations_train_the_same_run(setup: dict, uninterrupted) -> None:
    """--keep-activations: the edge MLPs keep their activations for the backward instead of
    recomputing them; the same losses and weights to the bit, on 2 x 2 ranks; recorded, and the
    model rebuilt from the run keeps them."""
    from meshshard.cli import main
    from meshshard.run import ModelRecipe

    losses, ckpt = _run(setup, "kept", keep_activations=True)
    assert losses == uninterrupted[0]
    for name, value in uninterrupted[1]["model"].items():
        assert torch.equal(ckpt["model"][name], value), name
    assert ckpt["config"]["keep_activations"] is True and uninterrupted[1]["config"]["keep_activations"] is False
    blocks = [ModelRecipe.from_config(c["config"]).build(4, 3, 1).processor for c in (ckpt, uninterrupted[1])]
    assert [b.recompute for b in blocks[0]] == [False, False] and [b.recompute for b in blocks[1]] == [True, True]
    assert main(["train", str(setup["root"] / "partition1"), "--data", str(setup["root"] / "data"), "--out",
                 str(setup["root"] / "kept-transolver"), "--model", "transolver", "--keep-activations", "-q"]) == 2


@pytest.mark.slow
def test_bf16_mixed_precision_trains_close_to_float32(setup: dict) -> None:
    """--precision bf16-mixed: bfloat16 products, float32 weights and sums; losses near the float32 run's."""
    base = {"partition": str(setup["root"] / "partition1"), "data_parallel": 1, "dtype": "float32"}
    fp32, _ = _run_one(setup, "fp32", **base)
    bf16, ckpt = _run_one(setup, "bf16", **base, precision="bf16-mixed")
    assert all(np.isfinite(bf16))
    assert all(p.dtype == torch.float32 for p in ckpt["model"].values())  # master weights stay float32
    rel = max(abs(a - b) / abs(b) for a, b in zip(bf16, fp32))
    assert 0 < rel < 0.05, (bf16, fp32)
    with pytest.raises(ValueError, match=r"Expected --precision fp32, or bf16-mixed or tf32 with --dtype float32 "
                                         r"\(got 'bf16-mixed', float64\)"):
        train(TrainConfig.from_dict(asdict(setup["cfg"]) | base | {"out": str(setup["root"] / "bf16-64"), "dtype": "float64",
                                                                  "precision": "bf16-mixed"}))


def test_tf32_lets_float32_products_use_tf32_while_training_and_restores_the_setting(
        setup: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """--precision tf32: torch.set_float32_matmul_precision("high") during every step (what lets a
    GPU's products use TF32, and the fused edge MLP kernel run), the caller's setting after; refused
    with float64 in one line."""
    from meshshard.run import _training

    seen = []
    real = _training._Session.backward

    def backward(self, *args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_training._Session, "backward", backward)
    base = asdict(setup["cfg"]) | {"partition": str(setup["root"] / "partition1"), "data_parallel": 1, "steps": 2,
                                   "dtype": "float32"}
    assert torch.get_float32_matmul_precision() == "highest"
    losses = train(TrainConfig.from_dict(base | {"out": str(setup["root"] / "tf32"), "precision": "tf32"}))
    assert len(losses) == 2 and all(np.isfinite(losses)) and seen == ["high", "high"]
    assert torch.get_float32_matmul_precision() == "highest"
    del seen[:]
    train(TrainConfig.from_dict(base | {"out": str(setup["root"] / "fp32-2")}))
    assert seen == ["highest", "highest"]
    with pytest.raises(ValueError, match=r"^Expected --precision fp32, or bf16-mixed or tf32 with --dtype float32 "
                                         r"\(got 'tf32', float64\)$"):
        train(TrainConfig.from_dict(base | {"out": str(setup["root"] / "tf32-64"), "dtype": "float64",
                                            "precision": "tf32"}))
    assert torch.get_float32_matmul_precision() == "highest"


def _run_one(setup: dict, name: str, **changes) -> tuple[list[float], dict]:
    cfg = asdict(setup["cfg"]) | {"out": str(setup["root"] / name)} | changes
    losses = run_ranks(train_rank, 1, cfg, timeout=180)[0]
    return losses, load_checkpoint(Path(cfg["out"]) / "checkpoint.pt")


def test_a_batch_larger_than_the_training_split_is_refused(setup: dict) -> None:
    """Issue 36 (minor): --batch larger than the training split was accepted (1e12 never finished a step)."""
    train_ids = open_dataset(setup["cfg"].data).train
    cfg = asdict(setup["cfg"]) | {"out": str(setup["root"] / "big-batch"), "partition": str(setup["root"] / "partition1"),
                                  "data_parallel": 1, "batch": 10**12}
    with pytest.raises(ValueError, match=rf"^Expected --batch at most the training samples \({len(train_ids)} in "
                                         r".*\) \(got 1000000000000\)$"):
        train(TrainConfig.from_dict(cfg))
    assert not (setup["root"] / "big-batch" / "checkpoint.pt").exists()


def test_a_damaged_sample_file_during_training_is_a_data_error(setup: dict, tmp_path: Path) -> None:
    """Issue 36 (minor): a damaged sample file during train exited 1 with "failed in the model's forward
    or backward"; it is a data error again (a ValueError: exit 2), naming the file."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(setup["cfg"].data, data)
    for sample in (data / "samples").iterdir():
        for array in sample.glob("*.npy"):
            array.write_bytes(b"not an array")
    cfg = asdict(setup["cfg"]) | {"out": str(tmp_path / "run"), "partition": str(setup["root"] / "partition1"),
                                  "data_parallel": 1, "data": str(data)}
    with pytest.raises(ValueError, match=r"^rank 0: step 0: .*samples/\d{5}/\w+\.npy") as info:
        train(TrainConfig.from_dict(cfg))
    assert "model's forward" not in str(info.value)
