"""Step 2 of the bring-your-own-mesh example: fields from a real FEM solver, written as ``.vtu``.

On the mesh of step 1, scikit-fem solves steady heat conduction with heat loss to the coolant in
the block (a screened Poisson problem, P1 tetrahedra)::

    -div(k grad T) + h T = f      in the block,
                       T = 0      on the cooling channels' walls,
           k dT/dn = 0            on the outer faces (insulated),

for ``--samples`` cases that vary the conductivity ``k`` (a smooth random field, 0.5 to 2) and the
heat source ``f`` (two to four Gaussian hot spots of random place, width and power). Each case is
written as one ``.vtu`` file carrying ``point_data`` fields ``k``, ``f``, ``wall`` (1 on the
channel walls) and ``T``: the kind of output a user's own solver writes, and what
``meshshard dataset`` reads.

    python examples/bring_your_own_mesh/solve.py byo/mesh.msh --samples 24 --out byo/fields

``--inputs-only`` writes new cases without solving them (``k``, ``f``, ``wall``; no ``T``): the
designs a trained model is asked about, which ``meshshard predict`` fills in.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import meshio
import numpy as np
from make_mesh import CHANNELS  # the same folder

H_LOSS = 20.0  # heat-loss coefficient h: the influence of a source decays over about sqrt(k / h) = 0.2


def read_tets(path: Path) -> tuple[np.ndarray, np.ndarray]:
    mesh = meshio.read(path)
    tets = np.concatenate([block.data for block in mesh.cells if block.type == "tetra"])
    used = np.unique(tets)
    remap = np.full(len(mesh.points), -1, np.int64)
    remap[used] = np.arange(len(used))
    return np.asarray(mesh.points[used], np.float64), remap[tets]


def random_case(points: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Conductivity ``k`` and source ``f`` at the nodes, smooth random fields."""
    log_k = np.zeros(len(points))
    for _ in range(4):
        wave = rng.normal(size=3) * 2.5
        log_k += rng.normal() * np.cos(points @ wave + rng.uniform(0, 2 * np.pi))
    k = np.exp(np.log(2.0) * np.tanh(log_k / 2))  # within (0.5, 2)
    f = np.zeros(len(points))
    lo, hi = points.min(0), points.max(0)
    for _ in range(rng.integers(2, 5)):
        centre = rng.uniform(lo, hi)
        width = rng.uniform(0.08, 0.2)
        f += rng.uniform(50, 150) * np.exp(-((points - centre) ** 2).sum(1) / (2 * width**2))
    return k, f


def wall_flags(points: np.ndarray) -> np.ndarray:
    """1 at the nodes on the cooling channels' walls (where ``T = 0``), else 0."""
    gap = np.min([np.hypot(points[:, 0] - cx, points[:, 1] - cy) - r for cx, cy, r in CHANNELS], axis=0)
    return (gap < 1e-3).astype(np.float64)


def solve(points: np.ndarray, tets: np.ndarray, k: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Temperature ``T`` at the nodes (P1 finite elements, scikit-fem), and the wall flag (1 on
    the channel walls, where ``T = 0``)."""
    from skfem import Basis, BilinearForm, ElementTetP1, LinearForm, MeshTet, condense
    from skfem import solve as fem_solve
    from skfem.helpers import dot, grad

    mesh = MeshTet(points.T.copy(), tets.T.copy())
    basis = Basis(mesh, ElementTetP1())

    @BilinearForm
    def operator(u, v, w):  # noqa: ANN001, ANN202 - scikit-fem form signature
        return w.k * dot(grad(u), grad(v)) + H_LOSS * u * v

    @LinearForm
    def load(v, w):  # noqa: ANN001, ANN202
        return w.f * v

    a = operator.assemble(basis, k=basis.interpolate(k))
    b = load.assemble(basis, f=basis.interpolate(f))
    walls = basis.get_dofs(lambda p: np.min([np.hypot(p[0] - cx, p[1] - cy) - r for cx, cy, r in CHANNELS], axis=0) < 1e-3)
    wall = np.zeros(len(points))
    wall[walls] = 1.0
    return fem_solve(*condense(a, b, D=walls)), wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mesh", type=Path, help="mesh file from step 1 (.msh)")
    p.add_argument("--out", type=Path, required=True, help="folder for the .vtu files")
    p.add_argument("--samples", type=int, default=16, help="number of cases (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inputs-only", action="store_true", help="write k, f and wall of new cases, without solving for T")
    args = p.parse_args()
    points, tets = read_tets(args.mesh)
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for i in range(args.samples):
        k, f = random_case(points, rng)
        if args.inputs_only:
            fields = {"k": k, "f": f, "wall": wall_flags(points)}
        else:
            t, wall = solve(points, tets, k, f)
            fields = {"k": k, "f": f, "wall": wall, "T": t}
        meshio.write(args.out / f"case-{i:03d}.vtu", meshio.Mesh(points, [("tetra", tets)], point_data=fields))
    print(f"wrote {args.samples} cases of {len(points):,} nodes to {args.out} (point fields {', '.join(fields)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
