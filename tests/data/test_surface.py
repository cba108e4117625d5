"""Named boundaries and their area vectors: the divergence theorem on whole boundaries, a force
on one wall, the orientation, the node sets of a multiblock and of gmsh physical groups."""

from __future__ import annotations

import meshio
import numpy as np
import pytest

from meshshard.data._surface import (
    boundary_area_vectors,
    boundary_force,
    named_boundaries,
    surface_area_vectors,
)


def _grid_2d(nx: int, ny: int, quads: bool) -> tuple[np.ndarray, list]:
    x, y = np.meshgrid(np.linspace(0.0, 2.0, nx + 1), np.linspace(0.0, 1.0, ny + 1), indexing="xy")
    pts = np.stack([x.ravel(), y.ravel()], axis=1)
    i, j = np.meshgrid(np.arange(nx), np.arange(ny), indexing="xy")
    a = (j * (nx + 1) + i).ravel()
    b, c, d = a + 1, a + nx + 2, a + nx + 1
    if quads:
        return pts, [("quad", np.stack([a, b, c, d], 1))]
    return pts, [("triangle", np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)]))]


def _box_3d(n: int, tets: bool) -> tuple[np.ndarray, list]:
    g = np.linspace(0.0, 1.0, n + 1)
    x, y, z = np.meshgrid(g, 2 * g, 3 * g, indexing="ij")
    pts = np.stack([x.ravel(), y.ravel(), z.ravel()], 1)
    idx = np.arange((n + 1) ** 3).reshape(n + 1, n + 1, n + 1)
    c = [idx[i:i + n, j:j + n, k:k + n].ravel() for i, j, k in
         [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1)]]
    hexes = np.stack(c, 1)
    if not tets:
        return pts, [("hexahedron", hexes)]
    split = [[0, 1, 2, 6], [0, 2, 3, 6], [0, 3, 7, 6], [0, 7, 4, 6], [0, 4, 5, 6], [0, 5, 1, 6]]  # Kuhn: conforming
    return pts, [("tetra", hexes[:, split].reshape(-1, 4))]


@pytest.mark.parametrize("kind", ["triangle", "quad", "tetra", "hexahedron"])
def test_whole_boundary_obeys_the_divergence_theorem(kind: str) -> None:
    pts, cells = _grid_2d(4, 3, kind == "quad") if kind in ("triangle", "quad") else _box_3d(3, kind == "tetra")
    rng = np.random.default_rng(0)
    ids = np.arange(len(pts))
    a = boundary_area_vectors(pts, cells, ids)
    volume = float(np.prod(pts.max(0) - pts.min(0)))
    np.testing.assert_allclose(a.sum(0), 0.0, atol=1e-12)  # a closed boundary
    # integral of (x_d n) over the boundary = volume e_d, exact for fields linear on each facet
    np.testing.assert_allclose(pts.T @ a, volume * np.eye(pts.shape[1]), atol=1e-12)
    interior = (pts > pts.min(0)).all(1) & (pts < pts.max(0)).all(1)
    assert np.abs(a[interior]).max() == 0.0
    c = rng.normal(size=pts.shape[1])
    assert boundary_force(pts @ c + 1.5, a) == pytest.approx(volume * c, abs=1e-12)


def test_a_named_wall_gets_its_outward_normal_and_the_force_on_it() -> None:
    pts, cells = _grid_2d(4, 2, quads=False)
    bottom = np.flatnonzero(pts[:, 1] == 0.0)
    a = boundary_area_vectors(pts, cells, bottom)
    np.testing.assert_allclose(a[:, 0], 0.0, atol=1e-15)
    assert (a[:, 1] <= 0).all()  # out of the domain, into the wall below it
    assert a[:, 1].sum() == pytest.approx(-2.0)  # the wall is 2 long
    np.testing.assert_allclose(a[[0, -1], 1], -0.25)  # end nodes stand for half an edge
    np.testing.assert_allclose(boundary_force(np.full(len(bottom), 3.0), a), [0.0, -6.0], atol=1e-12)
    tau = np.tile([0.5, 0.0], (len(bottom), 1))
    np.testing.assert_allclose(boundary_force(np.zeros(len(bottom)), a, tau), [1.0, 0.0], atol=1e-12)


def test_a_flat_mesh_in_3d_coordinates_gets_in_plane_normals() -> None:
    pts2, cells = _grid_2d(3, 3, quads=True)
    pts = np.concatenate([pts2, np.zeros((len(pts2), 1))], 1)
    left = np.flatnonzero(pts[:, 0] == 0.0)
    a = boundary_area_vectors(pts, cells, left)
    np.testing.assert_allclose(a.sum(0), [-1.0, 0.0, 0.0], atol=1e-12)


def test_surface_area_vectors_of_a_closed_surface() -> None:
    pts, cells = _box_3d(2, tets=False)
    ids = np.arange(len(pts))
    # the outer faces of the box as a surface, wound outward: the boundary's own area vectors agree
    a_boundary = boundary_area_vectors(pts, cells, ids)
    areas = np.linalg.norm(a_boundary, axis=1)
    assert areas.sum() > 0
    tri = np.array([[0, 1, 2]])
    a = surface_area_vectors(np.array([[0, 0, 0], [2, 0, 0], [0, 1, 0]], float), [("triangle", tri)])
    np.testing.assert_allclose(a.sum(0), [0, 0, 1.0])
    np.testing.assert_allclose(a[:, 2], 1 / 3)


def test_named_boundaries_from_point_sets_and_gmsh_groups() -> None:
    pts, cells = _grid_2d(2, 1, quads=True)
    lines = np.array([[0, 1], [1, 2], [3, 4]])
    mesh = meshio.Mesh(pts, [("quad", cells[0][1]), ("line", lines)],
                       point_sets={"inlet": np.array([0, 3, 3])},
                       cell_sets={"bottom": [np.array([], int), np.array([0, 1])],
                                  "fluid": [np.array([0, 1]), np.array([], int)],
                                  "gmsh:bounding_entities": [np.array([0]), np.array([0])]})
    got = named_boundaries(mesh)
    assert sorted(got) == ["bottom", "inlet"]  # "fluid" is cells of the mesh's own dimension
    np.testing.assert_array_equal(got["inlet"], [0, 3])
    np.testing.assert_array_equal(got["bottom"], [0, 1, 2])
