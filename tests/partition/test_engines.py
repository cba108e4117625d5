"""The optional engines in one process: KaMinPar (``--engine kaminpar``: its graph file, a valid partition, the
stored assignment rebuilt byte for byte, the documented command), and the one line each engine gives when
it is missing or cannot run here, before any work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.partition import (
    Graph,
    LocalExchange,
    partition_distributed,
    partition_file,
    read_assignment,
    read_metadata,
    verify_partition,
)

from ._mixed_mesh import write_mixed_vtkhdf

pytest.importorskip("h5py")
ROOT = Path(__file__).resolve().parents[2]


def test_ptscotch_without_mpi_is_one_line_before_any_work(tmp_path: Path) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    with pytest.raises(ValueError, match=r"^--engine ptscotch runs on MPI processes \(mpirun -n P"):
        partition_distributed(mesh, tmp_path / "out", 3, LocalExchange(), engine="ptscotch")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.vtkhdf"]


def test_a_missing_pyscotch_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import meshshard.partition._dist_scotch as scotch

    monkeypatch.setattr(scotch, "_LOADED", {})
    monkeypatch.setitem(sys.modules, "pyscotch", None)  # import pyscotch raises ImportError
    monkeypatch.setenv("PYSCOTCH_LIB_DIR", str(Path(__file__).parent))  # no look-up of the system library
    monkeypatch.setenv("PYSCOTCH_PARALLEL", "1")
    with pytest.raises(ValueError, match=r"needs the pyscotch package .*apt-get install libptscotch-7.0 openmpi-bin "
                                         r"&& pip install mpi4py pyscotch, then run: mpirun -n P meshshard"):
        scotch._pyscotch()


def test_a_missing_kaminpar_says_how_to_install_it_before_reading(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kaminpar", None)
    with pytest.raises(ValueError, match=r"^--engine kaminpar needs the kaminpar package .*pip install kaminpar$"):
        partition_file(tmp_path / "not-there.vtu", tmp_path / "out", 2, method="kaminpar")  # never read
    assert not (tmp_path / "out").exists()


def test_kaminpar_runs_in_one_process_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mesh = write_mixed_vtkhdf(tmp_path)
    assert main(["partition", str(mesh), "--parts", "3", "--out", str(tmp_path / "p"), "--engine", "kaminpar",
                 "--method", "metis"]) == 2
    assert "--engine kaminpar runs in one process (threads), without torchrun or mpirun" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_the_parhip_file_is_the_graph_kaminpar_reads(tmp_path: Path) -> None:
    kaminpar = pytest.importorskip("kaminpar")
    from meshshard.partition._kaminpar import write_parhip

    # a triangle 0-1-2 and an edge 2-3, node weights 1..4, edge weights by edge
    indptr = np.array([0, 2, 4, 7, 8])
    indices = np.array([1, 2, 0, 2, 0, 1, 3, 2])
    weights = np.array([5, 6, 5, 7, 6, 7, 9, 9])
    graph = Graph(indptr, indices, vertex_weights=np.arange(1, 5).reshape(-1, 1), edge_weights=weights)
    write_parhip(graph, tmp_path / "g.parhip")
    loaded = kaminpar.load_graph(str(tmp_path / "g.parhip"), kaminpar.GraphFileFormat.PARHIP)
    assert (loaded.n(), loaded.m()) == (4, 8)
    assert [loaded.node_weight(u) for u in range(4)] == [1, 2, 3, 4]
    assert [sorted(loaded.neighbors(u)) for u in range(4)] == [[(1, 5), (2, 6)], [(0, 5), (2, 7)],
                                                               [(0, 6), (1, 7), (3, 9)], [(2, 9)]]
    write_parhip(Graph(indptr, indices), tmp_path / "plain.parhip")
    plain = kaminpar.load_graph(str(tmp_path / "plain.parhip"), kaminpar.GraphFileFormat.PARHIP)
    assert not plain.is_node_weighted() and not plain.is_edge_weighted() and plain.degree(2) == 3


def test_kaminpar_partition_stores_an_assignment_one_process_rebuilds(tmp_path: Path) -> None:
    pytest.importorskip("kaminpar")
    from tests.partition.test_distributed import same_folders

    mesh = write_mixed_vtkhdf(tmp_path)
    folder = partition_file(mesh, tmp_path / "kp", 4, method="kaminpar", seed=3)
    meta = read_metadata(folder)
    assert meta["method"] == "kaminpar" and meta["load_imbalance"] <= 1.03 + 1e-12  # refined if KaMinPar was over
    assert verify_partition(folder) == []
    parts = read_assignment(folder)
    assert parts.shape == (meta["num_nodes"],) and np.bincount(parts).tolist() == [p["num_owned"] for p in meta["parts"]]
    again = partition_file(mesh, tmp_path / "again", 4, parts=parts)
    import tests.partition.test_distributed as geometric

    saved, geometric.HOW = geometric.HOW, ("metadata_sha256", "method", "parameters", "refinement")
    try:
        same_folders(folder, again)  # the part files byte for byte
    finally:
        geometric.HOW = saved


def test_the_documented_kaminpar_command_runs(tmp_path: Path) -> None:
    pytest.importorskip("kaminpar")
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "docs" / "partition.md").read_text(), re.S | re.M)
    code = [b for b in blocks if "--engine kaminpar" in b]
    assert len(code) == 1, "docs/partition.md: expected one ```bash block with --engine kaminpar"
    write_mixed_vtkhdf(tmp_path).rename(tmp_path / "cube.vtkhdf")
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code[0]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"{code[0]}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert read_metadata(tmp_path / "cube-kaminpar")["method"] == "kaminpar"
