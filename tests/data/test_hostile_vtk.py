"""Hostile VTK and HDF5 files never crash, hang or exhaust memory (issue 36, defects 2-6 and 10).

The cases that trusted a declared size ran in a child process whose address space is capped at
3 GiB, so a regression is a MemoryError or an abort there (``std::bad_alloc``, exit -6), not the
machine's memory; the cases that hung run in a child process with a timeout.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshshard.cli import main

from ._solver_files import vtk_grid, write_vtk, write_vtm, write_vtu
from .conftest import grid_triangles

pytest.importorskip("vtkmodules.vtkIOXML", reason="the vtk package is not installed (pip install vtk)")

_READ = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from meshshard.data._vtk_io import read_vtk
from meshshard.data._trajectory_steps import step_mesh, trajectory_steps
out = []
for path in json.loads(sys.argv[1]):
    try:
        if path.endswith(".pvd"):
            [step_mesh(s, None) for s in trajectory_steps(path)[1]]
        else:
            read_vtk(path)
        out.append("read")
    except ValueError as err:
        out.append(str(err))
print(json.dumps(out))
"""


def _read(paths: list[Path], *, allow_outside: bool = False) -> list[str]:
    """Each file read in a capped child process: ``"read"``, or the one-line error."""
    env = {k: v for k, v in os.environ.items() if k != "MESHSHARD_ALLOW_OUTSIDE_REFERENCES"}
    if allow_outside:
        env["MESHSHARD_ALLOW_OUTSIDE_REFERENCES"] = "1"
    try:
        done = subprocess.run([sys.executable, "-c", _READ, json.dumps([str(p) for p in paths])],
                              capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {[p.name for p in paths]} hung (60 s)")
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    out = json.loads(done.stdout)
    assert all("\n" not in line for line in out), out
    return out


def _vtp(path: Path, piece: str, body: str, appended: bytes = b"", header: str = "UInt32") -> Path:
    """A small PolyData file written by hand: ``piece`` the Piece's attributes, ``body`` its arrays."""
    text = (f'<?xml version="1.0"?>\n<VTKFile type="PolyData" version="1.0" byte_order="LittleEndian" '
            f'header_type="{header}">\n<PolyData><Piece {piece}>{body}</Piece></PolyData>\n').encode()
    if appended:
        text += b'<AppendedData encoding="raw">_' + appended + b"</AppendedData>\n"
    path.write_bytes(text + b"</VTKFile>\n")
    return path


_POINT = '<Points><DataArray type="Float32" NumberOfComponents="3" format="ascii">0 0 0</DataArray></Points>'
_APPENDED_POINT = '<Points><DataArray type="Float32" NumberOfComponents="3" format="appended" offset="0"/></Points>'
_VERT = ('<Verts><DataArray type="Int64" Name="connectivity" format="ascii">0</DataArray>'
         '<DataArray type="Int64" Name="offsets" format="ascii">{last}</DataArray></Verts>')


def test_declared_counts_of_a_vtp_are_checked_before_vtk_allocates(tmp_path: Path) -> None:
    """Defect 2: counts far beyond what the file holds were a std::bad_alloc and SIGABRT."""
    files = [
        _vtp(tmp_path / "ascii.vtp", 'NumberOfPoints="1000000000000"', _POINT),
        _vtp(tmp_path / "appended.vtp", 'NumberOfPoints="1000000000000"', _APPENDED_POINT,
             struct.pack("<I", 12) + bytes(12)),
        _vtp(tmp_path / "verts.vtp", 'NumberOfPoints="1" NumberOfVerts="4000000000"', _POINT + _VERT.format(last=1)),
        _vtp(tmp_path / "offsets.vtp", 'NumberOfPoints="1" NumberOfVerts="1"',
             _POINT + _VERT.format(last=1000000000000)),
    ]
    legacy = tmp_path / "legacy.vtk"  # legacy PolyData, which vtk reads here too
    legacy.write_text("# vtk DataFile Version 3.0\nx\nASCII\nDATASET POLYDATA\nPOINTS 1 float\n0 0 0\n"
                      "VERTICES 4000000000 8000000000\n1 0\n")
    files.append(legacy)
    out = _read(files)
    for path, line in zip(files, out):
        assert line.startswith(f"{path}: ") and re.search(r"declares|more than", line), line


def test_declared_sizes_of_blocks_and_components_are_checked(tmp_path: Path) -> None:
    """Defect 3: a block header of 0xFFFFFFF0 bytes (16.9 GB) and a billion components (6 GB)."""
    header = _vtp(tmp_path / "header.vtp", 'NumberOfPoints="1"', _APPENDED_POINT,
                  struct.pack("<I", 0xFFFFFFF0) + bytes(12))
    comps = _vtp(tmp_path / "comps.vtp", 'NumberOfPoints="1"', _POINT + '<PointData><DataArray type="Float32" '
                 'Name="u" NumberOfComponents="1000000000" format="ascii">0</DataArray></PointData>')
    block = struct.pack("<IIII", 1, 1 << 30, 1 << 30, 16) + bytes(16)  # one zlib block said to inflate to 1 GiB
    packed = _vtp(tmp_path / "packed.vtp", 'NumberOfPoints="1"', _APPENDED_POINT, block)
    packed.write_bytes(packed.read_bytes().replace(b'header_type="UInt32"',
                                                   b'header_type="UInt32" compressor="vtkZLibDataCompressor"'))
    out = _read([header, comps, packed])
    assert re.fullmatch(rf"{re.escape(str(header))}: .*4,294,967,280 bytes.*", out[0]), out[0]
    assert re.fullmatch(rf"{re.escape(str(comps))}: .*'u'.*declares.*", out[1]), out[1]
    assert re.fullmatch(rf"{re.escape(str(packed))}: .*MESHSHARD_MAX_EXPANSION.*", out[2]), out[2]


def _hdf(path: Path) -> Path:
    """A small ``.vtkhdf`` unstructured grid of hexahedra, by vtk's writer."""
    from ._solver_files import extruded

    m = extruded(3, 2)
    vtu = write_vtu(path.with_suffix(".vtu"), m["points3"], [("hexahedron", m["hexahedron"])])
    return write_vtk(path, vtk_grid(vtu))


def test_a_vtkhdf_is_checked_before_vtk_reads_it(tmp_path: Path) -> None:
    """Defect 4 (polyhedra without faces: a segfault), defect 10 (connectivity ids of 1e9), and
    counts beyond the datasets' sizes."""
    h5py = pytest.importorskip("h5py")
    poly = _hdf(tmp_path / "poly.vtkhdf")
    with h5py.File(poly, "r+") as f:
        f["VTKHDF/Types"][0] = 42
    ids = _hdf(tmp_path / "ids.vtkhdf")
    with h5py.File(ids, "r+") as f:
        f["VTKHDF/Connectivity"][3] = 1_000_000_000
    counts = _hdf(tmp_path / "counts.vtkhdf")
    with h5py.File(counts, "r+") as f:
        f["VTKHDF/NumberOfPoints"][0] = 1_000_000_000_000
    sparse = _hdf(tmp_path / "sparse.vtkhdf")
    with h5py.File(sparse, "r+") as f:  # a dataset of 24 TB that holds nothing: chunked, never written
        del f["VTKHDF/Points"]
        f["VTKHDF/NumberOfPoints"][0] = 1_000_000_000_000
        f.create_dataset("VTKHDF/Points", shape=(1_000_000_000_000, 3), dtype="f8", chunks=(1024, 3),
                         compression="gzip")
    out = _read([poly, ids, counts, sparse])
    assert out[0] == (f"{poly}: Expected cells of a fixed node count (got polyhedron cells, which meshshard does "
                      "not read) (foamToVTK writes polyhedral cells as they are: decompose them first, or write the "
                      "mesh with only hexahedra, prisms, pyramids and tetrahedra)"), out[0]
    assert re.fullmatch(rf"{re.escape(str(ids))}: .*node 1000000000.*", out[1]), out[1]
    assert re.fullmatch(rf"{re.escape(str(counts))}: .*NumberOfPoints.*", out[2]), out[2]
    assert re.fullmatch(rf"{re.escape(str(sparse))}: .*Points.*", out[3]), out[3]


def test_a_vtkhdf_error_is_one_line_without_hdf5_diagnostics(tmp_path: Path, capfd) -> None:
    """Minor finding: a .vtkhdf vtk refuses came after 20 lines of HDF5's error stack."""
    h5py = pytest.importorskip("h5py")
    for kind in ("UnstructuredGrid", "PolyData"):
        path = tmp_path / f"{kind}.vtkhdf"
        with h5py.File(path, "w") as f:  # a root that says its type, and none of the datasets that type has
            f.create_group("VTKHDF").attrs["Type"] = np.bytes_(kind)
        capfd.readouterr()
        assert main(["dataset", str(path), "--inputs", "pos", "--out", str(tmp_path / "d"), "-q"]) == 2
        err = capfd.readouterr().err
        assert len(err.splitlines()) == 1 and f"{path}: " in err, err


def _mesh(path: Path) -> Path:
    pts, tri = grid_triangles(3, 3)
    return write_vtu(path, pts, [("triangle", tri)])


def _pvtu(path: Path, sources: list[str]) -> Path:
    path.write_text('<?xml version="1.0"?>\n<VTKFile type="PUnstructuredGrid" version="0.1" '
                    'byte_order="LittleEndian">\n  <PUnstructuredGrid GhostLevel="0">\n'
                    '    <PPoints><PDataArray type="Float64" NumberOfComponents="3"/></PPoints>\n'
                    + "".join(f'    <Piece Source="{s}"/>\n' for s in sources)
                    + "  </PUnstructuredGrid>\n</VTKFile>\n")
    return path


def _pvd(path: Path, files: list[str]) -> Path:
    path.write_text('<?xml version="1.0"?>\n<VTKFile type="Collection" version="0.1">\n<Collection>\n'
                    + "".join(f'<DataSet timestep="{k}" part="0" file="{f}"/>\n' for k, f in enumerate(files))
                    + "</Collection>\n</VTKFile>\n")
    return path


def test_a_fifo_named_by_a_collection_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Defect 5: a .vtm block, a .pvtu piece or a .pvd frame naming a FIFO hung forever."""
    _mesh(tmp_path / "good.vtu")
    os.mkfifo(tmp_path / "fifo.vtu")
    files = [write_vtm(tmp_path / "a.vtm", {"internal": "fifo.vtu"}), _pvtu(tmp_path / "b.pvtu", ["fifo.vtu"]),
             _pvd(tmp_path / "c.pvd", ["good.vtu", "fifo.vtu"])]
    out = _read(files)
    for line in out:
        assert re.fullmatch(r".*fifo\.vtu: is not a regular file \(a FIFO, device or socket\)", line), line


def test_files_outside_a_collections_folder_are_refused_unless_allowed(tmp_path: Path) -> None:
    """Defect 6: absolute paths, ``..``, symlinks out and HDF5 external links were read."""
    h5py = pytest.importorskip("h5py")
    elsewhere = _mesh(tmp_path / "elsewhere" / "a.vtu")
    case = tmp_path / "case"
    case.mkdir()
    _mesh(case / "good.vtu")
    (case / "link.vtu").symlink_to(elsewhere)
    linked = _hdf(case / "linked.vtkhdf")
    with h5py.File(linked, "r") as f:
        points = f["VTKHDF/Points"][()]
    with h5py.File(tmp_path / "elsewhere" / "points.h5", "w") as f:
        f["Points"] = points
    with h5py.File(linked, "r+") as f:
        del f["VTKHDF/Points"]
        f["VTKHDF/Points"] = h5py.ExternalLink(str(tmp_path / "elsewhere" / "points.h5"), "/Points")
    files = [write_vtm(case / "abs.vtm", {"internal": str(elsewhere)}), _pvtu(case / "up.pvtu", ["../elsewhere/a.vtu"]),
             _pvd(case / "sym.pvd", ["good.vtu", "link.vtu"]), linked]
    out = _read(files)
    for path, line in zip(files, out):
        assert line.startswith(f"{path}: ") and "outside" in line and "MESHSHARD_ALLOW_OUTSIDE_REFERENCES" in line, line
    assert _read(files, allow_outside=True) == ["read"] * len(files)
    assert _read([_pvd(case / "fine.pvd", ["good.vtu"]), write_vtm(case / "fine.vtm", {"internal": "good.vtu"})]) \
        == ["read", "read"]


def test_honest_files_of_every_encoding_still_read(tmp_path: Path) -> None:
    """The checks refuse none of vtk's own outputs: ascii, binary, appended, raw and compressed."""
    from vtkmodules.vtkIOXML import vtkXMLPolyDataWriter

    from ._solver_files import polydata

    pts, tri = grid_triangles(4, 3)
    data = polydata(pts, polys=tri.tolist(), verts=[0, 1], point_data={"T": np.arange(len(pts), dtype=float)})
    paths = []
    for mode, raw, compress in (("ascii", False, False), ("binary", False, False), ("binary", False, True),
                                ("appended", True, False), ("appended", False, False), ("appended", True, True),
                                ("appended", False, True)):
        writer = vtkXMLPolyDataWriter()
        path = tmp_path / f"s_{mode}_{int(raw)}_{int(compress)}.vtp"
        writer.SetFileName(str(path))
        writer.SetInputData(data)
        getattr(writer, f"SetDataModeTo{mode.capitalize()}")()
        writer.SetEncodeAppendedData(not raw)
        writer.SetHeaderTypeToUInt64() if compress else writer.SetHeaderTypeToUInt32()
        if not compress:
            writer.SetCompressorTypeToNone()
        assert writer.Write() == 1
        paths.append(path)
    assert _read(paths) == ["read"] * len(paths)
