"""Surface pressure on a family of 3-D bodies from a real solver: potential flow past ellipsoids.

Each case is an ellipsoid of semi-axes ``(0.5 * aspect, 0.5, 0.5 * thickness)`` pitched by
``angle`` degrees about the y axis, in a uniform stream ``u_inf = (1, 0, 0)`` (``angle > 0`` lowers
the upstream end: a negative angle of attack in the aeronautical sense). gmsh meshes the box
``[-L, L]^3`` minus the body with tetrahedra (finer at the body); scikit-fem solves Laplace's
equation for the velocity potential with quadratic (P2) elements::

    laplace(phi) = 0           in the box minus the body,
    dphi/dn      = 0           on the body (no flow through it),
    phi          = u_inf . x   on the box's faces (the undisturbed stream far away).

The velocity ``u = grad phi`` is recovered at the nodes by an L2 projection of the gradient onto
the same P2 space, and Bernoulli gives the pressure coefficient ``Cp = 1 - |u|^2 / |u_inf|^2`` on
the body. Each case's body surface is written as ``<out>/case-NNN.vtp``: its triangles, the point
field ``p`` (= Cp, the pressure over ``0.5 rho |u_inf|^2``) and the case's parameters as constant
point fields; ``<out>/params.csv`` lists them per case (column ``sample``: the file name).

Before the cases, the same solver runs on a sphere of radius 0.5 and prints its error against the
analytic surface pressure ``Cp = 1 - 9/4 sin^2(theta)`` (theta from the stream's axis).

    python examples/point_cloud/simulate.py --cases 40 --size 0.06 --out cases

gmsh (GPL) and scikit-fem are needed by this script only: ``pip install gmsh scikit-fem``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

# one BLAS thread: the conjugate-gradient loops run on small vectors, where BLAS threads only contend
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HALF_BOX = 3.0  # the box [-L, L]^3 around a body of length 1 to 3
U_INF = np.array([1.0, 0.0, 0.0])


def mesh_body(aspect: float, thickness: float, angle: float, size: float) -> tuple[np.ndarray, np.ndarray]:
    """Tetrahedra of the box minus the pitched ellipsoid (gmsh, OpenCASCADE): points (N, 3), tets (M, 4)."""
    import gmsh

    gmsh.initialize(["-nt", "1"], readConfigFiles=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        occ = gmsh.model.occ
        box = occ.addBox(-HALF_BOX, -HALF_BOX, -HALF_BOX, 2 * HALF_BOX, 2 * HALF_BOX, 2 * HALF_BOX)
        body = occ.addSphere(0, 0, 0, 0.5)
        occ.dilate([(3, body)], 0, 0, 0, aspect, 1.0, thickness)
        occ.rotate([(3, body)], 0, 0, 0, 0, 1, 0, -np.radians(angle))  # angle > 0: the upstream end (-x) goes down
        occ.cut([(3, box)], [(3, body)])
        occ.synchronize()
        walls = [tag for dim, tag in gmsh.model.getEntities(2)
                 if max(abs(v) for v in gmsh.model.getBoundingBox(dim, tag)) < HALF_BOX - 1e-6]
        field = gmsh.model.mesh.field
        dist = field.add("Distance")
        field.setNumbers(dist, "SurfacesList", walls)
        grade = field.add("Threshold")
        field.setNumber(grade, "InField", dist)
        field.setNumber(grade, "SizeMin", size)
        field.setNumber(grade, "SizeMax", max(size * 12, 0.5))
        field.setNumber(grade, "DistMin", 0.05)
        field.setNumber(grade, "DistMax", HALF_BOX - 0.5)
        field.setAsBackgroundMesh(grade)
        for option in ("MeshSizeFromPoints", "MeshSizeFromCurvature", "MeshSizeExtendFromBoundary"):
            gmsh.option.setNumber(f"Mesh.{option}", 0)
        gmsh.model.mesh.generate(3)
        _, elem_nodes = gmsh.model.mesh.getElementsByType(4)  # 4-node tetrahedra
        if len(elem_nodes) == 0:  # Delaunay can fail on a coarse surface mesh: the frontal mesher then
            gmsh.model.mesh.clear()
            gmsh.option.setNumber("Mesh.Algorithm3D", 4)
            gmsh.model.mesh.generate(3)
            _, elem_nodes = gmsh.model.mesh.getElementsByType(4)
        tags, coords, _ = gmsh.model.mesh.getNodes()
    finally:
        gmsh.finalize()
    if len(elem_nodes) == 0:
        raise SystemExit(f"simulate.py: gmsh made no tetrahedra around the body (aspect {aspect}, thickness "
                         f"{thickness}, angle {angle}) at --size {size}; try a smaller --size")
    points = coords.reshape(-1, 3)
    lookup = np.zeros(int(tags.max()) + 1, np.int64)
    lookup[tags.astype(np.int64)] = np.arange(len(tags))
    tets = lookup[elem_nodes.astype(np.int64)].reshape(-1, 4)
    used = np.unique(tets)
    remap = np.full(len(points), -1, np.int64)
    remap[used] = np.arange(len(used))
    return points[used], remap[tets]


def solve_surface_cp(points: np.ndarray, tets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Potential flow on the mesh: the body's surface points, triangles and Cp at those points."""
    from skfem import Basis, BilinearForm, ElementTetP2, LinearForm, MeshTet, condense
    from skfem.helpers import dot, grad

    mesh = MeshTet(np.ascontiguousarray(points.T), np.ascontiguousarray(tets.T))
    basis = Basis(mesh, ElementTetP2())

    @BilinearForm
    def laplace(u, v, _):  # noqa: ANN001, ANN202 - scikit-fem form signature
        return dot(grad(u), grad(v))

    @BilinearForm
    def mass(u, v, _):  # noqa: ANN001, ANN202
        return u * v

    @LinearForm
    def gradient_component(v, w):  # noqa: ANN001, ANN202
        return w.g * v

    far = basis.get_dofs(lambda x: np.max(np.abs(x), axis=0) > HALF_BOX - 1e-9)
    phi = np.zeros(basis.N)
    phi[far] = basis.doflocs[0, far] * U_INF[0]  # phi = u_inf . x with u_inf along x
    a = laplace.assemble(basis)
    a_inner, b_inner, _, inner = condense(a, np.zeros(basis.N), x=phi, D=far)
    phi[inner] = _cg(a_inner, b_inner)
    # velocity at the nodes: L2 projection of grad(phi) onto the P2 space
    m = mass.assemble(basis)
    dphi = basis.interpolate(phi).grad
    velocity = np.stack([_cg(m, gradient_component.assemble(basis, g=dphi[d])) for d in range(3)], 1)
    # the body's surface: boundary facets away from the box
    facets = mesh.boundary_facets()
    corners = mesh.facets[:, facets]
    on_body = np.max(np.abs(points[corners.ravel()]), axis=1).reshape(3, -1).max(0) < HALF_BOX - 1e-6
    tri = corners[:, on_body].T
    if len(tri) == 0:
        raise SystemExit("simulate.py: the mesh has no boundary at the body (gmsh meshed its inside too); try a "
                         "smaller --size")
    surface = np.unique(tri)
    vertex_dofs = basis.nodal_dofs[0]  # the P2 dof holding the value at each mesh vertex
    speed2 = (velocity[vertex_dofs[surface]] ** 2).sum(1)
    remap = np.full(len(points), -1, np.int64)
    remap[surface] = np.arange(len(surface))
    tri = remap[tri]
    # outward from the body (into the fluid): flip triangles whose normal points to the body's centre
    p = points[surface]
    normal = np.cross(p[tri[:, 1]] - p[tri[:, 0]], p[tri[:, 2]] - p[tri[:, 0]])
    inward = (normal * p[tri].mean(1)).sum(1) < 0
    tri[inward] = tri[inward][:, [0, 2, 1]]
    return p, tri, 1.0 - speed2 / float(U_INF @ U_INF)


def _cg(a, b: np.ndarray) -> np.ndarray:  # noqa: ANN001 - a scipy sparse matrix
    """``a x = b`` for a symmetric positive definite ``a``: conjugate gradients, Jacobi preconditioner."""
    from scipy.sparse.linalg import LinearOperator, cg

    inverse_diagonal = 1.0 / a.diagonal()
    jacobi = LinearOperator(a.shape, matvec=lambda v: inverse_diagonal * v)
    x, info = cg(a, b, rtol=1e-10, atol=0.0, maxiter=20 * len(b), M=jacobi)
    if info:
        raise RuntimeError(f"conjugate gradients did not converge ({info} iterations)")
    return x


def sphere_check(size: float) -> float:
    """Relative L2 error of Cp on a sphere of radius 0.5 against 1 - 9/4 sin^2(theta)."""
    points, tri, cp = solve_surface_cp(*mesh_body(1.0, 1.0, 0.0, size))
    cos = points[:, 0] / np.linalg.norm(points, axis=1)
    exact = 1.0 - 2.25 * (1.0 - cos**2)
    return float(np.linalg.norm(cp - exact) / np.linalg.norm(exact))


def write_vtp(path: Path, points: np.ndarray, triangles: np.ndarray, fields: dict[str, np.ndarray]) -> None:
    """A VTK PolyData file (XML, ASCII) of the triangles with point fields (meshio writes no ``.vtp``)."""

    def numbers(a: np.ndarray, fmt: str) -> str:
        return " ".join(fmt % v for v in np.asarray(a).ravel())

    arrays = "".join(f'<DataArray type="Float64" Name="{key}" format="ascii">{numbers(value, "%.10g")}</DataArray>'
                     for key, value in fields.items())
    path.write_text(
        '<?xml version="1.0"?>\n<VTKFile type="PolyData" version="1.0" byte_order="LittleEndian">\n<PolyData>\n'
        f'<Piece NumberOfPoints="{len(points)}" NumberOfPolys="{len(triangles)}">\n'
        f'<PointData>{arrays}</PointData>\n'
        f'<Points><DataArray type="Float64" NumberOfComponents="3" format="ascii">{numbers(points, "%.10g")}'
        '</DataArray></Points>\n'
        f'<Polys><DataArray type="Int64" Name="connectivity" format="ascii">{numbers(triangles, "%d")}</DataArray>'
        f'<DataArray type="Int64" Name="offsets" format="ascii">{numbers(np.arange(1, len(triangles) + 1) * 3, "%d")}'
        '</DataArray></Polys>\n</Piece>\n</PolyData>\n</VTKFile>\n')


def case_parameters(count: int, seed: int) -> list[dict[str, float]]:
    """``count`` bodies: aspect ratio in [1, 3], thickness ratio in [0.6, 1], angle in [-20, 20] degrees."""
    rng = np.random.default_rng(seed)
    return [{"aspect": round(float(rng.uniform(1.0, 3.0)), 4), "thickness": round(float(rng.uniform(0.6, 1.0)), 4),
             "angle": round(float(rng.uniform(-20.0, 20.0)), 3)} for _ in range(count)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the case-NNN.vtp files and params.csv")
    p.add_argument("--cases", type=int, default=40, help="number of bodies (default 40)")
    p.add_argument("--size", type=float, default=0.06, help="mesh size at the body (default 0.06)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bodies' parameters (default 0)")
    args = p.parse_args()
    if args.cases < 1:
        p.error(f"--cases: expected a positive number of bodies, got {args.cases}")
    if not 0.005 <= args.size <= 0.5:
        p.error(f"--size: expected a mesh size at the body between 0.005 and 0.5, got {args.size}")
    start = time.perf_counter()
    error = sphere_check(args.size)
    print(f"sphere check: Cp relative L2 error {error:.2%} against 1 - 9/4 sin^2(theta) (size {args.size})")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, params in enumerate(case_parameters(args.cases, args.seed)):
        points, tri, cp = solve_surface_cp(*mesh_body(params["aspect"], params["thickness"], params["angle"], args.size))
        name = f"case-{i:03d}"
        fields = {"p": cp} | {key: np.full(len(points), value) for key, value in params.items()}
        write_vtp(args.out / f"{name}.vtp", points, tri, fields)
        rows.append({"sample": name} | params)
        print(f"  [{i + 1}/{args.cases}] {name}: {len(points):,} surface points, aspect {params['aspect']:.2f}, "
              f"thickness {params['thickness']:.2f}, angle {params['angle']:+.1f} deg, Cp {cp.min():.2f} to {cp.max():.2f}",
              flush=True)
    with open(args.out / "params.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.cases} cases to {args.out} (point fields p, aspect, thickness, angle; params.csv) "
          f"in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
