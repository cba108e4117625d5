"""Port a PyTorch Geometric model onto shards: a GraphSAGE trained on a partitioned mesh.

The model is ordinary PyG (SAGEConv, BatchNorm); the port wraps each message-passing layer in
``ShardConv`` and feeds ``ShardTensor`` node features and a ``ShardGraph``. The same module still
runs on a whole graph (``model(x, edge_index)``), which ``--check`` uses to train an identical
copy in one process and print how far the sharded losses are from it.

    meshshard partition MESH --parts 2 --out PARTS
    python train.py PARTS --nproc 2 --steps 20 --check MESH    # or: torchrun --nproc-per-node 2 train.py PARTS
"""

from __future__ import annotations

import argparse
import copy
import sys

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import BatchNorm, SAGEConv

from meshshard import ShardGraph, ShardTensor
from meshshard.comm import init_distributed
from meshshard.nn import DomainParallel, ShardConv
from meshshard.partition import build_graph, load_partition, read_input


class GraphSAGE(nn.Module):
    """Your PyG model. The only change for shards: ``ShardConv(...)`` around each conv layer."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = ShardConv(SAGEConv(in_channels, hidden))
        self.norm = BatchNorm(hidden)  # global statistics on shards
        self.conv2 = ShardConv(SAGEConv(hidden, out_channels, aggr="max"))

    def forward(self, x, graph):  # x: Tensor or ShardTensor; graph: edge_index or ShardGraph
        h = self.norm(self.conv1(x, graph)).relu()
        return self.conv2(h, graph)


def features(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (coordinates and a constant) and a smooth target, per node: row-wise, so a shard
    computes its own rows from its own coordinates."""
    scaled = pos / 100.0
    x = torch.cat([scaled, torch.ones_like(scaled[:, :1])], dim=1)
    y = torch.stack([torch.sin(3 * scaled[:, 0]) * torch.cos(2 * scaled[:, 1]), scaled.square().sum(1)], dim=1)
    return x, y


def train(model: nn.Module, x, graph, target, steps: int) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x, graph) - target) ** 2).mean()  # a global mean on shards
        loss.backward()  # under DomainParallel, also adds up every rank's part of the gradients
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def whole_mesh(mesh: str) -> tuple[torch.Tensor, torch.Tensor]:
    graph = build_graph(read_input(mesh), "nodal")
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return torch.as_tensor(graph.pos, dtype=torch.float64), torch.as_tensor(np.stack([graph.indices, dst]))


def worker(parts: str, steps: int, check: str | None) -> None:
    ctx = init_distributed()
    graph = ShardGraph.from_partition(load_partition(parts, ctx.rank), dtype=torch.float64)
    x_own, y_own = features(graph.pos[: graph.num_owned])
    x = ShardTensor.from_local(x_own, graph.spec)
    target = ShardTensor.from_local(y_own, graph.spec)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = GraphSAGE(x_own.shape[1], 32, 2).double()  # 2-D or 3-D coordinates, and a constant
    reference = copy.deepcopy(model)
    losses = train(DomainParallel(model), x, graph, target, steps)
    import torch.distributed as dist

    if dist.is_initialized():  # leave no gloo thread running at exit (it can abort the process)
        dist.barrier()
        dist.destroy_process_group()
    if ctx.rank != 0:
        return
    print(f"sharded on {ctx.world_size} ranks: loss {losses[0]:.6f} -> {losses[-1]:.6f} in {steps} steps")
    if check:
        pos, edge_index = whole_mesh(check)
        xf, yf = features(pos)
        whole = train(reference, xf, edge_index, yf, steps)
        gap = max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(losses, whole))
        print(f"one process:        loss {whole[0]:.6f} -> {whole[-1]:.6f}; largest relative difference {gap:.1e}")
        if gap > 1e-10:
            sys.exit(f"sharded training differs from one process by {gap:.1e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", help="a partition folder written by `meshshard partition`")
    parser.add_argument("--nproc", type=int, default=None, help="start this many local ranks (omit under torchrun)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--check", metavar="MESH", help="also train on the whole MESH in one process and compare")
    args = parser.parse_args(argv)
    if args.nproc:
        from meshshard import launch_local

        launch_local(worker, args.nproc, args.parts, args.steps, args.check)
    else:
        worker(args.parts, args.steps, args.check)


if __name__ == "__main__":
    main()
