"""``meshshard dataset`` of ``.vtkhdf`` samples on 1 to 4 gloo processes (``write_dataset_distributed``):
the same files as one process, errors raised on every process alike with nothing left behind, no
process holding an array of the global length, and training on the distributed partition and dataset
equal to training on the one-process ones."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshshard.data import write_dataset
from meshshard.partition import read_slice, write_vtkhdf
from tests._dist import RankFailure, run_ranks
from tests._trace import largest_array_held
from tests.partition._mixed_mesh import mixed_mesh

pytest.importorskip("h5py")
TIMEOUT = 60.0


def _samples(folder: Path) -> tuple[list[Path], Path]:
    """Three samples: a and b on the mixed mesh, c on a smaller one; the fields T, u (3-D) and p; and
    a table of one parameter, aoa."""
    files = []
    for name, shape, scale in (("a", (9, 7, 6), 1.0), ("b", (9, 7, 6), 2.0), ("c", (6, 5, 4), 3.0)):
        pos, cells = mixed_mesh(shape)
        fields = {"T": scale * pos[:, 0], "u": np.stack([pos[:, 1], scale * pos[:, 2], pos[:, 0] * pos[:, 1]], 1),
                  "p": np.sin(pos[:, 0]) + scale * pos[:, 2]}
        files.append(write_vtkhdf(folder / f"{name}.vtkhdf", pos, cells, fields))
    params = folder / "params.csv"
    params.write_text("sample,aoa\na,0\nb,2\nc,4\n")
    return files, params


def read_vtkhdf(path: Path) -> tuple[np.ndarray, Any]:
    whole = read_slice(path)  # the slice of process 0 of 1: the whole file
    return whole.pos, whole.cells


def _one_process(files: list[Path], out: Path) -> Path:
    """The reference: the one-process writer given the same arrays."""
    import h5py

    pos, cells, ins, outs = [], [], [], []
    for aoa, path in zip((0.0, 2.0, 4.0), files):
        p, c = read_vtkhdf(path)
        with h5py.File(path, "r") as f:
            t, u, pr = (f[f"VTKHDF/PointData/{k}"][()] for k in ("T", "u", "p"))
        pos.append(p)
        cells.append(c)
        ins.append(np.column_stack([t, u[:, 1], p, np.full(len(p), aoa)]))
        outs.append(np.column_stack([pr, u]))
    return write_dataset(out, ins, outs, pos=pos, cells=cells, input_names=["T", "u[1]", ("pos", 3), "aoa"],
                         target_names=["p", ("u", 3)], sample_names=["a", "b", "c"], val_samples=["b"])


def _write(rank: int, world: int, files: list[str], out: str, params: str) -> str:
    from meshshard.comm import ArrayExchange
    from meshshard.data import write_dataset_distributed

    return str(write_dataset_distributed(files, out, ArrayExchange(), inputs="T,u[1],pos", targets=["p", "u"],
                                         params=params, val_samples=["b"]))


@pytest.mark.parametrize("world", [1, 3])
def test_processes_write_the_one_process_files(tmp_path: Path, world: int) -> None:
    files, params = _samples(tmp_path)
    one = _one_process(files, tmp_path / "one")
    out = tmp_path / "dist"
    assert run_ranks(_write, world, [str(f) for f in files], str(out), str(params), timeout=TIMEOUT) == [str(out)] * world
    stored = sorted(p.relative_to(one) for p in one.rglob("*.npy"))
    assert stored == sorted(p.relative_to(out) for p in out.rglob("*.npy"))
    for name in stored:  # every array byte for byte, the points, cells and fields of each sample
        assert (one / name).read_bytes() == (out / name).read_bytes(), name
    a, b = (json.loads((d / "dataset.json").read_text()) for d in (one, out))
    for key in ("kind", "num_samples", "input_channels", "target_channels", "edge_channels", "split"):
        assert a[key] == b[key], key
    assert b["inputs"][-1] == {"name": "aoa", "components": 1, "parameter": True}
    assert b["parameters"] == {"names": ["aoa"], "values": [[0.0], [2.0], [4.0]]}
    assert b["distributed"] == {"processes": world}
    for m, n in zip(a["meshes"], b["meshes"]):
        assert {k: v for k, v in n.items() if k != "source_sha256"} == m
    assert [len(m["source_sha256"]) for m in b["meshes"]] == [2, 1]
    assert [s["mesh"] for s in b["samples"]] == [0, 0, 1]
    for part in ("inputs", "targets", "edges"):  # merged from per-process moments: equal to round-off
        for stat in ("mean", "std", "scale"):
            np.testing.assert_allclose(b["normalisation"][part][stat], a["normalisation"][part][stat],
                                       rtol=1e-12, atol=1e-12)
        assert b["normalisation"][part]["count"] == a["normalisation"][part]["count"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["dist", "one"]  # no staging left


def _refused(rank: int, world: int, files: list[str], out: str) -> str:
    from meshshard.comm import ArrayExchange
    from meshshard.data import write_dataset_distributed

    try:
        write_dataset_distributed(files, out, ArrayExchange(), inputs="T", targets="p")
    except ValueError as err:
        return str(err)
    return "no error"


def test_an_error_of_one_process_is_raised_by_all(tmp_path: Path) -> None:
    files, _ = _samples(tmp_path)
    import h5py

    with h5py.File(files[1], "r+") as f:  # a NaN in the last process's rows of sample b only
        f["VTKHDF/PointData/p"][-1] = np.nan
    found = run_ranks(_refused, 2, [str(f) for f in files], str(tmp_path / "dist"), timeout=TIMEOUT)
    n = len(mixed_mesh()[0])
    assert found == [f"{files[1]}: Expected finite values in field 'p' of sample 'b' (got nan at node {n - 1}; "
                     "1 such value in this process's rows)"] * 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []  # no DATA, no staging folder


def test_what_one_process_would_store_more_of_is_refused_in_one_line(tmp_path: Path) -> None:
    from meshshard.data import write_dataset_distributed

    pos = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0.5]])
    surface = write_vtkhdf(tmp_path / "s.vtkhdf", pos, [("triangle", np.array([[0, 1, 2], [1, 3, 2]]))], {"p": pos[:, 2]})
    with pytest.raises(ValueError, match=r"s\.vtkhdf: Expected 3-D cells \(got a surface of triangle\); a surface's "
                                         r"area vectors are made by one process: run meshshard dataset without torchrun$"):
        write_dataset_distributed([surface], tmp_path / "d", inputs="pos", targets="p")
    with pytest.raises(ValueError, match=r"s\.vtkhdf: Expected a point field 'q' \(got p\)$"):
        write_dataset_distributed([surface], tmp_path / "d", inputs="pos", targets="q")
    with pytest.raises(ValueError, match=r"s\.vtk: Expected a \.vtkhdf file, which each process reads in part"):
        write_dataset_distributed([tmp_path / "s.vtk"], tmp_path / "d", inputs="pos", targets="p")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.vtkhdf"]  # no DATA, no staging folder, no lock


def _dies(rank: int, world: int, files: list[str], out: str) -> str:
    import os

    import meshshard.data._dataset_dist as dist

    if rank == 1:
        def crash(*args: Any, **kwargs: Any) -> Any:
            os._exit(3)  # a process killed in the middle of a mesh

        dist._edge_moments = crash  # type: ignore[assignment]
    return _refused(rank, world, files, out)


def test_a_process_that_dies_fails_the_job_and_leaves_no_data(tmp_path: Path) -> None:
    files, _ = _samples(tmp_path)
    with pytest.raises(RankFailure):
        run_ranks(_dies, 2, [str(f) for f in files], str(tmp_path / "dist"), timeout=20.0)
    assert not (tmp_path / "dist").exists()


def _largest_array(rank: int, world: int, files: list[str], out: str) -> list[Any]:
    """Write the dataset with every line of the distributed modules traced: the longest numpy array
    (largest dimension) a local variable holds, or a list, tuple or dataclass held by one. A memory
    map (an ``.npy`` file written or hashed in place) is not held: only the slices read of it are."""
    import meshshard.data._dataset_dist as top
    import meshshard.partition._dist_graph as graph
    import meshshard.partition._exchange as exchange
    import meshshard.partition._vtkhdf as vtkhdf
    from meshshard.comm import ArrayExchange

    return largest_array_held(
        lambda: top.write_dataset_distributed(files, out, ArrayExchange(), inputs="T,pos", targets="p"),
        (top, graph, exchange, vtkhdf), skip_memmaps=True)


def test_no_process_holds_an_array_of_the_global_length(tmp_path: Path) -> None:
    n, world = 3000, 4
    pos = np.stack([np.arange(n, dtype=np.float64), np.zeros(n), np.zeros(n)], 1)
    lines = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    mesh = write_vtkhdf(tmp_path / "chain.vtkhdf", pos, [("line", lines)], {"T": pos[:, 0], "p": -pos[:, 0]})
    found = run_ranks(_largest_array, world, [str(mesh)], str(tmp_path / "out"), timeout=TIMEOUT)
    bound = 2 * n // world + 2 * n // 10  # a block's edges, 2 n / world, and some slack; the mesh is n long
    for length, where in found:
        assert length < bound, f"{length} >= {bound}: {where}"
    assert np.load(tmp_path / "out" / "samples" / "00000" / "inputs.npy").shape == (n, 4)


def _train_both(rank: int, world: int, mesh: str, root: str, cfg: dict) -> list[list[float]]:
    """On these ranks: the distributed partition and dataset of ``mesh``, then training on them and on
    the one-process partition and dataset (made beforehand in ``root``)."""
    from meshshard.comm import ArrayExchange
    from meshshard.data import write_dataset_distributed
    from meshshard.partition import partition_distributed
    from meshshard.run import TrainConfig, train

    ex = ArrayExchange()
    partition_distributed(mesh, f"{root}/dist-parts", world, ex)
    write_dataset_distributed([mesh], f"{root}/dist-data", ex, inputs="T,pos", targets="p", dtype="float64",
                              val_samples=[])
    losses = []
    for which in ("dist", "one"):
        losses.append(train(TrainConfig.from_dict(cfg | {"partition": f"{root}/{which}-parts",
                                                         "data": f"{root}/{which}-data", "out": f"{root}/{which}-run"})))
    return [losses, _predict_traced(root)]


def _predict_traced(root: str) -> list[tuple[str, int, int]]:
    """``meshshard predict --pieces`` on the distributed dataset, every read of a dataset array
    recorded: ``(file, its length, the rows read)``."""
    from meshshard.data import Dataset
    from meshshard.run import PredictConfig, predict

    reads: list[tuple[str, int, int]] = []

    class Traced(np.memmap):
        def __getitem__(self, key: Any) -> Any:
            out = super().__getitem__(key)
            if getattr(self, "file", None) is not None and self.ndim:
                reads.append((self.file, len(self), len(out) if np.ndim(out) == self.ndim else 1))
            return out

    real = Dataset.load_npy

    def load_npy(self: Any, file: Path, mmap_mode: str | None) -> np.ndarray:
        out = real(self, file, mmap_mode)
        if isinstance(out, np.memmap):
            out = out.view(Traced)
            out.file = str(Path(file).relative_to(self.path))
        return out

    Dataset.load_npy = load_npy  # type: ignore[method-assign]
    try:
        predict(PredictConfig(run=f"{root}/dist-run", data=f"{root}/dist-data", out=f"{root}/dist-pred", gather=False,
                              plots=False, quiet=True))
    finally:
        Dataset.load_npy = real  # type: ignore[method-assign]
    return reads


@pytest.mark.slow  # two trainings and a prediction in one spawn of 2 ranks (68-102 s at a load average of 25)
def test_training_on_the_distributed_partition_and_dataset_equals_the_one_process_ones(tmp_path: Path) -> None:
    import torch

    from meshshard.data import partition_dataset
    from meshshard.run import TrainConfig, load_checkpoint

    pos, cells = mixed_mesh((5, 4, 3))
    mesh = write_vtkhdf(tmp_path / "m.vtkhdf", pos, cells, {"T": pos[:, 0] * pos[:, 1], "p": np.cos(pos[:, 2])})
    p, c = read_vtkhdf(mesh)
    write_dataset(tmp_path / "one-data", [np.column_stack([p[:, 0] * p[:, 1], p])], [np.cos(p[:, 2])[:, None]],
                  pos=p, cells=c, input_names=["T", ("pos", 3)], target_names=["p"], dtype="float64", val_samples=[],
                  sample_names=["m"])
    partition_dataset(tmp_path / "one-data", tmp_path / "one-parts", 2, method="morton")  # the same assignment
    cfg = dataclasses.asdict(TrainConfig(partition="", data="", out="", steps=3, lr=1e-2, latent_size=8,
                                         hidden_layers=1, message_passing_steps=2, quiet=True, dtype="float64",
                                         lr_schedule="constant"))
    found = run_ranks(_train_both, 2, str(mesh), str(tmp_path), cfg, timeout=180)
    dist, one = found[0][0]
    # predict on the distributed dataset writes pieces, each rank reading only part of every array it reads
    assert sorted(p.name for p in (tmp_path / "dist-pred" / "m").iterdir()) == ["part-00000.vtu", "part-00001.vtu"]
    for _, reads in found:
        files = {file for file, _, _ in reads}
        assert {"samples/00000/inputs.npy", "samples/00000/targets.npy", "meshes/00000/cells-hexahedron.npy"} <= files
        for file, length, rows in reads:
            assert rows < length or length <= 2, (file, length, rows)
    assert len(dist) == 3 and dist == pytest.approx(one, rel=1e-10)
    a, b = (load_checkpoint(tmp_path / f"{w}-run" / "checkpoint.pt")["model"] for w in ("dist", "one"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-10, atol=1e-12, msg=name)
