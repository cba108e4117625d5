"""What ``meshshard predict`` takes (:class:`PredictConfig`) and its checks before any collective:
the samples, the run's model and normalisation against the dataset's, rollout or not, and the
partition each rank reads. Shared by the steady prediction and the rollout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshshard.data import check_partition_matches, open_dataset
from meshshard.partition import check_apart, check_input_folders, plural

from ..tasks import DatasetReader, get_task
from ._boundaries import check_boundary_names, check_boundary_request
from ._ensemble import check_ensemble
from ._folder import peek_run
from ._near import check_near_request
from ._recipe import check_model_radius, load_factory
from ._vtk import COMPRESSIONS, check_compression
from ._writer import field_slices

__all__ = ["PredictConfig", "check_model_request", "check_prediction_request", "check_rollout_request",
           "normalisation_of", "parse_view", "partition_reader", "select_samples"]


@dataclass
class PredictConfig:
    """A prediction: what ``meshshard predict`` takes (its options under their long names)."""

    run: str
    data: str
    out: str
    samples: str | None = None
    partition: str | None = None
    gather: bool | None = None  # True: --gather, False: --pieces, None: by size
    dtype: str | None = None
    force: bool = False
    plots: bool = True
    quiet: bool = False
    model: str | None = None  # --model: needed (and only allowed) when the run trained your own model
    model_args: dict[str, Any] | None = None  # --model-args; None: those the run trained with
    checkpoint: str = "best"  # --checkpoint: best (lowest validation loss; the last without one) or last
    boundary: str | None = None  # --boundary NAMES: errors and forces on these named boundaries (_boundaries.py)
    pressure: str | None = None  # --force-field (--pressure) FIELD: the force's pressure (default: a scalar target "p")
    shear: str | None = None  # --shear-field (--shear) FIELD: a wall shear stress target, added to the force
    force_reference: str | None = None  # --force-reference EXPR: the reference dynamic pressure q (default 1)
    reference_area: float | None = None  # --reference-area A: coefficients = force / (q A) (default 1)
    direction: tuple[float, ...] | None = None  # --direction X,Y,Z: the drag coefficient along it
    lift_direction: tuple[float, ...] | None = None  # --lift-direction X,Y,Z: the lift coefficient along it
    view: tuple[float, float, float, float] | None = None  # --view: the pictures' x and y ranges
    near: str | None = None  # --near PATCHES:DISTANCE: errors over the nodes near those boundaries (_near.py)
    rollout: bool = False  # --rollout: a transient run applied step after step from each trajectory's first state
    steps: int | None = None  # --rollout-steps N: a rollout's model applications (default: T - 1 strides)
    compression: str = COMPRESSIONS[0]  # --compression: of the ParaView files (_vtk.py: none, zlib, lz4)
    background: bool = True  # a rollout's files written by a background thread while the next step computes
    ensemble: list[str] | None = None  # --ensemble RUN2,...: runs averaged with this one (_ensemble.py)
    mirror_average: bool = False  # --mirror-average: with the mirrored sample's, mirrored back (_mirror_average.py)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PredictConfig:
        """From ``asdict(config)`` (what a command hands its ranks)."""
        values = dict(values)
        for key in ("view", "direction", "lift_direction"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


# ------------------------------------------------------------------------------------------------
# Inputs: the samples


def parse_view(text: str) -> tuple[float, float, float, float]:
    """``--view XMIN,XMAX,YMIN,YMAX`` as four finite numbers with XMIN < XMAX and YMIN < YMAX."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if (len(values) != 4 or not all(math.isfinite(v) for v in values) or values[0] >= values[1]
            or values[2] >= values[3]):
        raise ValueError(f"Expected --view XMIN,XMAX,YMIN,YMAX, four numbers with XMIN < XMAX and YMIN < YMAX "
                         f"(got {text!r})")
    return values  # type: ignore[return-value]


def select_samples(text: str | None, names: list[str], val: list[int]) -> list[int]:
    """Sample indices from ``--samples``: ``val`` (the default when there is a validation split),
    ``train``, ``all``, or a comma-separated list of names and indices."""
    if text is None:
        text = "val" if val else "all"
    if text == "all":
        return list(range(len(names)))
    if text == "val":
        if not val:
            raise ValueError("Expected a dataset with a validation split for --samples val "
                             "(it has none; pass --samples all)")
        return sorted(val)
    if text == "train":
        return [i for i in range(len(names)) if i not in set(val)]
    by_name = {n: i for i, n in enumerate(names)}
    picks: list[int] = []
    for item in (t.strip() for t in text.split(",")):
        if item in by_name:
            picks.append(by_name[item])
        elif item.isdigit() and int(item) < len(names):
            picks.append(int(item))
        else:
            raise ValueError(f"Expected --samples to list sample names or indices 0..{len(names) - 1}, "
                             f"or val/train/all (got {item!r})")
    return list(dict.fromkeys(picks))


def check_model_request(ckpt: dict[str, Any], run: str, model: str | None) -> None:
    """A run of your own model needs ``--model`` (never imported from the checkpoint); a
    MeshGraphNet run refuses one. One line, before any rank starts."""
    trained = ckpt.get("config", {}).get("model") or ""
    if trained and not model:
        raise ValueError(f"{run}: trained your own model ({trained}); pass --model with it to rebuild it "
                         "(predict imports code named on the command line only, never from a checkpoint)")
    if model and not trained:
        raise ValueError(f"{run}: trained the built-in MeshGraphNet; leave out --model")


def normalisation_of(ckpt: dict[str, Any], data: Any) -> Any:
    """The statistics the run trained with (stored in its checkpoint's config), or else the dataset's."""
    from meshshard.data import Normalisation

    stored = ckpt.get("config", {}).get("normalisation")
    if stored is None:
        return data.normalisation
    norm = Normalisation.from_dict(stored)
    checks = [("input", norm.inputs.channels, data.input_channels)]
    if data.target_channels:  # a dataset of inputs only has no targets to compare
        checks.append(("target", norm.targets.channels, data.target_channels))
    for what, theirs, mine in checks:
        if list(theirs) != list(mine):
            hint = ("; the run learnt the difference from its training cases' mean field: make these cases with "
                    "meshshard dataset ... --mean-field-from THE_RUN'S_DATA" if norm.target_offset is not None else "")
            raise ValueError(f"Expected {data.path} to have the run's {what} channels {list(theirs)} "
                             f"(got {list(mine)}){hint}")
    if norm.offset_sha256 is not None and (data.meta.get("mean_field") or {}).get("sha256") != norm.offset_sha256:
        raise ValueError(f"Expected {data.path} to carry the mean field the run trained with (the run learnt the "
                         "difference from it); this dataset's is another: make these cases with meshshard dataset "
                         "... --mean-field-from THE_RUN'S_DATA")
    theirs, mine = list(norm.edges.channels), list(data.edge_channels)
    if theirs != mine:  # the meshes' dimension: edge features are dpos[0..D-1], |dpos|
        d_run, d_data = len(theirs) - 1, len(mine) - 1
        hint = (" (the run's dataset was made with --collapse-2d: make this one with it too)"
                if d_run == 2 and d_data == 3 and data.meta.get("collapsed_2d") is not True else
                " (the run's dataset was one-cell-thick 3-D: make this one without --collapse-2d)"
                if d_run == 3 and data.meta.get("collapsed_2d") else "")
        raise ValueError(f"Expected {data.path} to have {d_run}-D meshes like the run's (got {d_data}-D){hint}")
    return norm


def partition_reader(cfg: PredictConfig, data: Any, run_cfg: dict[str, Any], ctx: Any, dtype: Any,
                      normaliser: Any) -> tuple[Path | None, DatasetReader | None]:
    """On R ranks: the partition into R parts (``--partition``, else the run's) and this rank's
    reader of it; on one process ``(None, None)``, the model runs on whole meshes."""
    if ctx.world_size == 1:
        return None, None
    parts = Path(cfg.partition or run_cfg.get("partition") or "")
    if not cfg.partition and not parts.is_dir():
        raise ValueError(f"{parts}: the run's partition folder is gone; pass --partition PARTS")
    whose = "the run's own partition, which the run needs" if not cfg.partition else "not for these meshes"
    meta = check_partition_matches(data, parts, hint=(
        f"it is {whose}: make one of {cfg.data} in a new folder and pass it: meshshard partition {cfg.data} "
        f"--parts {ctx.world_size} --out NEW_PARTS, then --partition NEW_PARTS"))
    if meta["num_parts"] != ctx.world_size:
        raise ValueError(f"Expected a partition into {plural(ctx.world_size, 'part')}, one per rank "
                         f"(got {meta['num_parts']} in {parts}); make one with meshshard partition {cfg.data} "
                         f"--parts {ctx.world_size} and pass --partition")
    reader = DatasetReader(data, parts, ctx.rank, None, device=ctx.device, dtype=dtype, normaliser=normaliser,
                           parts_meta=meta)  # the run's statistics, for the edge features too
    return parts, reader


def check_rollout_request(cfg: PredictConfig, run_cfg: dict[str, Any]) -> None:
    """A run of a task of trajectories predicts rollouts (``--rollout``), any other run does not;
    ``--rollout-steps`` is a positive count, with ``--rollout`` only. One line, before any collective."""
    task = get_task(str(run_cfg.get("task") or "steady"), run_cfg)
    if cfg.steps is not None and (not cfg.rollout or int(cfg.steps) < 1):
        raise ValueError(f"Expected --rollout-steps to be a positive number of steps, with --rollout (got {cfg.steps}"
                         + ("" if cfg.rollout else " without --rollout") + ")")
    if task.rolls_out and not cfg.rollout:
        raise ValueError(f"{cfg.run}: trained the {task.name} task, whose predictions are rollouts: pass --rollout")
    if cfg.rollout and not task.rolls_out:
        raise ValueError(f"{cfg.run}: trained the {task.name} task, which does not roll out (a run trained on a "
                         "trajectory dataset does); leave out --rollout")


def check_mirror_average(cfg: PredictConfig, run_config: dict[str, Any]) -> None:
    """``--mirror-average``: a steady prediction of a run trained with mirrored cases."""
    from ._mirror_average import POINT_MODEL, mirror_of_run

    if cfg.rollout:
        raise ValueError("Expected --mirror-average without --rollout (a trajectory dataset has no mirrors)")
    if run_config.get("architecture") == "ball-attention" and not run_config.get("model"):
        raise ValueError(f"{cfg.run}: {POINT_MODEL}")
    mirror_of_run(run_config, open_dataset(cfg.data).meta, cfg.run)


def check_prediction_request(cfg: PredictConfig) -> None:
    """Every refusal of :func:`predict` that files alone decide, as a one-line ``ValueError``,
    before any rank starts: the folders, where PRED goes, and the model (a run of your own model
    needs ``model``, whose file is imported here once)."""
    check_input_folders((cfg.run, "run folder"), (cfg.data, "dataset folder"))
    check_compression(cfg.compression)
    # PRED may be inside RUN (run/pred: train --force deletes only its own files), not RUN itself
    check_apart(cfg.out, (cfg.data, "dataset folder"),
                *(((cfg.partition, "partition folder"),) if cfg.partition else ()))
    if Path(cfg.out).resolve() == Path(cfg.run).resolve():
        raise ValueError(f"{cfg.out}: Expected an output folder apart from the run folder (got the run folder; "
                         f"{Path(cfg.out) / 'pred'} would do)")
    # the model it trained, from a look at the checkpoint's entries (its tensors are not read; a
    # checkpoint that does not load so is read whole, for the one-line reason); the ranks check it whole
    ckpt = peek_run(cfg.run, cfg.checkpoint)
    check_model_request(ckpt, cfg.run, cfg.model)
    check_rollout_request(cfg, ckpt.get("config", {}))
    check_ensemble(cfg.run, ckpt.get("config", {}), cfg.ensemble, cfg.checkpoint, cfg.rollout,
                   partition=cfg.partition)
    if cfg.partition:
        check_model_radius(ckpt.get("config", {}), cfg.partition)
    if cfg.mirror_average:
        check_mirror_average(cfg, ckpt.get("config", {}))
    if cfg.model:
        load_factory(cfg.model)
    if cfg.near is not None:  # what DATA decides
        data = open_dataset(cfg.data)
        check_near_request(data, cfg.near, select_samples(cfg.samples, [str(e["name"]) for e in data.meta["samples"]],
                                                          [int(v) for v in data.val]))
    if (cfg.boundary or cfg.pressure or cfg.shear or cfg.force_reference or cfg.reference_area is not None
            or cfg.direction is not None or cfg.lift_direction is not None):  # what DATA and the run decide
        data = open_dataset(cfg.data)
        run_cfg = ckpt.get("config", {})
        try:
            fields = field_slices(get_task(str(run_cfg.get("task") or "steady"), run_cfg).output_fields(data, run_cfg))
        except (KeyError, TypeError, ValueError):  # the ranks refuse it, from the whole checkpoint
            fields = None
        names = [str(e["name"]) for e in data.meta["samples"]]
        picks = select_samples(cfg.samples, names, [int(v) for v in data.val])
        if fields is None:
            check_boundary_names(data, cfg.boundary, cfg.force_reference, picks)
        else:
            check_boundary_request(data, fields, cfg.boundary, cfg.pressure, cfg.shear, cfg.force_reference, picks,
                                   cfg.reference_area, cfg.direction, cfg.lift_direction)
