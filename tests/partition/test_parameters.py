"""``meshshard dataset --params FILE.csv``: per-sample parameters (an angle, a speed) as input
channels the same at every node of their sample, recorded in dataset.json, shown by info, and
refused in one line when the table does not fit the samples."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np
import pytest
from scipy.spatial import Delaunay

from meshshard.cli import main
from meshshard.partition import open_dataset, read_parameters

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
])
def test_a_table_that_does_not_fit_is_refused_in_one_line(tmp_path: Path, csv: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_parameters(_table(tmp_path, csv), list(CASES))


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
