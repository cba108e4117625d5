
"""``meshshard train``: the command line of :func:`meshshard.run.train`.

Argument parsing, a recipe file (``--config FILE``: TrainConfig's fields as TOML, the flags given
override it; ``--print-config`` prints the resolved recipe and trains nothing), the settings a
resumed run takes from its checkpoint, the checks made before any rank starts, and the launch; the
training itself is the library's (:mod:`meshshard.run`).

Precedence, highest first: a flag on the command line, the recipe file, on ``--resume`` the run's
checkpoint, then TrainConfig's defaults.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.run import (
    AUTO_STEPS,
    AUTO_WARMUP,
    BUILTIN_MODELS,
    CHECKPOINT,
    POINT_MODELS,
    TrainConfig,
    builtin_args,
    check_training,
    load_checkpoint,
    normalise_spec,
    parse_model_args,
    read_recipe,
    recipe_text,
    resume_hint,
    train,
)
from meshshard.tasks import parse_force_loss, parse_loss_weight

from ._launch import as_rank, run_command, writing_command

__all__ = ["register"]


#: The largest ``--noise-std`` (normalised units: the state's own spread is 1; MeshGraphNets used 0.003-0.02).
MAX_NOISE_STD = 10.0


def _auto_or_steps(auto: int, least: int, not_a_number: str, too_few: str) -> Any:
    """A flag's parser of ``auto`` (stored as ``auto``) or a number of steps of at least ``least``;
    the two refusals name what the flag takes (``{text!r}`` in them is the value given)."""
    def parse(text: str) -> int:
        if text.strip().lower() == "auto":
            return auto
        try:
            steps = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(not_a_number.format(text=text)) from None
        if steps < least:  # -1 is how auto is stored, never a spelling of it
            raise argparse.ArgumentTypeError(too_few.format(text=text))
        return steps
    return parse


#: ``--warmup``: ``auto`` (:data:`AUTO_WARMUP`) or a number of steps, 0 for none.
_warmup = _auto_or_steps(AUTO_WARMUP, 0, "Expected auto or a number of steps (got {text!r})",
                         "Expected auto, 0 (none) or a positive number of steps (got {text!r})")
#: ``--steps``: a number of steps, or ``auto`` (:data:`AUTO_STEPS`: as many as fit ``--max-time``).
_steps = _auto_or_steps(AUTO_STEPS, 1, "Expected a number of steps or auto (got {text!r})",
                        "Expected a positive number of steps or auto (got {text!r})")


def _check_counts(args: Any) -> str | None:
    """The first count or rate on the command line that cannot work, as a one-line error; else None."""
    for flag, value in (("--steps", 1 if args.steps == AUTO_STEPS else args.steps), ("--every", args.every),
                        ("--log-every", args.log_every),
                        ("--latent", args.latent), ("--mp-steps", args.mp_steps),
                        ("--data-parallel", args.data_parallel),
                        ("--batch", args.batch), ("--rollout-train", args.rollout_train)):
        if value < 1:
            return f"Expected {flag} to be a positive integer (got {value})"
    if args.hidden_layers < 0:
        return f"Expected --hidden-layers to be 0 or more (got {args.hidden_layers})"
    if args.global_attention < 0 or args.attention_heads < 1 or args.attention_slices < 1:
        return (f"Expected --global-attention 0 (off) or more, and positive --attention-heads and --attention-slices "
                f"(got {args.global_attention}, {args.attention_heads}, {args.attention_slices})")
    if args.val_rollout < 0:
        return f"Expected --val-rollout to be 0 (off) or a positive integer (got {args.val_rollout})"
    if args.val_every < 0:
        return f"Expected --val-every to be 0 (off) or a positive integer (got {args.val_every})"
    if args.nproc < 0:
        return f"Expected --nproc to be 0 (not launching) or a positive integer (got {args.nproc})"
    if not (np.isfinite(args.lr) and args.lr > 0):
        return f"Expected --lr to be a positive number (got {args.lr})"
    if args.warmup < AUTO_WARMUP:
        return f"Expected --warmup to be auto, 0 (none) or a positive integer (got {args.warmup})"
    if args.warmup > args.steps and args.steps != AUTO_STEPS:
        return (f"Expected --warmup at most --steps (got {args.warmup} > {args.steps}): the learning rate would "
                "never reach --lr")
    if args.noise_std > MAX_NOISE_STD:
        return (f"Expected --noise-std in the state's normalised units, at most {MAX_NOISE_STD:g} (got "
                f"{args.noise_std:g}): noise that large drowns the state")
    if not (np.isfinite(args.lr_floor) and 0 <= args.lr_floor <= 1):
        return f"Expected --lr-floor to be a fraction between 0 and 1 (got {args.lr_floor})"
    if args.lr_schedule == "exponential" and args.lr_floor <= 0:
        return f"Expected --lr-floor above 0 for --lr-schedule exponential (got {args.lr_floor})"
    if not (np.isfinite(args.clip_grad) and args.clip_grad >= 0):
        return f"Expected --clip-grad to be 0 (off) or a positive number (got {args.clip_grad})"
    if not (np.isfinite(args.noise_std) and args.noise_std >= 0):
        return f"Expected --noise-std to be 0 (off) or a positive number (got {args.noise_std})"
    return None


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``1.5h``, ``1h30m`` or ``2d``; ``ValueError`` otherwise."""
    import re

    given = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d*)?)\s*([smhd]?)", given)
    if not given or not parts or re.sub(r"(\d+(?:\.\d*)?)\s*([smhd]?)", "", given).strip():
        raise ValueError(f"Expected --max-time as a duration such as 900, 90s, 15m, 1.5h or 1h30m (got {text!r})")
    return sum(float(number) * _UNITS[unit or "s"] for number, unit in parts)


#: The built-in MeshGraphNet's settings (argparse default None: given or not is known), and their defaults.
_MESHGRAPHNET_FLAGS = {"latent": "--latent", "hidden_layers": "--hidden-layers", "mp_steps": "--mp-steps",
                       "activation": "--activation", "checkpoint_steps": "--checkpoint-steps",
                       "keep_activations": "--keep-activations",
                       "global_attention": "--global-attention", "attention_heads": "--attention-heads",
                       "attention_slices": "--attention-slices"}


#: Settings a resumed run takes from its checkpoint when they are not on the command line (argparse
#: default None): argument name -> config key. A new run takes ``TrainConfig``'s defaults, stated there once.
_RUN_SETTINGS = {"steps": "steps", "latent": "latent_size", "hidden_layers": "hidden_layers",
                 "mp_steps": "message_passing_steps", "activation": "activation", "dtype": "dtype",
                 "precision": "precision", "seed": "seed", "data_parallel": "data_parallel", "lr": "lr",
                 "every": "checkpoint_every", "log_every": "log_every", "val_every": "val_every",
                 "checkpoint_steps": "checkpoint_steps", "keep_activations": "keep_activations",
                 "max_time": "max_time", "clip_grad": "clip_grad",
                 "batch": "batch", "lr_schedule": "lr_schedule", "warmup": "warmup", "lr_floor": "lr_floor",
                 "global_attention": "global_attention", "attention_heads": "attention_heads",
                 "attention_slices": "attention_slices", "noise_std": "noise_std",
                 "rollout_train": "rollout_train", "val_rollout": "val_rollout", "relative_loss": "relative_loss"}
_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}
#: TrainConfig's fields that the parsed arguments hold under another name (the flag's).
_ARGUMENT = {"latent_size": "latent", "message_passing_steps": "mp_steps", "checkpoint_every": "every"}
#: The values a setting may take, for the flag and the recipe file alike.
_CHOICES = {"dtype": ("float32", "float64"), "precision": ("fp32", "bf16-mixed", "tf32"),
            "lr_schedule": ("constant", "cosine", "exponential")}
#: What must be given, on the command line or in the recipe: argument name -> how usage names it.
_REQUIRED = {"partition": "PARTS", "data": "--data", "out": "--out"}
#: What a run of a version before a setting existed trained with, where that is not today's default.
_BEFORE = {"lr_schedule": "constant", "warmup": 0}


def _saved_checkpoint(args: Any) -> dict[str, Any] | None:
    """With --resume, RUN/checkpoint.pt (read once here, for the settings left out and the checks);
    else, or when it is missing or unreadable, None: the run-folder check then refuses in one line."""
    if not args.resume:
        return None
    try:
        return load_checkpoint(Path(args.out) / CHECKPOINT)
    except (ValueError, OSError):
        return None


def _model_settings(args: Any, saved: dict[str, Any]) -> str | None:
    """Fill the settings left out: on --resume the run's (``saved``), else the defaults; with
    --model, refuse MeshGraphNet's flags (one line) and read --model-args (on --resume with the
    run's --model, the run's arguments unless given). The model file itself is never taken from
    the checkpoint: code is imported only from a --model on the command line."""
    if saved.get("model") and not args.model:
        return (f"{args.out}: the run trained your own model ({saved['model']}); pass --model "
                f"{shlex.quote(str(saved['model']))} to resume it (code is never imported from what a checkpoint says)")
    # a built-in name (--model transolver) is no code: it is the run's architecture, its --model-args its settings
    if args.model in BUILTIN_MODELS:
        args.architecture, args.model = args.model, None
    else:
        args.architecture = None if args.model else str(saved.get("architecture") or "meshgraphnet")
    given = [flag for key, flag in _MESHGRAPHNET_FLAGS.items() if getattr(args, key) not in (None, False)]
    other_model = bool(args.model) or args.architecture not in (None, "meshgraphnet")
    for key, name in _RUN_SETTINGS.items():
        default = _DEFAULTS[name]
        if getattr(args, key) is None:
            keep = not (other_model and key in _MESHGRAPHNET_FLAGS)
            setattr(args, key, saved.get(name, _BEFORE.get(name, default) if saved else default) if keep else default)
    if given and other_model:
        what, whose = ("--model", "your") if args.model else (f"--model {args.architecture}", "the")
        return (f"{', '.join(given)} set(s) the built-in MeshGraphNet; with {what}, give {whose} model's settings "
                "as --model-args '{\"name\": value}'")
    if not args.model:
        if args.architecture == "meshgraphnet":
            return "Expected --model-args only with --model" if args.model_args else None
        try:  # a built-in model's settings: given, or on --resume the run's
            same = saved.get("architecture") == args.architecture
            args.model_args = (dict(saved.get("model_args") or {}) if args.model_args is None and same
                               else parse_model_args(args.model_args))
            builtin_args(args.architecture, args.model_args)
        except ValueError as err:
            return str(err)
        return None
    try:
        args.model = normalise_spec(args.model)
        if args.model_args is None and saved.get("model") == args.model:
            args.model_args = dict(saved.get("model_args") or {})
        else:
            args.model_args = parse_model_args(args.model_args)
    except ValueError as err:
        return str(err)
    return None


def _max_points(args: Any, saved: dict[str, Any]) -> str | None:
    """Fill ``--max-points`` when it is left out: on --resume the run's; else, for a point model, the
    dataset's (``meshshard dataset --max-points``), for a graph model 0 (every node: its message
    passing needs every edge), with a note when the dataset asks for a subset."""
    if args.max_points is not None:
        return None if args.max_points >= 0 else f"Expected --max-points to be 0 or more (got {args.max_points})"
    if saved:  # --resume: the run's (a run from before --max-points trained on every point)
        args.max_points = int(saved.get("max_points") or 0)
        return None
    try:
        from meshshard.data import open_dataset

        recorded = int(open_dataset(args.data).meta.get("max_points") or 0)
    except (ValueError, OSError, TypeError):
        recorded = 0  # the dataset's own refusal comes from check_training, in one line
    point_model = not args.model and args.architecture in POINT_MODELS
    args.max_points = recorded if point_model else 0
    if recorded and not point_model and not args.quiet and os.environ.get("RANK", "0") == "0":
        print(f"note: {args.data} asks for --max-points {recorded}; only point models (--model ball-attention or "
              "transolver) train on a subset, this model trains on every node", file=sys.stderr)
    return None


def _loss_weight(args: Any, saved: dict[str, Any]) -> str | None:
    """``--loss-weight`` (repeated, or a recipe's table) as ``{name: W}``; left out: on --resume
    the run's, else none."""
    given = args.loss_weight if args.loss_weight is not None else saved.get("loss_weight")
    forces = args.force_loss if args.force_loss is not None else saved.get("force_loss")
    try:
        args.loss_weight = parse_loss_weight(given)
        args.force_loss = parse_force_loss(forces)
    except ValueError as err:
        return str(err)
    return None


def _selftest_hint(model: str | None, model_args: str | None, resume: bool) -> str | None:
    """On a run's first start with --model (not on --resume; rank 0 only), the one line that
    suggests checking the model on shards first."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    if not model or model in BUILTIN_MODELS or resume or rank != "0":
        return None
    given = f"--model {shlex.quote(model)}" + (f" --model-args {shlex.quote(model_args)}" if model_args else "")
    return (f"note: check that your model on shards equals one process (output and every gradient) with: "
            f"meshshard selftest {given}")


def _file_value(parse: Any) -> Any:
    """A flag's parser made one for a recipe file's text value (``max_time = "13m"``, ``warmup = "auto"``)."""
    def convert(value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"Expected a number or a string (got {value!r})")
        try:
            return parse(value)
        except argparse.ArgumentTypeError as err:
            raise ValueError(str(err)) from None
    return convert


def _model_from_recipe(args: Any, recipe: dict[str, Any], where: str) -> str | None:
    """The recipe's model (``model``, or a built-in's ``architecture`` when ``model`` is empty) and
    ``model_args`` (a table, or its JSON text), where the command line gave none."""
    model, architecture = recipe.pop("model", None), recipe.pop("architecture", None)
    if architecture is not None and architecture not in BUILTIN_MODELS:
        return f"{where}: Expected 'architecture' to be one of {', '.join(BUILTIN_MODELS)} (got {architecture!r})"
    model_args = recipe.pop("model_args", None)
    names_one = bool(model or architecture)
    from_file = args.model is None and names_one
    if from_file:
        args.model = model or architecture
    # the file's arguments go with the file's model (or with the command line's, when the file names none)
    if args.model_args is None and model_args and (from_file or not names_one):
        args.model_args = model_args if isinstance(model_args, str) else json.dumps(model_args)
    return None


def _apply_recipe(args: Any) -> str | None:
    """``--config FILE``: its settings fill what the command line left out (a flag given overrides
    the file); then what must be given is checked. A one-line problem, or None."""
    if args.config:
        where = args.config
        try:
            recipe = read_recipe(where, TrainConfig, convert={"max_time": _file_value(_duration),
                                                              "warmup": _file_value(_warmup),
                                                              "steps": _file_value(_steps)},
                                 other_names={flag: key for key, flag in _ARGUMENT.items()})
        except ValueError as err:
            return str(err)
        for key, choices in _CHOICES.items():
            if key in recipe and recipe[key] not in choices:
                return f"{where}: Expected {key!r} to be one of {', '.join(choices)} (got {recipe[key]!r})"
        problem = _model_from_recipe(args, recipe, where)
        if problem:
            return problem
        other_model = args.model not in (None, "meshgraphnet")
        for key, value in recipe.items():
            name = _ARGUMENT.get(key, key)
            if other_model and name in _MESHGRAPHNET_FLAGS and value == _DEFAULTS[key]:
                continue  # a printed recipe of another model holds MeshGraphNet's defaults: nothing was set
            if getattr(args, name, None) is None or getattr(args, name) is False:  # not on the command line
                setattr(args, name, value)
    missing = [shown for name, shown in _REQUIRED.items() if not getattr(args, name)]
    if missing:
        return f"the following arguments are required: {', '.join(missing)} (on the command line or in --config)"
    return None


def _run(args: Any) -> int:  # one writer per RUN, before the checkpoint is read or any rank starts
    problem = _apply_recipe(args)
    if problem:
        print(f"meshshard train: error: {problem}", file=sys.stderr)
        return 2
    if args.print_config:  # nothing is written: no lock
        return _train(args)
    return writing_command("train", args.out, lambda: _train(args))


def _train(args: Any) -> int:
    hint = _selftest_hint(args.model, args.model_args, args.resume)  # as typed, before --model is made absolute
    saved_ckpt = _saved_checkpoint(args)
    saved_cfg = dict(saved_ckpt.get("config") or {}) if saved_ckpt else {}
    problem = (_model_settings(args, saved_cfg) or _check_counts(args) or _max_points(args, saved_cfg)
               or _loss_weight(args, saved_cfg))
    if problem:
        print(f"meshshard train: error: {problem}", file=sys.stderr)
        return 2
    cfg = TrainConfig(
        partition=args.partition, data=args.data, out=args.out, steps=args.steps, lr=args.lr,
        latent_size=args.latent, hidden_layers=args.hidden_layers, message_passing_steps=args.mp_steps,
        activation=args.activation, data_parallel=args.data_parallel, checkpoint_every=args.every,
        resume=args.resume, force=args.force, seed=args.seed, log_every=args.log_every, quiet=args.quiet,
        val_every=args.val_every, dtype=args.dtype, precision=args.precision,
        checkpoint_steps=args.checkpoint_steps, keep_activations=args.keep_activations, model=args.model or "",
        model_args=args.model_args or {},
        architecture=args.architecture or "meshgraphnet", global_attention=args.global_attention,
        attention_heads=args.attention_heads, attention_slices=args.attention_slices,
        max_time=args.max_time, clip_grad=args.clip_grad, max_points=args.max_points, batch=args.batch,
        lr_schedule=args.lr_schedule,
        warmup=args.warmup, lr_floor=args.lr_floor, noise_std=args.noise_std,
        rollout_train=args.rollout_train,
        val_rollout=args.val_rollout, task=args.task or "", loss_weight=args.loss_weight,
        force_loss=args.force_loss, relative_loss=args.relative_loss,
    )
    if args.print_config:  # the resolved recipe: --config reads it back to the same run
        print(recipe_text(cfg), end="")
        return 0
    def check() -> None:  # the RUN checks here too, so that a refusal is one line before any rank starts
        check_training(cfg, saved_ckpt)
        if hint:
            print(hint, file=sys.stderr, flush=True)

    worker = functools.partial(as_rank, train, TrainConfig.from_dict)
    return run_command("train", worker, args.nproc, asdict(cfg), check, stopped=lambda: resume_hint(cfg.out))


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        import argparse

        raise argparse.ArgumentTypeError(str(err)) from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train", help="train a sharded MeshGraphNet, or your own model, on a partition "
        "(under torchrun, or --nproc local ranks)",
        description="Train MeshGraphNet, or your own model (--model), on a partitioned mesh. Run under torchrun "
        "(torchrun --nproc-per-node R -m meshshard train ...) or start R local ranks with --nproc R.",
    )
    p.add_argument("partition", nargs="?", default=None, metavar="PARTS",
                   help="partitions of the dataset (meshshard partition DATA); required, here or in --config")
    p.add_argument("--data", default=None, help="dataset folder (meshshard dataset); required, here or in --config")
    p.add_argument("--out", "-o", default=None,
                   help="run folder: checkpoint.pt, log.jsonl, config.toml; required, here or in --config")
    p.add_argument("--config", default=None, metavar="FILE.toml",
                   help="a recipe: any of these settings under TrainConfig's names (latent_size, "
                   "message_passing_steps, checkpoint_every, ...) as TOML; a flag given overrides the file "
                   "(docs/training.md, \"Recipes as files\")")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved recipe as TOML (every setting, as the run would use it) and exit "
                   "without training; --config reads it back")
    p.add_argument("--steps", type=_steps, default=None, metavar="STEPS|auto",
                   help=f"total training steps (default {_DEFAULTS['steps']}; on --resume the run's: "
                   "a resumed run goes on up to this many); auto, with --max-time: as many as fit the budget, "
                   "timed on a few untrained passes first, so that the schedule ends within it")
    p.add_argument("--lr", type=float, default=None,
                   help=f"learning rate (default {_DEFAULTS['lr']:g}; on --resume the run's, "
                   "and a changed one is applied)")
    p.add_argument("--model", default=None, metavar="NAME|FILE.py:NAME",
                   help="a built-in model: " + "; ".join(f"{k}: {v}" for k, v in BUILTIN_MODELS.items())
                   + "; or your own: NAME(node_in, edge_in, node_out, **model_args) in a Python file or module "
                   "(docs/training.md)")
    p.add_argument("--model-args", default=None, metavar="JSON", help="keyword arguments of --model, a JSON object")
    p.add_argument("--latent", "--latent-size", dest="latent", type=int, default=None,
                   help=f"MeshGraphNet's latent size (default {_DEFAULTS['latent_size']}; paper: 128)")
    p.add_argument("--hidden-layers", type=int, default=None,
                   help=f"MeshGraphNet's hidden layers per MLP (default {_DEFAULTS['hidden_layers']})")
    p.add_argument("--mp-steps", type=int, default=None,
                   help=f"MeshGraphNet's message-passing steps (default {_DEFAULTS['message_passing_steps']}; "
                   "paper: 15)")
    p.add_argument("--activation", default=None, help=f"MeshGraphNet's activation (default {_DEFAULTS['activation']})")
    p.add_argument("--global-attention", type=int, default=None, metavar="K",
                   help="MeshGraphNet: a Transolver physics-attention block (reach over the whole mesh, exact on "
                   "shards) after every K message-passing steps (default 0: none)")
    p.add_argument("--attention-heads", type=int, default=None,
                   help=f"heads of --global-attention (default {_DEFAULTS['attention_heads']})")
    p.add_argument("--attention-slices", type=int, default=None,
                   help=f"slices of --global-attention (default {_DEFAULTS['attention_slices']})")
    p.add_argument("--data-parallel", type=int, default=None,
                   help=f"data-parallel groups; domain size = world / this (default {_DEFAULTS['data_parallel']})")
    p.add_argument("--every", "--checkpoint-every", dest="every", type=int, default=None,
                   help=f"checkpoint every N steps (default {_DEFAULTS['checkpoint_every']})")
    p.add_argument("--resume", action="store_true",
                   help="continue from RUN/checkpoint.pt; settings left out are the run's (a changed --lr is applied)")
    p.add_argument("--force", action="store_true", help="start RUN over (deletes only the files train writes in it)")
    p.add_argument("--seed", type=int, default=None,
                   help=f"seeds the weights and the order of the training samples (default {_DEFAULTS['seed']})")
    p.add_argument("--log-every", type=int, default=None,
                   help=f"print and log every N steps (default {_DEFAULTS['log_every']})")
    p.add_argument("--val-every", "--eval-every", dest="val_every", type=int, default=None,
                   help="mean loss over the validation split every K steps and at the end (default 0: off)")
    p.add_argument("--checkpoint-steps", action="store_true", default=None,
                   help="MeshGraphNet: recompute each message-passing step in backward (less memory, more time)")
    p.add_argument("--keep-activations", action="store_true", default=None,
                   help="MeshGraphNet: keep the edge MLPs' activations for the backward instead of recomputing them "
                   "(the same result, for more memory: sooner on a GPU; default: recomputed)")
    p.add_argument("--dtype", default=None, choices=_CHOICES["dtype"],
                   help=f"parameters and data (default {_DEFAULTS['dtype']})")
    p.add_argument("--precision", default=None, choices=_CHOICES["precision"],
                   help="fp32 (default); bf16-mixed: bfloat16 matrix products under autocast, float32 weights, "
                   "sums and loss; tf32: float32 with TF32 matrix products on a GPU (fused edge MLPs; no change "
                   "on a CPU)")
    p.add_argument("--lr-schedule", default=None, choices=_CHOICES["lr_schedule"],
                   help="cosine (default: a half cosine), exponential (geometric, after --warmup) or constant: "
                   "from --lr down to --lr x --lr-floor at the last step")
    p.add_argument("--warmup", type=_warmup, default=None, metavar="STEPS|auto",
                   help="linear warm-up of the learning rate over the first STEPS steps (0: none; default auto: 2%% "
                   "of --steps, at most 100)")
    p.add_argument("--lr-floor", type=float, default=None, metavar="FRACTION",
                   help=f"cosine's or exponential's last learning rate, a fraction of --lr "
                   f"(default {_DEFAULTS['lr_floor']}; above 0 for exponential)")
    p.add_argument("--batch", type=int, default=None, metavar="B",
                   help="samples per step for each data-parallel group: the step's loss is their mean (default 1; "
                   "memory grows with B: the B samples' activations are kept for one backward)")
    p.add_argument("--max-time", type=_duration, default=None, metavar="DURATION",
                   help="stop at this wall-time budget (900, 90s, 15m, 1.5h, 1h30m) with a checkpoint, which --resume "
                   "continues (default: none; on --resume the run's)")
    p.add_argument("--max-points", type=int, default=None, metavar="N",
                   help="point models (--model ball-attention, transolver): train each sample on about N of its "
                   "points, a new random subset each epoch, the same on any number of ranks; prediction uses every "
                   "point (default: the dataset's meshshard dataset --max-points, else every point; 0: every point)")
    p.add_argument("--clip-grad", type=float, default=None, metavar="NORM",
                   help="clip the gradients' global norm to NORM after they are summed over the ranks (default 0: off)")
    p.add_argument("--noise-std", type=float, default=None, metavar="SIGMA",
                   help="trajectories: Gaussian noise of SIGMA (normalised units) on the state input of interior "
                   "nodes at every step, the target corrected to match (default 0: off; docs/transient.md)")
    p.add_argument("--rollout-train", type=int, default=None, metavar="K",
                   help="trajectories: apply the model K times from each training state, each prediction the next "
                   "input, and sum the K losses (default 1: the one-step map)")
    p.add_argument("--val-rollout", type=int, default=None, metavar="V",
                   help="trajectories, with --val-every: also roll each validation trajectory out V steps (fewer if "
                   f"it holds fewer) and log the RMSE; best.pt keeps the lowest (default {_DEFAULTS['val_rollout']}; "
                   "0: off, best.pt by the one-step loss)")
    p.add_argument("--loss-weight", default=None, action="append", metavar="NAME=W[,NAME=W]",
                   help="steady task: weigh the loss at the nodes of named boundaries of the dataset (meshshard info "
                   "DATA lists them) by W, and with NAME:DISTANCE=W at the nodes within DISTANCE of one, every other "
                   "node by 1; the loss is the weighted mean (repeat the flag to add more; default: none; on --resume "
                   "the run's)")
    p.add_argument("--force-loss", default=None, action="append", metavar="NAME=W[,NAME=W]",
                   help="steady task: add to the loss W times the squared error of each target's integral over the "
                   "named boundary (with a pressure target, the error of the force on it), over the boundary's area "
                   "squared (repeat the flag to add more; default: none; on --resume the run's)")
    p.add_argument("--relative-loss", action="store_true", default=None,
                   help="steady task: divide each sample's loss by what predicting the training mean (about the prior, "
                   "with --mean-field) loses on it, so that every case counts by its relative error (default: off; "
                   "on --resume the run's)")
    p.add_argument("--nproc", type=int, default=0, help="start this many local ranks (when not under torchrun)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no banner, no per-step lines (errors and notes still print)")
    p.set_defaults(func=_run, task=None)  # the task: a recipe's, else the dataset's
