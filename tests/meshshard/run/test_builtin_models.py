"""Built-in models chosen by name: ``train --model transolver`` and MeshGraphNet's
``--global-attention K``. Sharded training equals one process (float64, 1e-10), the run records
the choice so predict, info and --resume rebuild it without --model, and wrong settings are
refused in one line.

Mesh: ../shared/data/sfepy/big.mesh (2-D triangles), or a generated triangle mesh when it is missing.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.run import TrainConfig, load_checkpoint
from tests._dist import run_ranks
from tests._ranks import train_rank
from tests.meshshard.run._cases import waves_on_big_mesh

SMALL = {"width": 8, "layers": 2, "heads": 2, "slices": 4, "mlp_ratio": 2}


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    return waves_on_big_mesh(tmp_path_factory.mktemp("builtin"), 4, 3, 1.0, 0.5, (1, 3))


def _cfg(case: dict, parts: int, name: str, **settings) -> dict:
    return asdict(TrainConfig(partition=str(case["root"] / f"parts{parts}"), data=case["data"],
                              out=str(case["root"] / name), steps=3, lr=1e-2, quiet=True, dtype="float64",
                              **settings))


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    {"architecture": "transolver", "model_args": SMALL},
    {"latent_size": 8, "hidden_layers": 1, "message_passing_steps": 2, "global_attention": 1, "attention_heads": 2,
     "attention_slices": 4},
], ids=["transolver", "meshgraphnet-global-attention"])
def test_builtin_models_train_on_shards_exactly_as_one_process(case: dict, settings: dict) -> None:
    name = settings.get("architecture", "mgn")
    one = run_ranks(train_rank, 1, _cfg(case, 1, f"{name}-1", **settings), timeout=120)[0]
    three = run_ranks(train_rank, 3, _cfg(case, 3, f"{name}-3", **settings), timeout=180)
    np.testing.assert_allclose(three[0], one, rtol=1e-10)
    a = load_checkpoint(case["root"] / f"{name}-1" / "checkpoint.pt")
    b = load_checkpoint(case["root"] / f"{name}-3" / "checkpoint.pt")
    assert a["config"]["architecture"] == settings.get("architecture", "meshgraphnet")
    assert any("attention" in key for key in a["model"])
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.slow
def test_the_commands_take_a_builtin_model_by_name(case: dict, capsys) -> None:
    root, data = case["root"], case["data"]
    run = str(root / "cli-run")
    base = ["train", str(root / "parts1"), "--data", data, "--out", run, "--dtype", "float64", "-q"]
    assert main([*base, "--steps", "2", "--model", "transolver", "--model-args",
                 '{"width": 8, "layers": 1, "heads": 2, "slices": 4}']) == 0
    capsys.readouterr()
    assert main(["info", run]) == 0
    assert "Transolver, width 8, layers 1, heads 2, slices 4, mlp_ratio 4" in capsys.readouterr().out
    assert main([*base, "--steps", "3", "--resume"]) == 0  # the architecture and its settings come from the run
    ckpt = load_checkpoint(Path(run) / "checkpoint.pt")
    assert ckpt["step"] == 3 and ckpt["config"]["architecture"] == "transolver"
    assert ckpt["config"]["model_args"] == {"width": 8, "layers": 1, "heads": 2, "slices": 4}
    assert main(["predict", run, "--data", data, "--out", str(root / "cli-pred"), "--no-plots", "-q"]) == 0
    for extra, message in (
        (["--model", "transolver", "--latent", "8"], "--latent set(s) the built-in MeshGraphNet; with --model "
                                                     "transolver, give the model's settings as --model-args"),
        (["--model", "transolver", "--model-args", '{"depth": 2}'], "Expected --model-args of --model transolver "
                                                                    "among width, layers, heads, slices, mlp_ratio"),
        (["--model", "transolver", "--model-args", '{"width": 10, "heads": 4}'], "a multiple of heads (4)"),
        (["--global-attention", "-1"], "Expected --global-attention 0 (off) or more"),
    ):
        capsys.readouterr()
        assert main(["train", str(root / "parts1"), "--data", data, "--out", str(root / "refused"), "--steps", "1",
                     *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (root / "refused").exists()
