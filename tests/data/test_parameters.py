"""``meshshard dataset --params FILE.csv``: per-sample parameters (an angle, a speed) as input
channels the same at every node of their sample, recorded in dataset.json, shown by info, and
refused in one line when the table does not fit the samples."""

from __future__ import annotations

import re
from pathlib import Path

import meshio
import numpy as np
import pytest
import torch
from scipy.spatial import Delaunay

from meshshard.cli import main
from meshshard.data import open_dataset, read_parameters
from meshshard.run import load_run

CASES = {"aoa+00": (0.0, 10.0), "aoa+02": (2.0, 10.0), "aoa-02": (-2.0, 20.0), "aoa+04": (4.0, 20.0)}


def _cases(root: Path) -> Path:
    rng = np.random.default_rng(0)
    points = rng.random((60, 2))
    tri = Delaunay(points).simplices
    folder = root / "cases"
    folder.mkdir()
    for name, (aoa, speed) in CASES.items():
        p = speed ** 2 * (1 + aoa * points[:, 0])
        meshio.write(folder / f"{name}.vtu", meshio.Mesh(np.c_[points, np.zeros(60)], [("triangle", tri)],
                                                        point_data={"wall": points[:, 1], "p": p}))
    return folder


def _table(root: Path, text: str) -> Path:
    path = root / "params.csv"
    path.write_text(text)
    return path


def test_parameters_become_input_channels_recorded_and_shown(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cases = _cases(tmp_path)
    csv = "sample,aoa,speed\n" + "".join(f"{n},{a},{s}\n" for n, (a, s) in CASES.items()) + "aoa+06,6,30\n"
    table = _table(tmp_path, csv)
    assert main(["dataset", str(cases), "--out", str(tmp_path / "data"), "--inputs", "wall", "--targets", "p",
                 "--params", str(table), "--val-samples", "aoa+02"]) == 0
    assert "1 row of samples not in this dataset, left out: aoa+06" in capsys.readouterr().err
    data = open_dataset(tmp_path / "data")
    assert data.input_channels == ["wall", "aoa", "speed"]
    assert [f.get("parameter", False) for f in data.meta["inputs"]] == [False, True, True]
    names = [s["name"] for s in data.meta["samples"]]
    assert data.meta["parameters"]["names"] == ["aoa", "speed"]
    for i, name in enumerate(names):
        assert data.meta["parameters"]["values"][i] == list(CASES[name])
        x, _ = data.rows(i, np.arange(60))
        assert (x[:, 1] == CASES[name][0]).all() and (x[:, 2] == CASES[name][1]).all()
    assert main(["info", str(tmp_path / "data")]) == 0
    assert "  params   aoa -2..4, speed 10..20 (input channels, the same at every node of a sample)" in \
        capsys.readouterr().out
    # the same parameters for new cases, without targets: what predict needs
    assert main(["dataset", str(cases), "--out", str(tmp_path / "new"), "--inputs", "wall",
                 "--params", str(table)]) == 0
    assert open_dataset(tmp_path / "new").input_channels == ["wall", "aoa", "speed"]


@pytest.mark.parametrize(("csv", "message"), [
    ("name,aoa\n", r"Expected a 'sample' column of sample names \(got columns name, aoa\)"),
    ("sample\n", r"Expected named parameter columns besides 'sample'"),
    ("sample,aoa\naoa+00,0\n", r"Expected a row for every sample \(no row for aoa\+02, aoa-02, aoa\+04"),
    ("sample,aoa\naoa+00,zero\n", r"row 2, column aoa: Expected a number \(got 'zero'\)"),
    ("sample,aoa\naoa+00,nan\n", r"row 2, column aoa: Expected a finite number"),
    ("sample,aoa\naoa+00,1\naoa+00,2\n", r"row 3: sample 'aoa\+00' has a row already"),
    ("sample,aoa\naoa+00,1,2\n", r"row 2: Expected 2 values \(got 3\)"),
    ("", r"Expected a CSV table with a header row"),
    # issue 36, defect 10: a cell or a column name over csv's field limit was a _csv.Error traceback
    ("sample,aoa\naoa+00," + "1" * 200_000 + "\n", r"line 2: not a readable CSV table \(field larger than field limit"),
    ("sample," + "a" * 200_000 + "\n", r"line 1: not a readable CSV table \(field larger than field limit"),
    ("sample,aoa\naoa+00,1_000\n", r"row 2, column aoa: Expected a number \(got '1_000'\)"),  # float() takes it
])
def test_a_table_that_does_not_fit_is_refused_in_one_line(tmp_path: Path, csv: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        read_parameters(_table(tmp_path, csv), list(CASES))
    assert "\n" not in str(info.value) and len(str(info.value)) < 1000


def test_a_long_table_is_read_a_row_at_a_time(tmp_path: Path) -> None:
    """Issue 36 (minor): a 20 MB, 2M-row CSV peaked at 750 MB (every row held as a list of strings, then
    as floats, ~37x the file). 200k rows of other samples besides the four: under 10x the file's size."""
    import tracemalloc

    text = "sample,aoa,speed\n" + "".join(f"{n},{a},{v}\n" for n, (a, v) in CASES.items())
    text += "".join(f"other{i},{i % 7}.5,{i % 11}.25\n" for i in range(200_000))
    table = _table(tmp_path, text)
    tracemalloc.start()
    try:
        got = read_parameters(table, list(CASES))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == {"names": ["aoa", "speed"], "values": [list(v) for v in CASES.values()]}
    assert peak < 10 * len(text), f"{peak / 2**20:.0f} MiB traced reading a {len(text) / 2**20:.1f} MiB table"


def test_the_command_refuses_a_bad_table_and_a_name_clash_leaving_nothing(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    cases = _cases(tmp_path)
    table = _table(tmp_path, "sample,wall\n" + "".join(f"{n},1\n" for n in CASES))
    assert main(["dataset", str(cases), "--out", str(tmp_path / "data"), "--inputs", "wall", "--targets", "p",
                 "--params", str(table)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Expected parameter names apart from the input fields (got wall in both)" in err
    assert not (tmp_path / "data").exists()
    assert main(["dataset", str(cases), "--out", str(tmp_path / "data"), "--inputs", "wall", "--targets", "p",
                 "--params", str(tmp_path / "missing.csv")]) == 2
    assert not (tmp_path / "data").exists()


def test_non_dimensional_targets_are_stored_scaled_and_predicted_in_physical_units(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    table = _table(tmp_path, "sample,aoa,speed\n" + "".join(f"{n},{a},{s}\n" for n, (a, s) in CASES.items()))
    root = str(tmp_path)
    assert main(["dataset", str(cases), "--out", f"{root}/data", "--inputs", "wall", "--targets", "p", "--params",
                 str(table), "--target-scale", "p=0.5*speed**2", "--val-samples", "aoa+02", "--dtype", "float64"]) == 0
    data = open_dataset(tmp_path / "data")
    assert data.meta["target_scales"] == {"p": "0.5*speed**2"}
    for i, s in enumerate(data.meta["samples"]):
        physical = meshio.read(cases / f"{s['name']}.vtu").point_data["p"]
        _, y = data.rows(i, np.arange(60))
        np.testing.assert_allclose(y[:, 0], physical / (0.5 * CASES[s["name"]][1] ** 2), rtol=1e-12)
        assert data.target_factors(i).tolist() == [0.5 * CASES[s["name"]][1] ** 2]
    assert main(["partition", f"{root}/data", "--parts", "1", "--out", f"{root}/parts"]) == 0
    assert main(["train", f"{root}/parts", "--data", f"{root}/data", "--out", f"{root}/run", "--steps", "2",
                 "--latent", "8", "--mp-steps", "1", "--dtype", "float64", "--quiet"]) == 0
    assert main(["predict", f"{root}/run", "--data", f"{root}/data", "--out", f"{root}/pred", "--samples", "all",
                 "--no-plots", "--quiet"]) == 0
    run = load_run(tmp_path / "run")  # in physical units too: the parameters are among its inputs
    for i, s in enumerate(data.meta["samples"]):
        written = meshio.read(tmp_path / "pred" / f"{s['name']}.vtu")
        physical = meshio.read(cases / f"{s['name']}.vtu").point_data["p"]
        np.testing.assert_allclose(written.point_data["p"], physical, rtol=1e-12)  # the truth, back in physical units
        mesh = data.mesh(0)
        x, _ = data.rows(i, np.arange(60))
        with torch.no_grad():
            scaled = run(x, mesh.graph().edge_index(), mesh.points).numpy()[:, 0]
        np.testing.assert_allclose(written.point_data["p_pred"], scaled, rtol=1e-10)
        np.testing.assert_allclose(run.model(torch.as_tensor(run._normaliser.normalise_inputs(torch.as_tensor(x))),
                                             torch.as_tensor(mesh.graph().edge_index()),
                                             run._normaliser.edge_attr(torch.as_tensor(mesh.points),
                                                                       torch.as_tensor(mesh.graph().edge_index()))
                                             ).detach().numpy()[:, 0] * run._normaliser._out[1].item()
                                   + run._normaliser._out[0].item(),
                                   scaled / (0.5 * CASES[s["name"]][1] ** 2), rtol=1e-10)  # the model: non-dimensional


@pytest.mark.parametrize(("scale", "message"), [
    ("p=0.5*speed**2", r"Expected --params with --target-scale"),
    ("q=speed", r"Expected --target-scale to name target fields \(p\) \(got q\)"),
    ("p=speed*mach", r"to use the parameters aoa, speed only \(got mach\)"),
    ("p=aoa", r"sample aoa\+00: Expected --target-scale p=aoa to be non-zero"),
    ("p=__import__('os').system('true')", r"Expected numbers, parameter names, \+ - \* / \*\* and parentheses only"),
    ("p", r"Expected --target-scale as FIELD=EXPRESSION"),
    # issue 36, defect 12: accepted, then a float32 run's predictions times 1e39 were infinite
    ("p=speed*1e39", r"sample aoa\+00: Expected --target-scale p=speed\*1e39 within float32's range \(1.18e-38 to "
                     r"3.4e\+38 in magnitude; got 1e\+40\), since a run's predictions are multiplied back by it"),
    ("p=1/(speed*1e38)", r"within float32's range"),
    ("p=" + "+".join(["speed"] * 60000), r"Expected an arithmetic expression of the parameters of at most 500"),
    ("p=speed,p=aoa", r"Expected each field once in --target-scale"),
])
def test_a_target_scale_that_cannot_work_is_refused(tmp_path: Path, scale: str, message: str,
                                                   capsys: pytest.CaptureFixture) -> None:
    cases = _cases(tmp_path)
    table = _table(tmp_path, "sample,aoa,speed\n" + "".join(f"{n},{a},{s}\n" for n, (a, s) in CASES.items()))
    params = [] if "Expected --params" in message else ["--params", str(table)]
    assert main(["dataset", str(cases), "--out", str(tmp_path / "data"), "--inputs", "wall", "--targets", "p",
                 *params, "--target-scale", scale]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "data").exists()
