"""Step 1 of the bring-your-own-mesh example: a 3-D tetrahedral mesh made with gmsh.

A heat-sink block ``[0, 2] x [0, 1] x [0, 0.5]`` with two cylindrical cooling channels along z,
meshed with tetrahedra of size about ``--size`` and written as a gmsh ``.msh`` file: the kind of
file a user brings. Any mesh that meshio reads would do; gmsh (GPL, installed from PyPI by the
``examples`` extra) is used only here, never by meshshard.

    python examples/bring_your_own_mesh/make_mesh.py --out byo/mesh.msh --size 0.08
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHANNELS = ((0.6, 0.5, 0.15), (1.4, 0.5, 0.15))  # (x, y, radius) of each channel


def make_mesh(out: Path, size: float) -> None:
    import gmsh

    gmsh.initialize(["-noenv"])
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("heat_sink")
        occ = gmsh.model.occ
        block = occ.addBox(0, 0, 0, 2, 1, 0.5)
        holes = [(3, occ.addCylinder(x, y, -0.1, 0, 0, 0.7, r)) for x, y, r in CHANNELS]
        occ.cut([(3, block)], holes)
        occ.synchronize()
        gmsh.model.addPhysicalGroup(3, [tag for _, tag in gmsh.model.getEntities(3)], name="solid")
        gmsh.option.setNumber("Mesh.MeshSizeMax", size)
        gmsh.option.setNumber("Mesh.MeshSizeMin", size / 2)
        gmsh.model.mesh.generate(3)
        out.parent.mkdir(parents=True, exist_ok=True)
        gmsh.write(str(out))
    finally:
        gmsh.finalize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="mesh file to write (.msh)")
    p.add_argument("--size", type=float, default=0.08, help="element size (default 0.08: about 2,500 nodes)")
    args = p.parse_args()
    make_mesh(args.out, args.size)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
