"""``meshshard demo``: runs the heat-diffusion example of a source checkout.

The example itself (mesh, simulator, the end-to-end run) is application code and lives in
``examples/heat_diffusion/`` at the top of the repository, not in this package. This command only
finds it beside the package (an editable install from a clone) and runs it with the same
arguments; an installed package without the repository says where to get it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from ._spelling import add_deprecated

__all__ = ["register"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "heat_diffusion" / "demo.py"


def _run(args: argparse.Namespace) -> int:
    if not EXAMPLE.is_file():
        print(f"meshshard demo: error: the example is not installed with the package: run "
              f"examples/heat_diffusion/demo.py from a clone of the repository (looked for {EXAMPLE})", file=sys.stderr)
        return 2
    forwarded = ["--out", args.out, "--steps", str(args.steps), "--nodes", str(args.nodes), "--nproc", str(args.nproc)]
    return subprocess.call([sys.executable, str(EXAMPLE), *forwarded])


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo",
                              help="run examples/heat_diffusion/demo.py (the heat-diffusion example) of a clone",
                              description="Run the heat-diffusion example from examples/heat_diffusion/; "
                              "the arguments are passed on.")
    p.add_argument("--out", "-o", default="meshshard-demo", help="output folder (default ./meshshard-demo)")
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--nodes", type=int, default=20000, help="approximate mesh size (default 20000)")
    p.add_argument("--nproc", type=int, default=2,
                   help="local ranks (default 2; on the CPU unless there is a GPU for each)")
    add_deprecated(p, "--ranks", "--nproc", "demo", dest="nproc", type=int)
    p.set_defaults(func=_run)
