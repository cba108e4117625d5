"""``meshshard info RUN``: a run folder described from its checkpoint and log; partition and
dataset folders still go to meshshard.partition's description."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from meshshard.cli import main
from meshshard.cli._info import describe_run
from meshshard.data import open_dataset, partition_dataset, write_dataset
from meshshard.run import PredictConfig, TrainConfig, predict, train
from meshshard.run._recipe import build_user_model
from tests.partition.conftest import grid_triangles

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model" / "model.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("info")
    pts, tri = grid_triangles(12, 10)
    rng = np.random.default_rng(0)
    inputs = rng.random((4, len(pts), 2))
    targets = np.concatenate([inputs[:, :, :1] * 2, inputs.sum(2, keepdims=True), inputs[:, :, 1:] ** 2], axis=2)
    write_dataset(root / "data", inputs, targets, pos=pts, cells=[("triangle", tri)], input_names=["a", "b"],
                  target_names=[("u", 2), "p"], val_samples=[3])
    partition_dataset(root / "data", root / "parts", 1)
    common = {"partition": str(root / "parts"), "data": str(root / "data"), "steps": 3, "quiet": True, "val_every": 2}
    torch.manual_seed(0)
    train(TrainConfig(out=str(root / "mgn"), latent_size=8, hidden_layers=1, message_passing_steps=2, **common))
    train(TrainConfig(out=str(root / "mine"), model=f"{EXAMPLE}:build", model_args={"hidden": 8, "layers": 1}, **common))
    predict(PredictConfig(run=str(root / "mgn"), data=str(root / "data"), out=str(root / "pred"), samples="all",
                          plots=False, quiet=True))
    return root


def test_info_describes_a_run_of_meshgraphnet_and_of_your_own_model(runs: Path, capsys) -> None:
    assert main(["info", str(runs / "mgn")]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{runs / 'mgn'}: meshshard run, 3 of 3 steps done, on 1 rank(s)\n")
    assert "  model      MeshGraphNet, latent 8, 1 hidden layers, 2 message-passing steps, relu, " in text
    assert f"  data       {runs / 'data'} (inputs a, b -> targets u (2), p)" in text
    assert "  val loss   last " in text and "at step 3" in text
    assert main(["info", str(runs / "mine"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == {"kind": "your own", "spec": f"{EXAMPLE}:build", "model_args": {"hidden": 8, "layers": 1}}
    assert summary["targets"] == [{"name": "u", "components": 2}, {"name": "p", "components": 1}]
    data = open_dataset(runs / "data")  # the weights trained, as the banner counts them (not buffers)
    built = build_user_model(f"{EXAMPLE}:build", {"hidden": 8, "layers": 1}, len(data.input_channels),
                             len(data.edge_channels), len(data.target_channels))
    assert summary["parameters"] == sum(p.numel() for p in built.parameters()) > 0
    assert summary["step"] == 3 and len([v for v in (summary["loss"]["first"], summary["loss"]["last"]) if v > 0]) == 2
    assert summary["val_loss"]["last_step"] == 3 and summary["settings"]["lr"] == 1e-3
    assert main(["info", str(runs / "mine")]) == 0
    assert f"(meshshard predict needs --model {shlex.quote(f'{EXAMPLE}:build')})" in capsys.readouterr().out
    # a command to paste is quoted for the shell: a path with a space, model args with a quote
    summary["model"] = {"kind": "your own", "spec": "/tmp/u/my models/sage.py:build", "model_args": {"name": "it's"}}
    text = describe_run(summary)
    assert shlex.split(text.split(" --model-args ")[1].split(", ")[0]) == ['{"name": "it\'s"}']
    assert "(meshshard predict needs --model '/tmp/u/my models/sage.py:build')" in text


def test_info_still_describes_partitions_and_datasets_and_refuses_a_damaged_run(runs: Path, capsys) -> None:
    assert main(["info", str(runs / "data")]) == 0
    assert "meshshard-dataset" in capsys.readouterr().out
    assert main(["info", str(runs / "parts")]) == 0
    assert "meshshard-partition" in capsys.readouterr().out
    (runs / "bad").mkdir()
    (runs / "bad" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["info", str(runs / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshshard info: error: ") and err.count("\n") == 1


def test_info_on_a_file_or_a_folder_of_none_of_its_kinds_says_what_it_takes(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("my notes")
    assert main(["info", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"meshshard info: error: {tmp_path}: not a partition, dataset, run or prediction "
                                       "folder (no partition.json, dataset.json, checkpoint.pt or metrics.json in it)\n")
    assert main(["info", str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err == (f"meshshard info: error: {tmp_path / 'notes.txt'}: is a file; meshshard info "
                                       "takes a folder (a partition, dataset, run or prediction folder)\n")
    assert main(["info", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"meshshard info: error: {tmp_path / 'none'}: no such folder\n"


def test_info_describes_a_prediction_finished_stopped_part_way_or_of_an_older_version(runs: Path, tmp_path: Path,
                                                                                       capsys) -> None:
    pred = runs / "pred"
    metrics = json.loads((pred / "metrics.json").read_text())
    assert main(["info", str(pred)]) == 0
    text = full = capsys.readouterr().out
    assert text.startswith(f"{pred}: meshshard prediction on 1 rank(s), complete, 4 samples\n"
                           f"  run        {runs / 'mgn'} (step 3)\n  data       {runs / 'data'}\n"
                           "  samples    00000 (120 nodes), 00001 (120 nodes), 00002 (120 nodes), 00003 (120 nodes)\n")
    u, p = metrics["mean"]["u"], metrics["mean"]["p"]
    assert f"  mean       u: RMSE {u['rmse']:.4g}, rel L2 {u['rel_l2']:.3%} (over all samples)\n" in text
    assert f"             p: RMSE {p['rmse']:.4g}, rel L2 {p['rel_l2']:.3%}\n" in text
    assert main(["info", str(pred), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["complete"] and summary["mean"] == metrics["mean"] and summary["step"] == 3
    assert [s["file"] for s in summary["samples"]] == [f"0000{i}.vtu" for i in range(4)]

    def info_of(name: str, record: object) -> tuple[int, str, str]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(record))
        code = main(["info", str(tmp_path / name)])
        out, err = capsys.readouterr()
        return code, out, err

    # stopped part-way: complete false, no mean; the mean of the samples it finished
    head = {k: v for k, v in metrics.items() if k not in ("mean", "samples")}
    code, text, _ = info_of("stopped", head | {"complete": False, "samples": metrics["samples"][:2]})
    assert code == 0 and ": meshshard prediction on 1 rank(s), stopped part-way: 2 samples finished (a rerun into this " in text
    first = np.mean([r["fields"]["u"]["rmse"] for r in metrics["samples"][:2]])
    assert f"  mean       u: RMSE {first:.4g}, " in text and "(over the 2 samples finished)" in text
    # from before format, complete and files were recorded: written when it finished
    old = {k: v for k, v in metrics.items() if k not in ("format", "format_version", "complete", "files")}
    assert info_of("older", old)[:2] == (0, full.replace(str(pred), str(tmp_path / "older"), 1))
    # of new cases (no targets): no errors to show
    unknown = {"rmse": None, "rel_l2": None}
    new = head | {"targets_known": False, "mean": {"u": unknown, "p": unknown},
                  "samples": [r | {"fields": {"u": unknown, "p": unknown}} for r in metrics["samples"]]}
    code, text, _ = info_of("new", new)
    assert code == 0 and text.endswith("  errors     none: the data has no targets (predictions only)\n")
    # not ours: another format, no samples, a metrics.json that is a link out of the folder
    code, _, err = info_of("other", {"format": "my-metrics"})
    assert code == 2 and err == (f"meshshard info: error: {tmp_path / 'other' / 'metrics.json'}: Expected format "
                                 "'meshshard-predictions' (got 'my-metrics')\n")
    code, _, err = info_of("mine", {"accuracy": 0.9})
    assert code == 2 and "Expected a list of samples" in err and err.count("\n") == 1
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "metrics.json").symlink_to(pred / "metrics.json")
    assert main(["info", str(tmp_path / "link")]) == 2
    assert "Expected a file inside the folder" in capsys.readouterr().err


def test_the_kinds_table_names_the_run_layers_own_files() -> None:
    """partition may not import meshshard.run, so its table of folder kinds states a run's and a
    prediction's marker files again: they must be the ones meshshard.run writes."""
    from meshshard.data import FOLDER_KINDS
    from meshshard.run import CHECKPOINT, METRICS_FILE

    assert FOLDER_KINDS["run"].marker == CHECKPOINT
    assert FOLDER_KINDS["prediction"].marker == METRICS_FILE


@pytest.mark.parametrize("name", ["metrics.json", "dataset.json", "partitions.json"])
def test_info_of_a_folder_whose_metadata_is_nested_too_deep_is_one_line(name: str, tmp_path: Path, capsys) -> None:
    """JSON nested deep enough to exhaust Python's recursion crashed info with a RecursionError."""
    (tmp_path / name).write_text("[" * 200000)
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshshard info: error: ") and err.count("\n") == 1, err
    assert f"{tmp_path / name}: not valid JSON (nested too deeply)" in err, err
