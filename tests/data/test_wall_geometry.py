"""Geometric inputs from named walls (--wall-normal, --signed-distance) on analytic bodies: a
circle and a sphere of radius R in a box, meshed inside too or cut out. The offset is (r - R) n,
the normal radial, the signed distance r - R, to the mesh's resolution (exact on the wall); each
refusal is one line."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np
import pytest
from scipy.spatial import Delaunay

from meshshard.cli import main
from meshshard.data import build_dataset, open_dataset
from meshshard.data._wall_geometry import signed_distance, wall_normal

R = 0.5


def _disc(hole: bool, n_theta: int = 64) -> tuple[meshio.Mesh, np.ndarray]:
    """A box [-1.5, 1.5]^2 around a circle of radius R (node set ``body``): polar rings near the
    circle, a grid further out, Delaunay triangles; with ``hole``, the disc's triangles left out."""
    theta = np.arange(n_theta) * 2 * np.pi / n_theta
    radii = np.array([0.2, 0.3, 0.38, 0.44, R, 0.56, 0.62, 0.7, 0.8])
    rings = np.concatenate([np.stack([r * np.cos(theta + r), r * np.sin(theta + r)], 1) if r != R else
                            np.stack([R * np.cos(theta), R * np.sin(theta)], 1) for r in radii])
    g = np.linspace(-1.5, 1.5, 19)
    grid = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    grid = grid[np.linalg.norm(grid, axis=1) > 0.95]
    pts = np.concatenate([[[0.0, 0.0]], rings, grid])
    tri = Delaunay(pts).simplices
    if hole:
        tri = tri[np.linalg.norm(pts[tri].mean(1), axis=1) > R]
        used = np.unique(tri)
        new = np.full(len(pts), -1)
        new[used] = np.arange(len(used))
        pts, tri = pts[used], new[tri]
    body = np.flatnonzero(np.abs(np.linalg.norm(pts, axis=1) - R) < 1e-12)
    assert len(body) == n_theta
    return meshio.Mesh(pts, [("triangle", tri)], point_sets={"body": body, "box": np.flatnonzero(
        np.abs(pts).max(1) > 1.5 - 1e-12)}), body


@pytest.mark.parametrize("hole", [False, True])
def test_a_circle_in_a_box(hole: bool) -> None:
    mesh, body = _disc(hole)
    pts = mesh.points
    r = np.linalg.norm(pts, axis=1)
    radial = pts / np.maximum(r, 1e-300)[:, None]
    got = wall_normal(mesh, ["body"], Path("m.msh"))
    offset, normal = got[:, :2], got[:, 2:]
    assert got.shape == (len(pts), 4)
    np.testing.assert_allclose(np.linalg.norm(normal, axis=1), 1.0, atol=1e-12)
    # on the wall: no offset, the normal radial (out of the body, into the fluid): equal arcs each side
    np.testing.assert_array_equal(offset[body], 0.0)
    np.testing.assert_allclose(normal[body], radial[body], atol=1e-12)
    # off the wall: offset (r - R) n to within half an arc (the nearest node, not the nearest point)
    arc = 2 * np.pi * R / 64
    away = r > 0
    err = np.linalg.norm(offset - (r - R)[:, None] * radial, axis=1)
    assert err[away].max() <= arc / 2 + 1e-12
    assert (np.einsum("nd,nd->n", normal, radial)[away] >= np.cos(np.pi / 64) - 1e-12).all()
    sd = signed_distance(mesh, ["body"], Path("m.msh"))[:, 0]
    np.testing.assert_array_equal(sd[body], 0.0)
    off = np.abs(r - R) > 1e-9
    np.testing.assert_array_equal(np.sign(sd[off]), np.sign(r - R)[off])
    assert np.abs(np.abs(sd) - np.abs(r - R)).max() <= arc / 2
    if not hole:
        assert (sd < 0).sum() == 1 + 4 * 64  # the centre and the four rings inside
    else:
        assert (sd >= 0).all()


def test_a_sphere_in_a_box() -> None:
    n = 300
    k = np.arange(n) + 0.5
    phi, theta = np.arccos(1 - 2 * k / n), np.pi * (1 + 5**0.5) * k
    unit = np.stack([np.cos(theta) * np.sin(phi), np.sin(theta) * np.sin(phi), np.cos(phi)], 1)
    shells = [s * unit for s in (0.3, 0.4, R, 0.6, 0.7)]
    g = np.linspace(-1.2, 1.2, 9)
    grid = np.stack(np.meshgrid(g, g, g), -1).reshape(-1, 3)
    pts = np.concatenate([[[0.0, 0.0, 0.0]], *shells, grid[np.linalg.norm(grid, axis=1) > 0.85]])
    tets = Delaunay(pts).simplices
    body = np.arange(1 + 2 * n, 1 + 3 * n)
    mesh = meshio.Mesh(pts, [("tetra", tets)], point_sets={"sphere": body})
    r = np.linalg.norm(pts, axis=1)
    radial = pts / np.maximum(r, 1e-300)[:, None]
    got = wall_normal(mesh, ["sphere"], Path("s.vtu"))
    np.testing.assert_array_equal(got[body, :3], 0.0)
    assert (np.einsum("nd,nd->n", got[body, 3:], radial[body]) > 0.99).all()  # the area-weighted normal
    spacing = np.sqrt(4 * np.pi * R**2 / n)
    away = r > 0
    assert np.linalg.norm(got[:, :3] - (r - R)[:, None] * radial, axis=1)[away].max() < spacing
    sd = signed_distance(mesh, ["sphere"], Path("s.vtu"))[:, 0]
    np.testing.assert_array_equal(sd[body], 0.0)
    off = np.abs(r - R) > 1e-9
    np.testing.assert_array_equal(np.sign(sd[off]), np.sign(r - R)[off])
    assert (sd < 0).sum() == 1 + 2 * n


def test_refusals_are_one_line() -> None:
    mesh, _ = _disc(hole=False)
    with pytest.raises(ValueError, match=r"^m\.msh: Expected --signed-distance to name boundaries of the file "
                                         r"\(got wing; the boundaries are body, box\)$"):
        signed_distance(mesh, ["wing", "body"], Path("m.msh"))
    with pytest.raises(ValueError, match=r"^m\.vtu: Expected named boundaries for --wall-normal \(got none"):
        wall_normal(meshio.Mesh(mesh.points, mesh.cells), ["body"], Path("m.vtu"))
    # an arc of the circle does not close
    pts = mesh.points
    arc = np.flatnonzero((np.abs(np.linalg.norm(pts, axis=1) - R) < 1e-12) & (pts[:, 1] > 0))
    cut = meshio.Mesh(pts, mesh.cells, point_sets={"arc": arc})
    with pytest.raises(ValueError, match=r"^m\.msh: Expected arc to close around a body for --signed-distance \(got "
                                         r"2 nodes without exactly two wall edges, the first node \d+ with 1\); "):
        signed_distance(cut, ["arc"], Path("m.msh"))
    # ... and inside the mesh it parts nothing: fluid on both sides
    with pytest.raises(ValueError, match=r"^m\.msh: Expected arc to part fluid from a body for --wall-normal \(got an "
                                         r"edge inside the mesh, nodes \[\d+, \d+\], with fluid on both sides\)$"):
        wall_normal(cut, ["arc"], Path("m.msh"))
    scattered = meshio.Mesh(pts, mesh.cells, point_sets={"dots": np.array([0, 100, 200])})
    with pytest.raises(ValueError, match=r"^m\.msh: Expected faces of the mesh's cells on dots for --wall-normal"):
        wall_normal(scattered, ["dots"], Path("m.msh"))
    # the box's outer boundary closes (2-D) and is the fluid's own boundary: positive everywhere
    sd = signed_distance(mesh, ["box"], Path("m.msh"))[:, 0]
    assert (sd >= 0).all() and (sd == 0).sum() == 72


def _gmsh(path: Path, mesh: meshio.Mesh, body: np.ndarray, p: np.ndarray) -> None:
    """A gmsh 2.2 file of the triangles and the body's edges as the physical group ``body``."""
    tri = mesh.cells[0].data
    on = np.zeros(len(mesh.points), bool)
    on[body] = True
    edges = np.sort(np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]]), axis=1)
    edges = np.unique(edges[on[edges].all(1)], axis=0)
    pts3 = np.c_[mesh.points, np.zeros(len(mesh.points))]
    meshio.write(path, meshio.Mesh(pts3, [("line", edges), ("triangle", tri)], point_data={"p": p[:, None]},
                                   cell_data={"gmsh:physical": [np.full(len(edges), 1), np.full(len(tri), 2)],
                                              "gmsh:geometrical": [np.full(len(edges), 1), np.full(len(tri), 2)]},
                                   field_data={"body": np.array([1, 1]), "fluid": np.array([2, 2])}),
                 file_format="gmsh22", binary=True)


def test_in_a_dataset_and_info(tmp_path: Path, capsys) -> None:
    mesh, body = _disc(hole=False)
    for k in range(2):
        _gmsh(tmp_path / f"c{k}.msh", mesh, body, mesh.points[:, 0] * (k + 1))
    out = build_dataset([tmp_path / "c0.msh", tmp_path / "c1.msh"], tmp_path / "d", inputs="pos", targets="p",
                        wall_normal="body", signed_distance=["body"], val_fraction=0)
    data = open_dataset(out)
    dim = data.meta["meshes"][0]["pos_dim"]
    assert data.input_channels == ([f"pos[{i}]" for i in range(dim)] + [f"wall_offset[{i}]" for i in range(dim)]
                                   + [f"wall_normal[{i}]" for i in range(dim)] + ["signed_distance"])
    assert data.meta["inputs"][1] == {"name": "wall_offset", "components": dim, "patches": ["body"]}
    assert data.meta["inputs"][3] == {"name": "signed_distance", "components": 1, "patches": ["body"]}
    x, _ = data.rows(0, np.arange(data.num_nodes(0)))
    r = np.linalg.norm(x[:, :2], axis=1)
    np.testing.assert_allclose(x[:, -1], r - R, atol=2 * np.pi * R / 128 + 1e-6)
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "wall     wall_offset: x - x_wall to the nearest node of body" in shown
    assert "wall     signed_distance: the distance to the nearest node of body, negative inside" in shown
    assert main(["dataset", str(tmp_path / "c0.msh"), "--out", str(tmp_path / "e"), "--inputs", "pos", "--targets",
                 "p", "--signed-distance", "fluid,body", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"meshshard dataset: error: {tmp_path / 'c0.msh'}: Expected --signed-distance to name boundaries "
                   "of the file (got fluid; the boundaries are body)"], err
    assert not (tmp_path / "e").exists()
