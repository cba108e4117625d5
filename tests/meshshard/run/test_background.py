"""The background writer of a rollout's files (``meshshard.run._background``) and the ParaView files
of every ``--compression``, read back by the ``vtk`` package's own readers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import meshio
import numpy as np
import pytest
from vtkmodules.util.numpy_support import vtk_to_numpy
from vtkmodules.vtkIOXML import vtkXMLUnstructuredGridReader

from meshshard.run import COMPRESSIONS
from meshshard.run._background import BackgroundWriter, WriteFailed
from meshshard.run._vtk import check_compression, read_vtp, write_vtp, write_vtu

pytestmark = pytest.mark.timeout(60)  # nothing here may hang


def _slow_write(path: Path, text: str) -> None:
    time.sleep(0.05)
    path.write_text(text)


def test_every_queued_file_is_written_in_order_and_the_thread_joined(tmp_path: Path) -> None:
    order = []

    def write(path: Path, k: int) -> None:
        time.sleep(0.02)
        order.append(k)
        path.write_text(str(k))

    with BackgroundWriter(depth=2) as writer:
        for k in range(6):
            writer.submit(write, tmp_path / f"f{k}", k)
    assert order == list(range(6))
    assert [(tmp_path / f"f{k}").read_text() for k in range(6)] == [str(k) for k in range(6)]
    assert not any(t.name == "meshshard-writer" for t in threading.enumerate())


def test_a_full_queue_makes_the_caller_wait(tmp_path: Path) -> None:
    gate = threading.Event()

    def blocked(path: Path) -> None:
        gate.wait(10)
        path.write_text("x")

    writer = BackgroundWriter(depth=1)
    writer.submit(blocked, tmp_path / "a")  # taken by the thread, which waits on the gate
    time.sleep(0.1)
    writer.submit(blocked, tmp_path / "b")  # queued: the queue is full now
    third = threading.Thread(target=writer.submit, args=(blocked, tmp_path / "c"))
    third.start()
    time.sleep(0.2)
    assert third.is_alive()  # waiting for room
    gate.set()
    third.join(10)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]


def test_a_file_that_fails_is_named_in_one_line_and_nothing_hangs(tmp_path: Path) -> None:
    def failing(path: Path, text: str) -> None:
        if path.name == "f2":
            raise PermissionError(13, "Permission denied", str(path))
        _slow_write(path, text)

    writer = BackgroundWriter(depth=2)
    with pytest.raises(WriteFailed, match=r"f2: could not write the file \(PermissionError: .*Permission denied") as err:
        for k in range(50):  # the failure is raised by a later submit, well before 50
            writer.submit(failing, tmp_path / f"f{k}", "x")
    message = str(err.value)
    assert "\n" not in message and err.value.filename == str(tmp_path / "f2")
    with pytest.raises(WriteFailed, match="f2: could not write"):
        writer.close()  # joined all the same, and it says so again
    assert (tmp_path / "f0").is_file() and (tmp_path / "f1").is_file()
    assert not any(t.name == "meshshard-writer" for t in threading.enumerate())


def test_an_exception_in_the_loop_still_flushes_the_queue_and_is_the_one_raised(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="the step's own error"):
        with BackgroundWriter(depth=3) as writer:
            for k in range(3):
                writer.submit(_slow_write, tmp_path / f"f{k}", "x")
            raise KeyError("the step's own error")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "f2"]


def _cells() -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """Points of a unit cube's corners and more, with triangles, a quad and a wedge (whose node order
    meshio and VTK disagree on)."""
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [0, 1, 1], [1, 1, 0], [1, 1, 1.0]])
    return pts, [("triangle", np.array([[0, 1, 2], [1, 6, 2]])), ("quad", np.array([[0, 1, 4, 3]])),
                 ("wedge", np.array([[0, 1, 2, 3, 4, 5]]))]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_compression_opens_in_vtk_and_meshio_with_every_value(tmp_path: Path, compression: str) -> None:
    pts, cells = _cells()
    rng = np.random.default_rng(3)
    fields = {"u_pred": rng.standard_normal(len(pts)), "v": rng.standard_normal((len(pts), 3)),
              "global_id": np.arange(len(pts), dtype=np.int64) + 10}
    path = tmp_path / "a.vtu"
    write_vtu(path, pts, cells, fields, compression)
    reader = vtkXMLUnstructuredGridReader()
    reader.SetFileName(str(path))
    reader.Update()
    grid = reader.GetOutput()
    assert grid.GetNumberOfPoints() == len(pts) and grid.GetNumberOfCells() == 4
    np.testing.assert_array_equal(vtk_to_numpy(grid.GetPoints().GetData()), pts)
    for name, values in fields.items():
        np.testing.assert_array_equal(vtk_to_numpy(grid.GetPointData().GetArray(name)), values)
    assert [grid.GetCellType(i) for i in range(4)] == [5, 5, 9, 13]  # triangle, quad, VTK_WEDGE
    if compression != "lz4":  # meshio reads no LZ4
        back = meshio.read(path)  # and turns VTK's wedge order back into its own
        assert [(c.type, c.data.tolist()) for c in back.cells] == [(t, c.tolist()) for t, c in cells]
    poly = tmp_path / "a.vtp"
    write_vtp(poly, pts, cells[:2], fields, compression)
    read = read_vtp(poly)
    assert [p.tolist() for p in read["polys"]] == [[0, 1, 2], [1, 6, 2], [0, 1, 4, 3]]
    np.testing.assert_array_equal(read["point_data"]["v"], fields["v"])


def test_a_large_array_spans_several_compressed_blocks(tmp_path: Path) -> None:
    pts = np.random.default_rng(0).random((200_000, 3))  # 4.8 MB of points: 5 blocks of 1 MiB
    for compression in ("zlib", "lz4"):
        path = tmp_path / f"{compression}.vtu"
        write_vtu(path, pts, [], {"x": pts[:, 0]}, compression)
        reader = vtkXMLUnstructuredGridReader()
        reader.SetFileName(str(path))
        reader.Update()
        grid = reader.GetOutput()
        np.testing.assert_array_equal(vtk_to_numpy(grid.GetPoints().GetData()), pts)
        np.testing.assert_array_equal(vtk_to_numpy(grid.GetPointData().GetArray("x")), pts[:, 0])
        assert grid.GetNumberOfCells() == len(pts)  # a vertex per point, without cells


def test_an_unknown_compression_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^Expected --compression none\|lz4\|zlib \(got 'gzip'\)$"):
        check_compression("gzip")


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_meshio_reads_every_array_of_a_raw_appended_file_at_any_size(tmp_path: Path, compression: str) -> None:
    """meshio rewrites the offsets of the arrays it has read to offsets into a longer base64 text and
    finds the next array by its offset: with the arrays laid out in document order a rewritten
    offset can equal a later one's, and meshio read another array's values in its place (a 2-rank
    predict's piece did). Every size from 1 to 300 points, eight fields of 1 and 3 components."""
    from meshshard.run._vtk import write_vtu

    rng = np.random.default_rng(3)
    for n in range(1, 301):
        pts = rng.random((n, 3))
        cells = [("vertex", np.arange(n)[:, None])]
        fields = {f"f{k}": rng.random((n, 3) if k % 3 == 0 else n) for k in range(8)} | {"global_id": np.arange(n)}
        write_vtu(tmp_path / "a.vtu", pts, cells, fields, compression)
        back = meshio.read(tmp_path / "a.vtu")
        np.testing.assert_array_equal(back.points, pts)
        for name, values in fields.items():
            np.testing.assert_array_equal(back.point_data[name], values, err_msg=f"{name} at {n} points")
