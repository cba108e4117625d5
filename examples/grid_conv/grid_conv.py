"""A (B, C, H, W) image sharded along H across ranks, through nn.Conv2d: the output, the input
gradient and the weight gradients equal those of one device.

    python examples/grid_conv/grid_conv.py --nproc 2               # two local ranks
    torchrun --nproc-per-node 4 examples/grid_conv/grid_conv.py     # or under torchrun

Every rank builds the same image (a fixed seed) and keeps its slab of rows; rank 0 also runs the
convolution on the whole image and compares. Exits 1 if any difference is above the tolerance
(1e-10 relative in float64, 1e-5 in float32).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from meshshard import GridTensor, grid_layout
from meshshard.comm import count_collectives, init_distributed, sum_gradients
from meshshard.nn import GridConv


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def run(args: argparse.Namespace) -> int:
    ctx = init_distributed()
    rank, world = ctx.rank, ctx.world_size
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(0)
    image = torch.randn(args.batch, args.channels, args.height, args.width, generator=gen, dtype=dtype)
    upstream = torch.randn(args.batch, args.out_channels, args.height, args.width, generator=gen, dtype=dtype)
    torch.manual_seed(0)
    conv = nn.Conv2d(args.channels, args.out_channels, args.kernel, padding=args.kernel // 2,
                     padding_mode=args.padding_mode).to(dtype)

    # The sharded run: slabs of rows, the same Conv2d (same parameters) wrapped by GridConv.
    layout = grid_layout((args.height, args.width), world)
    x = GridTensor.distribute(image, layout).to_local().clone().requires_grad_(True)
    with count_collectives() as log:
        y = GridConv(conv)(GridTensor.from_local(x, layout))
        (y.to_local() * GridTensor.distribute(upstream, layout).to_local()).sum().backward()
    sum_gradients(conv.parameters())  # each rank holds its slab's share of the weight gradient
    y_full = y.full_tensor().detach()
    dx_full = GridTensor.from_local(x.grad, layout).full_tensor()
    sharded_grads = [p.grad.clone() for p in conv.parameters()]

    if rank == 0:
        conv.zero_grad()
        whole = image.clone().requires_grad_(True)
        out = conv(whole)
        (out * upstream).sum().backward()
        errors = {"output": _max_rel(y_full, out.detach()), "input gradient": _max_rel(dx_full, whole.grad)}
        for (name, p), g in zip(conv.named_parameters(), sharded_grads):
            errors[f"{name} gradient"] = _max_rel(g, p.grad)
        tol = 1e-10 if dtype == torch.float64 else 1e-5
        print(f"{args.batch} x {args.channels} x {args.height} x {args.width} image, rows per rank "
              f"{list(layout.splits[0])}, Conv2d {args.kernel}x{args.kernel} ({args.padding_mode} padding), "
              f"{args.dtype}")
        print(f"halo exchanges on rank 0: {log.count('indexed_all_to_all_v', 'forward')} forward, "
              f"{log.count('indexed_all_to_all_v', 'backward')} backward, "
              f"{log.bytes_sent('indexed_all_to_all_v', 'forward')} bytes sent forward")
        for name, err in errors.items():
            print(f"  {name:16s} max relative difference to one device: {err:.2e}")
        ok = all(e <= tol for e in errors.values())
        print("equal to one device" if ok else f"DIFFERENT from one device (tolerance {tol:g})")
        code = 0 if ok else 1
    else:
        code = 0
    if dist.is_initialized():
        flag = torch.tensor([code])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        code = int(flag)
        dist.destroy_process_group()
    return code


def _worker(args: argparse.Namespace) -> None:
    if run(args):
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=None, help="local ranks to start (default: torchrun's, or 2)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--out-channels", type=int, default=8)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--kernel", type=int, default=3, help="odd kernel size (padding k // 2 keeps the size)")
    parser.add_argument("--padding-mode", default="zeros", choices=("zeros", "reflect", "replicate", "circular"))
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    args = parser.parse_args(argv)
    if "RANK" in os.environ:  # under torchrun
        return run(args)
    from meshshard import launch_local

    try:
        launch_local(_worker, args.nproc or 2, args)
    except RuntimeError as err:
        print(f"grid_conv: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
