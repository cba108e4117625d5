"""The halo radius a partition of a cloud records (``meshshard partition DATA --radius R``) against
the halo ``BallQueryPlan`` builds at run time for that radius: on every rank, the points of other
ranks within R of an owned point (``radius_ghosts``, counted when partitioning) are all among the
plan's ghosts, which hold a little more (the plan tests boxes of a lattice, not points)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from meshshard import ShardSpec
from meshshard.data import (
    build_dataset,
    dataset_partition_folder,
    open_dataset,
    partition_dataset,
    read_partitions_metadata,
)
from meshshard.nn import BallQueryPlan
from meshshard.partition import check_radius, load_partition, read_metadata
from tests._dist import run_ranks

RADIUS = 0.12
METHODS = ("rcb", "metis")


def _plan_ghosts(rank: int, world: int, folder: str) -> list[int]:
    part = load_partition(folder, rank)
    spec = ShardSpec.from_partition(part)
    pos = torch.as_tensor(part.pos[: len(part.owned_ids)], dtype=torch.float64)
    plan = BallQueryPlan.build(pos, RADIUS, 16, spec)
    return sorted(plan.ghost_ids.tolist())


def _plan_ghosts_of_each(rank: int, world: int, folders: list[str]) -> list[list[int]]:
    return [_plan_ghosts(rank, world, folder) for folder in folders]


def test_recorded_halo_is_within_the_ball_query_halo(tmp_path: Path) -> None:
    """For each partition method; both methods' plans are built in one spawn of 3 ranks."""
    pos = np.random.default_rng(3).random((1500, 3))
    np.savez(tmp_path / "cloud.npz", pos=pos, p=pos[:, 0])
    data = build_dataset([tmp_path / "cloud.npz"], tmp_path / "data", inputs="pos", targets="p", val_fraction=0)
    points = open_dataset(data).mesh(0).points
    folders = {}
    for method in METHODS:
        parts = partition_dataset(data, tmp_path / f"parts-{method}", 3, method=method, radius=RADIUS)
        check_radius(read_partitions_metadata(parts), RADIUS)
        folders[method] = dataset_partition_folder(parts, 0)
    found = run_ranks(_plan_ghosts_of_each, 3, [str(f) for f in folders.values()])
    for m, (method, folder) in enumerate(folders.items()):
        recorded = read_metadata(folder)["radius_ghosts"]
        ghosts = [found[rank][m] for rank in range(3)]
        for rank in range(3):
            owned = load_partition(folder, rank).owned_ids
            mine = np.zeros(len(points), dtype=bool)
            mine[owned] = True
            d = np.linalg.norm(points[~mine][:, None] - points[mine][None], axis=2).min(axis=1)
            exact = set(np.flatnonzero(~mine)[d <= RADIUS].tolist())
            assert len(exact) == recorded[rank] > 0, (method, rank)
            assert exact <= set(ghosts[rank]), (method, rank)
        assert sum(len(g) for g in ghosts) >= sum(recorded), method
