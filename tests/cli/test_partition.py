"""The partition / info / verify / plot commands, in process and as a subprocess."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshshard.cli import main


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_partition_info_verify_plot(mesh_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "parts"
    assert main(["partition", str(mesh_file), "--parts", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "edge cut" in printed and "halo fraction" in printed and "time" in printed

    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("format", "format_version", "num_parts", "num_nodes", "num_edges", "edge_cut",
                "imbalance", "halo_hops", "method", "parts"):
        assert key in info, key
    assert info["num_parts"] == 4 and info["method"] == "metis" and info["num_nodes"] == 600
    assert len(info["parts"]) == 4
    assert all(set(p) >= {"part", "num_owned", "num_ghost", "num_edges"} for p in info["parts"])
    assert main(["info", str(out)]) == 0
    assert "imbalance" in capsys.readouterr().out

    assert main(["verify", str(out)]) == 0
    assert ": OK (4 parts" in capsys.readouterr().out

    png = tmp_path / "parts.png"
    assert main(["plot", str(out), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_options_reach_the_metadata(mesh_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "p"
    assert main(["partition", str(mesh_file), "-k", "3", "-o", str(out), "--method", "rcb",
                 "--halo-hops", "2", "--graph", "dual", "--tpwgts", "0.5,0.25,0.25", "-q"]) == 0
    assert capsys.readouterr().out == ""
    meta = json.loads((out / "partition.json").read_text())
    assert (meta["method"], meta["graph"], meta["halo_hops"]) == ("rcb", "dual", 2)
    assert meta["num_nodes"] == 2 * 29 * 19
    assert meta["parameters"]["tpwgts"] == [0.5, 0.25, 0.25]
    assert main(["verify", str(out)]) == 0


def test_verify_fails_on_damage(mesh_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "p"
    assert main(["partition", str(mesh_file), "-k", "2", "-o", str(out), "-q"]) == 0
    file = out / "part-00000.npz"
    file.write_bytes(file.read_bytes()[:-10])
    assert main(["verify", str(out)]) == 1
    assert "checksum mismatch" in capsys.readouterr().out


def _bad_inputs(tmp: Path, mesh_file: Path) -> list[tuple[list[str], str, str]]:
    nan = tmp / "nan.npy"
    np.save(nan, np.array([[0.0, 0.0], [np.nan, 1.0], [1.0, 1.0]]))
    empty = tmp / "empty.npy"
    np.save(empty, np.zeros((0, 3)))
    unknown = tmp / "mesh.xyz"
    unknown.write_text("1 2 3\n")
    broken = tmp / "broken.graph"
    broken.write_text("3 5\n2\n1\n\n")
    m = str(mesh_file)
    return [
        ([m, "-k", "0"], m, r"Expected --parts >= 1 (got 0)"),
        ([m, "-k", "-3"], m, r"Expected --parts >= 1 (got -3)"),
        ([m, "-k", "601"], m, "Expected at most one part per node: --parts <= 600 (got 601)"),
        ([str(empty), "-k", "2"], str(empty), "Expected at least one node"),
        ([str(nan), "-k", "2"], str(nan), "Expected finite coordinates"),
        ([str(tmp / "nope.vtu"), "-k", "2"], str(tmp / "nope.vtu"), "no such file"),
        ([str(unknown), "-k", "2"], str(unknown), "unknown input format '.xyz'"),
        ([str(broken), "-k", "2"], str(broken), "Expected 5 edges as the header says"),
        ([m, "-k", "2", "--method", "rcb", "--graph", "knn"], m, ""),  # fine: a control
        ([m, "-k", "2", "--graph", "radius"], m, "--graph radius needs --radius R"),
        ([m, "-k", "2", "--halo-hops", "0"], m, "Expected 1 <= --halo-hops <= 100 (got 0)"),
        ([m, "-k", "2", "--imbalance", "-1"], m, "Expected --imbalance >= 0 (got -1.0)"),
        ([m, "-k", "2", "--tpwgts", "0.2,0.2"], m, "Expected target part weights that sum"),
    ]


def test_bad_input_is_one_line_and_leaves_nothing(mesh_file: Path, tmp_path: Path,
                                                   capsys) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for args, file, message in _bad_inputs(inputs, mesh_file):
        work = tmp_path / "work"
        work.mkdir()
        code = main(["partition", *args, "--out", str(work / "out"), "-q"])
        err = capsys.readouterr().err
        if not message:
            assert code == 0
        else:
            assert code == 2, args
            assert err.startswith(f"meshshard partition: error: {file}: {message}"), err
            assert err.count("\n") == 1 and "Traceback" not in err, err
            assert _leftovers(work) == [], args
        shutil.rmtree(work)


def test_existing_folder_needs_force(mesh_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "p"
    args = ["partition", str(mesh_file), "-k", "2", "-o", str(out), "-q"]
    assert main(args) == 0
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"meshshard partition: error: {out}: exists and is not empty (pass --force to replace "
        "it)\n")
    assert main([*args, "--force"]) == 0
    assert _leftovers(tmp_path) == ["p"]


def test_info_verify_plot_errors(tmp_path: Path, shared_data: Path, capsys) -> None:
    assert main(["info", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err == f"meshshard info: error: {tmp_path / 'none'}: no such folder\n"
    assert main(["verify", str(tmp_path)]) == 2
    assert "not a partition folder" in capsys.readouterr().err
    out = tmp_path / "g"
    assert main(["partition", str(shared_data / "metis/4elt.graph"), "-k", "4", "-o", str(out),
                 "-q"]) == 0
    assert main(["plot", str(out), "--out", str(tmp_path / "x.png")]) == 2
    assert "has no coordinates to plot" in capsys.readouterr().err


def test_partition_of_a_folder_of_case_files_points_to_meshshard_dataset(mesh_file: Path, tmp_path: Path,
                                                                            capsys) -> None:
    cases = tmp_path / "my cases"
    cases.mkdir()
    shutil.copy(mesh_file, cases / "case-0.vtu")
    assert main(["partition", str(cases), "--parts", "2", "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err == (
        f"meshshard partition: error: {cases}: is a folder without dataset.json, not a mesh, graph or point-cloud "
        f"file; for a folder of case files, make a dataset of them first: meshshard dataset '{cases}' --out DATA "
        f"--inputs NAMES --targets NAMES, then meshshard partition DATA --parts 2 --out {tmp_path / 'p'}\n")
    assert _leftovers(tmp_path) == ["my cases"]


def test_command_in_a_subprocess(mesh_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "p"
    run = [sys.executable, "-m", "meshshard"]
    done = subprocess.run([*run, "partition", str(mesh_file), "-k", "3", "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "edge cut" in done.stdout and done.stderr == ""  # no bars when not a terminal
    done = subprocess.run([*run, "verify", str(out)], capture_output=True, text=True)
    assert done.returncode == 0 and "OK" in done.stdout
    done = subprocess.run([*run, "partition", str(tmp_path / "x.obj"), "-k", "3", "-o",
                           str(tmp_path / "q")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("meshshard partition: error: ")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "q").exists()


def test_import_does_not_load_torch() -> None:
    code = ("import sys, meshshard.partition, meshshard.cli._partition; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'pymetis' not in sys.modules and 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _modules_after(argv: list[str]) -> set[str]:
    """Run ``meshshard ARGV`` in a fresh interpreter; the modules it had imported at exit."""
    code = ("import sys\nfrom meshshard.cli import main\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as stop:\n    rc = stop.code\n"
            "print(' '.join(sorted(sys.modules)))\nsys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_help_and_partition_never_import_torch(mesh_file: Path, tmp_path: Path) -> None:
    """``meshshard --help`` lists every command without importing one; the partition commands
    import the partition layer only."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "meshshard", "--help"],
                          capture_output=True, text=True)
    assert done.returncode == 0
    for name in ("partition", "info", "verify", "plot", "train", "demo", "selftest"):
        assert re.search(rf"^ +{name}\b", done.stdout, re.M), name
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "torch" not in imported and "meshshard.run" not in imported
    assert not any(m.startswith("meshshard.partition._") for m in imported)
    out = tmp_path / "p"
    for argv in (["partition", str(mesh_file), "-k", "2", "-o", str(out)], ["verify", str(out)],
                 ["info", str(out)], ["partition", "--help"]):
        modules = _modules_after(argv)
        assert "torch" not in modules and "meshshard.run" not in modules, argv


def test_plot_of_a_datasets_partitions_names_the_mesh_folders_to_plot(tmp_path: Path, capsys) -> None:
    """A partition of a dataset of several meshes (one folder per mesh, no partition.json of its
    own): plot names, in one line, the folders to plot, found as verify finds them."""
    from meshshard.data import partition_dataset, write_dataset
    from tests.partition.conftest import grid_triangles

    meshes = [grid_triangles(n, 5) for n in (6, 7, 8)]
    write_dataset(tmp_path / "d", [np.ones((len(p), 1)) for p, _ in meshes], [np.ones((len(p), 1)) for p, _ in meshes],
                  pos=[p for p, _ in meshes], cells=[[("triangle", t)] for _, t in meshes])
    parts = partition_dataset(tmp_path / "d", tmp_path / "p", 2)
    capsys.readouterr()
    assert main(["plot", str(parts), "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == (
        f"meshshard plot: error: {parts}: holds the partitions of 3 meshes (mesh-00000, mesh-00001, mesh-00002); "
        f"plot one of them: meshshard plot {parts / 'mesh-00000'} --out {tmp_path / 'x.png'}\n")
    assert not (tmp_path / "x.png").exists()
    assert main(["plot", str(parts / "mesh-00001"), "--out", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_that_fails_keeps_the_existing_picture(mesh_file: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """A failed write (a full disk) left a truncated PNG in place of --out: the picture is drawn
    into a temporary file beside it and renamed, so the old one stays whole and nothing is left."""
    import errno

    from matplotlib.figure import Figure

    out = tmp_path / "p"
    assert main(["partition", str(mesh_file), "-k", "2", "-o", str(out), "-q"]) == 0
    png = tmp_path / "pics" / "parts.png"
    png.parent.mkdir()
    png.write_bytes(b"the old picture")

    def full_disk(self, fname, *args, **kwargs) -> None:
        with open(fname, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n truncated")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    capsys.readouterr()
    assert main(["plot", str(out), "--out", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and str(png) in err, err
    assert png.read_bytes() == b"the old picture" and sorted(p.name for p in png.parent.iterdir()) == ["parts.png"]
    monkeypatch.undo()
    assert main(["plot", str(out), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and sorted(p.name for p in png.parent.iterdir()) == ["parts.png"]
