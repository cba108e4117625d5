"""``meshshard predict --mirror-average``: the prediction of a mirrored sample is exactly the mirror
of the original's (which a plain prediction's is not), the same on one process and on 2 ranks, and
a run that never saw mirrors, or whose target scales use a mirrored parameter (a mirror's
targets then scaled otherwise), is refused in one line.

The cases are those of ``tests/data/test_mirror.py`` (a disc around a body, fields with no
symmetry); the dataset mirrors its training cases (``--mirror y:U --mirror-params camber``) with a
``knn:2`` prior, so a mirror's inputs, edges and prior are computed from its mirrored mesh by the
dataset, not by the rule the prediction mirrors with. A run of three steps in float64.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import mirrored_channels, open_dataset, partition_dataset
from meshshard.run import PredictConfig, TrainConfig, check_prediction_request, predict, train
from meshshard.run._mirror_average import mirror_of_run
from meshshard.run._request import check_mirror_average
from tests._dist import run_ranks
from tests._ranks import predict_rank
from tests._refusals import assert_refused_in_one_line
from tests.data.test_mirror import _args, _write


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mirror-average")
    _write(root)
    common = ["--val-samples", "v", "--mean-field", "knn:2"]
    mirror = ["--mirror", "y:U", "--mirror-params", "camber"]
    speed = ["--target-scale", "U=speed,p=speed**2"]  # (_args's p scale, speed**2+camber, would be refused)
    assert main(_args(root, "cases", "data", "params.csv", *common, *mirror, *speed)) == 0
    assert main(_args(root, "cases", "plain", "params.csv", *common, *speed)) == 0
    for name in ("data", "plain"):
        partition_dataset(root / name, root / f"{name}-parts1", 1)
    partition_dataset(root / "data", root / "data-parts2", 2)
    for name in ("data", "plain"):
        train(TrainConfig(partition=str(root / f"{name}-parts1"), data=str(root / name), out=str(root / f"run-{name}"),
                          steps=3, lr=1e-2, latent_size=8, hidden_layers=1, message_passing_steps=2, global_attention=1,
                          attention_heads=2, attention_slices=4, quiet=True, dtype="float64"))
    return {"root": root, "data": root / "data", "run": root / "run-data", "plain-run": root / "run-plain"}


def _predictions(folder: Path) -> dict[str, np.ndarray]:
    """Per sample, ``(N, 4)``: p and U predicted, in node order."""
    out = {}
    for record in json.loads((folder / "metrics.json").read_text())["samples"]:
        mesh = meshio.read(folder / record["file"])
        order = np.argsort(mesh.point_data["global_id"])
        out[record["name"]] = np.c_[mesh.point_data["p_pred"], mesh.point_data["U_pred"]][order]
    return out


@pytest.mark.slow
def test_a_mirrored_samples_prediction_is_the_mirror_of_the_originals(runs: dict[str, Path]) -> None:
    root, meta = runs["root"], open_dataset(runs["data"]).meta
    assert [c for c, f in zip(meta["target_channels"], mirrored_channels(meta, meta["targets"])) if f] == ["U[1]"]
    base = PredictConfig(run=str(runs["run"]), data=str(runs["data"]), out="", samples="all", quiet=True, plots=False)
    predict(replace(base, out=str(root / "pred-plain")))
    averaged = predict(replace(base, out=str(root / "pred-averaged"), mirror_average=True))
    two = run_ranks(predict_rank, 2, asdict(base) | {"out": str(root / "pred-averaged-2"), "mirror_average": True,
                                                      "partition": str(root / "data-parts2"), "gather": True},
                    timeout=180)[0]
    plain, mean, mean2 = (_predictions(root / n) for n in ("pred-plain", "pred-averaged", "pred-averaged-2"))
    flip = np.array([1.0, 1.0, -1.0, 1.0])  # p, U[0], U[1], U[2]
    scale = np.abs(mean["a"]).max()
    for original in ("a", "b"):
        mirror = f"{original}~mirror-y"
        np.testing.assert_allclose(mean[mirror], mean[original] * flip, rtol=0, atol=1e-10 * scale)
        # a plain prediction is not symmetric: the test above can fail
        assert np.abs(plain[mirror] - plain[original] * flip).max() > 1e-4 * scale
        # the mean of the two forward passes: the plain prediction and the mirror of the mirror's
        np.testing.assert_allclose(mean[original], (plain[original] + plain[mirror] * flip) / 2, rtol=0,
                                   atol=1e-10 * scale)
    for name in mean:
        np.testing.assert_allclose(mean2[name], mean[name], rtol=0, atol=1e-10 * scale)
    assert two["samples"][0]["fields"]["p"]["rmse"] == pytest.approx(averaged["samples"][0]["fields"]["p"]["rmse"],
                                                                      rel=1e-10)
    metrics = json.loads((root / "pred-averaged" / "metrics.json").read_text())
    assert metrics["mirror_average"] is True
    assert "mirror_average" not in json.loads((root / "pred-plain" / "metrics.json").read_text())


def test_a_run_that_never_saw_mirrors_or_scales_by_a_mirrored_parameter_is_refused_in_one_line(runs: dict[str, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    import torch

    config = torch.load(runs["run"] / "checkpoint.pt", weights_only=True)["config"]
    assert config["mirror"] == {"axis": "y", "vectors": ["U"], "parameters": ["camber"]}
    plain = runs["root"] / "plain"
    with pytest.raises(ValueError, match=r"run-plain: Expected a run trained on a dataset made with meshshard dataset "
                                         r"--mirror for --mirror-average"):
        check_prediction_request(PredictConfig(run=str(runs["plain-run"]), data=str(plain), out=str(tmp_path / "p"),
                                               mirror_average=True))
    assert_refused_in_one_line(["predict", str(runs["plain-run"]), "--data", str(plain), "--out",
                                str(tmp_path / "p"), "--mirror-average"], "--mirror-average", capsys, tmp_path / "p")
    # a run whose p scale is speed**2+camber (test_mirror's dataset as it is): its mirror's p scaled otherwise
    with pytest.raises(ValueError, match=r"run-data: Expected target scales apart from the mirrored parameters for "
                                         r"--mirror-average \(got p=speed\*\*2\+camber, of camber: "):
        mirror_of_run(config | {"target_scales": {"U": "speed", "p": "speed**2+camber"}},
                      open_dataset(runs["data"]).meta, str(runs["run"]))
    # a point model (its ball query reads the positions, which a mirror does not flip), before any rank starts
    with pytest.raises(ValueError, match=r"run-data: Expected a mesh model for --mirror-average \(a point model"):
        check_mirror_average(PredictConfig(run=str(runs["run"]), data=str(runs["data"]), out=str(tmp_path / "p"),
                                           mirror_average=True), config | {"architecture": "ball-attention"})
    check_prediction_request(PredictConfig(run=str(runs["run"]), data=str(runs["data"]), out=str(tmp_path / "p"),
                                           mirror_average=True))  # accepted
    assert not (tmp_path / "p").exists()
