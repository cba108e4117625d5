"""``meshshard predict RUN --ensemble RUN2[,RUN3...]``: the mean of several runs' predictions.

Runs trained alike on one dataset, with other seeds, disagree where their training cases do not
decide, and their mean is nearer the truth than each of them. On 2 cores, two runs of one rank
each, side by side, take the time of one run on two ranks: on the shape sweep
(``examples/shape_sweep``) the mean of two such runs halved the error of the best baseline on
new shapes, which no single run of the same budget did.

The members' outputs are averaged in the normalised units of the model (every member must have
trained with the same statistics, target scales, task and model: checked, one line each), which
is their mean in physical units too, the de-normalisation being the same affine map for all.
Each member's weights come from its own folder with the same ``--checkpoint`` (best or last);
a run of your own model takes the one ``--model``. Rollouts are refused: a rollout applies one
run's model step after step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from torch import nn

from meshshard.partition import check_input_folders

from ._folder import peek_run, read_run
from ._recipe import build_model, check_model_radius

__all__ = ["MeanOf", "check_ensemble", "ensemble_model", "parse_ensemble"]

#: What members share with the run they are averaged with: config key -> what it is, for the refusal.
_SHARED = {"normalisation": "statistics (the dataset and its options: train them on one dataset)",
           "target_scales": "target scales", "target_fields": "target fields", "task": "task",
           "model": "model (--model)", "architecture": "built-in architecture"}


class MeanOf(nn.Module):
    """The mean of the outputs of ``members``, each called with the same arguments (tensors or
    ``ShardTensor``: the sum and the division are row-wise, so it is exact on shards)."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    @property
    def needs_pos(self) -> bool:
        """Whether a caller with a whole mesh passes the coordinates (a point model among them)."""
        return any(getattr(m, "needs_pos", False) for m in self.members)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The members' outputs, summed in their order and divided by their number."""
        total = self.members[0](*args, **kwargs)
        for member in self.members[1:]:
            total = total + member(*args, **kwargs)
        return total / len(self.members)


def parse_ensemble(text: str) -> list[str]:
    """``--ensemble RUN2[,RUN3...]``: the run folders, at least one, none given twice."""
    runs = [r.strip() for r in text.split(",")]
    if not all(runs):
        raise ValueError(f"Expected --ensemble RUN2[,RUN3...], run folders separated by commas (got {text!r})")
    return runs


def check_ensemble(run: str, config: dict[str, Any], members: list[str] | None, checkpoint: str, rollout: bool,
                   read: Any = None, partition: Any = None) -> None:
    """Refuse, in one line, members that cannot be averaged with ``run`` (its checkpoint's
    ``config``): a rollout, a folder given twice or missing, a member trained otherwise (see
    :data:`_SHARED`), and with ``partition`` a member whose ball radius exceeds the halo the
    partition was made for (:func:`~meshshard.run._recipe.check_model_radius`, as for ``run``).
    ``read(member)`` gives a member's checkpoint (default: a look at its entries, its tensors not
    read)."""
    if not members:
        return
    if rollout:
        raise ValueError("Expected --ensemble without --rollout (a rollout applies one run's model step after step)")
    resolved = [Path(r).resolve() for r in (run, *members)]
    if len(set(resolved)) < len(resolved):
        raise ValueError(f"Expected --ensemble runs other than {run} and each given once (got {','.join(members)})")
    check_input_folders(*((m, "run folder of --ensemble") for m in members))
    read = read or peek_run
    for member in members:
        theirs = read(member, checkpoint).get("config", {})
        for key, what in _SHARED.items():
            if theirs.get(key) != config.get(key):
                raise ValueError(f"{member}: Expected a run trained like {run} to average with it; its {what} differ")
        if partition:
            try:
                check_model_radius(theirs, partition)
            except ValueError as err:
                raise ValueError(f"{member}: {err}") from None


def ensemble_model(model: nn.Module, run: str, config: dict[str, Any], members: list[str], checkpoint: str,
                   sizes: tuple[int, int, int], dtype: Any, model_spec: str | nn.Module | None, model_args: Any,
                   where: str) -> MeanOf:
    """``model`` (``run``'s) and each member's, rebuilt from its checkpoint (read whole and
    checked again here, on every rank), as one :class:`MeanOf`. ``model_spec`` a module (your
    own, built): each member gets a copy of it with its weights."""
    ckpts = {m: read_run(m, checkpoint) for m in members}
    check_ensemble(run, config, members, checkpoint, False, read=lambda m, _: ckpts[m])
    built = [build_model(ckpts[m], sizes, dtype, copy.deepcopy(model_spec) if isinstance(model_spec, nn.Module)
                         else model_spec, model_args, where) for m in members]
    return MeanOf([model, *built])
