"""``meshshard dataset --mean-field``: the training cases' node-wise mean of the targets as input
channels, the targets learnt as the difference from it, and predictions that add it back; new
cases take it with ``--mean-field-from``; what cannot work is refused in one line."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np
import pytest
import torch
from scipy.spatial import Delaunay

from meshshard.cli import main
from meshshard.data import open_dataset, write_dataset
from meshshard.run import load_run
from meshshard.tasks import DatasetReader, whole_sample
from tests._refusals import assert_refused_in_one_line

SPEEDS = {"u10": 10.0, "u12": 12.0, "u14": 14.0, "u16": 16.0, "u18": 18.0}


def _points() -> tuple[np.ndarray, np.ndarray]:
    points = np.random.default_rng(0).random((60, 2))
    return points, Delaunay(points).simplices


def _cases(root: Path, speeds: dict[str, float] = SPEEDS, shift: float = 0.0) -> Path:
    points, tri = _points()
    folder = root / "cases"
    folder.mkdir()
    for name, speed in speeds.items():
        x, y = points[:, 0] + shift, points[:, 1]
        p = speed ** 2 * (1 + x * y + 0.01 * speed * x)
        u = speed * np.c_[1 + y + 0.01 * speed * x * x, 0.1 * np.sin(3 * x) * speed / 10, np.zeros(60)]
        meshio.write(folder / f"{name}.vtu", meshio.Mesh(np.c_[x, y, np.zeros(60)], [("triangle", tri)],
                                                        point_data={"p": p, "U": u}))
    return folder


def _table(root: Path, speeds: dict[str, float] = SPEEDS) -> Path:
    path = root / "params.csv"
    path.write_text("sample,speed\n" + "".join(f"{n},{s}\n" for n, s in speeds.items()))
    return path


def _dataset(root: Path, *extra: str, out: str = "data") -> list[str]:
    return ["dataset", str(root / "cases"), "--out", str(root / out), "--inputs", "pos[0],pos[1]", "--targets", "p,U",
            "--params", str(root / "params.csv"), "--target-scale", "p=speed**2,U=speed", "--val-samples", "u14",
            "--same-mesh", "--mean-field", *extra]


def test_the_mean_field_is_stored_as_inputs_and_the_targets_normalised_about_it(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _cases(tmp_path)
    _table(tmp_path)
    assert main(_dataset(tmp_path, "--dtype", "float64")) == 0
    data = open_dataset(tmp_path / "data")
    assert data.input_channels == ["pos[0]", "pos[1]", "speed", "p_mean", "U_mean[0]", "U_mean[1]", "U_mean[2]"]
    assert [f.get("mean_of") for f in data.meta["inputs"]][-2:] == ["p", "U"]
    ys = {s: data.rows(s, np.arange(60))[1] for s in range(data.num_samples)}
    mean = np.mean([ys[s] for s in data.train], axis=0)  # the non-dimensional targets' mean, node by node
    for s in range(data.num_samples):
        x, _ = data.rows(s, np.arange(60))
        np.testing.assert_allclose(x[:, 3:], mean, rtol=1e-14, atol=1e-15)
    norm = data.normalisation
    assert norm.target_offset == (3, 4, 5, 6)
    resid = np.concatenate([ys[s] - mean for s in data.train])
    np.testing.assert_allclose(norm.targets.mean, resid.mean(0), atol=1e-15)
    np.testing.assert_allclose(norm.targets.std, resid.std(0), rtol=1e-10, atol=1e-18)
    assert norm.targets.held.tolist() == [False, False, False, False] or norm.targets.std[3] == 0
    assert data.meta["mean_field"]["samples"] == 4 and len(data.meta["mean_field"]["sha256"]) == 64
    # the reader and whole_sample learn the difference: (y - mean field - mean) / scale, exactly
    reader = DatasetReader(data, _one_part(tmp_path), 0, device="cpu", dtype=torch.float64)
    for s in range(data.num_samples):
        local = reader.sample(s)
        want = (ys[s][local.owned_ids] - mean[local.owned_ids] - norm.targets.mean) / norm.targets.scale
        np.testing.assert_allclose(local.y.to_local().numpy(), want, rtol=1e-12, atol=1e-12)
        x, y, _, _ = whole_sample(data, s, dtype=torch.float64)
        np.testing.assert_allclose(y.numpy(), (ys[s] - mean - norm.targets.mean) / norm.targets.scale, atol=1e-12)
        raw = torch.as_tensor(data.rows(s, np.arange(60))[0])
        np.testing.assert_allclose(reader.normaliser.denormalise_targets(y, raw).numpy(), ys[s], atol=1e-12)
    with pytest.raises(ValueError, match="Expected the raw inputs"):
        reader.normaliser.normalise_targets(torch.as_tensor(ys[0]))
    assert main(["info", str(tmp_path / "data")]) == 0
    assert ("  mean     p_mean, U_mean: the node-wise mean of the targets over the training samples, as input "
            "channels; the model learns each target's difference from it") in capsys.readouterr().out


def _one_part(root: Path) -> Path:
    assert main(["partition", str(root / "data"), "--parts", "1", "--out", str(root / "parts1"), "--quiet"]) == 0
    return root / "parts1"


def test_predict_adds_the_mean_field_back_on_shards_and_on_new_cases(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    _cases(tmp_path)
    _table(tmp_path)
    root = str(tmp_path)
    assert main(_dataset(tmp_path, "--dtype", "float64")) == 0
    assert main(["partition", f"{root}/data", "--parts", "2", "--out", f"{root}/parts"]) == 0
    assert main(["train", f"{root}/parts", "--data", f"{root}/data", "--out", f"{root}/run", "--nproc", "2",
                 "--steps", "3", "--latent", "8", "--mp-steps", "1", "--dtype", "float64", "--quiet"]) == 0
    assert main(["predict", f"{root}/run", "--data", f"{root}/data", "--out", f"{root}/pred", "--samples", "all",
                 "--nproc", "2", "--no-plots", "--quiet"]) == 0
    data = open_dataset(tmp_path / "data")
    run = load_run(tmp_path / "run")
    norm = run._normaliser
    mesh = data.mesh(0)
    ei = torch.as_tensor(mesh.graph().edge_index())
    for s, entry in enumerate(data.meta["samples"]):
        name = entry["name"]
        written = meshio.read(tmp_path / "pred" / f"{name}.vtu")
        order = np.asarray(written.point_data["global_id"], np.int64)
        x, _ = data.rows(s, np.arange(60))
        with torch.no_grad():  # independently: the model's output, de-normalised, plus the mean field, times speed^k
            out = run.model(norm.normalise_inputs(torch.as_tensor(x)), ei,
                            norm.edge_attr(torch.as_tensor(mesh.points), ei)).numpy()
        stats = data.normalisation.targets
        assert stats.std[3] == 0 and stats.output_scale[3] == 0  # w: predicted as its constant, not the output
        want = (out * stats.output_scale + stats.mean + x[:, 3:]) * np.array([SPEEDS[name] ** 2] + [SPEEDS[name]] * 3)
        np.testing.assert_allclose(written.point_data["p_pred"], want[order, 0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(written.point_data["U_pred"], want[order, 1:], rtol=1e-10, atol=1e-12)
        assert (written.point_data["U_pred"][:, 2] == 0).all()
        with torch.no_grad():  # load_run gives the same, the mean field added back
            np.testing.assert_allclose(run(x, ei, mesh.points).numpy(), want, rtol=1e-10, atol=1e-12)
    # new cases without targets, on the same mesh: they take the training dataset's mean field
    new = tmp_path / "new"
    new.mkdir()
    _cases(new, {"u11": 11.0, "u17": 17.0})
    _table(new, {"u11": 11.0, "u17": 17.0})
    plain = ["dataset", str(new / "cases"), "--out", str(new / "plain"), "--inputs", "pos[0],pos[1]", "--params",
             str(new / "params.csv")]
    assert main(plain) == 0
    capsys.readouterr()
    assert main(["predict", f"{root}/run", "--data", str(new / "plain"), "--out", str(new / "pred0"), "--no-plots",
                 "--quiet"]) == 2  # without the mean field: refused, saying how to make them
    assert "make these cases with meshshard dataset ... --mean-field-from" in capsys.readouterr().err
    capsys.readouterr()
    assert main([*plain[:3], str(new / "data"), *plain[4:], "--mean-field-from", f"{root}/data"]) == 2
    assert "Expected --dtype float64, the precision of the --mean-field-from dataset" in capsys.readouterr().err
    assert main([*plain[:3], str(new / "data"), *plain[4:], "--mean-field-from", f"{root}/data", "--dtype",
                 "float64"]) == 0
    made = open_dataset(new / "data")
    np.testing.assert_array_equal(made.rows(0, np.arange(60))[0][:, 3:], data.rows(0, np.arange(60))[0][:, 3:])
    assert main(["predict", f"{root}/run", "--data", str(new / "data"), "--out", str(new / "pred"), "--no-plots",
                 "--quiet"]) == 0
    written = meshio.read(new / "pred" / "u11.vtu")
    x, _ = made.rows(0, np.arange(60))
    with torch.no_grad():
        want = run(x, ei, mesh.points).numpy()
    order = np.asarray(written.point_data["global_id"], np.int64)
    np.testing.assert_allclose(written.point_data["p_pred"], want[order, 0], rtol=1e-10)


def test_a_mean_field_from_other_training_cases_is_refused_at_predict(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _cases(tmp_path)
    _table(tmp_path)
    root = str(tmp_path)
    assert main(_dataset(tmp_path)) == 0
    assert main(_dataset(tmp_path, out="other")[:-1] + ["--val-samples", "u12", "--mean-field"]) == 0
    assert main(["partition", f"{root}/data", "--parts", "1", "--out", f"{root}/parts"]) == 0
    assert main(["train", f"{root}/parts", "--data", f"{root}/data", "--out", f"{root}/run", "--steps", "1",
                 "--latent", "8", "--mp-steps", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["predict", f"{root}/run", "--data", f"{root}/other", "--out", f"{root}/pred", "--no-plots",
                 "--quiet"]) == 2
    assert "to carry the mean field the run trained with" in capsys.readouterr().err
    assert not (tmp_path / "pred").exists()


@pytest.mark.parametrize(("case", "message"), [
    ("no-targets", "Expected --targets for --mean-field"),
    ("not-a-mean-field", "Expected a dataset made with --mean-field"),
])
def test_a_mean_field_that_cannot_work_is_refused_leaving_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    case: str, message: str) -> None:
    # many meshes, and new cases on another mesh, are no longer refused: tests/data/test_prior.py
    _cases(tmp_path)
    _table(tmp_path)
    root = str(tmp_path)
    if case == "no-targets":
        args = ["dataset", f"{root}/cases", "--out", f"{root}/out", "--inputs", "pos[0]", "--mean-field"]
    else:
        assert main(_dataset(tmp_path)[:-1]) == 0
        other = tmp_path / "other"
        other.mkdir()
        _cases(other)
        args = ["dataset", str(other / "cases"), "--out", f"{root}/out", "--inputs", "pos[0],pos[1]",
                "--mean-field-from", f"{root}/data"]
    assert_refused_in_one_line(args, message, capsys, tmp_path / "out")


def test_write_dataset_takes_a_mean_field_too(tmp_path: Path) -> None:
    points, tri = _points()
    ys = np.random.default_rng(1).random((4, 60, 1))
    write_dataset(tmp_path / "d", np.zeros((4, 60, 1)), ys, pos=points, cells=[("triangle", tri)],
                  target_names=["q"], val_samples=[3], dtype="float64", mean_field=True)
    data = open_dataset(tmp_path / "d")
    assert data.input_channels == ["x", "q_mean"]
    np.testing.assert_allclose(data.rows(3, np.arange(60))[0][:, 1], ys[:3, :, 0].mean(0), rtol=1e-14)
