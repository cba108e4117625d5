"""OpenFOAM's foamToVTK output as it comes: a case folder, its VTK/ folder or one .vtm is a sample
named after the case, from the last iteration, with the boundary patches as named node sets.

The committed ``data/foam_cavity`` is real foamToVTK output; the last test runs OpenFOAM itself
where it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import build_dataset, list_sources, open_dataset
from meshshard.data._sources import sample_names
from meshshard.data._vtk_io import read_vtk

from ._solver_files import FOAM_CAVITY, extruded, foam_case

pytest.importorskip("vtkmodules.vtkIOXML", reason="the vtk package is not installed (pip install vtk)")

LAST = FOAM_CAVITY / "VTK" / "cavity_2.vtm"


def test_the_vtm_is_the_internal_mesh_with_its_fields_and_patches() -> None:
    mesh = read_vtk(LAST)
    internal = meshio.read(FOAM_CAVITY / "VTK" / "cavity_2" / "internal.vtu")
    np.testing.assert_array_equal(mesh.points, internal.points)
    assert [(b.type, b.data.tolist()) for b in mesh.cells] == [(b.type, b.data.tolist()) for b in internal.cells]
    for name in ("p", "U"):
        np.testing.assert_array_equal(mesh.point_data[name], internal.point_data[name])
        np.testing.assert_array_equal(mesh.cell_data[name][0], internal.cell_data[name][0])
    assert sorted(mesh.point_sets) == ["fixedWalls", "movingWall"]
    x, y = mesh.points[:, 0], mesh.points[:, 1]
    assert mesh.point_sets["movingWall"].tolist() == np.flatnonzero(np.isclose(y, 0.1)).tolist()
    walls = np.isclose(x, 0) | np.isclose(x, 0.1) | np.isclose(y, 0)
    assert mesh.point_sets["fixedWalls"].tolist() == np.flatnonzero(walls).tolist()


@pytest.mark.parametrize("given", ["case", "VTK", "vtm"])
def test_a_case_its_vtk_folder_or_its_vtm_is_one_sample_named_after_the_case(tmp_path: Path, given: str) -> None:
    source = {"case": FOAM_CAVITY, "VTK": FOAM_CAVITY / "VTK", "vtm": LAST}[given]
    said: list[str] = []
    out = build_dataset([source], tmp_path / "d", inputs="pos", targets="p,U", notes=said.append)
    data = open_dataset(out)
    assert [(s["name"], s["source"]) for s in data.meta["samples"]] == [("cavity", str(LAST))]
    internal = meshio.read(FOAM_CAVITY / "VTK" / "cavity_2" / "internal.vtu")
    _, y = data.rows(0, np.arange(40))
    np.testing.assert_allclose(y, np.column_stack([internal.point_data["p"], internal.point_data["U"]]), rtol=1e-6)
    iterations = (f"{FOAM_CAVITY / 'VTK'}: 3 iterations of cavity (0 to 2); taking the last, cavity_2.vtm (name a "
                  ".vtm in SOURCES to take another)")
    assert (iterations in said) == (given != "vtm")
    assert not [s for s in said if s.startswith("skipped")], said  # foamToVTK's own files are no news
    assert any("one cell thick in z" in s and "--collapse-2d" in s for s in said), said


def test_an_iteration_folder_is_its_vtm() -> None:
    assert list_sources([FOAM_CAVITY / "VTK" / "cavity_1"]) == [FOAM_CAVITY / "VTK" / "cavity_1.vtm"]


def test_sample_names_drop_the_iteration_unless_two_would_be_one(tmp_path: Path) -> None:
    m = extruded(3, 3)
    fields = {"p": np.zeros(len(m["points3"]))}
    a = foam_case(tmp_path / "runs" / "aoa+02", 300, m, fields, {})
    b = foam_case(tmp_path / "runs" / "aoa+04", 285, m, fields, {})
    b2 = foam_case(tmp_path / "runs" / "aoa+04", 290, m, fields, {})
    files = list_sources([tmp_path / "runs" / "aoa+02", tmp_path / "runs" / "aoa+04"])
    assert files == [a, b2]
    assert sample_names(files) == (["aoa+02", "aoa+04"], [])
    assert sample_names([b, b2]) == (["aoa+04_285", "aoa+04_290"], [])  # two iterations of one case keep them
    copy = tmp_path / "other" / "aoa+02"
    shutil.copytree(tmp_path / "runs" / "aoa+02", copy)
    assert sample_names([a, copy / "VTK" / a.name]) == (["runs/aoa+02/VTK/aoa+02", "other/aoa+02/VTK/aoa+02"], [0, 1])


def test_a_sweep_of_case_folders(tmp_path: Path, capsys) -> None:
    m = extruded(4, 3)
    for k, speed in enumerate((1.0, 2.0, 3.0)):
        foam_case(tmp_path / "sweep" / f"u{k}", 100 + k, m, {"U": m["points3"] * speed, "p": m["points3"][:, 0] * speed},
                  {"wall": np.arange(0, 12, 3)})
    (tmp_path / "params.csv").write_text("sample,speed\nu0,1\nu1,2\nu2,3\n")
    capsys.readouterr()
    assert main(["dataset", *(str(tmp_path / "sweep" / f"u{k}") for k in range(3)), "--out", str(tmp_path / "d"),
                 "--inputs", "pos", "--targets", "p", "--params", str(tmp_path / "params.csv"), "--val-samples", "u2",
                 "-q"]) == 0
    data = open_dataset(tmp_path / "d")
    assert [s["name"] for s in data.meta["samples"]] == ["u0", "u1", "u2"]
    assert data.parameters(2) == {"speed": 3.0}


def _openfoam() -> str | None:
    """The shell line that sets OpenFOAM's environment, or None where it is not installed."""
    for bashrc in (os.environ.get("WM_PROJECT_DIR", "") + "/etc/bashrc", "/usr/share/openfoam/etc/bashrc"):
        if bashrc.startswith("/") and Path(bashrc).is_file() and shutil.which("bash"):
            return f"source {bashrc} >/dev/null 2>&1; "
    return None


CAVITY = Path("/usr/share/doc/openfoam-examples/examples/incompressible/icoFoam/cavity/cavity")


def test_a_real_openfoam_run_end_to_end(tmp_path: Path, capsys) -> None:
    """blockMesh, icoFoam and foamToVTK on a 4 x 3 x 1 cavity (a fraction of a second), then
    meshshard dataset on the case folder and meshshard info."""
    env = _openfoam()
    if env is None or not CAVITY.is_dir():
        pytest.skip("OpenFOAM is not installed (Debian: apt-get install openfoam openfoam-examples)")
    case = tmp_path / "cavity"
    shutil.copytree(CAVITY, case)
    mesh_dict = case / "system" / "blockMeshDict"
    mesh_dict.write_text(mesh_dict.read_text().replace("(20 20 1)", "(4 3 1)"))
    control = case / "system" / "controlDict"
    control.write_text("\n".join("endTime 0.01;" if line.startswith("endTime") else line
                                 for line in control.read_text().splitlines()))
    run = subprocess.run(["bash", "-c", env + "blockMesh && icoFoam && foamToVTK && "
                          "foamToVTK -latestTime -no-point-data -name cells"],
                         cwd=case, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    capsys.readouterr()
    out = tmp_path / "data"
    assert main(["dataset", str(case), "--out", str(out), "--inputs", "pos", "--targets", "p,U", "--collapse-2d",
                 "--wall-distance", "movingWall", "-q"]) == 0
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "one mesh, 20 nodes" in info and "quad 12" in info and "inputs   pos (2), wall_distance" in info
    assert "wall_distance: the distance to the nearest node of movingWall" in info and "--collapse-2d" in info
    data = open_dataset(out)
    assert [s["name"] for s in data.meta["samples"]] == ["cavity"]
    x, _ = data.rows(0, np.arange(20))
    np.testing.assert_allclose(x[:, 2], 0.1 - x[:, 1], atol=1e-7)  # the lid is at y = 0.1
    # cell data only (-no-point-data): refused as before, averaged with --cell-data-to-points
    assert main(["dataset", str(case / "cells"), "--out", str(tmp_path / "c"), "--inputs", "pos", "--targets", "p",
                 "-q"]) == 2
    assert "interpolate it to the nodes first" in capsys.readouterr().err
    assert main(["dataset", str(case / "cells"), "--out", str(tmp_path / "c"), "--inputs", "pos", "--targets", "p",
                 "--cell-data-to-points", "--collapse-2d", "-q"]) == 0
    assert open_dataset(tmp_path / "c").num_nodes(0) == 20


@pytest.mark.parametrize("collapse", [False, True])
def test_the_patches_are_kept_with_the_area_each_node_stands_for(tmp_path: Path, collapse: bool) -> None:
    data = open_dataset(build_dataset([LAST], tmp_path / "d", inputs=["pos"], targets=["p"], collapse_2d=collapse))
    assert data.boundary_names(0) == ["fixedWalls", "movingWall"]
    mesh = data.mesh(0)
    ids, area = data.boundary(0, "movingWall")
    np.testing.assert_array_equal(ids, np.flatnonzero(np.isclose(mesh.points[:, 1], 0.1)))
    depth = 1.0 if collapse else float(np.ptp(mesh.points[:, 2]))
    # the lid is 0.1 long: its area vectors point out of the cavity, up, and add up to its area
    np.testing.assert_allclose(area.sum(0)[:2], [0.0, 0.1 * depth], atol=1e-12)
    ids, area = data.boundary(0, "fixedWalls")
    np.testing.assert_allclose(area.sum(0)[:2], [0.0, -0.1 * depth], atol=1e-12)  # the floor's; the sides cancel
    assert np.abs(area[:, :2]).sum() == pytest.approx(0.3 * depth, rel=1e-6)  # floor and sides, no lid (float32 points)
    with pytest.raises(ValueError, match="Expected a named boundary of mesh 0 .got 'inlet'; it has fixedWalls, movingWall"):
        data.boundary(0, "inlet")


def test_info_lists_the_named_boundaries(tmp_path: Path, capsys) -> None:
    build_dataset([LAST], tmp_path / "d", inputs=["pos"], targets=["p"], collapse_2d=True)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "  boundary fixedWalls (" in out and "movingWall (" in out and "--boundary NAMES" in out


def test_boundary_classes_are_one_hot_inputs_from_the_patches(tmp_path: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["dataset", str(LAST), "--out", str(tmp_path / "d"), "--inputs", "pos", "--targets", "p",
                 "--collapse-2d", "--boundary-classes", "-q"]) == 0
    data = open_dataset(tmp_path / "d")
    field = data.meta["inputs"][-1]
    assert field == {"name": "node_type", "components": 3, "classes": ["interior", "movingWall", "fixedWalls"]}
    assert data.input_channels[-3:] == ["node_type[0]", "node_type[1]", "node_type[2]"]
    x, _ = data.rows(0, np.arange(data.num_nodes(0)))
    onehot = x[:, -3:]
    assert (onehot.sum(1) == 1).all()
    lid, walls = data.boundary(0, "movingWall")[0], data.boundary(0, "fixedWalls")[0]
    # the lid's two end nodes are on the fixed walls too: the first set in the file's order (the lid) wins
    expected = np.zeros(len(x), dtype=np.int64)
    expected[walls] = 2
    expected[lid] = 1
    assert len(np.intersect1d(lid, walls)) == 2
    np.testing.assert_array_equal(onehot.argmax(1), expected)
    assert main(["dataset", str(tmp_path / "d" / ".."), "--out", str(tmp_path / "e"), "--inputs", "pos",
                 "--state", "p", "--boundary-classes"]) == 2
    assert "--boundary-classes" in capsys.readouterr().err


def test_boundary_classes_need_named_boundaries(tmp_path: Path, capsys) -> None:
    internal = FOAM_CAVITY / "VTK" / "cavity_2" / "internal.vtu"
    capsys.readouterr()
    assert main(["dataset", str(internal), "--out", str(tmp_path / "d"), "--inputs", "pos", "--targets", "p",
                 "--boundary-classes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Expected named boundaries for --boundary-classes (got none" in err, err
    assert not (tmp_path / "d").exists()
