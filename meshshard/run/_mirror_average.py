"""``meshshard predict --mirror-average``: the mean of a prediction and the mirror of the prediction
of the mirrored sample.

A run trained on a dataset made with ``meshshard dataset --mirror`` (:mod:`meshshard.data._mirror`)
has seen every training case and its mirror, but nothing makes its model exactly symmetric: the
prediction of a mirrored sample is near the mirror of the original's prediction, not equal to it.
With ``--mirror-average`` each sample is predicted twice, as it is and mirrored, and the mirrored
prediction is mirrored back and averaged with the first. The result is exactly symmetric: the
prediction of a mirrored sample is the mirror of the original's. It costs a second forward per
sample. On the shape sweep (``examples/shape_sweep``) it lowered the held-out errors by 5-9%
(docs/prediction.md).

The mirror is the run's (recorded at training; a run trained before that: ``DATA``'s
``mirror``): its axis, vectors and parameters say which channels it negates
(:func:`~meshshard.data.mirrored_channels`): of the inputs, the component along the axis of the
positions, of the wall offset and normal, of the named vectors and of their priors, and the named
parameters; of the edge features ``dpos`` along the axis; of the targets the named vectors' component.
A sample is mirrored in the model's normalised units, where negating a raw value ``v`` is an affine
map, ``(-v - mean) / scale = -n - 2 mean / scale``, and the output is mirrored back the same way.
The target offset (a ``--mean-field`` prior) mirrors with the inputs it is read from, so the
output's mirror is that of the difference from it. Both maps are row by row, so the mean is as
exact on shards as the model is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["POINT_MODEL", "MirrorMean", "mirror_of_run", "mirror_average_model"]


def mirror_of_run(run_config: dict[str, Any], data_meta: dict[str, Any], where: str) -> dict[str, Any]:
    """The mirror a run trained with (its config's ``mirror``, else the dataset's), or a one-line
    refusal naming ``where`` (the run folder)."""
    record = run_config.get("mirror") or data_meta.get("mirror")
    if not record or not record.get("axis"):
        raise ValueError(f"{where}: Expected a run trained on a dataset made with meshshard dataset --mirror for "
                         "--mirror-average (a model that never saw mirrored cases predicts them no better than "
                         "any case it never saw)")
    from meshshard.data import expression_names, mirror_record

    for target, scale in (run_config.get("target_scales") or data_meta.get("target_scales") or {}).items():
        used = sorted(expression_names(str(scale)) & set(record.get("parameters", [])))
        if used:
            raise ValueError(f"{where}: Expected target scales apart from the mirrored parameters for --mirror-average "
                             f"(got {target}={scale}, of {', '.join(used)}: a mirror's targets are scaled otherwise "
                             "than its original's, so its prediction does not mirror back in the run's units)")
    return mirror_record(record) or {}


def _affine(flip: np.ndarray, mean: Any, scale: Any, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(sign, shift)``: the mirror in normalised units, ``n -> sign * n + shift``."""
    mean = np.asarray(mean, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    sign = np.where(flip, -1.0, 1.0)
    shift = np.where(flip, -2.0 * mean / scale, 0.0)
    return torch.as_tensor(sign, dtype=dtype), torch.as_tensor(shift, dtype=dtype)


class MirrorMean(nn.Module):
    """The mean of ``model(x, graph, e)`` and the mirror of ``model(mirror(x), graph, mirror(e))``.

    ``inputs``, ``edges`` and ``outputs`` are each ``(sign, shift)`` over the channels: the mirror
    in normalised units (see the module docstring). ``x`` may be a tensor or a ``ShardTensor``;
    the maps are row-wise, so the mean is exact on shards.
    """

    def __init__(self, model: nn.Module, inputs: tuple[Tensor, Tensor], edges: tuple[Tensor, Tensor],
                 outputs: tuple[Tensor, Tensor]) -> None:
        super().__init__()
        self.model = model
        for name, (sign, shift) in (("inputs", inputs), ("edges", edges), ("outputs", outputs)):
            self.register_buffer(f"{name}_sign", sign, persistent=False)
            self.register_buffer(f"{name}_shift", shift, persistent=False)

    def forward(self, x: Any, graph: Any, edge_attr: Tensor, **kwargs: Any) -> Any:
        """The mean of the two passes, in the model's normalised target units: ``(N, F_out)``, a
        tensor or a ``ShardTensor`` as the model returns."""
        direct = self.model(x, graph, edge_attr, **kwargs)
        mirrored = self.model(x * self.inputs_sign + self.inputs_shift, graph,
                              edge_attr * self.edges_sign + self.edges_shift, **kwargs)
        return (direct + (mirrored * self.outputs_sign + self.outputs_shift)) / 2


#: The refusal of a point model (its ball query reads the positions, which a mirror does not flip).
POINT_MODEL = ("Expected a mesh model for --mirror-average (a point model's ball query reads the positions, which it "
               "does not mirror)")


def mirror_average_model(model: nn.Module, record: dict[str, Any], norm: Any, input_fields: list[dict[str, Any]],
                         target_fields: list[dict[str, Any]], dtype: torch.dtype) -> MirrorMean:
    """``model`` (a run's, or an ensemble's mean) as a :class:`MirrorMean` for the mirror ``record``
    (:func:`mirror_of_run`), with the run's statistics ``norm``, the dataset's input fields and the
    run's target fields (``[{"name", "components"}]``)."""
    from meshshard.data import mirrored_channels

    if getattr(model, "needs_pos", False):  # a model of your own (a built-in one is refused before the ranks)
        raise ValueError(POINT_MODEL)
    flips = [mirrored_channels({}, input_fields, record),
             mirrored_channels({}, [{"name": c, "components": 1} for c in norm.edges.channels], record),
             mirrored_channels({}, target_fields, record)]
    stats = [norm.inputs, norm.edges, norm.targets]
    for flip, stat, what in zip(flips, stats, ("input", "edge", "target")):
        if len(flip) != len(stat.channels):
            raise ValueError(f"Expected the run's {len(stat.channels)} {what} channels to mirror (got {len(flip)} "
                             "from the dataset's fields)")
    return MirrorMean(model, *(_affine(f, s.mean, s.scale, dtype) for f, s in zip(flips, stats)))
