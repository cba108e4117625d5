"""The heat-diffusion example: the whole job end to end, in about a minute on 2 cores.

    python examples/heat_diffusion/demo.py [--out meshshard-demo] [--steps 100] [--nodes 20000] [--nproc 2]

(``make demo`` runs it with the defaults.) The steps:

1. make an unstructured 2-D mesh (a plate with three holes, about 18k nodes) and write it as VTU;
2. simulate heat diffusion on it (P1 finite elements) to get (state, next state) samples;
3. ``meshshard partition`` it into 2 METIS parts;
4. train the sharded MeshGraphNet on 2 local ranks (gloo on the CPU; NCCL with a GPU for each);
5. verify the first step against the single-process model on the whole mesh (loss and gradients);
6. write a partition picture and a loss curve (PNG).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # simulate.py beside this file

from simulate import make_plate_mesh, simulate_heat, write_dataset  # noqa: E402

__all__ = ["run_demo"]


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _single_process_first_step(cfg: Any, sample: int) -> tuple[float, Any]:
    """Loss and gradients of the first step, computed by one process on the whole mesh."""
    import torch

    from meshshard.nn import MeshGraphNet
    from meshshard.tasks import whole_sample

    x, y, edge_index, ea = whole_sample(cfg.data, sample)
    torch.manual_seed(cfg.seed)
    model = MeshGraphNet(x.shape[1], ea.shape[1], y.shape[1], latent_size=cfg.latent_size,
                         hidden_layers=cfg.hidden_layers, message_passing_steps=cfg.message_passing_steps)
    loss = ((model(x, edge_index, ea) - y) ** 2).mean()
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _loss_plot(losses: list[float], evals: list[tuple[int, float]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.semilogy(range(len(losses)), losses, lw=0.8, alpha=0.5, label="training loss (one sample per step)")
    if evals:
        ax.semilogy([s for s, _ in evals], [v for _, v in evals], "o-", lw=2, label="validation loss")
    ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MSE, normalised)")
    ax.set_title("Sharded MeshGraphNet, 2 ranks: heat diffusion on a plate")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def run_demo(out: Path, steps: int, nodes: int, ranks: int) -> int:
    import meshio
    import torch

    from meshshard import TrainConfig
    from meshshard.cli import main as cli

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    _say(f"1/6 making a 2-D unstructured mesh (plate with holes, ~{nodes:,} nodes)")
    points, triangles = make_plate_mesh(nodes)
    with warnings.catch_warnings():  # meshio notes that VTU stores 2-D points with a zero z
        warnings.simplefilter("ignore")
        meshio.write(out / "mesh.vtu", meshio.Mesh(points, [("triangle", triangles)]))
    _say(f"    {len(points):,} nodes, {len(triangles):,} triangles -> {out / 'mesh.vtu'}")

    _say("2/6 simulating heat diffusion (P1 FEM, implicit Euler; 8 trajectories x 5 steps)")
    data = simulate_heat(points, triangles, trajectories=8, steps=5, seed=0)
    write_dataset(data, out / "data", force=True)
    _say(f"    {data.inputs.shape[0]} samples of {data.inputs.shape[1]:,} nodes -> {out / 'data'}")

    _say(f"3/6 meshshard partition {out / 'data'} --parts {ranks} --out {out / 'partition'} --force")
    code = cli(["partition", str(out / "data"), "--parts", str(ranks), "--out", str(out / "partition"), "--force"])
    if code:
        return code

    cfg = TrainConfig(partition=str(out / "partition"), data=str(out / "data"), out=str(out / "run"), steps=steps,
                      lr=3e-3, latent_size=32, hidden_layers=1, message_passing_steps=4, checkpoint_every=max(1, steps // 3),
                      log_every=max(1, steps // 10), val_every=max(1, steps // 10))
    train = ["train", cfg.partition, "--data", cfg.data, "--out", cfg.out, "--nproc", str(ranks), "--steps", str(steps),
             "--lr", str(cfg.lr), "--latent", str(cfg.latent_size), "--hidden-layers", str(cfg.hidden_layers),
             "--mp-steps", str(cfg.message_passing_steps), "--every", str(cfg.checkpoint_every),
             "--log-every", str(cfg.log_every), "--val-every", str(cfg.val_every), "--force"]
    _say(f"4/6 meshshard {' '.join(train)}")
    if code := cli(train):
        return code
    records = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    evals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]

    _say("5/6 verifying the first step against the single-process model on the whole mesh")
    first = torch.load(out / "run" / "first_step.pt", weights_only=True)
    loss_1, grads_1 = _single_process_first_step(cfg, first["sample"])
    loss_err = abs(first["loss"] - loss_1) / abs(loss_1)
    grad_err = float((first["grads"] - grads_1).norm() / grads_1.norm())
    ok = loss_err < 1e-5 and grad_err < 1e-4
    _say(f"    loss: sharded {first['loss']:.7f} vs one process {loss_1:.7f} (relative difference {loss_err:.1e})")
    _say(f"    gradients of all {grads_1.numel():,} parameters: normwise relative difference {grad_err:.1e} (float32)")

    _say("6/6 writing pictures")
    cli(["plot", str(out / "partition"), "--out", str(out / "partition.png")])
    if _loss_plot(losses, evals, out / "loss.png"):
        _say(f"    wrote {out / 'loss.png'}")
    first_eval, last_eval = evals[0][1], evals[-1][1]
    _say(f"done in {time.perf_counter() - started:.0f} s: validation loss {first_eval:.4f} -> {last_eval:.4f} "
         f"(x{first_eval / max(last_eval, 1e-12):.1f} lower) in {len(losses)} steps; first step {'verified' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="meshshard's heat-diffusion example, end to end")
    p.add_argument("--out", "-o", default="meshshard-demo", help="output folder (default ./meshshard-demo)")
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--nodes", type=int, default=20000, help="approximate mesh size (default 20000)")
    p.add_argument("--nproc", type=int, default=2, help="local ranks (default 2; on the CPU unless there is a GPU for each)")
    p.add_argument("--ranks", dest="nproc", type=int, help=argparse.SUPPRESS)  # the old spelling
    args = p.parse_args(argv)
    try:
        return run_demo(Path(args.out), args.steps, args.nodes, args.nproc)
    except RuntimeError as err:
        print(f"demo: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
