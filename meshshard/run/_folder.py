"""The run folder: the files ``meshshard train`` writes, and every rule about them, in one place.

::

    RUN/
      checkpoint.pt   model, optimizer, completed steps, loss history, RNG state, config;
                      tensors and plain values only, with a checksum (:mod:`._checkpoint`)
      log.jsonl       one record per step (loss, seconds, memory), per validation, per event
      first_step.pt   the batch-0 loss and the synced gradients of the first step (for checks)
      loss.png        training and validation loss (:func:`meshshard.run._report.write_loss_plot`)
      config.toml     the resolved recipe the run trains with (:mod:`._recipe_file`; rewritten on
                      --resume, whose changes the checkpoint's config was checked against)

- :data:`CHECKPOINT`, :data:`LOG`, :data:`FIRST_STEP`, :data:`LOSS_PLOT`, :data:`CONFIG`: the names, stated once;
  :data:`RUN_FILES`: all of them, the only files ``--force`` may delete.
- :func:`read_run`: the checkpoint of a run folder (read from inside it only).
- :func:`check_run_folder`: an existing RUN is never silently replaced. A RUN holding a
  checkpoint or a log is refused without ``--resume`` (continue it) or ``--force`` (start over,
  deleting only :data:`RUN_FILES`, and only when they are a run's: :func:`why_not_a_run`); ``--resume``
  without a checkpoint is an error. Files with those names that are not a run (the user's own
  ``checkpoint.pt``, say) are refused, with ``--force`` too.
- :func:`check_resume`: a resumed run must keep what its exactness depends on (the model's shape,
  the dtype, the seed and the data-parallel schedule, the dataset, the partition's mesh); a changed
  learning rate is applied and logged (:func:`lr_change`).
- :func:`resume_hint`: what to do after a stopped run.
- :func:`read_log`: the records of ``log.jsonl``; :func:`check_log`: its first damaged line.

All checks run on every rank, from files only, before any collective, so a refusal stops every
rank with the same one-line message.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshshard.partition import Refusals, check_destination, loads_json, read_json
from meshshard.partition.files import open_regular

from ._checkpoint import load_checkpoint, peek
from ._recipe_file import RECIPE_HEADER

__all__ = [
    "CHECKPOINT",
    "BEST",
    "CHECKPOINTS",
    "checkpoint_path",
    "peek_run",
    "checkpoint_used",
    "LOG",
    "FIRST_STEP",
    "LOSS_PLOT",
    "CONFIG",
    "RUN_FILES",
    "EXACTNESS_KEYS",
    "read_run",
    "check_run_folder",
    "why_not_a_run",
    "run_identity",
    "check_resume",
    "lr_change",
    "read_log",
    "check_log",
    "run_val_losses",
    "delete_run_files",
    "resume_hint",
    "run_summary",
]

#: The run's checkpoint (:mod:`._checkpoint`'s format).
CHECKPOINT = "checkpoint.pt"
#: The checkpoint of the lowest validation loss so far (the same format; with ``--val-every``).
BEST = "best.pt"
#: The checkpoints a run can be read from: ``--checkpoint best|last``.
CHECKPOINTS = ("best", "last")
#: One JSON record a line: steps, validations, events.
LOG = "log.jsonl"
#: The first step's loss and gradients.
FIRST_STEP = "first_step.pt"
#: The loss curve.
LOSS_PLOT = "loss.png"
#: The resolved recipe of the run (``meshshard train --config RUN/config.toml`` trains it again).
CONFIG = "config.toml"
#: The files ``meshshard train`` writes in RUN (and ``--force`` may delete); nothing else is touched.
RUN_FILES = (CHECKPOINT, BEST, LOG, FIRST_STEP, LOSS_PLOT, CONFIG)
#: Settings that a resumed run must keep, or its steps would not repeat the uninterrupted run's.
EXACTNESS_KEYS = ("model", "model_args", "architecture", "latent_size", "hidden_layers", "message_passing_steps",
                  "activation", "global_attention", "attention_heads", "attention_slices", "dtype",
                  "precision", "seed", "data_parallel", "clip_grad", "batch",
                  "lr_schedule", "warmup", "lr_floor", "noise_std",
                  "rollout_train", "max_points", "loss_weight", "force_loss", "relative_loss")


def _holds_a_run(out: Path) -> str:
    """The refusal of a RUN that holds a run, without ``--resume`` or ``--force``."""
    if not (out / CHECKPOINT).is_file():  # a run that stopped before its first checkpoint: nothing to continue
        return f"{out}: holds a run that stopped before it saved a checkpoint (log.jsonl); pass --force to start over"
    held = [name for name in (CHECKPOINT, LOG) if (out / name).is_file()]
    return f"{out}: holds a run ({', '.join(held)}); pass --resume to continue it or --force to start over"


#: A run folder's words for ``check_destination``'s refusals.
_REFUSALS = Refusals(current="{out}: is the current folder or one of its parents; refusing to write a run there "
                             "(give a new folder)",
                     link="{out}: exists and is not a folder", not_empty=_holds_a_run)


def _holds_run_files(out: Path) -> bool:
    return any((out / name).exists() or (out / name).is_symlink() for name in RUN_FILES)


def _check_is_a_run(out: Path) -> None:
    """Raise unless the files of :data:`RUN_FILES` in ``out`` are a run's (:func:`why_not_a_run`)."""
    for name in RUN_FILES:
        if (out / name).is_symlink() or (out / name).exists() and not (out / name).is_file():
            raise ValueError(f"{out}: holds {name}, which is not a file meshshard train wrote (a link or a folder); "
                             "refusing to write over it: pick another --out")
        if (out / name).is_file() and (links := os.lstat(out / name).st_nlink) > 1:
            raise ValueError(f"{out}: holds {name}, a hard link ({links} names share the file: one may be yours); "
                             "refusing to write over it: pick another --out")
    not_ours = why_not_a_run(out)
    if not_ours:
        raise ValueError(f"{out}: holds {not_ours}; refusing to write over it, even with --force: pick another --out")


def check_run_folder(out: str | os.PathLike[str], resume: bool, force: bool) -> list[Path]:
    """Raise a one-line ``ValueError`` unless RUN may be used as asked; return what ``--force``
    must delete (our files only).

    ``meshshard.partition.check_destination``'s rule for a folder written in place: RUN may hold
    anything besides :data:`RUN_FILES`; files by those names must be a run's, even with ``--force``;
    never the current folder or one of its parents (as a partition or a dataset).
    """
    if resume and force:
        raise ValueError("Expected --resume or --force, not both (--resume continues RUN, --force starts it over)")
    out = Path(out)
    check_destination(out, force=force or resume,  # --resume, like --force, takes a RUN that holds a run
                      is_ours=_check_is_a_run, in_place=True, holds=_holds_run_files, ours_first=True,
                      refusals=_REFUSALS, current_ok=False)  # a run among the user's files: in a folder of its own
    if resume:
        if not (out / CHECKPOINT).is_file():
            if (out / LOG).is_file():
                raise ValueError(f"{out}: nothing to resume (no checkpoint.pt): the run stopped before it saved one; "
                                 "pass --force instead of --resume to start it over")
            raise ValueError(f"{out}: nothing to resume (no checkpoint.pt); run without --resume to start")
        check_log(out / LOG)
        return []
    return [out / name for name in RUN_FILES if (out / name).is_file()] if force else []


def why_not_a_run(out: Path) -> str | None:
    """None when the files of :data:`RUN_FILES` in ``out`` are a run of ``meshshard train``'s: a
    ``checkpoint.pt`` in its format, and a ``log.jsonl`` of its records (at least one of the two;
    ``first_step.pt`` and ``loss.png`` alone are no run). Else what is not ours."""
    ckpt, log = out / CHECKPOINT, out / LOG
    if ckpt.is_file():
        if (peek(ckpt) or {}).get("format") != "meshshard-checkpoint":
            return "checkpoint.pt, which is not a readable meshshard checkpoint (another program's, or damaged)"
    if log.is_file() and not log.is_symlink():
        with open_regular(log) as f:
            first = f.readline(1 << 16)
        try:
            record = loads_json(first, log) if first.strip() else {"step": 0}  # empty: made, nothing logged yet
        except ValueError:  # beside our checkpoint, our log damaged (check_log names it on --resume)
            record = {"step": 0} if ckpt.is_file() else None
        if not isinstance(record, dict) or "step" not in record:
            return "log.jsonl, which is not a log of meshshard train's"
    best = out / BEST
    if best.is_file() and (peek(best) or {}).get("format") != "meshshard-checkpoint":
        return "best.pt, which is not a readable meshshard checkpoint (another program's, or damaged)"
    config = out / CONFIG
    if config.is_file() and not _starts_with(config, RECIPE_HEADER):
        return "config.toml, which is not a recipe meshshard train wrote"
    first = out / FIRST_STEP
    if first.is_file():
        if set(peek(first) or {}) != {"loss", "grads", "sample"}:
            return "first_step.pt, which is not the first step of a meshshard run"
    if not ckpt.is_file() and not log.is_file():
        present = [name for name in RUN_FILES if (out / name).is_file()]
        return f"{' and '.join(present)} but no run of meshshard train's (no checkpoint.pt or log.jsonl)"
    return None


def _starts_with(path: Path, header: str) -> bool:
    with open_regular(path) as f:
        return f.read(len(header.encode())) == header.encode()


def delete_run_files(paths: Sequence[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def run_identity(partition_meta: Mapping[str, Any], data_path: str | os.PathLike[str]) -> dict[str, Any]:
    """What the run's data and partition are, for :func:`check_resume`: the partition's meshes
    (node counts and checksums, from ``check_partition_matches``) and the dataset's meshes,
    samples and channels."""
    identity: dict[str, Any] = {
        "partition_meshes": [[int(m.get("num_nodes", 0)), m.get("sha256")] for m in partition_meta.get("meshes", [])],
    }
    try:
        meta = read_json(Path(data_path) / "dataset.json")
    except (OSError, ValueError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    identity["dataset"] = {
        "num_samples": meta.get("num_samples"),
        "meshes": [m.get("sha256") for m in meta.get("meshes", [])],
        "input_channels": meta.get("input_channels"),
        "target_channels": meta.get("target_channels"),
    }
    return identity


def check_resume(saved_config: Mapping[str, Any], saved_identity: Mapping[str, Any] | None,
                 config: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Raise a one-line ``ValueError`` naming every setting a resumed run changed that breaks exactness."""
    changed = [f"{key} {saved_config[key]!r} -> {config[key]!r}" for key in EXACTNESS_KEYS
               if key in saved_config and saved_config[key] != config.get(key)]
    if saved_identity:
        if saved_identity.get("dataset") != identity.get("dataset"):
            changed.append(f"the dataset ({config.get('data')} is not the one the run trained on)")
        if saved_identity.get("partition_meshes") != identity.get("partition_meshes"):
            changed.append(f"the partition's mesh ({config.get('partition')} was made for another mesh)")
    if changed:
        raise ValueError(
            f"{config.get('out')}: cannot resume with changed settings: {'; '.join(changed)} "
            "(use the run's settings, or --force to start over)"
        )


def lr_change(saved_config: Mapping[str, Any], lr: float) -> float | None:
    """The run's previous learning rate when ``lr`` differs from it, else ``None``."""
    old = saved_config.get("lr")
    return float(old) if old is not None and float(old) != float(lr) else None


def _log_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a ``log.jsonl`` (none for a link or a special file, such as a FIFO that
    would block the reader)."""
    if Path(path).is_symlink() or not Path(path).is_file():
        return []
    try:
        return Path(path).read_text(errors="replace").splitlines(keepends=True)
    except OSError:
        return []


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl`` (an unreadable line is skipped, :func:`check_log` names it;
    a link or a special file reads as no records). Each line is parsed strictly
    (``meshshard.partition.loads_json``: no NaN, no nesting deep enough to exhaust recursion)."""
    records = []
    for line in _log_lines(path):
        try:
            records.append(loads_json(line, path))
        except ValueError:
            continue
    return records


def check_log(path: str | os.PathLike[str]) -> None:
    """Raise a one-line ``ValueError`` naming the first damaged line of a run's ``log.jsonl``
    (not strict JSON, or not a record), before a resume rewrites it; the last line may be cut
    short (no newline: the write a killed run did not finish)."""
    lines = _log_lines(path)
    for number, line in enumerate(lines, 1):
        if not line.strip() or number == len(lines) and not line.endswith("\n"):
            continue
        try:
            record = loads_json(line, f"line {number}")
            why = None if isinstance(record, dict) else "not a record"
        except ValueError as err:
            why = str(err).removeprefix(f"line {number}: ")
        if why is not None:
            raise ValueError(f"{path}: damaged at line {number} ({why}); move it aside to resume from "
                             f"{CHECKPOINT}, or pass --force to start over")


def run_val_losses(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """``(step, validation loss)`` of a log's records; a loss logged as null (it was NaN) is left out."""
    return [(int(r["step"]), float(r["val_loss"])) for r in records
            if isinstance(r.get("val_loss"), (int, float)) and not isinstance(r.get("val_loss"), bool)]


def checkpoint_path(run: str | os.PathLike[str], checkpoint: str = "last") -> Path:
    """The file of a run's ``checkpoint``: ``"last"`` (:data:`CHECKPOINT`, the latest step) or
    ``"best"`` (:data:`BEST`, the lowest validation loss; the last one for a run that has none,
    trained without ``--val-every``)."""
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"Expected --checkpoint best or last (got {checkpoint!r})")
    best = Path(run) / BEST
    return best if checkpoint == "best" and os.path.lexists(best) else Path(run) / CHECKPOINT


def checkpoint_used(run: str | os.PathLike[str], checkpoint: str = "last") -> str:
    """Which checkpoint :func:`read_run` reads for ``checkpoint``: ``"best"`` only where RUN has a
    best.pt (``--checkpoint best`` of a run trained without validation reads the last one, and says so)."""
    return "best" if checkpoint_path(run, checkpoint).name == BEST else "last"


def read_run(run: str | os.PathLike[str], checkpoint: str = "last") -> dict[str, Any]:
    """The checkpoint of a run folder (``checkpoint``: ``"last"`` or ``"best"``, see
    :func:`checkpoint_path`), read from inside it (tensors and plain values only, checksum checked)."""
    path = checkpoint_path(run, checkpoint)
    if path.is_symlink():
        raise ValueError(f"{path}: is a link; a run's checkpoint is read from inside its folder only")
    if not path.exists():
        raise ValueError(f"{run}: no {CHECKPOINT} (not a run folder of meshshard train, or no step finished yet)")
    return load_checkpoint(path)  # a FIFO, a device or a folder in its place: refused in one line, never opened


def peek_run(run: str | os.PathLike[str], checkpoint: str = "last") -> dict[str, Any]:
    """A run's checkpoint entries for a check before any rank starts: a look at them, its tensors
    not read, where that can be; else :func:`read_run` (the whole, for the one-line reason)."""
    path = checkpoint_path(run, checkpoint)
    seen = peek(path) if not path.is_symlink() else None
    return seen if isinstance((seen or {}).get("config"), dict) else read_run(run, checkpoint)


def resume_hint(out: str | os.PathLike[str]) -> str | None:
    """What to do after a stopped run: resume from its last checkpoint, or start over without one."""
    ckpt = Path(out) / CHECKPOINT
    if not Path(out).is_dir():  # stopped before it made RUN: nothing to say
        return None
    if not ckpt.is_file():
        return f"{out} has no checkpoint yet: start it over with --force"
    step = (peek(ckpt) or {}).get("step")
    return f"{ckpt} holds step {int(step)}: continue with --resume" if isinstance(step, int) else None


def run_summary(run: str | Path) -> dict[str, Any]:
    """The facts ``meshshard info RUN`` prints, as plain values (``--json``)."""
    from ..tasks import get_task

    ckpt = read_run(run)
    cfg = dict(ckpt.get("config") or {})
    norm = cfg.pop("normalisation", None) or {}
    records = read_log(Path(run) / LOG)
    losses = [float(v) for v in ckpt.get("losses", [])]
    val = run_val_losses(records)
    rolled = [(int(r["step"]), float(v), r.get("val_rollout_steps")) for r in records
              if isinstance(v := r.get("val_rollout_rmse"), (int, float)) and not isinstance(v, bool)]
    finite = [(i, v) for i, v in enumerate(losses) if math.isfinite(v)]
    best = min(finite, key=lambda iv: iv[1]) if finite else None
    model = cfg.get("model") or ""
    return {
        "run": str(run),
        "step": int(ckpt.get("step", 0)),
        "steps": cfg.get("steps"),
        "world_size": ckpt.get("world_size"),
        # the weights trained, as the banner counts them (a checkpoint from before it was recorded: the
        # state dict, buffers included)
        "parameters": int(cfg.get("num_parameters") or sum(v.numel() for v in (ckpt.get("model") or {}).values())),
        "model": ({"kind": "your own", "spec": model, "model_args": cfg.get("model_args") or {}} if model else
                  {"kind": {"transolver": "Transolver", "ball-attention": "BallAttentionNet"}[cfg["architecture"]],
                   "model_args": cfg.get("model_args") or {}}
                  if cfg.get("architecture") in ("transolver", "ball-attention") else
                  {"kind": "MeshGraphNet", **{k: cfg.get(k) for k in ("latent_size", "hidden_layers",
                                                                      "message_passing_steps", "activation",
                                                                      "global_attention")}}),
        "settings": {k: cfg.get(k) for k in ("lr", "dtype", "precision", "seed", "data_parallel", "checkpoint_every")},
        "task": {"name": str(cfg.get("task") or "steady"), "noise_std": cfg.get("noise_std") or 0,
                 "rollout_train": cfg.get("rollout_train") or 1, "loss_weight": dict(cfg.get("loss_weight") or {}),
                 "force_loss": dict(cfg.get("force_loss") or {}), "relative_loss": bool(cfg.get("relative_loss"))},
        "data": cfg.get("data"),
        "partition": cfg.get("partition"),
        "inputs": list(norm.get("input_channels", [])),
        "targets": get_task(str(cfg.get("task") or "steady")).output_fields(None, cfg | {"normalisation": norm}),
        "loss": {"first": losses[0] if losses else None, "last": losses[-1] if losses else None,
                 "best": best[1] if best else None, "best_step": best[0] if best else None},
        "val_loss": {"last": val[-1][1], "last_step": val[-1][0],
                     "best": min(v for _, v in val), "best_step": min(val, key=lambda sv: sv[1])[0]} if val else None,
        # a transient run's validation rollout (--val-rollout): normalised RMSE; best.pt holds its lowest
        "val_rollout_rmse": {"last": rolled[-1][1], "last_step": rolled[-1][0], "steps": rolled[-1][2],
                             "best": min(v for _, v, _ in rolled),
                             "best_step": min(rolled, key=lambda sv: sv[1])[0]} if rolled else None,
    }
