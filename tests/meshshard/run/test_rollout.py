"""``meshshard predict --rollout``: a rollout of 20 steps on 2, 3 and 4 ranks (uneven METIS shards;
3 ranks written as pieces) equals the one-process rollout on the whole mesh at every step
(float64, 1e-10); the files, times and metrics it writes; its refusals, in one line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import meshio
import numpy as np
import pytest
from PIL import Image

from meshshard.cli import main
from meshshard.partition import load_partition
from meshshard.run import PredictConfig, TrainConfig, predict, train
from meshshard.run._vtk import read_pvtu
from tests._dist import run_ranks
from tests._ranks import predict_rank
from tests.meshshard.tasks import _trajectories

STEPS = 20


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rollout")
    out = _trajectories.write(root, parts=(1, 2, 3, 4), steps=STEPS + 1)
    cfg = TrainConfig(partition=out[1], data=out["data"], out=str(root / "run"), steps=3, lr=1e-2, latent_size=8,
                      hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64", noise_std=0.05)
    train(cfg)
    out["run"] = cfg.out
    return out


def _steps(folder: Path, stem: str) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(time, u_pred, u) by global id of every step the .pvd lists, gathered or in pieces."""
    root = ET.parse(folder / f"{stem}.pvd").getroot()
    out = []
    for entry in root.iter("DataSet"):
        path = folder / entry.attrib["file"]
        meshes = read_pvtu(path) if path.suffix == ".pvtu" else [meshio.read(path)]
        ids = np.concatenate([m.point_data["global_id"] for m in meshes])
        first = np.unique(ids, return_index=True)[1]  # a piece repeats the nodes of its cells it does not own
        pred = np.concatenate([m.point_data["u_pred"] for m in meshes])[first]
        truth = np.concatenate([m.point_data["u"] for m in meshes])[first]
        assert len(first) == _trajectories.NX * _trajectories.NY
        out.append((float(entry.attrib["timestep"]), pred, truth))
    return out


@pytest.mark.slow
def test_a_rollout_on_2_3_and_4_ranks_equals_one_process_at_every_step(setup: dict) -> None:
    root = setup["root"]
    base = PredictConfig(run=setup["run"], data=setup["data"], out=str(root / "pred1"), rollout=True, quiet=True)
    one = predict(base)
    ref = _steps(root / "pred1", "run2")
    whole = setup["whole"][2]
    assert len(ref) == STEPS + 1 and [t for t, _, _ in ref] == pytest.approx(list(whole["times"]), abs=0)
    np.testing.assert_array_equal(ref[0][1], whole["states"][0])  # step 0: the initial state
    boundary = whole["classes"] == 1
    for n, (_, pred, truth) in enumerate(ref):
        np.testing.assert_array_equal(truth, whole["states"][n])
        np.testing.assert_array_equal(pred[boundary], whole["states"][n][boundary])  # prescribed from the truth
    assert np.abs(ref[-1][1] - ref[-1][2]).max() > 1e-3  # the interior is predicted, not copied
    rmse = one["samples"][0]["fields"]["u"]["rollout"]["rmse"]
    assert len(rmse) == STEPS
    want = [np.sqrt(((pred - truth)[~boundary] ** 2).mean()) for _, pred, truth in ref[1:]]
    np.testing.assert_allclose(rmse, want, rtol=1e-10)
    for r in (2, 3, 4):
        sizes = [len(load_partition(setup[r], p).owned_ids) for p in range(r)]  # one mesh: one partition folder
        assert len(set(sizes)) > 1, sizes  # uneven shards
        cfg = asdict(base) | {"out": str(root / f"pred{r}"), "partition": setup[r], "gather": False if r == 3 else None}
        run_ranks(predict_rank, r, cfg, timeout=180)
        got = _steps(root / f"pred{r}", "run2")
        assert len(got) == STEPS + 1
        for n, ((t, pred, truth), (t_ref, pred_ref, _)) in enumerate(zip(got, ref, strict=True)):
            assert t == t_ref
            np.testing.assert_allclose(pred, pred_ref, rtol=1e-10, atol=1e-12, err_msg=f"{r} ranks, step {n}")
        metrics = json.loads((root / f"pred{r}" / "metrics.json").read_text())
        np.testing.assert_allclose(metrics["samples"][0]["fields"]["u"]["rollout"]["rmse"], rmse, rtol=1e-10)
        assert metrics["world_size"] == r and metrics["complete"]
        timing = metrics["samples"][0]["timing"]  # every rank's figures, in rank order
        assert len(metrics["peak_rss_mb"]) == r and all(len(v) == r for k, v in timing.items() if k != "memory")
        assert [m["step"] for m in timing["memory"]] == [0, 1, 10, STEPS]
        assert all(len(m["peak_rss_mb"]) == len(m["rss_mb"]) == r for m in timing["memory"])
    assert (root / "pred3" / "run2" / "step-00004.pvtu").is_file() and (root / "pred3" / "run2" / "step-00004").is_dir()


def test_the_metrics_the_files_and_force(setup: dict, capsys) -> None:
    root = setup["root"]
    out = root / "short"
    args = ["predict", setup["run"], "--data", setup["data"], "--out", str(out), "--rollout", "--samples", "run0,run2",
            "--quiet"]
    assert main([*args, "--steps", "12"]) == 0  # the old spelling of --rollout-steps: it works, with a note
    assert "meshshard predict: --steps is deprecated; use --rollout-steps\n" in capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["files"] == ["run0.pvd", "run0", "run0_error.png", "run0.gif",
                                "run2.pvd", "run2", "run2_error.png", "run2.gif"]
    with Image.open(out / "run0.gif") as gif:  # truth, prediction, error: one frame per step 0 .. 12
        assert gif.n_frames == 13 and gif.size[0] > 2 * gif.size[1]
    assert metrics["samples"][0]["animation"] == "run0.gif"
    assert sorted(p.name for p in out.iterdir()) == sorted(metrics["files"] + ["metrics.json"])
    assert sorted(p.name for p in (out / "run0").iterdir()) == [f"step-{n:05d}.vtu" for n in range(13)]
    first = metrics["samples"][0]["fields"]["u"]["rollout"]
    assert set(first) == {"rmse", "rmse_1", "rmse_10", "rmse_all"} and len(first["rmse"]) == 12
    assert first["rmse_1"] == first["rmse"][0] and first["rmse_10"] == first["rmse"][9]
    assert first["rmse_all"] == pytest.approx(np.sqrt(np.mean(np.square(first["rmse"]))), rel=1e-12)
    mean = metrics["mean"]["u"]["rollout"]
    both = [r["fields"]["u"]["rollout"]["rmse_10"] for r in metrics["samples"]]
    assert mean["rmse_10"] == pytest.approx(np.mean(both), rel=1e-12) and mean["rmse_50"] is None
    assert (out / "run0_error.png").stat().st_size > 0
    assert len(metrics["peak_rss_mb"]) == 1 and metrics["peak_rss_mb"][0] > 0
    timing = metrics["samples"][0]["timing"]
    parts = [timing[f"{key}_s"][0] for key in ("read", "compute", "write")]
    assert all(v > 0 for v in parts) and sum(parts) <= timing["total_s"][0]  # timed one after another
    assert [m["step"] for m in timing["memory"]] == [0, 1, 10, 12]
    peaks = [m["peak_rss_mb"][0] for m in timing["memory"]]
    assert peaks == sorted(peaks) and peaks[-1] <= metrics["peak_rss_mb"][0]  # a peak never falls
    assert all(0 < m["rss_mb"][0] <= m["peak_rss_mb"][0] + 1 for m in timing["memory"])
    # past the trajectory's end: the state goes on (boundary held), its errors are null, its times extrapolated
    assert main([*args, "--rollout-steps", "23", "--force", "--samples", "run2"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    record = metrics["samples"][0]
    assert record["fields"]["u"]["rollout"]["rmse"][STEPS:] == [None] * 3 and record["times"][-1] == pytest.approx(2.3)
    assert not (out / "run0").exists() and (out / "run2" / "step-00023.vtu").is_file()  # --force replaced it all
    last = meshio.read(out / "run2" / "step-00023.vtu")
    assert "u" not in last.point_data and "u_pred" in last.point_data
    assert "no truth past step 20" in capsys.readouterr().err
    with Image.open(out / "run2.gif") as gif:  # the steps whose truth is known: 0 .. 20
        assert gif.n_frames == 21
    assert main([*args, "--rollout-steps", "3", "--force", "--no-plots"]) == 0
    assert not list(out.glob("*.gif")) and not list(out.glob("*.png"))


def test_an_animation_shows_at_most_60_steps_spread_evenly() -> None:
    from meshshard.run._pictures import animation_steps

    assert animation_steps(12) == list(range(13))
    steps = animation_steps(1000)
    assert len(steps) == 60 and steps[0] == 0 and steps[-1] == 1000
    gaps = np.diff(steps)
    assert gaps.min() >= 16 and gaps.max() <= 17
    assert animation_steps(0) == [0] and animation_steps(-1) == []


def test_no_animation_when_the_steps_are_written_in_pieces(setup: dict, capfd) -> None:
    out = setup["root"] / "pieces2"
    cfg = PredictConfig(run=setup["run"], data=setup["data"], out=str(out), rollout=True, quiet=True, steps=2,
                        partition=setup[2], gather=False, samples="run2")
    run_ranks(predict_rank, 2, asdict(cfg), timeout=120)
    metrics = json.loads((out / "metrics.json").read_text())
    assert "run2.gif" not in metrics["files"] and not (out / "run2.gif").exists()
    assert (out / "run2_error.png").is_file()


def test_rollout_refusals_are_one_line(setup: dict, tmp_path: Path, capsys) -> None:
    base = ["predict", setup["run"], "--data", setup["data"], "--out", str(tmp_path / "p")]
    for extra, message in (
        ([], "trained the transient task, whose predictions are rollouts: pass --rollout"),
        (["--rollout", "--rollout-steps", "0"], "Expected --rollout-steps to be a positive number of steps, with --rollout (got 0)"),
        (["--rollout-steps", "3"], "(got 3 without --rollout)"),
    ):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "p").exists()


def test_info_says_what_a_transient_run_learnt(setup: dict, capsys) -> None:
    from meshshard.cli import main

    capsys.readouterr()
    assert main(["info", setup["run"]]) == 0
    out = capsys.readouterr().out
    assert ("  task       transient: the one-step map, training noise 0.05 (normalised), 1 step(s) unrolled per "
            "sample (meshshard predict --rollout)") in out, out


def test_memory_is_recorded_after_steps_0_1_10_100_and_the_last() -> None:
    from meshshard.run._rollout import memory_steps

    assert memory_steps(0) == [0] and memory_steps(1) == [0, 1] and memory_steps(9) == [0, 1, 9]
    assert memory_steps(10) == [0, 1, 10] and memory_steps(250) == [0, 1, 10, 100, 250]


def test_a_3d_mesh_is_animated_on_its_middle_slab(tmp_path: Path) -> None:
    from meshshard.data import Trajectory, partition_dataset, write_trajectories
    from tests._meshes import synthetic_mesh

    mesh = synthetic_mesh("a-3d-box.mesh")  # 336 nodes of jittered tetrahedra
    pos = np.asarray(mesh.pos)
    classes = (np.abs(pos[:, 0]) > 0.9).astype(np.int64)
    runs = []
    for k, c in enumerate((0.5, 1.0)):
        times = 0.1 * np.arange(5)
        states = np.stack([np.exp(-4 * ((pos[:, 0] - c * t) ** 2 + pos[:, 1] ** 2))[:, None] for t in times])
        runs.append(Trajectory(f"box{k}", pos, list(mesh.cells), times, iter(states), np.full((len(pos), 1), c),
                               classes))
    write_trajectories(tmp_path / "data", iter(runs), ["box0", "box1"], state_fields=[{"name": "u", "components": 1}],
                       input_fields=[{"name": "c", "components": 1}], node_type_source="test", val_samples=["box1"],
                       dtype="float64")
    partition_dataset(tmp_path / "data", tmp_path / "parts1", 1)
    cfg = TrainConfig(partition=str(tmp_path / "parts1"), data=str(tmp_path / "data"), out=str(tmp_path / "run"),
                      steps=1, latent_size=8, hidden_layers=1, message_passing_steps=1, quiet=True, dtype="float64")
    train(cfg)
    predict(PredictConfig(run=cfg.out, data=cfg.data, out=str(tmp_path / "pred"), rollout=True, quiet=True))
    with Image.open(tmp_path / "pred" / "box1.gif") as gif:
        assert gif.n_frames == 5


class _Enough(RuntimeError):
    """Raised by the test's writer after a few steps: a long rollout stopped early."""


def test_memory_grows_with_the_steps_done_not_with_rollout_steps(setup: dict, monkeypatch, capsys) -> None:
    """Issue 36, defect 7: ``predict --rollout --rollout-steps 1000000000`` grew ~260 MB/s with nothing
    written (every step's time was made before the first step). Ten million steps asked, three done:
    the rollout holds no more than a few steps' worth (tracemalloc's peak, the run's own arrays aside)."""
    import tracemalloc

    from meshshard.run import _rollout

    written = []
    real = _rollout.write_gathered

    def write_three(*args, **kwargs):
        written.append(args[0])
        if len(written) > 3:
            raise _Enough("three steps written")
        return real(*args, **kwargs)

    monkeypatch.setattr(_rollout, "write_gathered", write_three)
    tracemalloc.start()
    try:
        code = main(["predict", setup["run"], "--data", setup["data"], "--out", str(setup["root"] / "long"),
                     "--rollout", "--samples", "run0", "--rollout-steps", "10000000", "--quiet", "--no-plots"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 1 and "three steps written" in capsys.readouterr().err
    assert len(written) == 4
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB traced for 3 steps of a 10,000,000-step rollout"


@pytest.mark.timeout(120)
def test_a_step_file_that_cannot_be_written_stops_the_rollout_naming_it(setup: dict, monkeypatch, capsys) -> None:
    """Issue 37: the background writer's failure is one line naming the file; the steps queued
    before it are on disk, and nothing hangs (the writer's thread is joined)."""
    import threading

    from meshshard.run import _writer

    real = _writer.write_vtu

    def failing(path, *args):
        if path.name == "step-00002.vtu":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args)

    monkeypatch.setattr(_writer, "write_vtu", failing)
    out = setup["root"] / "unwritable"
    code = main(["predict", setup["run"], "--data", setup["data"], "--out", str(out), "--rollout", "--samples", "run0",
                 "--rollout-steps", "8", "--quiet", "--no-plots"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert f"{out / 'run0' / 'step-00002.vtu'}: could not write the file (PermissionError: " in err, err
    assert (out / "run0" / "step-00001.vtu").is_file() and not (out / "run0" / "step-00002.vtu").exists()
    assert not any(t.name == "meshshard-writer" for t in threading.enumerate())


def test_every_compression_writes_the_same_steps_that_vtk_opens(setup: dict) -> None:
    """Issue 37: ``--compression`` none, zlib (here written at once, ``--no-background``) and lz4:
    the vtk package's reader opens every step, and every value is the same."""
    from vtkmodules.util.numpy_support import vtk_to_numpy
    from vtkmodules.vtkIOXML import vtkXMLUnstructuredGridReader

    read = {}
    for compression in ("zlib", "none", "lz4"):
        out = setup["root"] / f"compressed-{compression}"
        args = ["predict", setup["run"], "--data", setup["data"], "--out", str(out), "--rollout", "--samples", "run0",
                "--rollout-steps", "3", "--quiet", "--no-plots", "--compression", compression]
        assert main(args + (["--no-background"] if compression == "zlib" else [])) == 0
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["compression"] == compression and metrics["background_writing"] is (compression != "zlib")
        read[compression] = []
        for n in range(4):
            reader = vtkXMLUnstructuredGridReader()
            reader.SetFileName(str(out / "run0" / f"step-{n:05d}.vtu"))
            reader.Update()
            grid = reader.GetOutput()
            assert grid.GetNumberOfPoints() == _trajectories.NX * _trajectories.NY and grid.GetNumberOfCells() > 0
            values = grid.GetPointData()
            read[compression].append({name: vtk_to_numpy(values.GetArray(name)).copy()
                                      for name in ("u_pred", "u", "u_error", "global_id")})
    assert not np.array_equal(read["zlib"][3]["u_pred"], read["zlib"][0]["u_pred"])  # the steps differ
    for compression in ("none", "lz4"):
        for a, b in zip(read["zlib"], read[compression], strict=True):
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])
