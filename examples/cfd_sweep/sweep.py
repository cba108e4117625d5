"""Step 1 of the CFD-sweep example: a real OpenFOAM parameter sweep, each case as foamToVTK writes it.

From OpenFOAM's ``pitzDaily`` tutorial (the backward-facing step, steady RANS with k-epsilon,
``simpleFoam``), a grid of cases that vary the inlet speed and the kinematic viscosity:

- ``blockMesh`` runs once; every case is a copy of that mesh (so all cases share one mesh, node
  for node, which ``meshshard dataset --same-mesh`` checks);
- per case, the inlet velocity is ``(speed, 0, 0)``, the inlet turbulence keeps the tutorial's
  intensity and length scale (``k`` ~ speed^2, ``epsilon`` ~ speed^3), and ``nu`` is set in
  ``constant/transportProperties``;
- ``simpleFoam`` runs ``--iterations`` iterations (its ``endTime``; the tutorial's residual control
  is taken out: it stops at a pressure residual of 1e-2, where the fields are still 2% from where
  they settle), then ``foamToVTK -latestTime``, ``--jobs`` cases at a time. How far each case still
  moved over its last ``--iterations / 10`` iterations is recorded (``settle``): pitzDaily's fields
  settle to 0.1-0.5% after about 500 iterations and then wander at that level;
- each case keeps foamToVTK's layout, ``OUT/cases/<case>/VTK/<case>_<iteration>.vtm``: the
  internal mesh (point data ``p``, ``U``, ``k``, ..., interpolated by foamToVTK from the cell
  values) and the boundary patches (``inlet``, ``outlet``, ``upperWall``, ``lowerWall``), which
  ``meshshard dataset`` reads as they are (the case folder is the sample, named after the case);
- with ``--wall-distance``, ``checkMesh -writeFields '(wallDistance)'`` writes the distance to the
  nearest wall once, and every case's files carry it as the point field ``wallDistance``.

It writes ``OUT/params.csv`` (``sample,speed,nu``: what ``meshshard dataset --params`` reads) and
``OUT/sweep.json`` (the grid, the held-out cases, each case's iterations, convergence and time).
Held out are interior cases of the grid, no two of them neighbours, so that each has training
cases on both sides in every parameter (the interpolation baselines of ``run.py`` need them).

    python examples/cfd_sweep/sweep.py --out cfd-sweep --cases 16 --iterations 1000

Case names keep the parameters readable and survive as file names: ``U07.5_nu1.00e-05``.
OpenFOAM's environment is taken from the shell if it is set (``WM_PROJECT_DIR``), else from
sourcing ``--openfoam-bashrc`` (Debian's ``openfoam`` package: ``/usr/share/openfoam/etc/bashrc``);
that and the job loop are ``examples/foam_sweeps.py``'s, shared with ``shape_sweep``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from foam_sweeps import BASHRC, fresh_folder, openfoam_env, run, settle, solve_all, substitute, written_times  # noqa: E402

TUTORIAL = Path("/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/pitzDaily")

#: The tutorial's inlet: 10 m/s, k = 0.375 m^2/s^2 (5% intensity), epsilon = 14.855 m^2/s^3.
REF_SPEED, REF_K, REF_EPSILON = 10.0, 0.375, 14.855


def case_name(speed: float, nu: float) -> str:
    """``U07.5_nu1.00e-05``: sortable, readable, and a safe file name (the sign of the exponent kept)."""
    return f"U{speed:04.1f}_nu{nu:.2e}"


def levels(lo: float, hi: float, n: int) -> list[float]:
    return [lo] if n == 1 else [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def grid_shape(cases: int, nu_levels: int | None) -> tuple[int, int]:
    """(speeds, viscosities): as square as ``cases`` allows, speed the longer side; 1-D below 6 cases."""
    if nu_levels is None:
        nu_levels = 1 if cases < 6 else max(d for d in range(1, math.isqrt(cases) + 1) if cases % d == 0)
    if nu_levels < 1 or cases % nu_levels:
        sys.exit(f"sweep.py: --cases {cases} is not a multiple of --nu-levels {nu_levels}")
    return cases // nu_levels, nu_levels


def held_out(n_speed: int, n_nu: int) -> list[tuple[int, int]]:
    """Interior grid points of one parity: never two neighbours, so each keeps training cases on
    both sides along every varied parameter."""
    interior = [(i, j) for i in range(n_speed) for j in range(n_nu)
                if 0 < i < n_speed - 1 and (n_nu == 1 or 0 < j < n_nu - 1)]
    return [(i, j) for i, j in interior if (i + j) % 2 == 1] if n_nu == 1 else \
        [(i, j) for i, j in interior if (i + j) % 2 == 0]


def prepare_base(tutorial: Path, base: Path, iterations: int, env: dict[str, str], wall_distance: bool) -> None:
    """The tutorial copied, its controls set, its mesh made once by blockMesh (and its wall distance
    by checkMesh)."""
    shutil.copytree(tutorial, base)
    for path in base.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)  # the packaged tutorial is read-only
    control = base / "system" / "controlDict"
    substitute(control, r"^endTime\s+.*;", f"endTime         {iterations};")
    # the last two of every tenth iteration are kept: the last for the data, the one before to see it settled
    substitute(control, r"^writeInterval\s+.*;", f"writeInterval   {max(1, iterations // 10)};")
    substitute(control, r"^purgeWrite\s+.*;", "purgeWrite      2;")
    substitute(base / "system" / "fvSolution", r"^\s*residualControl\s*\{[^}]*\}", "", count=1)
    text = control.read_text()
    control.write_text(re.sub(r"^\s*#includeFunc\s+streamlines\s*$", "", text, flags=re.M))  # no streamlines
    run(["blockMesh"], base, env, "blockMesh")
    if wall_distance:  # 0/wallDistance: each cell's distance to the nearest wall patch (0 on the walls)
        run(["checkMesh", "-writeFields", "(wallDistance)"], base, env, "checkMesh")


def solve_case(base: Path, case: Path, speed: float, nu: float, env: dict[str, str]) -> dict:
    """One case: the inlet and nu set, simpleFoam, foamToVTK (``case/VTK``, as it writes it)."""
    started = time.perf_counter()
    shutil.copytree(base, case, ignore=shutil.ignore_patterns("log.*"))
    scale = speed / REF_SPEED
    substitute(case / "0" / "U", r"uniform \(10 0 0\)", f"uniform ({speed:g} 0 0)")
    substitute(case / "0" / "k", r"uniform 0\.375\b", f"uniform {REF_K * scale ** 2:.6g}")
    substitute(case / "0" / "epsilon", r"uniform 14\.855\b", f"uniform {REF_EPSILON * scale ** 3:.6g}")
    substitute(case / "constant" / "transportProperties", r"^nu\s+.*;", f"nu              {nu:.6g};")
    run(["simpleFoam"], case, env, "simpleFoam")
    times = written_times(case)
    if (case / "0" / "wallDistance").is_file():  # the mesh's, so the same at every time: beside the results
        shutil.copyfile(case / "0" / "wallDistance", case / str(times[-1]) / "wallDistance")
    run(["foamToVTK", "-latestTime"], case, env, "foamToVTK")
    [internal] = (case / "VTK").glob(f"{case.name}_{times[-1]}/internal.vtu")
    moved = settle(case, times, internal, env)
    return {"sample": case.name, "speed": speed, "nu": nu, "iterations": times[-1],
            "settle": moved, "settle_over": times[-1] - times[-2] if moved else None,
            "seconds": round(time.perf_counter() - started, 1), "foamToVTK": str(internal.relative_to(case.parent.parent))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="sweep folder: cases/, params.csv, sweep.json")
    p.add_argument("--cases", type=int, default=16, help="number of cases (default 16: 4 speeds x 4 viscosities)")
    p.add_argument("--nu-levels", type=int, default=None,
                   help="viscosities in the grid (default: as square a grid as --cases allows; 1 below 6 cases)")
    p.add_argument("--speeds", type=float, nargs=2, default=(5.0, 15.0), metavar=("LO", "HI"),
                   help="inlet speed range, m/s (default 5 15)")
    p.add_argument("--nus", type=float, nargs=2, default=(1e-5, 4e-5), metavar=("LO", "HI"),
                   help="kinematic viscosity range, m^2/s (default 1e-5 4e-5)")
    p.add_argument("--iterations", type=int, default=1000,
                   help="simpleFoam iterations per case, its endTime (default 1000)")
    p.add_argument("--jobs", type=int, default=2, help="cases solved at a time (default 2)")
    p.add_argument("--tutorial", type=Path, default=TUTORIAL, help=f"the pitzDaily tutorial (default {TUTORIAL})")
    p.add_argument("--openfoam-bashrc", type=Path, default=BASHRC,
                   help=f"sourced when OpenFOAM's environment is not set (default {BASHRC})")
    p.add_argument("--wall-distance", action="store_true",
                   help="also write each node's distance to the nearest wall, wallDistance (checkMesh -writeFields)")
    p.add_argument("--force", action="store_true", help="replace OUT if it is a sweep folder")
    args = p.parse_args(argv)

    out: Path = args.out
    fresh_folder(out, args.force)
    env = openfoam_env(args.openfoam_bashrc)
    n_speed, n_nu = grid_shape(args.cases, args.nu_levels)
    speeds, nus = levels(*args.speeds, n_speed), levels(*args.nus, n_nu)
    grid = [(i, j) for j in range(n_nu) for i in range(n_speed)]
    holdout = {case_name(speeds[i], nus[j]) for i, j in held_out(n_speed, n_nu)}

    started = time.perf_counter()
    (out / "cases").mkdir(parents=True)
    base = out / "cases" / "_mesh"
    prepare_base(args.tutorial, base, args.iterations, env, args.wall_distance)
    print(f"sweep: {n_speed} speeds x {n_nu} viscosities = {len(grid)} cases of pitzDaily, "
          f"up to {args.iterations} iterations each, {args.jobs} at a time", flush=True)

    def one(ij: tuple[int, int]) -> dict:
        speed, nu = speeds[ij[0]], nus[ij[1]]
        name = case_name(speed, nu)
        record = solve_case(base, out / "cases" / name, speed, nu, env)
        moved = record["settle"]
        print(f"  {name}: {record['iterations']} iterations, {record['seconds']} s" + (
            f"; over the last {record['settle_over']}, p moved {moved['p']:.2%}, U {moved['U']:.2%}" if moved else ""),
            flush=True)
        return record

    records = solve_all(grid, one, args.jobs)
    with open(out / "params.csv", "w", newline="") as f:
        table = csv.writer(f)
        table.writerow(["sample", "speed", "nu"])
        for r in records:
            table.writerow([r["sample"], f"{r['speed']:g}", f"{r['nu']:.6g}"])
    seconds = round(time.perf_counter() - started, 1)
    summary = {"tutorial": str(args.tutorial), "iterations": args.iterations, "speeds": speeds, "nus": nus,
               "held_out": sorted(holdout), "seconds": seconds, "cases": records}
    (out / "sweep.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out}/: cases/ ({len(records)} cases, foamToVTK's VTK/ in each), params.csv, sweep.json; held out "
          f"{','.join(sorted(holdout))}; {seconds} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
