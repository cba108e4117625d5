"""A walled rectangle for the tests of the steady task's loss options (``--loss-weight``,
``--force-loss``, ``--relative-loss``): a 2 x 1 rectangle of 20 x 10 nodes (200: 3 ranks cannot own as many each) in
quadrilaterals, four samples of smooth fields, its bottom, left and top walls stored as named
boundaries, partitioned into 1 to 4 parts; and the sharded loss and gradients against a
single-process reference, float64, 1e-10."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from meshshard.data import dataset_partition_folder, open_dataset, partition_dataset, write_dataset
from meshshard.nn import MeshGraphNet
from meshshard.partition import read_metadata
from meshshard.run import load_checkpoint
from meshshard.tasks import get_task, whole_sample
from tests._ranks import all_sum

NX, NY = 19, 9


def write_rectangle(root: Path, seed: int, extra: dict[str, np.ndarray] | None = None
                    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``root/data`` and ``root/parts1`` .. ``parts4``; returns the points and the walls' node ids."""
    x, y = np.meshgrid(np.linspace(0.0, 2.0, NX + 1), np.linspace(0.0, 1.0, NY + 1), indexing="xy")
    pts = np.stack([x.ravel(), y.ravel()], 1)
    i, j = np.meshgrid(np.arange(NX), np.arange(NY), indexing="xy")
    a = (j * (NX + 1) + i).ravel()
    quads = np.stack([a, a + 1, a + NX + 2, a + NX + 1], 1)
    waves = np.random.default_rng(seed).normal(size=(4, 2, 2))
    inputs = np.stack([np.cos(pts @ w) for w in waves])
    targets = np.stack([np.stack([v[:, 0] + pts[:, 0], v[:, 1], v[:, 0] * v[:, 1]], 1) for v in inputs])
    walls = {"bottom": np.flatnonzero(pts[:, 1] == 0.0), "left": np.flatnonzero(pts[:, 0] == 0.0),
             "top": np.flatnonzero(pts[:, 1] == 1.0), **(extra or {})}
    write_dataset(root / "data", inputs, targets, pos=pts, cells=[("quad", quads)], input_names=[("a", 2)],
                  target_names=["p", ("U", 2)], val_samples=[3], dtype="float64", boundaries=walls)
    for k in (1, 2, 3, 4):
        partition_dataset(root / "data", root / f"parts{k}", k)
    return pts, walls


def wall_weights(num_nodes: int, walls: dict[str, np.ndarray]) -> np.ndarray:
    """Each node's weight under ``--loss-weight bottom=10,left=0.5`` (the larger where both apply; 1
    elsewhere), from the walls' node ids."""
    nodes = np.arange(num_nodes)
    return np.where(np.isin(nodes, walls["bottom"]), 10.0, np.where(np.isin(nodes, walls["left"]), 0.5, 1.0))


def model(seed: int) -> MeshGraphNet:
    torch.manual_seed(seed)
    return MeshGraphNet(2, 3, 3, latent_size=8, hidden_layers=1, message_passing_steps=2).to(torch.float64)


def sharded(rank: int, world: int, data: str, parts: str, configs: list[dict], seed: int) -> list:
    """Per task config, per sample (0 and 2): the loss and every parameter's gradient (summed over
    the ranks)."""
    out = []
    for config in configs:
        net, task = model(seed), get_task("steady", config)
        reader = task.reader(open_dataset(data), parts, rank, None, dtype=torch.float64)
        per = []
        for s in (0, 2):
            net.zero_grad()
            b = reader.sample(s)
            loss = task.loss(net(b.x, b.graph, b.edge_attr), b)
            loss.backward()
            per.append((float(loss.detach()), [all_sum(p.grad).numpy() for p in net.parameters()]))
        out.append(per)
    return out


def reference(data: str, seed: int, loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list:
    """One process on the whole mesh, per sample (0 and 2): ``loss_of(e, y)`` of the model's error
    ``e`` and the normalised targets ``y``, and every parameter's gradient."""
    net, out = model(seed), []
    for s in (0, 2):
        net.zero_grad()
        x, y, ei, ea = whole_sample(data, s, dtype=torch.float64)
        loss = loss_of(net(x, ei, ea) - y, y)
        loss.backward()
        out.append((float(loss.detach()), [p.grad.numpy().copy() for p in net.parameters()]))
    return out


def check_on_ranks(root: Path, data: str, world: int, configs: list[dict], wants: list, seed: int) -> None:
    """Each task config's loss and gradients on ``world`` ranks (``root/parts<world>``) equal its
    reference in ``wants``."""
    from tests._dist import run_ranks

    parts = str(root / f"parts{world}")
    got = run_ranks(sharded, world, data, parts, configs, seed, timeout=90) if world > 1 else \
        [sharded(0, 1, data, parts, configs, seed)]
    check_ranks(got, wants, parts, world)


def check_ranks(got: list, wants: list, parts: str, world: int) -> None:
    """Every rank's losses and gradients (per config, per sample) equal the references, to 1e-10,
    on uneven shards."""
    counts = [p["num_owned"] for p in read_metadata(dataset_partition_folder(parts, 0))["parts"]]
    for rank in got:
        for per_config, want in zip(rank, wants, strict=True):
            for (loss, grads), (ref, ref_grads) in zip(per_config, want, strict=True):
                assert abs(loss - ref) <= 1e-10 * abs(ref)
                for g, r in zip(grads, ref_grads, strict=True):
                    np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-13)
    assert len(counts) == world and (world != 3 or len(set(counts)) > 1)  # uneven shards


def check_resumed(main: Any, common: list[str], out: Path, key: str, recorded: dict, flag: str, other: str,
                  capsys: Any) -> None:
    """``--resume`` of ``out`` keeps the run's ``key`` setting, and another (``flag other``) is
    refused: the run would not repeat."""
    assert main(["train", *common[:-1], "--out", str(out), "--resume", "--steps", "2", "-q"]) == 0
    assert load_checkpoint(out / "checkpoint.pt")["config"][key] == recorded
    assert main(["train", *common[:-1], "--out", str(out), "--resume", "--steps", "3", flag, other, "-q"]) == 2
    assert f"cannot resume with changed settings: {key}" in capsys.readouterr().err


def check_refused_beside_subsets_and_trajectories(data: str, tmp_path: Path, key: str, flag: str) -> None:
    """``key`` (``flag``) is refused with ``--max-points`` and by the transient task, in one line."""
    from tests.meshshard.tasks import _trajectories

    with pytest.raises(ValueError, match=rf"^Expected {flag} without --max-points \(got --max-points 50\)"):
        get_task("steady", {key: {"bottom": 2.0}, "max_points": 50}).check_dataset(open_dataset(data))
    trajectories = open_dataset(_trajectories.write(tmp_path, parts=(1,))["data"])
    with pytest.raises(ValueError, match=rf"^Expected {flag} only with the steady task \(got --task transient"):
        get_task("transient", {key: {"bottom": 2.0}}).check_dataset(trajectories)


def check_training(root: Path, data: str, key: str, value: Any, recorded: str) -> None:
    """3 steps with ``key = value`` on three ranks equal one process's; recorded in the
    checkpoint, and in ``config.toml`` as the line ``recorded``."""
    from dataclasses import asdict

    from meshshard.run import TrainConfig
    from tests._dist import run_ranks
    from tests._ranks import train_rank

    cfg = TrainConfig(partition=str(root / "parts3"), data=data, out=str(root / "run3"), steps=3, lr=1e-2,
                      latent_size=8, hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64",
                      **{key: dict(value) if isinstance(value, dict) else value})
    three = run_ranks(train_rank, 3, asdict(cfg), timeout=120)[0]
    one = train_rank(0, 1, asdict(TrainConfig(**{**asdict(cfg), "partition": str(root / "parts1"),
                                                 "out": str(root / "run1")})))
    np.testing.assert_allclose(three, one, rtol=1e-10)
    assert load_checkpoint(root / "run3" / "checkpoint.pt")["config"][key] == value
    assert recorded in (root / "run3" / "config.toml").read_text()
