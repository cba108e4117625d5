"""A trained run in your own script: :func:`load_run` rebuilds its model, with its weights and the
statistics it was trained with, and predicts in physical units, on a whole mesh or on shards.

``meshshard predict`` writes files for ParaView; this is the same model for code of your own
(a design loop, a sensitivity study, a coupling to a solver)::

    run = meshshard.load_run("run/")                       # model=... for a run of your own model
    with torch.no_grad():
        T = run(x, edge_index, pos)                        # (N, F_in) physical -> (N, F_out) physical

    # or sharded, on this rank's part of a partition, under torchrun:
    T_own = run(ShardTensor.from_local(x_own, graph.spec), graph)   # graph: a ShardGraph

The checkpoint is read with :func:`meshshard.run.load_checkpoint` (tensors and plain values only,
checksum checked); code is never imported from what a checkpoint names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from meshshard.partition import Normalisation

from ..tasks import TensorNormalisation, get_task
from ._folder import read_run
from ._recipe import build_model

__all__ = ["TrainedRun", "load_run"]


@dataclass(eq=False)
class TrainedRun:
    """A run's model, weights and normalisation, from :func:`load_run`.

    Attributes:
        model: the model (MeshGraphNet or yours), in eval mode; it takes normalised inputs.
        step: the steps the run had trained when its checkpoint was written.
        config: the run's settings (``TrainConfig`` as a dict).
        input_channels, target_channels: channel names, in order (``u[0]``, ``u[1]``, ... for
            a vector field).
        device, dtype: where and in what precision the model runs.
    """

    model: nn.Module
    step: int
    config: dict[str, Any]
    input_channels: list[str]
    target_channels: list[str]
    device: torch.device
    dtype: torch.dtype
    _normaliser: Any = field(repr=False)

    def __call__(self, x: Any, graph: Any, pos: Any = None) -> Any:
        """The prediction, in physical units, for inputs ``x`` in physical units.

        On one process: ``x`` ``(N, F_in)`` (a tensor or an array), ``graph`` the directed edges
        ``(2, E)`` (source row, target row), ``pos`` ``(N, D)`` the node coordinates; returns an
        ``(N, F_out)`` tensor. Sharded: ``x`` a ``ShardTensor`` of this rank's owned rows and
        ``graph`` a ``ShardGraph`` (its ``pos`` is used); returns a ``ShardTensor``, and equals the
        whole-mesh prediction on those rows (build the graph in the run's precision,
        ``ShardGraph.from_partition(part, dtype=run.dtype)``: its coordinates give the edge
        features). Gradients flow to ``x``; wrap the call in ``torch.no_grad()`` to predict only.
        """
        from .._graph import ShardGraph
        from .._tensor import ShardTensor

        norm = self._normaliser
        if isinstance(graph, ShardGraph):
            if not isinstance(x, ShardTensor):
                raise ValueError("Expected x to be a ShardTensor of this rank's owned rows with a ShardGraph "
                                 f"(got {type(x).__name__})")
            self._check_channels(x.to_local().shape)
            self._check_pos(graph.pos.shape)
            local = norm.normalise_inputs(x.to_local().to(self.device, self.dtype))
            ea = norm.edge_attr(graph.pos.to(self.device, self.dtype), graph.edge_index)
            out = norm.denormalise_targets(self.model(ShardTensor.from_local(local, x.spec), graph, ea))
            return ShardTensor.from_local(self._dimensional(out.to_local(), x.to_local()), out.spec)
        if pos is None:
            raise ValueError("Expected pos, the (N, D) node coordinates, with an edge_index (the edge features are "
                             "computed from them)")
        x = torch.as_tensor(x).to(self.device, self.dtype)
        self._check_channels(x.shape)
        edge_index = torch.as_tensor(graph, device=self.device).long()
        pos = torch.as_tensor(pos).to(self.device, self.dtype)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2 or pos.ndim != 2 or pos.shape[0] != x.shape[0]:
            raise ValueError(f"Expected edge_index (2, E) and pos ({x.shape[0]}, D) for x of {x.shape[0]} rows "
                             f"(got {tuple(edge_index.shape)} and {tuple(pos.shape)})")
        self._check_pos(pos.shape)
        if edge_index.numel():
            low, high = int(edge_index.min()), int(edge_index.max())
            if low < 0 or high >= x.shape[0]:
                raise ValueError(f"Expected edge_index in 0..{x.shape[0] - 1}, node ids of x's {x.shape[0]} rows "
                                 f"(got {low if low < 0 else high})")
        ea = norm.edge_attr(pos, edge_index)
        extra = {"pos": pos} if getattr(self.model, "needs_pos", False) else {}  # a point model (ball-attention)
        out = self.model(norm.normalise_inputs(x), edge_index, ea, **extra)
        return self._dimensional(norm.denormalise_targets(out), x)

    def _dimensional(self, out: Any, x: Any) -> Any:
        """``out`` ``(n, F_out)`` in physical units: for a run of non-dimensional targets
        (``meshshard dataset --target-scale``), each field times its expression of the parameters,
        which are input channels of ``x`` ``(n, F_in)``, row by row."""
        scales = self.config.get("target_scales") or {}
        if not scales:
            return out
        from meshshard.partition import evaluate_columns

        x = x.to(out.device, out.dtype)
        columns = {name: x[:, i] for i, name in enumerate(self.input_channels)}
        factors = []
        for target in self.config.get("target_fields") or []:
            expression = scales.get(str(target["name"]))
            value = evaluate_columns(expression, columns) if expression else torch.ones_like(out[:, 0])
            factors += [value] * int(target["components"])
        return out * torch.stack(factors, dim=1)

    def _check_pos(self, shape: Any) -> None:
        dims = len(self._normaliser.normalisation.edges.channels) - 1  # the edge features: dpos, then |dpos|
        if shape[-1] != dims:
            raise ValueError(f"Expected pos with {dims} coordinates per node, as the run was trained on "
                             f"(got {tuple(shape)})")

    def _check_channels(self, shape: Any) -> None:
        if len(shape) != 2 or shape[1] != len(self.input_channels):
            raise ValueError(f"Expected inputs (N, {len(self.input_channels)}): the run's channels "
                             f"{', '.join(self.input_channels)} (got shape {tuple(shape)})")


def load_run(run: str | os.PathLike[str], *, model: str | nn.Module | None = None,
             model_args: dict[str, Any] | None = None, device: Any = None,
             dtype: torch.dtype | str | None = None, checkpoint: str = "best") -> TrainedRun:
    """The trained model of a run folder of ``meshshard train``, for prediction in your own code.

    Args:
        run: the run folder.
        model: for a run of your own model: its ``"file.py:name"`` (as given to ``train --model``),
            or the module itself, built as for training (its weights are replaced by the run's).
            Leave out for the built-in MeshGraphNet.
        model_args: the ``model="file.py:name"`` arguments (default: the run's).
        device: where the model runs (default: CPU).
        dtype: its precision, ``torch.float32`` or ``torch.float64`` (or their names; default: the run's).
        checkpoint: ``"best"`` (``RUN/best.pt``, the lowest validation loss; ``RUN/checkpoint.pt``
            for a run trained without ``--val-every``) or ``"last"`` (``RUN/checkpoint.pt``), as
            ``meshshard predict --checkpoint``.

    Raises:
        ValueError: on one line: no checkpoint, a damaged one, a run of your own model without
            ``model``, a model whose weights are not the run's, or another ``dtype``.
        TypeError: ``model`` neither a string nor a module.
    """
    if model is not None and not isinstance(model, str | nn.Module):
        raise TypeError(f"Expected model to be a 'FILE.py:NAME' string or a torch.nn.Module (got "
                        f"{type(model).__name__} {model!r})")
    if dtype is not None:
        dtype = getattr(torch, dtype, dtype) if isinstance(dtype, str) and dtype in ("float32", "float64") else dtype
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"Expected dtype float32 or float64 (got {dtype!r})")
    ckpt = read_run(run, checkpoint)
    cfg = dict(ckpt.get("config") or {})
    stored = cfg.get("normalisation")
    if stored is None:
        raise ValueError(f"{run}: its checkpoint does not hold the statistics it was trained with (a run of an "
                         "older version); predict it with meshshard predict RUN --data DATA")
    if get_task(str(cfg.get("task") or "steady"), cfg).rolls_out:
        raise ValueError(f"{run}: trained the {cfg.get('task')} task, whose model steps a state on; load_run does not "
                         "cover it yet: roll it out with meshshard predict RUN --data DATA --out PRED --rollout")
    norm = Normalisation.from_dict(stored)
    dtype = dtype or getattr(torch, str(cfg.get("dtype", "float32")))
    device = torch.device(device or "cpu")
    sizes = len(norm.inputs.channels), len(norm.edges.channels), len(norm.targets.channels)
    trained = str(cfg.get("model") or "")
    if trained and model is None:
        raise ValueError(f"{run}: trained your own model ({trained}); pass model={trained!r}, or the module "
                         "itself (code named in a checkpoint is never imported)")
    if isinstance(model, str) and model and not trained:
        raise ValueError(f"{run}: trained the built-in MeshGraphNet; leave out model")
    built = build_model(ckpt, sizes, dtype, model, model_args, f"{run}'s recorded statistics")
    return TrainedRun(model=built.to(device), step=int(ckpt.get("step", 0)), config=cfg,
                      input_channels=list(norm.inputs.channels), target_channels=list(norm.targets.channels),
                      device=device, dtype=dtype, _normaliser=TensorNormalisation(norm, device, dtype))
