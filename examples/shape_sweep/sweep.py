"""Step 1 of the shape-sweep example: a family of aerofoil-like bodies, each its own mesh, solved by OpenFOAM.

Each case is one body of the family of ``shapes.py`` (thickness, camber, nose bluntness) at one
angle of attack, in a steady laminar flow at a Reynolds number of 1000 (chord 1, ``--speed``,
``nu = speed / --reynolds``): slow enough to be steady for every shape and angle of the sweep,
so ``simpleFoam`` converges (its residuals below ``--residual``, 1e-4) in a few hundred iterations.

- The case is OpenFOAM's ``airFoil2D`` tutorial (``simpleFoam``, free-stream boundaries) with its
  mesh replaced and its flow made laminar: per case, ``shapes.block_mesh_dict`` writes a C-grid
  around the body turned to the angle of attack (so the free stream is ``(speed, 0, 0)`` in every
  case: drag along x, lift along y), ``blockMesh`` makes it, ``simpleFoam`` runs until its
  residuals are below ``--residual`` (the tutorial's residualControl; at most ``--iterations``), then ``foamToVTK
  -latestTime``, ``--jobs`` cases at a time;
- each case keeps foamToVTK's layout, ``OUT/cases/<case>/VTK/<case>_<iteration>.vtm``: the internal
  mesh (point data ``p``, ``U``) and the patches ``body``, ``inlet``, ``outlet``, which ``meshshard
  dataset`` reads as they are (the body's patch is what ``--boundary body`` and ``--wall-distance
  body`` name); how far the fields still moved between the last two written iterations is
  recorded (``settle``).

It writes ``OUT/params.csv`` (``sample,thickness,camber,nose,aoa,speed``: the shape parameters and
the operating point, what ``meshshard dataset --params`` reads), ``OUT/sweep.json`` (the shapes,
the held-out shapes and their cases, each case's iterations, convergence and time) and
``OUT/shapes.png`` (the outlines, held-out ones in red). Held out are whole shapes, every angle of
each, chosen inside the family (``shapes.design``: inside the convex hull of the shapes trained on).

    python examples/shape_sweep/sweep.py --out shape-sweep --shapes 16 --aoa 0,3,6

Case names keep the parameters readable and survive as file names: ``t0.140_m0.020_n0.86_a03.0``.
OpenFOAM's environment is taken from the shell if it is set, else from sourcing
``--openfoam-bashrc`` (Debian's ``openfoam`` package: ``/usr/share/openfoam/etc/bashrc``); the
helpers that find it, run its commands and loop over the cases are ``examples/foam_sweeps.py``'s,
shared with ``cfd_sweep``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import foam_sweeps as foam  # noqa: E402  (examples/foam_sweeps.py: OpenFOAM's environment, commands, job loop)
import shapes  # noqa: E402  (beside this script)

TUTORIAL = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/airFoil2D")
BASHRC = foam.BASHRC


def case_name(shape: shapes.Shape, aoa: float) -> str:
    return f"{shape.name}_a{aoa:04.1f}"


def prepare_base(tutorial: Path, base: Path, speed: float, nu: float, iterations: int, residual: float) -> None:
    """The tutorial copied, its mesh taken out, its wall named ``body``, its flow laminar at ``speed``, ``nu``."""
    shutil.copytree(tutorial, base)
    for path in base.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)  # the packaged tutorial is read-only
    shutil.rmtree(base / "constant" / "polyMesh")
    for name in ("nut", "nuTilda"):  # laminar: no turbulence fields
        (base / "0" / name).unlink()
    for name in ("U", "p"):
        foam.substitute(base / "0" / name, r"^(\s*)walls\b", r"\1body")
    foam.substitute(base / "0" / "U", r"^internalField\s+uniform\s*\([^)]*\);", f"internalField   uniform ({speed:g} 0 0);")
    foam.substitute(base / "constant" / "turbulenceProperties", r"^simulationType\s+\w+;", "simulationType  laminar;")
    foam.substitute(base / "constant" / "transportProperties", r"^nu\s+.*;", f"nu              {nu:.6g};")
    control = base / "system" / "controlDict"
    foam.substitute(control, r"^endTime\s+.*;", f"endTime         {iterations};")
    foam.substitute(control, r"^writeInterval\s+.*;", f"writeInterval   {max(1, iterations // 10)};")
    foam.substitute(control, r"^purgeWrite\s+.*;", "purgeWrite      2;")
    # the tutorial's residualControl, at ``residual``: simpleFoam stops, and writes, when converged
    solution = base / "system" / "fvSolution"
    text = solution.read_text()
    block = re.search(r"residualControl\s*\{[^}]*\}", text)
    if block is None:
        sys.exit(f"sweep.py: {solution}: found no residualControl to set (another tutorial version?)")
    limits = re.sub(r"^(\s*(p|U)\s+)[0-9.eE+-]+;", rf"\g<1>{residual:g};", block.group(0), flags=re.M)
    solution.write_text(text[:block.start()] + limits + text[block.end():])


def last_residual(log: Path, field: str) -> float:
    """The initial residual of ``field``'s last solve in a simpleFoam log."""
    found = re.findall(rf"Solving for {field}, Initial residual = ([0-9.eE+-]+)", log.read_text())
    return float(found[-1]) if found else float("nan")


def solve_case(base: Path, case: Path, shape: shapes.Shape, aoa: float, sizes: shapes.MeshSizes, cap: int, tolerance: float,
               env: dict[str, str]) -> dict:
    """One case: its mesh, simpleFoam, foamToVTK (``case/VTK``, as it writes it)."""
    started = time.perf_counter()
    shutil.copytree(base, case, ignore=shutil.ignore_patterns("log.*"))
    text, cells = shapes.block_mesh_dict(shape, aoa, sizes)
    (case / "system" / "blockMeshDict").write_text(text)
    foam.run(["blockMesh"], case, env, "blockMesh")
    foam.run(["simpleFoam"], case, env, "simpleFoam")
    times = foam.written_times(case)
    foam.run(["foamToVTK", "-latestTime"], case, env, "foamToVTK")
    [internal] = (case / "VTK").glob(f"{case.name}_{times[-1]}/internal.vtu")
    settle = foam.settle(case, times, internal, env)
    residual = {f: last_residual(case / "log.simpleFoam", f) for f in ("p", "Ux", "Uy")}
    return {"sample": case.name, "thickness": shape.thickness, "camber": shape.camber, "nose": shape.nose,
            "aoa": aoa, "cells": cells, "iterations": times[-1], "residual": residual,
            "converged": all(r < tolerance for r in residual.values()) or times[-1] < cap,  # simpleFoam stopped early
            "settle": settle, "settle_over": times[-1] - times[-2] if settle else None,
            "seconds": round(time.perf_counter() - started, 1),
            "foamToVTK": str(internal.relative_to(case.parent.parent))}


def outline_figure(path: Path, family: list[shapes.Shape], held: list[shapes.Shape]) -> None:
    """The outlines of the family, held-out shapes in red (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 3))
    for s in family:
        o = s.outline()
        o = np.concatenate([o, o[:1]])
        ax.plot(o[:, 0], o[:, 1], color="tab:red" if s in held else "0.4", lw=1.2 if s in held else 0.6)
    ax.set_aspect("equal")
    ax.set_title(f"{len(family)} shapes, {len(held)} held out (red)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_angles(text: str) -> list[float]:
    try:
        return [float(a) for a in text.split(",") if a.strip()]
    except ValueError:
        sys.exit(f"sweep.py: --aoa {text!r}: expected comma-separated angles in degrees, e.g. 0,3,6")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="sweep folder: cases/, params.csv, sweep.json, shapes.png")
    p.add_argument("--shapes", type=int, default=16,
                   help="bodies of the family (default 16: the 8 corners of the parameter box and 8 inside, "
                        "4 of them held out); fewer than 12: a reduced sweep, one shape held out")
    p.add_argument("--held-out", type=int, default=None, help="held-out shapes (default (shapes - 8) // 2)")
    p.add_argument("--aoa", default="0,3,6", help="angles of attack, degrees, comma-separated (default 0,3,6)")
    p.add_argument("--speed", type=float, default=1.0, help="free-stream speed (default 1)")
    p.add_argument("--reynolds", type=float, default=1000.0,
                   help="Reynolds number on the chord, speed / nu (default 1000: steady for every shape)")
    p.add_argument("--mesh-scale", type=float, default=1.25,
                   help="every cell size times this (default 1.25: about 4,700 cells; 1: about 7,300; 3: a coarse "
                        "test mesh)")
    p.add_argument("--iterations", type=int, default=1000,
                   help="simpleFoam iterations at most per case (it stops at --residual)")
    p.add_argument("--residual", type=float, default=1e-4,
                   help="simpleFoam stops when the initial residuals of p and U are below this (default 1e-4; how far "
                        "the fields still moved is each case's 'settle' in sweep.json)")
    p.add_argument("--jobs", type=int, default=2, help="cases solved at a time (default 2)")
    p.add_argument("--tutorial", type=Path, default=TUTORIAL, help=f"the airFoil2D tutorial (default {TUTORIAL})")
    p.add_argument("--openfoam-bashrc", type=Path, default=BASHRC,
                   help=f"sourced when OpenFOAM's environment is not set (default {BASHRC})")
    p.add_argument("--force", action="store_true", help="replace OUT if it is a sweep folder")
    args = p.parse_args(argv)

    out: Path = args.out
    foam.fresh_folder(out, args.force)
    if not args.tutorial.is_dir():
        sys.exit(f"sweep.py: OpenFOAM's airFoil2D tutorial is not at {args.tutorial} (Debian: apt-get install "
                 "openfoam-examples), or pass --tutorial")
    angles = parse_angles(args.aoa)
    env = foam.openfoam_env(args.openfoam_bashrc)
    family, held = shapes.design(args.shapes, held=args.held_out)
    sizes = shapes.MeshSizes(scale=args.mesh_scale)
    nu = args.speed / args.reynolds

    started = time.perf_counter()
    (out / "cases").mkdir(parents=True)
    base = out / "cases" / "_base"
    prepare_base(args.tutorial, base, args.speed, nu, args.iterations, args.residual)
    outline_figure(out / "shapes.png", family, held)
    jobs = [(s, a) for s in family for a in angles]
    print(f"sweep: {len(family)} shapes x {len(angles)} angles = {len(jobs)} cases, laminar at Re {args.reynolds:g}, "
          f"up to {args.iterations} iterations each, {args.jobs} at a time", flush=True)

    def one(job: tuple[shapes.Shape, float]) -> dict:
        shape, aoa = job
        record = solve_case(base, out / "cases" / case_name(shape, aoa), shape, aoa, sizes, args.iterations,
                            args.residual, env)
        moved = record["settle"]
        print(f"  {record['sample']}: {record['cells']} cells, {record['iterations']} iterations, "
              f"{record['seconds']} s" + ("" if record["converged"] else ", NOT converged") + (
                  f"; over the last {record['settle_over']}, p moved {moved['p']:.2%}, U {moved['U']:.2%}"
                  if moved else ""), flush=True)
        return record

    records = foam.solve_all(jobs, one, args.jobs)
    with open(out / "params.csv", "w", newline="") as f:
        table = csv.writer(f)
        table.writerow(["sample", "thickness", "camber", "nose", "aoa", "speed"])
        for r in records:
            table.writerow([r["sample"], f"{r['thickness']:g}", f"{r['camber']:g}", f"{r['nose']:g}", f"{r['aoa']:g}",
                            f"{args.speed:g}"])
    seconds = round(time.perf_counter() - started, 1)
    held_cases = sorted(case_name(s, a) for s in held for a in angles)
    summary = {"tutorial": str(args.tutorial), "reynolds": args.reynolds, "speed": args.speed, "nu": nu,
               "aoa": angles, "ranges": shapes.RANGES, "mesh_scale": args.mesh_scale, "iterations": args.iterations,
               "residual": args.residual,
               "shapes": [s.name for s in family], "held_out_shapes": [s.name for s in held],
               "held_out": held_cases, "seconds": seconds, "cases": records}
    (out / "sweep.json").write_text(json.dumps(summary, indent=1) + "\n")
    bad = [r["sample"] for r in records if not r["converged"]]
    print(f"wrote {out}/: cases/ ({len(records)} cases, foamToVTK's VTK/ in each), params.csv, sweep.json, shapes.png; "
          f"held out {len(held)} shapes ({len(held_cases)} cases): {', '.join(s.name for s in held)}; "
          + (f"not converged: {', '.join(bad)}; " if bad else "all converged; ") + f"{seconds} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
