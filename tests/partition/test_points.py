"""Point clouds (partition/_points.py): every reader on a tiny generated file, a surface's normals and
areas, the kNN and radius graphs against brute force, bad input, partitions of clouds of different
sizes, the halo radius, and what ``meshshard info`` says of a cloud dataset."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.cli import main
from meshshard.data import (
    build_dataset,
    check_partition_matches,
    dataset_partition_folder,
    open_dataset,
    partition_dataset,
    read_partitions_metadata,
    write_dataset,
)
from meshshard.partition import (
    check_radius,
    load_partition,
    parse_graph_rule,
    point_graph,
    read_metadata,
    verify_partition,
)

# the unit cube, point i at (x, y, z) = (i & 1, (i >> 1) & 1, (i >> 2) & 1), its faces wound outward
CUBE = np.array([[i & 1, (i >> 1) & 1, (i >> 2) & 1] for i in range(8)], dtype=np.float64)
QUADS = np.array([[0, 2, 3, 1], [4, 5, 7, 6], [0, 1, 5, 4], [2, 6, 7, 3], [0, 4, 6, 2], [1, 3, 7, 5]])
TRIANGLES = np.concatenate([QUADS[:, [0, 1, 2]], QUADS[:, [0, 2, 3]]])


def _cloud(n: int, seed: int = 0, dim: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).random((n, dim))


def _vtk_poly(points: np.ndarray, polys: list[list[int]] | None = None, verts: list[list[int]] | None = None,
              fields: dict[str, np.ndarray] | None = None):  # -> vtkPolyData
    import vtkmodules.vtkCommonCore as core
    import vtkmodules.vtkCommonDataModel as model
    from vtkmodules.util import numpy_support as ns

    poly = model.vtkPolyData()
    pts = core.vtkPoints()
    pts.SetData(ns.numpy_to_vtk(np.ascontiguousarray(points, dtype=np.float64), deep=True))
    poly.SetPoints(pts)
    for cells, setter in ((polys, poly.SetPolys), (verts, poly.SetVerts)):
        if cells:
            array = model.vtkCellArray()
            for c in cells:
                array.InsertNextCell(len(c), [int(i) for i in c])
            setter(array)
    for name, values in (fields or {}).items():
        a = ns.numpy_to_vtk(np.ascontiguousarray(values, dtype=np.float64), deep=True)
        a.SetName(name)
        poly.GetPointData().AddArray(a)
    return poly


def _write_vtp(path: Path, poly) -> Path:
    import vtkmodules.vtkIOXML as xml

    writer = xml.vtkXMLPolyDataWriter()
    writer.SetFileName(str(path))
    writer.SetInputData(poly)
    assert writer.Write() == 1
    return path


def _write_legacy(path: Path, poly) -> Path:
    import vtkmodules.vtkIOLegacy as legacy

    writer = legacy.vtkPolyDataWriter()
    writer.SetFileName(str(path))
    writer.SetInputData(poly)
    assert writer.Write() == 1
    return path


def _surface_inputs(data_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The stored normal (3 channels) and area (1) of sample 0 of a dataset made with --inputs normal,area."""
    inputs, _ = open_dataset(data_path).sample_arrays(0)
    x = np.asarray(inputs, dtype=np.float64)
    return x[:, :3], x[:, 3]


def _check_cube(data: Path, exact_quads: bool) -> None:
    normal, area = _surface_inputs(data)
    np.testing.assert_allclose(area.sum(), 6.0, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(normal, axis=1), 1.0, rtol=1e-6)
    assert (np.einsum("nd,nd->n", normal, CUBE - 0.5) > 0.5).all()  # outward
    if exact_quads:  # a quarter of each of its three faces at every corner
        np.testing.assert_allclose(area, 0.75, rtol=1e-6)
        np.testing.assert_allclose(normal, (2 * CUBE - 1) / np.sqrt(3), rtol=1e-6)
    dataset = open_dataset(data)
    vectors = dataset.surface_area(0)
    assert vectors.shape == (8, 3)
    np.testing.assert_allclose(vectors.sum(axis=0), 0.0, atol=1e-12)  # a closed surface
    np.testing.assert_allclose(dataset.meta["meshes"][0]["surface_area"], 6.0)
    assert (Path(data) / "meshes/00000/surface-area.npy").is_file()


# ---------------------------------------------------------------------------------------------
# Readers


def test_vtp_surface_normals_areas_and_field(tmp_path: Path) -> None:
    p = CUBE[:, 2] * 10.0
    src = _write_vtp(tmp_path / "cube.vtp", _vtk_poly(CUBE, polys=TRIANGLES.tolist(), fields={"p": p}))
    data = build_dataset([src], tmp_path / "data", inputs="normal,area", targets="p", val_fraction=0)
    _check_cube(data, exact_quads=False)
    _, targets = open_dataset(data).sample_arrays(0)
    np.testing.assert_array_equal(np.asarray(targets)[:, 0], p)
    assert "graph" not in open_dataset(data).meta  # a surface keeps its triangles' edges by default


def test_legacy_vtk_polydata_polygons_split_by_a_fan(tmp_path: Path) -> None:
    # the top face as one pentagon (a fifth point in the middle of an edge), the rest as quads
    points = np.concatenate([CUBE, [[0.5, 0.0, 1.0]]])
    polys = [q.tolist() for q in QUADS if not {4, 5, 7, 6} == set(q.tolist())] + [[8, 5, 7, 6, 4]]
    src = _write_legacy(tmp_path / "cube.vtk", _vtk_poly(points, polys=polys))
    data = build_dataset([src], tmp_path / "data", inputs="normal,area,pos")
    normal, area = _surface_inputs(data)
    np.testing.assert_allclose(area.sum(), 6.0, rtol=1e-6)
    np.testing.assert_allclose(normal[8], [0, 0, 1], atol=1e-7)
    mesh = open_dataset(data).mesh(0)
    assert [t for t, _ in mesh.cells] == ["quad", "triangle"] and len(mesh.cells[1][1]) == 3


def test_ply_quads_give_exact_corner_normals(tmp_path: Path) -> None:
    src = tmp_path / "cube.ply"
    meshio.write(src, meshio.Mesh(CUBE, [("quad", QUADS)], point_data={"p": CUBE[:, 0]}))
    data = build_dataset([src], tmp_path / "data", inputs="normal,area", targets="p", val_fraction=0)
    _check_cube(data, exact_quads=True)


def test_stl_surface(tmp_path: Path) -> None:
    src = tmp_path / "cube.stl"
    meshio.write(src, meshio.Mesh(CUBE, [("triangle", TRIANGLES)]))
    data = build_dataset([src], tmp_path / "data", inputs="normal,area")
    normal, area = _surface_inputs(data)
    pos = open_dataset(data).mesh(0).points  # meshio's STL reader may renumber the points
    np.testing.assert_allclose(area.sum(), 6.0, rtol=1e-6)
    assert (np.einsum("nd,nd->n", normal, pos - 0.5) > 0.5).all()


def test_vtu_of_vertex_cells_and_vtp_cloud_get_a_knn_graph(tmp_path: Path) -> None:
    pos = _cloud(30, seed=1)
    meshio.write(tmp_path / "a.vtu", meshio.Mesh(pos, [("vertex", np.arange(30)[:, None])],
                                                 point_data={"t": pos[:, 0]}))
    _write_vtp(tmp_path / "b.vtp", _vtk_poly(pos[:20], verts=[list(range(20))], fields={"t": pos[:20, 0]}))
    data = build_dataset([tmp_path / "a.vtu", tmp_path / "b.vtp"], tmp_path / "data", inputs="pos", targets="t",
                         val_fraction=0)
    dataset = open_dataset(data)
    assert dataset.kind == "many-meshes" and dataset.meta["graph"] == "knn:8"
    for m, n in ((0, 30), (1, 20)):
        mesh = dataset.mesh(m)
        assert mesh.num_nodes == n and dataset.meta["meshes"][m]["graph"] == {"rule": "knn", "k": 8, "symmetric": True}
        np.testing.assert_array_equal(mesh.edge_index, point_graph(pos[:n], parse_graph_rule("knn:8")))
    assert [t for t, _ in dataset.mesh(1).cells] == ["vertex"]  # the poly-vertex, one vertex cell per point


def test_npz_clouds_of_different_sizes(tmp_path: Path) -> None:
    for i, n in enumerate((12, 25)):
        pos = _cloud(n, seed=i, dim=2)
        np.savez(tmp_path / f"c{i}.npz", pos=pos, u=np.stack([pos[:, 1], -pos[:, 0]], 1), flag=pos[:, 0] > 0.5)
    data = build_dataset([tmp_path], tmp_path / "data", inputs="pos,flag", targets="u", val_fraction=0,
                         graph="radius:0.4", max_points=10)
    dataset = open_dataset(data)
    assert dataset.meta["graph"] == "radius:0.4" and dataset.meta["max_points"] == 10
    assert [m["num_nodes"] for m in dataset.meta["meshes"]] == [12, 25]
    x, y = dataset.rows(1, np.arange(25))
    pos = _cloud(25, seed=1, dim=2)
    np.testing.assert_allclose(x[:, :2], pos, rtol=1e-6)
    np.testing.assert_array_equal(x[:, 2], pos[:, 0] > 0.5)
    np.testing.assert_allclose(y, np.stack([pos[:, 1], -pos[:, 0]], 1), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Graphs against brute force


def _pairs(edge_index: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(edge_index[0].tolist(), edge_index[1].tolist()))


@pytest.mark.parametrize("dim", [2, 3])
def test_knn_graph_is_symmetric_and_exact(dim: int) -> None:
    pos = _cloud(50, seed=dim, dim=dim)
    k = 5
    d = np.linalg.norm(pos[:, None] - pos[None], axis=2)
    np.fill_diagonal(d, np.inf)
    nearest = np.argsort(d, axis=1)[:, :k]
    want = {(int(j), i) for i in range(50) for j in nearest[i]}
    want |= {(b, a) for a, b in want}
    got = point_graph(pos, parse_graph_rule(f"knn:{k}"))
    assert _pairs(got) == want and len(_pairs(got)) == got.shape[1]
    assert _pairs(got) == {(b, a) for a, b in _pairs(got)}


def test_radius_graph_is_exact() -> None:
    pos = _cloud(60, seed=3)
    d = np.linalg.norm(pos[:, None] - pos[None], axis=2)
    want = {(int(a), int(b)) for a, b in zip(*np.nonzero(d <= 0.3)) if a != b}
    assert _pairs(point_graph(pos, parse_graph_rule("radius:0.3"))) == want


def test_write_dataset_of_a_cloud_takes_its_point_graph(tmp_path: Path) -> None:
    pos = _cloud(20, seed=5)
    with pytest.raises(ValueError, match=r"Expected cells or an edge_index \(got neither; a point cloud's: "
                                         r"meshshard.partition.point_graph\(pos, parse_graph_rule\('knn:8'\)\)\)"):
        write_dataset(tmp_path / "none", [pos[:, :1]], pos=pos)
    edges = point_graph(pos, parse_graph_rule("knn:8"))
    mesh = open_dataset(write_dataset(tmp_path / "data", [pos[:, :1]], pos=pos, edge_index=edges)).mesh(0)
    np.testing.assert_array_equal(mesh.graph().edge_index(), edges)


def test_graph_rules_parse_and_refuse() -> None:
    assert str(parse_graph_rule("knn:12")) == "knn:12" and parse_graph_rule("radius:0.5").radius == 0.5
    assert parse_graph_rule("mesh").rule == "mesh"
    for bad in ("knn", "knn:0", "knn:2.5", "radius:-1", "radius:nan", "delaunay", "mesh:3"):
        with pytest.raises(ValueError, match="Expected --graph mesh, knn:K"):
            parse_graph_rule(bad)


# ---------------------------------------------------------------------------------------------
# Bad input: one line naming the file, exit 2, nothing left behind


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


BAD = {
    "no-pos": (lambda p: _npz(p, xyz=_cloud(20)), [], r"Expected a 'pos' array of point coordinates \(got 'xyz'\)"),
    "complex": (lambda p: _npz(p, pos=_cloud(20), t=np.ones(20, dtype=complex)), [],
                r"Expected real numbers in field 't' \(got complex128\)"),
    "object": (lambda p: _npz(p, pos=_cloud(20), t=np.array([{}] * 20, dtype=object)), [],
               "holds Python objects"),
    "short-field": (lambda p: _npz(p, pos=_cloud(20), t=np.ones(19)), [],
                    r"Expected field 't' to have one value per point, 20 \(got shape \(19,\)\)"),
    "duplicates": (lambda p: _npz(p, pos=np.concatenate([_cloud(20), _cloud(20)[3:4]]), t=np.ones(21)), [],
                   r"Expected distinct points for --graph knn:8 \(got points 3 and 20 at the same coordinates"),
    "nan": (lambda p: _npz(p, pos=np.where(np.arange(20)[:, None] == 7, np.nan, _cloud(20)), t=np.ones(20)), [],
            r"Expected finite coordinates \(got NaN or inf at point 7"),
    "too-few": (lambda p: _npz(p, pos=_cloud(8), t=np.ones(8)), [],
                r"Expected at least 9 points for --graph knn:8 \(got 8\)"),
    "radius-one-point": (lambda p: _npz(p, pos=_cloud(1), t=np.ones(1)), ["--graph", "radius:0.5"],
                         r"Expected at least 2 points for --graph radius:0.5 \(got 1\)"),
    "normal-of-a-cloud": (lambda p: _npz(p, pos=_cloud(20), t=np.ones(20)), ["--inputs", "normal"],
                          "Expected the faces of a 3-D surface"),
    "mesh-graph-of-a-cloud": (lambda p: _npz(p, pos=_cloud(20), t=np.ones(20)), ["--graph", "mesh"],
                              "Expected cells that join points for --graph mesh"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_point_clouds_are_refused_in_one_line(case: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    make, extra, message = BAD[case]
    src = make(tmp_path / f"{case}.npz")
    inputs = ["--inputs", "pos"] if "--inputs" not in extra else []
    code = main(["dataset", str(src), "--out", str(tmp_path / "data"), *inputs, "--targets", "t", "-q", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"meshshard dataset: error: {src}: "), err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("flag", "message"), [(["--graph", "knn:0"], "Expected --graph mesh, knn:K"),
                                               (["--max-points", "0"], "Expected --max-points to be an integer >= 1")])
def test_bad_options_are_refused(flag: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    src = _npz(tmp_path / "c.npz", pos=_cloud(20), t=np.ones(20))
    code = main(["dataset", str(src), "--out", str(tmp_path / "data"), "--inputs", "pos", "-q", *flag])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------------------------------------
# Partitions of clouds, the halo radius, info


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of three 3-D clouds of 60, 90 and 130 points (kNN graph, the default)."""
    folder = tmp_path_factory.mktemp("clouds")
    for i, n in enumerate((60, 90, 130)):
        pos = _cloud(n, seed=10 + i)
        np.savez(folder / f"cloud-{i}.npz", pos=pos, p=np.sin(4 * pos[:, 0]))
    return build_dataset([folder], folder / "data", inputs="pos", targets="p", val_fraction=0)


@pytest.mark.parametrize("method", ["rcb", "metis"])
def test_clouds_of_different_sizes_partition(clouds: Path, method: str, tmp_path: Path) -> None:
    parts = partition_dataset(clouds, tmp_path / "parts", 3, method=method)
    check_partition_matches(clouds, parts)
    dataset = open_dataset(clouds)
    for m in range(3):
        folder = dataset_partition_folder(parts, m)
        assert verify_partition(folder) == []
        meta = read_metadata(folder)
        assert meta["method"] == method and meta["graph"] == "knn"
        mesh = dataset.mesh(m)
        edges = set()
        for r in range(3):
            p = load_partition(folder, r)
            local = np.concatenate([p.owned_ids, p.ghost_ids])
            np.testing.assert_array_equal(p.pos, mesh.points[local])
            edges |= _pairs(local[p.edge_index])
        assert edges == _pairs(mesh.edge_index)  # every kNN edge on the rank of its destination


def test_halo_radius_is_recorded_and_checked(clouds: Path, tmp_path: Path) -> None:
    radius = 0.2
    parts = partition_dataset(clouds, tmp_path / "parts", 3, method="rcb", radius=radius)
    top = read_partitions_metadata(parts)
    assert top["halo_radius"] == radius
    dataset = open_dataset(clouds)
    for m in range(3):
        meta = read_metadata(dataset_partition_folder(parts, m))
        assert meta["halo_radius"] == radius
        points = dataset.mesh(m).points
        owner = np.empty(len(points), dtype=np.int64)
        for r in range(3):
            owner[load_partition(dataset_partition_folder(parts, m), r).owned_ids] = r
        d = np.linalg.norm(points[:, None] - points[None], axis=2)
        near = (d <= radius) & (owner[:, None] != owner[None])  # [own point, other point]
        want = [int(near[owner == r].any(axis=0).sum()) for r in range(3)]
        assert meta["radius_ghosts"] == want and sum(want) > 0
    check_radius(top, radius)
    check_radius(top, radius / 2)
    with pytest.raises(ValueError, match=r"Expected a model radius of at most 0.2, the halo radius the partition was "
                                         r"made for \(got 0.3\); partition again with meshshard partition DATA "
                                         r"--radius 0.3"):
        check_radius(top, 0.3)
    check_radius(read_partitions_metadata(dataset_partition_folder(parts, 0)), 0.2)
    with pytest.raises(ValueError, match="at most 0.2"):
        check_radius(read_metadata(dataset_partition_folder(parts, 0)), 0.25)
    check_radius(read_partitions_metadata(partition_dataset(clouds, tmp_path / "none", 2)), 10.0)  # none recorded
    for bad in (0, -1.0, float("nan"), "x"):
        with pytest.raises(ValueError, match="Expected the model's radius to be"):
            check_radius(top, bad)


def test_partition_command_radius_and_info(clouds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "parts"
    assert main(["partition", str(clouds), "--parts", "2", "--out", str(out), "--method", "morton",
                 "--radius", "0.15", "-q"]) == 0
    assert main(["info", str(out)]) == 0
    assert "made for a ball radius up to 0.15 (--radius)" in capsys.readouterr().out
    assert main(["info", str(out / "mesh-00000")]) == 0
    assert "halo radius 0.15 (--radius: the largest ball radius of a model): " in capsys.readouterr().out
    assert main(["partition", str(clouds), "--parts", "2", "--out", str(tmp_path / "bad"), "--radius", "-1"]) == 2
    assert "Expected --radius to be a positive number (got -1.0)" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main(["info", str(clouds)]) == 0
    text = capsys.readouterr().out
    assert "3 distinct meshes, 60 to 130 nodes" in text
    assert "graph    knn:8 from the points (symmetrised)" in text


def test_info_describes_a_surface_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write_vtp(tmp_path / "cube.vtp", _vtk_poly(CUBE, polys=QUADS.tolist(), fields={"p": CUBE[:, 0]}))
    data = build_dataset([src], tmp_path / "data", inputs="pos,normal", targets="p", val_fraction=0,
                         graph="knn:3", max_points=4)
    assert main(["info", str(data)]) == 0
    text = capsys.readouterr().out
    assert "graph    knn:3 from the points (symmetrised)" in text
    assert "surface  1 surface, area 6 to 6 (normal and area available as inputs" in text
    assert "about 4 per sample and epoch in training" in text
    mesh = open_dataset(data).mesh(0)
    assert [t for t, _ in mesh.cells] == ["quad"] and mesh.graph().num_edges == mesh.edge_index.shape[1]
    np.testing.assert_array_equal(mesh.edge_index, point_graph(CUBE, parse_graph_rule("knn:3")))
    again = build_dataset([src], data, inputs="pos", force=True)  # --force knows surface-area.npy as its own
    assert (again / "meshes/00000/surface-area.npy").is_file() and "graph" not in open_dataset(again).meta


def test_a_surface_and_a_cloud_each_keep_their_own_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    surface = _write_vtp(tmp_path / "cube.vtp", _vtk_poly(CUBE, polys=TRIANGLES.tolist()))
    cloud = _npz(tmp_path / "cloud.npz", pos=_cloud(20, seed=7))
    data = build_dataset([surface, cloud], tmp_path / "data", inputs="pos")
    meshes = open_dataset(data).meta["meshes"]
    assert "graph" not in meshes[0] and meshes[1]["graph"]["rule"] == "knn"
    assert "surface_area" in meshes[0] and "surface_area" not in meshes[1]
    assert main(["info", str(data)]) == 0
    assert ("graph    knn:8 from the points (symmetrised, 1 of 2 meshes; the others their cells' edges)"
            in capsys.readouterr().out)
