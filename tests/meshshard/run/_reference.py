"""One process training MeshGraphNet on the whole mesh, step by step as ``meshshard.run.train``
does (Adam, each step the mean loss of its samples), to hold the sharded runs against."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from meshshard.nn import MeshGraphNet
from meshshard.run import TrainConfig
from meshshard.tasks import whole_sample


def whole_mesh_training(cfg: TrainConfig, steps: int, samples_of_step: Callable[[int], Sequence[int]], *,
                        lr_of_step: Callable[[int], float] | None = None,
                        clip: float = 0.0) -> tuple[list[float], dict, list[float]]:
    """``(losses, state_dict, gradient norms before clipping)`` of ``steps`` steps in float64, at
    the learning rate ``lr_of_step(step)`` (default: ``cfg``'s schedule, ``lr_at``)."""
    from meshshard.run._schedule import lr_at

    lr_of_step = lr_of_step or (lambda step: lr_at(cfg, step))
    cache: dict[int, tuple] = {}
    torch.manual_seed(cfg.seed)
    model = MeshGraphNet(3, 3, 1, latent_size=cfg.latent_size, hidden_layers=cfg.hidden_layers,
                         message_passing_steps=cfg.message_passing_steps).to(torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses, norms = [], []
    for step in range(steps):
        picks = [int(s) for s in samples_of_step(step)]
        for s in picks:
            cache.setdefault(s, whole_sample(cfg.data, s, dtype=torch.float64))
        loss = sum(((model(x, ei, ea) - y) ** 2).mean() for x, y, ei, ea in (cache[s] for s in picks)) / len(picks)
        opt.zero_grad()
        loss.backward()
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        for group in opt.param_groups:
            group["lr"] = lr_of_step(step)
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict(), norms
