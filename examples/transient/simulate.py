"""The transient example's solver: a pollutant puff carried past a cylinder in a channel.

A 2-D channel ``[0, 3] x [0, 1]`` with a round obstacle, meshed with triangles by gmsh (GPL,
installed by the ``examples`` extra; only this script imports it). On it, scikit-fem solves the
advection-diffusion of a concentration ``c``::

    dc/dt + b . grad c = D lap c,      c = 0 on the inflow (x = 0),
                                       no diffusive flux on the walls, the obstacle and the outflow,

with P1 elements and implicit Euler. The velocity ``b`` is the potential flow of a uniform stream
of speed ``U`` around the cylinder (divergence-free, tangent to the obstacle). Each trajectory
varies the speed ``U`` and where the puff starts (a Gaussian blob of concentration 1), so a
held-out trajectory is a run nobody trained on.

Each trajectory is written the way solvers (OpenFOAM's ``foamToVTK`` among them) write a run,
a folder of numbered files ``traj-000/c_0000.vtu``, ``c_0001.vtu``, ... with a ParaView
``.series`` file giving their times.
Every file holds the point fields

- ``c``: the state, the concentration;
- ``vx``, ``vy``: the velocity, static;
- ``node_type``: 0 interior, 1 inflow (prescribed: ``c = 0``), 2 channel walls and obstacle,
  3 outflow.

    python examples/transient/simulate.py --out tr/runs --size 0.06 --trajectories 16 --steps 40
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

LENGTH, HEIGHT = 3.0, 1.0
OBSTACLE = (0.9, 0.5, 0.15)  # (x, y, radius)
DIFFUSIVITY = 0.004
DT = 0.04


def make_mesh(size: float) -> tuple[np.ndarray, np.ndarray]:
    """The channel with its obstacle, triangles of size about ``size``: points ``(N, 2)``, triangles ``(C, 3)``."""
    import gmsh

    gmsh.initialize(["-noenv"])
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("channel")
        occ = gmsh.model.occ
        box = occ.addRectangle(0, 0, 0, LENGTH, HEIGHT)
        hole = occ.addDisk(OBSTACLE[0], OBSTACLE[1], 0, OBSTACLE[2], OBSTACLE[2])
        occ.cut([(2, box)], [(2, hole)])
        occ.synchronize()
        gmsh.model.addPhysicalGroup(2, [tag for _, tag in gmsh.model.getEntities(2)], name="fluid")
        gmsh.option.setNumber("Mesh.MeshSizeMax", size)
        gmsh.option.setNumber("Mesh.MeshSizeMin", size / 2)
        gmsh.model.mesh.generate(2)
        tags, coords, _ = gmsh.model.mesh.getNodes()
        types, _, nodes = gmsh.model.mesh.getElements(2)
        [tri] = [n for t, n in zip(types, nodes, strict=True) if t == 2]  # 3-node triangles
    finally:
        gmsh.finalize()
    order = np.argsort(tags)
    index = np.empty(int(tags.max()) + 1, np.int64)
    index[tags[order]] = np.arange(len(tags))
    points = coords.reshape(-1, 3)[order, :2]
    triangles = index[np.asarray(tri, np.int64)].reshape(-1, 3)
    used = np.unique(triangles)
    remap = np.full(len(points), -1, np.int64)
    remap[used] = np.arange(len(used))
    return points[used], remap[triangles]


def velocity(x: np.ndarray, y: np.ndarray, speed: float) -> tuple[np.ndarray, np.ndarray]:
    """Potential flow of a uniform stream ``speed`` past the cylinder (works on arrays of any shape)."""
    cx, cy, r = OBSTACLE
    dx, dy = x - cx, y - cy
    rho2 = np.maximum(dx**2 + dy**2, r**2)
    a = r**2 / rho2**2
    return speed * (1 - a * (dx**2 - dy**2)), -speed * 2 * a * dx * dy


def node_types(points: np.ndarray, size: float) -> np.ndarray:
    """0 interior, 1 inflow, 2 walls and obstacle, 3 outflow (corners go to the inflow / outflow)."""
    x, y = points[:, 0], points[:, 1]
    tol = 1e-6
    out = np.zeros(len(points), np.int64)
    on_obstacle = np.abs(np.hypot(x - OBSTACLE[0], y - OBSTACLE[1]) - OBSTACLE[2]) < 1e-3 * size + 1e-6
    out[(y < tol) | (y > HEIGHT - tol) | on_obstacle] = 2
    out[x > LENGTH - tol] = 3
    out[x < tol] = 1
    return out


def simulate(points: np.ndarray, triangles: np.ndarray, speed: float, centre: tuple[float, float], steps: int,
             width: float = 0.12) -> np.ndarray:
    """``(steps + 1, N)`` concentrations: the puff at ``centre`` and ``steps`` implicit-Euler steps of ``DT``."""
    import scipy.sparse.linalg as spla
    import skfem
    from skfem.helpers import dot, grad

    mesh = skfem.MeshTri(points.T.copy(), triangles.T.copy())
    basis = skfem.Basis(mesh, skfem.ElementTriP1())

    @skfem.BilinearForm
    def mass(u, v, _):
        return u * v

    @skfem.BilinearForm
    def transport(u, v, w):
        bx, by = velocity(w.x[0], w.x[1], speed)
        return DIFFUSIVITY * dot(grad(u), grad(v)) + (bx * grad(u)[0] + by * grad(u)[1]) * v

    m = mass.assemble(basis)
    system = (m + DT * transport.assemble(basis)).tolil()
    inflow = np.flatnonzero(points[:, 0] < 1e-6)
    system[inflow] = 0  # c = 0 on the inflow: identity rows
    system[inflow, inflow] = 1.0
    solve = spla.factorized(system.tocsc())
    c = np.exp(-((points[:, 0] - centre[0]) ** 2 + (points[:, 1] - centre[1]) ** 2) / (2 * width**2))
    c[inflow] = 0.0
    out = [c]
    for _ in range(steps):
        rhs = m @ c
        rhs[inflow] = 0.0
        c = solve(rhs)
        out.append(c)
    return np.stack(out)


def write_trajectory(folder: Path, points: np.ndarray, triangles: np.ndarray, states: np.ndarray,
                     fields: dict[str, np.ndarray]) -> None:
    """One numbered ``.vtu`` per step (``c_0000.vtu``, ...) and a ``.series`` file with their times."""
    import meshio

    folder.mkdir(parents=True, exist_ok=True)
    xyz = np.column_stack([points, np.zeros(len(points))])
    files = []
    for step, c in enumerate(states):
        name = f"c_{step:04d}.vtu"
        meshio.write(folder / name, meshio.Mesh(xyz, [("triangle", triangles)], point_data={"c": c, **fields}))
        files.append({"name": name, "time": round(step * DT, 10)})
    (folder / "c.vtu.series").write_text(json.dumps({"file-series-version": "1.0", "files": files}, indent=1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the trajectories (one sub-folder each)")
    p.add_argument("--size", type=float, default=0.06, help="element size (default 0.06: about 1,100 nodes)")
    p.add_argument("--trajectories", type=int, default=16, help="runs to simulate (default 16)")
    p.add_argument("--steps", type=int, default=40, help=f"time steps per run, of {DT} each (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the runs' speeds and puff positions")
    args = p.parse_args()
    if args.size <= 0 or args.trajectories < 2 or args.steps < 2:
        p.error("--size must be > 0, --trajectories and --steps at least 2")
    points, triangles = make_mesh(args.size)
    kinds = node_types(points, args.size)
    rng = np.random.default_rng(args.seed)
    for k in range(args.trajectories):
        speed = float(rng.uniform(0.6, 1.2))
        centre = (float(rng.uniform(0.3, 0.5)), float(rng.uniform(0.25, 0.75)))
        states = simulate(points, triangles, speed, centre, args.steps)
        vx, vy = velocity(points[:, 0], points[:, 1], speed)
        write_trajectory(args.out / f"traj-{k:03d}", points, triangles, states,
                         {"vx": vx, "vy": vy, "node_type": kinds.astype(np.float64)})
        print(f"traj-{k:03d}: speed {speed:.2f}, puff at ({centre[0]:.2f}, {centre[1]:.2f}), "
              f"c in [{states.min():.3f}, {states.max():.3f}]")
    print(f"wrote {args.trajectories} trajectories of {args.steps + 1} steps, {len(points)} nodes, to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
