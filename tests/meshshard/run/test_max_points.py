"""``--max-points N``: point models train on about N random points per sample and epoch.

The subset is a pure function of (seed, epoch, sample, global id): training on 2 ranks equals one
process (losses and weights, float64, 1e-10) for ball-attention and transolver; the subset is not
the whole cloud (the losses differ from training on every point) and changes between epochs; a
graph model is refused in one line.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import build_dataset, partition_dataset
from meshshard.run import TrainConfig, keep_points, load_checkpoint
from meshshard.run._subsample import sample_epoch
from tests._dist import run_ranks
from tests._ranks import train_rank

ARGS = {"ball-attention": {"width": 8, "layers": 2, "heads": 2, "radius": 0.3, "max_neighbors": 8},
        "ball-attention-checkpoint": {"width": 8, "layers": 3, "heads": 2, "radius": [0.2, 0.3], "max_neighbors": 8,
                                      "checkpoint": True},
        "transolver": {"width": 8, "layers": 2, "heads": 2, "slices": 4, "mlp_ratio": 2, "checkpoint": True}}


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("maxpoints")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(8)
    for i, n in enumerate((140, 110, 160)):
        pos = rng.random((n, 3))
        np.savez(src / f"c{i}.npz", pos=pos, p=np.sin(4 * pos[:, 0]) * pos[:, 2])
    build_dataset([src], root / "data", inputs="pos", targets="p", val_fraction=0, dtype="float64", max_points=50)
    for k in (1, 2):
        partition_dataset(root / "data", root / f"parts{k}", k, method="rcb")
    return root


def _cfg(root: Path, parts: int, name: str, case: str, max_points: int) -> dict:
    return asdict(TrainConfig(partition=str(root / f"parts{parts}"), data=str(root / "data"), out=str(root / name),
                              steps=4, lr=1e-2, quiet=True, dtype="float64",
                              architecture=case.removesuffix("-checkpoint"), model_args=ARGS[case],
                              max_points=max_points))


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARGS))
def test_training_on_a_subset_is_the_same_on_two_ranks(clouds: Path, arch: str) -> None:
    one = run_ranks(train_rank, 1, _cfg(clouds, 1, f"{arch}-1", arch, 50), timeout=120)[0]
    two = run_ranks(train_rank, 2, _cfg(clouds, 2, f"{arch}-2", arch, 50), timeout=120)
    np.testing.assert_allclose(two[0], one, rtol=1e-10)
    np.testing.assert_allclose(two[1], one, rtol=1e-10)
    a = load_checkpoint(clouds / f"{arch}-1" / "checkpoint.pt")
    b = load_checkpoint(clouds / f"{arch}-2" / "checkpoint.pt")
    assert a["config"]["max_points"] == 50
    for key, value in a["model"].items():
        # normwise relative: the attention's key bias has a zero gradient (a shift of every key of a
        # query leaves its softmax unchanged), which Adam turns into steps of rounding noise, ~1e-11
        error = (b["model"][key] - value).norm() / max(value.norm(), 1e-30)
        assert error <= 1e-10, (key, float(error))
    every = run_ranks(train_rank, 1, _cfg(clouds, 1, f"{arch}-all", arch, 0), timeout=120)[0]
    assert not np.allclose(every, one, rtol=1e-6)  # the subset is not the whole cloud


def test_the_subset_is_a_function_of_the_ids_and_changes_between_epochs() -> None:
    ids = np.arange(20_000)
    kept = keep_points(3, 0, 5, ids, len(ids), 2_000)
    assert abs(int(kept.sum()) - 2_000) < 4 * np.sqrt(2_000)  # about N: each point with probability N / n
    parts = np.array_split(np.random.default_rng(0).permutation(ids), 3)  # any split, any order
    for part in parts:
        np.testing.assert_array_equal(keep_points(3, 0, 5, part, len(ids), 2_000), kept[part])
    assert (keep_points(3, 1, 5, ids, len(ids), 2_000) != kept).mean() > 0.1  # the next epoch: another subset
    assert (keep_points(3, 0, 6, ids, len(ids), 2_000) != kept).mean() > 0.1  # another sample: another subset
    assert (keep_points(4, 0, 5, ids, len(ids), 2_000) != kept).mean() > 0.1  # another seed
    assert keep_points(3, 0, 5, ids[:100], 100, 2_000).all()  # a sample of at most N points: all of them
    assert [sample_epoch(s, 0, 1, 1, 0, 3) for s in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    assert [sample_epoch(s, 1, 2, 2, 1, 4) for s in range(3)] == [0, 1, 2]  # (2 s + 1) * 2 + 1 = 3, 7, 11


def test_a_graph_model_is_refused(clouds: Path, capsys) -> None:
    out = clouds / "refused"
    assert main(["train", str(clouds / "parts1"), "--data", str(clouds / "data"), "--out", str(out), "--steps", "1",
                 "--max-points", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("Expected --max-points only with a point model, --model ball-attention or "
                                     "--model transolver (got the built-in meshgraphnet") in err, err
    assert not out.exists()
    # the dataset's own --max-points: a point model takes it; a graph model trains on every node, with a note
    assert main(["train", str(clouds / "parts1"), "--data", str(clouds / "data"), "--out", str(out), "--steps", "1",
                 "--latent", "8", "--mp-steps", "1", "--dtype", "float64"]) == 0
    assert "asks for --max-points 50; only point models" in capsys.readouterr().err
    assert load_checkpoint(out / "checkpoint.pt")["config"]["max_points"] == 0
    assert main(["train", str(clouds / "parts1"), "--data", str(clouds / "data"), "--out", str(clouds / "taken"),
                 "--steps", "1", "--model", "transolver", "--model-args", '{"width": 8, "heads": 2, "layers": 1}',
                 "--dtype", "float64", "-q"]) == 0
    assert load_checkpoint(clouds / "taken" / "checkpoint.pt")["config"]["max_points"] == 50
