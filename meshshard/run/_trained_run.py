"""A trained run in your own script: :func:`load_run` rebuilds its model, with its weights and the
statistics it was trained with, and predicts in physical units, on a whole mesh or on shards.

``meshshard predict`` writes files for ParaView; this is the same model for code of your own
(a design loop, a sensitivity study, a coupling to a solver)::

    run = meshshard.load_run("run/")                       # model=... for a run of your own model
    with torch.no_grad():
        T = run(x, edge_index, pos)                        # (N, F_in) physical -> (N, F_out) physical

    # or sharded, on this rank's part of a partition, under torchrun:
    T_own = run(ShardTensor.from_local(x_own, graph.spec), graph)   # graph: a ShardGraph

A transient run (``meshshard dataset --state``) loads as a :class:`TransientRun`, whose model
steps a state on: :meth:`TransientRun.rollout` applies it ``steps`` times from a state, on the
whole mesh or on shards, and returns every step's state in physical units, as ``meshshard predict
--rollout`` writes them (the same loop, :mod:`meshshard.run._stepping`)::

    run = meshshard.load_run("run/")                       # a transient run: a TransientRun
    states = run.rollout(state0, inputs, node_type, edge_index, pos, steps=50,
                         boundary=lambda n: prescribed[n])  # (51, N, C) physical units

The checkpoint is read with :func:`meshshard.run.load_checkpoint` (tensors and plain values only,
checksum checked); code is never imported from what a checkpoint names.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from meshshard.data import Normalisation

from ..tasks import TensorNormalisation, get_task
from ._ensemble import check_ensemble, ensemble_model
from ._folder import read_run
from ._recipe import build_model

__all__ = ["TrainedRun", "TransientRun", "load_run"]


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
            raw = x.to_local().to(self.device, self.dtype)
            ea = norm.edge_attr(graph.pos.to(self.device, self.dtype), graph.edge_index)
            out = norm.denormalise_targets(self.model(ShardTensor.from_local(norm.normalise_inputs(raw), x.spec),
                                                      graph, ea), raw)
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
        return self._dimensional(norm.denormalise_targets(out, x), x)

    def _dimensional(self, out: Any, x: Any) -> Any:
        """``out`` ``(n, F_out)`` in physical units: for a run of non-dimensional targets
        (``meshshard dataset --target-scale``), each field times its expression of the parameters,
        which are input channels of ``x`` ``(n, F_in)``, row by row."""
        scales = self.config.get("target_scales") or {}
        if not scales:
            return out
        from meshshard.data import evaluate_columns

        x = x.to(out.device, out.dtype)
        columns = {name: x[:, i] for i, name in enumerate(self.input_channels)}
        factors = []
        for target in self.config.get("target_fields") or []:
            expression = scales.get(str(target["name"]))
            value = evaluate_columns(expression, columns) if expression else torch.ones_like(out[:, 0])
            factors += [value] * int(target["components"])
        scaled = out * torch.stack(factors, dim=1)
        bad = ~torch.isfinite(scaled).all(dim=0) & torch.isfinite(out).all(dim=0)  # finite before, not after
        if bool(bad.any()):
            column = int(bad.nonzero()[0, 0])
            names = [str(t["name"]) for t in self.config.get("target_fields") or []
                     for _ in range(int(t["components"]))]
            name = names[column] if column < len(names) else str(column)
            raise ValueError(f"Expected the predictions of {name} to be finite in physical units (times its target "
                             f"scale {scales.get(name)}, they overflow {str(out.dtype).removeprefix('torch.')}); "
                             "predict in float64, or rebuild the dataset with a smaller --target-scale")
        return scaled

    def _check_pos(self, shape: Any) -> None:
        dims = len(self._normaliser.normalisation.edges.channels) - 1  # the edge features: dpos, then |dpos|
        if shape[-1] != dims:
            raise ValueError(f"Expected pos with {dims} coordinates per node, as the run was trained on "
                             f"(got {tuple(shape)})")

    def _check_channels(self, shape: Any) -> None:
        if len(shape) != 2 or shape[1] != len(self.input_channels):
            raise ValueError(f"Expected inputs (N, {len(self.input_channels)}): the run's channels "
                             f"{', '.join(self.input_channels)} (got shape {tuple(shape)})")


@dataclass(eq=False)
class TransientRun(TrainedRun):
    """A transient run (:class:`TrainedRun`, from :func:`load_run`): its model steps a state on;
    :meth:`rollout` applies it again and again, as ``meshshard predict --rollout`` does.

    Attributes (besides :class:`TrainedRun`'s): state_channels: the state's channel names (the
    model's outputs are their change over a stride); ``input_channels`` are the static inputs;
    class_ids: the node classes the run knows, in one-hot order; boundary_classes: those whose
    nodes are prescribed, not predicted.
    """

    class_ids: list[int] = field(default_factory=list)
    boundary_classes: list[int] = field(default_factory=list)

    @property
    def state_channels(self) -> list[str]:
        """The state's channels, in order (the run's targets)."""
        return self.target_channels

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: a transient run's model is applied to a state with :meth:`rollout`."""
        raise ValueError("Expected run.rollout(state0, inputs, node_type, graph, pos, steps=N) for a transient run "
                         "(its model steps a state on)")

    def rollout(self, state0: Any, inputs: Any, node_type: Any, graph: Any, pos: Any = None, *, steps: int,
                boundary: Any = None) -> torch.Tensor:
        """The state after 0, 1, ... ``steps`` applications of the model, in physical units: a
        tensor ``(steps + 1, n, C)`` (``[0]`` is ``state0``), equal to what ``meshshard predict
        --rollout`` writes for the same trajectory.

        On one process: ``state0`` ``(N, C)`` the state (:attr:`state_channels`), ``inputs``
        ``(N, F_in)`` the static inputs (:attr:`input_channels`), ``node_type`` ``(N,)`` each node's
        class id (:attr:`class_ids`), ``graph`` the directed edges ``(2, E)``, ``pos`` ``(N, D)``.
        Sharded (under torchrun): ``state0`` and ``inputs`` are ``ShardTensor`` of this rank's owned
        rows, ``node_type`` those rows' classes, ``graph`` a ``ShardGraph`` (built in the run's
        precision, as for ``run(...)``); the result holds this rank's rows, and on any number of
        ranks they equal the whole-mesh rollout's. The state never leaves its shard.

        ``boundary``: the prescribed state of the boundary-class nodes at each step: ``(steps + 1,
        n, C)`` rows (row 0 unused; only the boundary nodes' values are read), or a function of
        the step ``n`` returning ``(n, C)`` or ``None``; where it is missing (or ``None``) the
        boundary nodes keep their previous value. Runs without gradients."""
        from .._graph import ShardGraph
        from .._tensor import ShardTensor
        from ._stepping import roll_states

        norm = self._normaliser
        sharded = isinstance(graph, ShardGraph)
        if sharded != isinstance(state0, ShardTensor) or sharded != isinstance(inputs, ShardTensor):
            raise ValueError("Expected state0 and inputs both ShardTensor with a ShardGraph, or both arrays with an "
                             f"edge_index (got {type(state0).__name__}, {type(inputs).__name__}, "
                             f"{type(graph).__name__})")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"Expected steps to be 0 or a positive integer (got {steps!r})")
        state = torch.as_tensor(state0.to_local() if sharded else state0).to(self.device, self.dtype)
        x = torch.as_tensor(inputs.to_local() if sharded else inputs).to(self.device, self.dtype)
        n = state.shape[0] if state.ndim == 2 else -1
        if state.ndim != 2 or state.shape[1] != len(self.state_channels):
            raise ValueError(f"Expected state0 (N, {len(self.state_channels)}): the run's state channels "
                             f"{', '.join(self.state_channels)} (got shape {tuple(state.shape)})")
        if x.ndim != 2 or x.shape != (n, len(self.input_channels)):
            raise ValueError(f"Expected inputs ({n}, {len(self.input_channels)}): the run's static inputs "
                             f"{', '.join(self.input_channels) or '(none)'} (got shape {tuple(x.shape)})")
        kinds = np.asarray(node_type.cpu() if isinstance(node_type, torch.Tensor) else node_type)
        known = np.asarray(self.class_ids, dtype=np.int64)
        if kinds.shape != (n,) or kinds.dtype.kind not in "iu" or not np.isin(kinds, known).all():
            raise ValueError(f"Expected node_type ({n},) of the run's class ids {known.tolist()} (got "
                             f"{kinds.dtype} {kinds.shape}{'' if kinds.shape != (n,) else ' with other ids'})")
        boundary_of_class = np.isin(known, self.boundary_classes)
        index = torch.as_tensor(np.searchsorted(known, kinds.astype(np.int64)), device=self.device)
        rows = get_task("transient").static_rows(x, index, boundary_of_class, norm)
        if sharded:
            self._check_pos(graph.pos.shape)
            ea = norm.edge_attr(graph.pos.to(self.device, self.dtype), graph.edge_index)

            def forward(z: Any) -> Any:
                return self.model(ShardTensor.from_local(z, graph.spec), graph, ea).to_local()
        else:
            if pos is None:
                raise ValueError("Expected pos, the (N, D) node coordinates, with an edge_index (the edge features "
                                 "are computed from them)")
            edge_index = torch.as_tensor(graph, device=self.device).long()
            pos = torch.as_tensor(pos).to(self.device, self.dtype)
            if edge_index.ndim != 2 or edge_index.shape[0] != 2 or pos.ndim != 2 or pos.shape[0] != n:
                raise ValueError(f"Expected edge_index (2, E) and pos ({n}, D) for a state of {n} rows "
                                 f"(got {tuple(edge_index.shape)} and {tuple(pos.shape)})")
            self._check_pos(pos.shape)
            if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
                raise ValueError(f"Expected edge_index in 0..{n - 1}, node ids of the state's {n} rows")
            ea = norm.edge_attr(pos, edge_index)
            extra = {"pos": pos} if getattr(self.model, "needs_pos", False) else {}

            def forward(z: Any) -> Any:
                return self.model(z, edge_index, ea, **extra)

        def truth_of(step: int) -> Any:
            if boundary is None or step == 0:
                return None
            if callable(boundary):
                value = boundary(step)
            else:
                if len(boundary) <= step:
                    return None
                value = boundary[step]
            if value is None:
                return None
            value = torch.as_tensor(value.to_local() if isinstance(value, ShardTensor) else value)
            if tuple(value.shape) != tuple(state.shape):
                raise ValueError(f"Expected the boundary state of step {step} of shape {tuple(state.shape)} "
                                 f"(got {tuple(value.shape)})")
            return value.to(self.device, self.dtype)

        return torch.stack([s for _, s, _ in roll_states(get_task("transient"), norm, forward, state, rows, steps,
                                                         truth_of)])


def load_run(run: str | os.PathLike[str], *, model: str | nn.Module | None = None,
             model_args: dict[str, Any] | None = None, device: Any = None,
             dtype: torch.dtype | str | None = None, checkpoint: str = "best",
             data: str | os.PathLike[str] | None = None,
             ensemble: Sequence[str | os.PathLike[str]] = ()) -> TrainedRun:
    """The trained model of a run folder of ``meshshard train``, for prediction in your own code.

    Args:
        run: the run folder.
        model: for a run of your own model: its ``"file.py:name"`` (as given to ``train --model``),
            or the module itself, built as for training (its weights are replaced by the run's).
            Leave out for the built-in MeshGraphNet.
        model_args: the ``model="file.py:name"`` arguments (default: the run's).
        device: where the model runs (default: CPU).
        dtype: its precision, ``torch.float32`` or ``torch.float64`` (or their names; default: the run's).
        checkpoint: ``"best"`` (``RUN/best.pt``, the lowest validation loss, or rollout error for a
            transient run; ``RUN/checkpoint.pt`` for a run trained without ``--val-every``) or
            ``"last"`` (``RUN/checkpoint.pt``), as ``meshshard predict --checkpoint``.
        data: a transient run's dataset, read for its node classes only where the checkpoint
            does not record them (a run trained before they were recorded).
        ensemble: other runs trained alike (other seeds): the model is the mean of their outputs
            and ``run``'s, as ``meshshard predict --ensemble`` (:mod:`meshshard.run._ensemble`);
            each is read with the same ``checkpoint`` (and ``model``, copied). Steady runs only.

    Returns:
        a :class:`TrainedRun`; for a transient run a :class:`TransientRun`, whose
        :meth:`~TransientRun.rollout` steps a state on.

    Raises:
        ValueError: on one line: no checkpoint, a damaged one, a run of your own model without
            ``model``, a model whose weights are not the run's, another ``dtype``, or an
            ``ensemble`` member missing or trained otherwise, or of a transient run.
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
    norm = Normalisation.from_dict(stored)
    dtype = dtype or getattr(torch, str(cfg.get("dtype", "float32")))
    device = torch.device(device or "cpu")
    sizes = len(norm.inputs.channels), len(norm.edges.channels), len(norm.targets.channels)
    transient = get_task(str(cfg.get("task") or "steady"), cfg).rolls_out
    if transient:
        node_types = cfg.get("node_types")
        if not node_types and data is not None:
            from meshshard.data import open_dataset

            node_types = open_dataset(data).meta.get("node_types")
        if not node_types:
            raise ValueError(f"{run}: its checkpoint does not record the node classes of its transient task (a run "
                             "of an older version); pass data=DATA, the dataset it trained on")
        classes = sorted(node_types["classes"], key=lambda c: int(c["id"]))
        sizes = (sizes[2] + sizes[0] + len(classes), sizes[1], sizes[2])  # [state, static inputs, one-hot class]
    trained = str(cfg.get("model") or "")
    if trained and model is None:
        raise ValueError(f"{run}: trained your own model ({trained}); pass model={trained!r}, or the module "
                         "itself (code named in a checkpoint is never imported)")
    if isinstance(model, str) and model and not trained:
        raise ValueError(f"{run}: trained the built-in MeshGraphNet; leave out model")
    built = build_model(ckpt, sizes, dtype, model, model_args, f"{run}'s recorded statistics")
    if ensemble:
        members = [str(m) for m in ensemble]
        if transient:
            raise ValueError(f"{run}: Expected ensemble only with a steady run (got a transient run, whose rollout "
                             "applies one model step after step)")
        check_ensemble(str(run), cfg, members, checkpoint, False)
        built = ensemble_model(built, str(run), cfg, members, checkpoint, sizes, dtype, model, model_args,
                               f"{run}'s recorded statistics")
    if transient:
        return TransientRun(model=built.to(device), step=int(ckpt.get("step", 0)), config=cfg,
                            input_channels=list(norm.inputs.channels), target_channels=list(norm.targets.channels),
                            device=device, dtype=dtype,
                            _normaliser=get_task("transient").prediction_normaliser(cfg, device, dtype),
                            class_ids=[int(c["id"]) for c in classes],
                            boundary_classes=[int(c["id"]) for c in classes if c.get("boundary")])
    return TrainedRun(model=built.to(device), step=int(ckpt.get("step", 0)), config=cfg,
                      input_channels=list(norm.inputs.channels), target_channels=list(norm.targets.channels),
                      device=device, dtype=dtype, _normaliser=TensorNormalisation(norm, device, dtype))
