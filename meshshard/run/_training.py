
"""Training a sharded MeshGraphNet (or your own model) under torchrun: data x domain parallel, exact resume.

``torchrun --nproc-per-node R -m meshshard train PARTITION --data DATA --out RUN`` (or
``meshshard train ... --nproc R`` to start the ranks locally). The ranks form a
``data_parallel x domain_parallel`` device mesh: each domain group (``domain_parallel`` ranks, one per part
of the partition) trains on one sample at a time; the data groups train on different samples.

Per step, for data rank ``d``: training sample ``schedule(seed, step, d)`` (of the dataset's
training split); each domain rank reads only its owned rows of that sample, normalised with the
dataset's statistics (:class:`meshshard.run.DatasetReader`; a many-meshes dataset loads the
partition of the sample's mesh when a sample on it is first drawn); forward and backward of the
sharded model; the loss is the mean over all nodes of the mesh (not the mean of per-rank means);
gradients are summed over the domain group and averaged over the data group (``DomainParallel``,
during the backward), so every rank applies the gradient of the batch loss, equal to
single-process training on the same batch.

The run folder's files are defined in :mod:`meshshard.run._folder`.

A resumed run (``--resume``) continues from the checkpoint and its loss trajectory equals the
uninterrupted run's: the sample order is a pure function of (seed, step) and the computation is
deterministic on CPU. ``--model FILE.py:NAME`` trains your own model instead of MeshGraphNet
(:class:`meshshard.run.ModelRecipe`). If a rank dies, the others fail their next collective and exit with an
error that names the step and the last checkpoint.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshshard.comm import all_reduce_sum, backend_name, barrier
from meshshard.data import check_partition_matches, mirror_record, open_dataset
from meshshard.partition import check_apart, check_input_folders, plural

from .._tensor import ShardTensor
from ..tasks import dataset_task, get_task
from . import _folder, _report
from ._checkpoint import atomic_save as _atomic_save
from ._checkpoint import load_checkpoint, save_checkpoint
from ._failures import (
    SampleReadError,
    check_finite,
    local_flags,
    maybe_fail,
    non_finite_row,
    step_failure,
)
from ._folder import BEST, CHECKPOINT, CONFIG, FIRST_STEP, LOG
from ._recipe import (
    MESHGRAPHNET_DEFAULTS,
    ModelOutputError,
    ModelRecipe,
    check_model_output,
    check_model_radius,
    first_line,
    model_digest,
)
from ._recipe_file import write_recipe
from ._schedule import (
    AUTO_STEPS,
    LR_SCHEDULES,
    PROBE_STEPS,
    check_steps,
    fit_steps,
    lr_at,
    resumed_steps,
    unfinished_schedule,
    warmup_steps,
)
from ._stepping import validation_rollout
from ._subsample import POINT_MODELS, keep_points, sample_epoch, subsample_sample
from ._train_log import TrainLog, rewrite_log

__all__ = ["TrainConfig", "train", "check_training", "check_max_points", "load_checkpoint", "sample_index",
           "step_samples", "lr_at", "LR_SCHEDULES"]

_MGN = MESHGRAPHNET_DEFAULTS


@dataclass
class TrainConfig:
    """A training run: what ``meshshard train`` takes, and what a run's checkpoint records.

    ``partition`` (``meshshard partition DATA``), ``data`` (``meshshard dataset``) and ``out`` (the
    run folder) are folders; the rest are the command's options under their long names (``--every``
    is ``checkpoint_every``, ``--latent`` ``latent_size``, ``--mp-steps``
    ``message_passing_steps``). Each default is stated here, once.
    """

    partition: str
    data: str
    out: str
    steps: int = 100
    lr: float = 1e-3
    latent_size: int = _MGN["latent_size"]
    hidden_layers: int = _MGN["hidden_layers"]
    message_passing_steps: int = _MGN["message_passing_steps"]
    activation: str = _MGN["activation"]
    data_parallel: int = 1
    checkpoint_every: int = 20
    resume: bool = False
    force: bool = False
    seed: int = 0
    log_every: int = 10
    val_every: int = 0
    quiet: bool = False
    checkpoint_steps: bool = _MGN["checkpoint_steps"]
    keep_activations: bool = _MGN["keep_activations"]  # MeshGraphNet: edge MLPs kept for the backward, not recomputed
    global_attention: int = _MGN["global_attention"]  # MeshGraphNet: a physics-attention block every K steps (0: off)
    attention_heads: int = _MGN["attention_heads"]
    attention_slices: int = _MGN["attention_slices"]
    architecture: str = "meshgraphnet"  # the built-in model (BUILTIN_MODELS) when ``model`` is ""
    dtype: str = "float32"
    precision: str = "fp32"
    model: str = ""  # "": the built-in MeshGraphNet; else FILE.py:NAME or MODULE:NAME (ModelRecipe)
    model_args: dict[str, Any] = field(default_factory=dict)
    task: str = ""  # the workload (meshshard.tasks): how a sample is read, the loss; "": the dataset's
    noise_std: float = 0.0  # transient: Gaussian noise on the state input at each step, normalised units (0: off)
    rollout_train: int = 1  # transient: model applications unrolled per training sample, their losses summed
    val_rollout: int = 10  # transient, with val_every: each validation trajectory rolled out this many steps (0: off)
    lr_schedule: str = "cosine"  # constant, cosine or exponential: from lr down to lr * lr_floor at the last step
    warmup: int = -1  # steps of linear warm-up from lr / warmup to lr (0: none; -1: auto, warmup_steps)
    lr_floor: float = 0.01  # cosine's or exponential's last learning rate, as a fraction of lr
    batch: int = 1  # samples per step for each data-parallel group (their mean loss; one backward)
    max_time: float = 0.0  # seconds of wall time for this process's training (0: no budget); then checkpoint, stop
    clip_grad: float = 0.0  # clip the gradients' global norm to this (0: off), after they are summed over the ranks
    max_points: int = 0  # point models: about this many random points per sample and epoch in training (0: all)
    loss_weight: dict[str, float] = field(default_factory=dict)  # steady: named boundaries' rows weighted (1: others)
    force_loss: dict[str, float] = field(default_factory=dict)  # steady: + W |boundary integral of the error|^2
    relative_loss: bool = False  # steady: each sample's loss over what predicting the training mean loses on it

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """From ``asdict(config)`` or a checkpoint's config (keys it does not know are left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def sample_index(seed: int, step: int, data_rank: int, data_parallel: int, num_samples: int) -> int:
    """The sample data rank ``data_rank`` trains on at ``step``: shuffled once per epoch."""
    k = step * data_parallel + data_rank
    epoch, i = divmod(k, num_samples)
    return int(np.random.default_rng([seed, epoch]).permutation(num_samples)[i])


def check_max_points(cfg: TrainConfig) -> None:
    """Raise a one-line ``ValueError`` unless ``cfg.max_points`` is 0 (every point) or a positive
    number of points for a built-in point model (``ball-attention``, ``transolver``) of a steady task:
    a graph model's message passing needs edges that a subset of the points does not have."""
    n = cfg.max_points
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"Expected --max-points to be 0 (every point) or a positive integer (got {n!r})")
    if not n:
        return
    if cfg.model or cfg.architecture not in POINT_MODELS:
        model = f"--model {cfg.model}" if cfg.model else f"the built-in {cfg.architecture}"
        raise ValueError(f"Expected --max-points only with a point model, --model {' or --model '.join(POINT_MODELS)} "
                         f"(got {model}, whose message passing needs the edges of every point); leave it out, or "
                         "--max-points 0")
    if cfg.task not in ("", "steady"):
        raise ValueError(f"Expected --max-points only with the steady task (got --task {cfg.task})")


def step_samples(cfg: TrainConfig, step: int, data_rank: int, train_ids: Any) -> list[int]:
    """The ``cfg.batch`` training samples data rank ``data_rank`` trains on at ``step``: the
    schedule of :func:`sample_index` read ``batch`` micro-steps at a time (``batch`` 1: the sample
    of ``step``), so every epoch still draws each training sample once."""
    n = len(train_ids)
    return [int(train_ids[sample_index(cfg.seed, step * cfg.batch + k, data_rank, cfg.data_parallel, n)])
            for k in range(cfg.batch)]


def _checked_setup(cfg: TrainConfig, ctx: Any) -> tuple[TrainConfig, Any, Any, dict[str, Any], int, Any]:
    """Every refusal that the options, DATA and PARTITION decide, before any collective; returns the
    config with its task recorded, the dataset, the task, the partition's metadata, the domain size
    (ranks per sample) and the dtype."""
    if cfg.data_parallel < 1 or ctx.world_size % cfg.data_parallel:
        raise ValueError(f"Expected --data-parallel to divide the world size {ctx.world_size} "
                         f"(got {cfg.data_parallel})")
    if cfg.batch < 1:
        raise ValueError(f"Expected --batch to be a positive integer (got {cfg.batch})")
    lr_at(cfg, 0)  # refuses an unknown schedule, before any collective
    check_max_points(cfg)
    check_steps(cfg)
    domain = ctx.world_size // cfg.data_parallel
    dataset = open_dataset(cfg.data)  # once: the checks and the reader share it
    cfg = replace(cfg, task=cfg.task or dataset_task(dataset))  # recorded: predict finds the task again
    task = get_task(cfg.task, asdict(cfg))
    meta = check_partition_matches(dataset, cfg.partition)
    check_model_radius(asdict(cfg), cfg.partition)  # ball-attention: not beyond the partition's halo radius
    task.check_dataset(dataset)
    if meta["num_parts"] != domain:
        raise ValueError(
            f"Expected a partition into {plural(domain, 'part')} ({plural(ctx.world_size, 'rank')} / "
            f"{cfg.data_parallel} data-parallel) (got {plural(meta['num_parts'], 'part')} in {cfg.partition}); "
            + (f"train it on {meta['num_parts']} ranks with --nproc {meta['num_parts']}, or under torchrun"
               if ctx.world_size == 1 else
               f"make one with meshshard partition {cfg.data} --parts {domain} --out NEW_PARTS")
        )
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"Expected --dtype float32 or float64 (got {cfg.dtype!r})")
    dtype = getattr(torch, cfg.dtype)
    if cfg.precision not in PRECISIONS or (cfg.precision != "fp32" and cfg.dtype != "float32"):
        raise ValueError(f"Expected --precision fp32, or bf16-mixed or tf32 with --dtype float32 "
                         f"(got {cfg.precision!r}, {cfg.dtype})")
    return cfg, dataset, task, meta, domain, dtype


@dataclass
class _Session:
    """What one rank's training steps and validations share: the config, the ranks, the reader,
    the task, the model (``inner`` wrapped in ``DomainParallel``) and its optimizer."""

    cfg: TrainConfig
    ctx: Any
    device_mesh: Any
    reader: Any
    task: Any
    inner: Any
    model: Any
    opt: Any
    domain: int
    dtype: Any
    ckpt_path: Path

    def autocast(self) -> Any:
        """bf16-mixed: matrix products in bfloat16 under autocast; weights, optimizer state, the
        aggregation (MeshGraphNet sums half-precision messages in float32) and the loss stay float32."""
        return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16-mixed")

    def forward_of(self, b: Any) -> Any:
        """The model on the graph of ``b``, on this rank's rows (for the validation rollout)."""
        def forward(x: Any) -> Any:
            with self.autocast():
                return self.model(ShardTensor.from_local(x, b.graph.spec), b.graph, b.edge_attr).to_local()
        return forward

    def validate_rollout(self, at: int) -> float:
        """The validation rollout RMSE (normalised state units) at step ``at``: data rank d rolls out
        every dp-th validation trajectory, every rank its rows; one all-reduce sums them all."""
        cfg, ctx = self.cfg, self.ctx
        mine = [int(k) for k in np.asarray(self.reader.dataset.val)[self.device_mesh.data_rank::cfg.data_parallel]]
        try:
            local = validation_rollout(self.task, self.reader, mine, cfg.val_rollout, self.forward_of)
        except Exception as err:
            raise step_failure(err, f"rank {ctx.rank}: validation rollout at step {at}", self.ckpt_path,
                                self.inner if cfg.model else None, "forward") from err
        sums = torch.tensor(local, dtype=torch.float64, device=ctx.device)
        all_reduce_sum(sums)
        return math.sqrt(float(sums[0]) / float(sums[1])) if float(sums[1]) > 0 else math.nan

    def validate(self, at: int) -> float:
        """Mean loss over the validation split at step ``at``; data rank d takes every dp-th sample."""
        cfg, ctx, reader = self.cfg, self.ctx, self.reader
        total = torch.zeros(1, dtype=torch.float64, device=ctx.device)
        with torch.no_grad():
            for s in reader.val[self.device_mesh.data_rank::cfg.data_parallel]:
                b = reader.sample(int(s))  # validation: the sample as it is (no training noise)
                try:
                    with self.autocast():
                        pred = self.model(b.x, b.graph, b.edge_attr)
                except Exception as err:
                    raise step_failure(err, f"rank {ctx.rank}: validation at step {at}", self.ckpt_path,
                                        self.inner if cfg.model else None, "forward") from err
                if cfg.model:
                    check_model_output(pred, len(b.owned_ids), reader.num_targets, cfg.model, sharded=True,
                                 group=self.device_mesh.domain_group)
                total += float(self.task.loss(pred, b))
        all_reduce_sum(total)  # every domain rank of a data group holds that group's sum
        return float(total) / (self.domain * len(reader.val))

    def backward(self, step: int, start: int, checked: dict[int, tuple | None], began: float) -> torch.Tensor:
        """Step ``step``'s forward and backward on this data rank's ``--batch`` samples; returns the
        flags summed over every rank (:func:`local_flags`: the loss, the finite checks and rank 0's
        clock). ``checked``: each sample's first non-finite row on this rank, filled as read."""
        cfg, ctx, reader, model = self.cfg, self.ctx, self.reader, self.model
        mine = step_samples(cfg, step, self.device_mesh.data_rank, reader.train)  # this data rank's --batch samples
        bad_row = None
        try:
            loss = torch.zeros((), dtype=self.dtype, device=ctx.device)
            for j, k in enumerate(mine):  # one graph for the step's samples: a single backward, exact as for one sample
                try:
                    b = self.task.batch(reader, k, step)
                except (ValueError, OSError) as err:  # a damaged or missing sample file: the data's fault, exit 2
                    raise SampleReadError(f"rank {ctx.rank}: step {step}: {first_line(err)}") from err
                if k not in checked:  # the data do not change: each sample is checked the first time it is read
                    checked[k] = non_finite_row(b.x.to_local(), b.y.to_local(), b.owned_ids, k)
                bad_row = bad_row or checked[k]
                if cfg.max_points:  # a point model on about max_points of the sample's points (_subsample)
                    epoch = sample_epoch(step, j, cfg.batch, cfg.data_parallel, self.device_mesh.data_rank,
                                         len(reader.train))
                    b = subsample_sample(b, keep_points(cfg.seed, epoch, k, b.owned_ids, b.graph.spec.num_nodes,
                                                        cfg.max_points))
                with self.autocast():
                    pred = model(b.x, b.graph, b.edge_attr)
                if cfg.model and step == start:
                    check_model_output(pred, len(b.owned_ids), reader.num_targets, cfg.model, sharded=True,
                                       group=self.device_mesh.domain_group)
                def apply(x: Any, b: Any = b) -> Any:  # the model again, for a task that unrolls it
                    with self.autocast():
                        return model(x, b.graph, b.edge_attr)

                loss = loss + self.task.loss(pred, b, apply) / len(mine)
            maybe_fail(ctx.rank, step)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            out_of_time = ctx.rank == 0 and cfg.max_time > 0 and time.monotonic() - began >= cfg.max_time
            flags = local_flags(loss, bad_row, model.parameters(), rank=ctx.rank, world=ctx.world_size,
                                 out_of_time=out_of_time)
            all_reduce_sum(flags)  # each domain rank holds its sample's loss; and every rank's finite checks
        except (ModelOutputError, SampleReadError):
            raise
        except Exception as err:  # the model's own error (any type) or a collective's: said which, on one line
            raise step_failure(err, f"rank {ctx.rank}: step {step}", self.ckpt_path,
                                self.inner if cfg.model else None) from err
        return flags

    def apply_gradients(self, step: int) -> None:
        """Clip (``--clip-grad``), set the schedule's rate of ``step`` and take the optimizer step."""
        cfg = self.cfg
        if cfg.clip_grad > 0:  # the gradients are whole and equal on every rank here: each clips alike
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
        for group in self.opt.param_groups:  # the schedule's rate of this step (a pure function of it: resumes exactly)
            group["lr"] = lr_at(cfg, step)
        self.opt.step()


def _resume(session: _Session, saved: dict[str, Any], best_by: str) -> tuple[list[float], int, Any, Any]:
    """The model, optimizer and random state of a resumed run, from its checkpoint; returns the
    losses so far, the step to start at, the best validation figure (when kept by ``best_by``) and
    the learning rate before, when ``--lr`` changed it."""
    cfg, ctx, opt = session.cfg, session.ctx, session.opt
    session.model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    losses, start = list(saved["losses"]), int(saved["step"])
    best_val = saved.get("best_val_loss") if saved.get("best_by", "val_loss") == best_by else None
    note = _check_steps_left(start, cfg)
    if note and ctx.rank == 0 and not cfg.quiet:
        print(note, file=sys.stderr)
    torch.set_rng_state(saved["rng"].cpu())
    old_lr = _folder.lr_change(saved.get("config", {}), cfg.lr)
    for group in opt.param_groups:
        group["lr"] = cfg.lr  # a changed learning rate is applied (and logged below)
    return losses, start, best_val, old_lr


def _open_log(session: _Session, stale: list[Path], losses: list[float], start: int, meta: dict[str, Any],
              num_parameters: int, saved: dict[str, Any] | None, digest: str | None, old_lr: Any) -> TrainLog:
    """Rank 0 clears what ``--force`` replaces, makes RUN and rewrites its log as of the checkpoint,
    prints the banner; every rank opens the log (rank 0's writes) and says what a resume changed."""
    cfg, ctx, out = session.cfg, session.ctx, Path(session.cfg.out)
    if ctx.rank == 0:
        _folder.delete_run_files(stale)
        out.mkdir(parents=True, exist_ok=True)
        rewrite_log(out / LOG, losses)
        # the recipe this run trains with (how RUN is treated, --resume or --force, is the command line's)
        write_recipe(out / CONFIG, cfg, leave_out=("resume", "force"))
        if not cfg.quiet:
            print(_report.banner(world_size=ctx.world_size, data_parallel=cfg.data_parallel, device=ctx.device,
                                 backend=backend_name() or "single process",
                                 parameters=num_parameters, partition=cfg.partition,
                                 model=(f"{type(session.inner).__name__} from {cfg.model}" if cfg.model
                                        else ModelRecipe.from_config(asdict(cfg)).name),
                                 partition_meta=meta, data=cfg.data, steps=cfg.steps, start=start), flush=True)
    log = TrainLog(ctx.rank == 0, cfg, start, round(session.reader.mean_nodes()) * cfg.data_parallel)
    if saved is not None:
        log.event(None, f"resuming from step {start}")
        was = saved.get("config", {}).get("model_sha256")
        if cfg.model and was and digest and was != digest:
            log.event({"step": start, "event": "model file changed", "from": was, "to": digest},
                      f"note: {cfg.model.rpartition(':')[0]} changed since step {start} was saved "
                      f"(SHA-256 {was[:12]} -> {digest[:12]}); the weights load, but the resumed steps repeat the "
                      "uninterrupted run's only if the model computes what it did")
    if old_lr is not None:
        log.event({"step": start, "event": "lr", "from": old_lr, "to": cfg.lr},
                  f"learning rate changed on resume: {old_lr:g} -> {cfg.lr:g} (applied from step {start})")
    return log


#: ``--precision``: float32 products; bfloat16 products under autocast; TF32 products on a GPU.
PRECISIONS = ("fp32", "bf16-mixed", "tf32")


def train(cfg: TrainConfig) -> list[float]:
    """Run (or resume) training; returns the loss of every step so far (on every rank).

    ``precision="tf32"``: float32 matrix products may use TF32 on a GPU while it runs
    (``torch.set_float32_matmul_precision("high")``, restored after): cuBLAS's, and the
    processor's edge MLPs then run as one fused kernel each (``meshshard/nn/_edge_triton.py``)."""
    before = torch.get_float32_matmul_precision()
    if cfg.precision == "tf32":
        torch.set_float32_matmul_precision("high")
    try:
        return _train(cfg)
    finally:
        torch.set_float32_matmul_precision(before)


def _train(cfg: TrainConfig) -> list[float]:
    from meshshard.comm import init_device_mesh_2d, init_distributed

    from ..nn import DomainParallel

    ctx = init_distributed()
    cfg, dataset, task, meta, domain, dtype = _checked_setup(cfg, ctx)
    # RUN: refused, started over or resumed, decided on every rank from files, before any collective
    stale = _folder.check_run_folder(cfg.out, cfg.resume, cfg.force)
    identity = _folder.run_identity(meta, cfg.data)
    saved = load_checkpoint(Path(cfg.out) / CHECKPOINT, "cpu") if cfg.resume else None
    cfg = resumed_steps(cfg, saved)
    if saved is not None:
        _folder.check_resume(saved.get("config", {}), saved.get("identity"), asdict(cfg), identity)
    device_mesh = init_device_mesh_2d(domain)  # the ranks: data x domain
    reader = task.reader(dataset, cfg.partition, device_mesh.domain_rank, device_mesh.domain_group, device=ctx.device,
                         dtype=dtype, parts_meta=meta)
    names = reader.sample_names  # to name a sample in an error
    if cfg.batch > len(reader.train):  # every rank alike, from DATA: a step would draw samples again and again
        raise ValueError(f"Expected --batch at most the training samples ({len(reader.train)} in {cfg.data}) "
                         f"(got {cfg.batch})")

    torch.manual_seed(cfg.seed)
    digest = model_digest(cfg.model) if cfg.model else None  # the model file as it is now, before it is run
    inner = ModelRecipe.from_config(asdict(cfg)).build(reader.num_inputs, reader.num_edge_features, reader.num_targets)
    # gradients: sum over the domain, mean over the data groups, in backward
    model = DomainParallel(inner.to(ctx.device, dtype), device_mesh)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    num_parameters = sum(p.numel() for p in model.parameters())  # the weights trained (not buffers)
    out = Path(cfg.out)
    ckpt_path = out / CHECKPOINT
    run = _Session(cfg, ctx, device_mesh, reader, task, inner, model, opt, domain, dtype, ckpt_path)
    losses: list[float] = []
    start = 0
    old_lr = None
    best_val: float | None = None  # the lowest validation loss so far (its checkpoint is RUN/best.pt)
    # a transient run validated by rollouts keeps the best rollout error instead (what a user rolls out)
    rolling = cfg.val_rollout > 0 and bool(getattr(task, "rolls_out", False))
    best_by = "val_rollout_rmse" if rolling else "val_loss"
    if saved is not None:
        losses, start, best_val, old_lr = _resume(run, saved, best_by)
    began = time.monotonic()  # --max-time counts this process's training, from here
    fitted = None
    if cfg.steps == AUTO_STEPS:
        cfg, fitted = fit_steps(run, began)
        run.cfg = cfg
    last_saved = f"{ckpt_path} (step {start})" if start else "none yet"
    log = _open_log(run, stale, losses, start, meta, num_parameters, saved, digest, old_lr)

    def state(done: int) -> dict[str, Any]:
        """What a checkpoint of the run after ``done`` steps holds (checkpoint.pt and best.pt alike)."""
        return {
            "step": done, "model": model.state_dict(), "optimizer": opt.state_dict(), "losses": losses,
            "rng": torch.get_rng_state(),
            "config": {**asdict(cfg), "normalisation": reader.normaliser.to_dict(), "model_sha256": digest,
                       "target_fields": task.output_fields(reader.dataset, {}),  # predict names its outputs by them
                       "target_scales": reader.dataset.meta.get("target_scales") or {},  # and multiplies them back
                       "node_types": reader.dataset.meta.get("node_types"),  # a transient run's classes (load_run)
                       "mirror": mirror_record(reader.dataset.meta.get("mirror")),  # predict --mirror-average
                       "num_parameters": num_parameters},
            "world_size": ctx.world_size, "identity": identity, "best_val_loss": best_val, "best_by": best_by,
        }

    def keep_best(at: int) -> None:
        """Validate after ``at`` steps and log the loss (and rollout error); rank 0 keeps RUN/best.pt
        at the lowest so far of ``best_by``: the rollout error where it is measured, else the loss."""
        nonlocal best_val
        val_loss, rollout_rmse = run.validate(at), run.validate_rollout(at) if rolling else None
        log.eval(at, val_loss, rollout_rmse, cfg.val_rollout if rollout_rmse is not None else None)
        value = rollout_rmse if best_by == "val_rollout_rmse" else val_loss
        if value is not None and math.isfinite(value) and (best_val is None or value < best_val):
            best_val = value
            if ctx.rank == 0:
                extra = {"val_loss": val_loss} | ({} if rollout_rmse is None else {"val_rollout_rmse": rollout_rmse})
                save_checkpoint(out / BEST, state(at) | extra)

    validating = cfg.val_every > 0 and len(reader.val) > 0
    if cfg.val_every > 0 and not validating and ctx.rank == 0 and not cfg.quiet:
        print(f"note: {cfg.data} has no validation samples (meshshard dataset --val-fraction / --val-samples); "
              "no validation loss is logged", file=sys.stderr)
    if fitted is not None:
        log.event({"step": 0, "event": "fit_steps", "steps": cfg.steps, **fitted},
                  f"--steps auto: {cfg.steps} steps fit the rest of --max-time {cfg.max_time:g} s, at "
                  f"{fitted['step_s'] * 1e3:.1f} ms a step (the slowest rank, {PROBE_STEPS} untrained passes)"
                  + (f" and {fitted['validation_s']:.2f} s a validation every {cfg.val_every}"
                     if fitted["validation_s"] else ""))
    checked: dict[int, tuple | None] = {}  # sample -> its first non-finite row on this rank, or None
    for step in range(start, cfg.steps):
        if validating and step % cfg.val_every == 0:
            keep_best(step)
        t0 = time.perf_counter()
        flags = run.backward(step, start, checked, began)
        batch = [k for d in range(cfg.data_parallel) for k in step_samples(cfg, step, d, reader.train)]
        batch_loss = check_finite(flags, step=step, samples=batch, data=cfg.data, last=last_saved, names=names)
        if step == 0 and ctx.rank == 0:
            grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)  # unused: zeros,
                               for p in model.parameters()])  # as DomainParallel gives them on several ranks
            s = step_samples(cfg, step, device_mesh.data_rank, reader.train)[0]
            _atomic_save({"loss": batch_loss, "grads": grads.cpu(), "sample": s}, out / FIRST_STEP)
        run.apply_gradients(step)
        losses.append(batch_loss)
        stopping = bool(flags[-1] > 0) and step + 1 < cfg.steps  # rank 0's clock, on every rank
        seconds, done = time.perf_counter() - t0, step + 1
        report = step % cfg.log_every == 0 or done == cfg.steps or stopping
        memory = _report.gather_peak_memory(ctx.device) if report else None  # every rank takes part
        scheduled = cfg.lr_schedule != "constant" or warmup_steps(cfg) > 0
        log.step(step, batch_loss, seconds, memory, lr=lr_at(cfg, step) if scheduled else None)
        if report:
            log.plot()
        if ctx.rank == 0 and (done % cfg.checkpoint_every == 0 or done == cfg.steps or stopping):
            save_checkpoint(ckpt_path, state(done))
        if done % cfg.checkpoint_every == 0 or done == cfg.steps or stopping:
            last_saved = f"{ckpt_path} (step {done})"
        if stopping:
            log.event({"step": done, "event": "max_time", "seconds": cfg.max_time, "steps": cfg.steps},
                      f"stopped at the time budget (--max-time {cfg.max_time:g} s) after step {done}: {ckpt_path} "
                      f"holds it; continue with --resume" + unfinished_schedule(cfg, done))
            break
    else:
        stopping = False
    if validating and cfg.steps > start and not stopping:
        keep_best(cfg.steps)
    log.plot(final=True)
    log.close()
    barrier()
    return losses


def _check_steps_left(done: int, cfg: TrainConfig) -> str | None:
    """Refuse (one line) a resume whose --steps is below the steps the run has done; for a run
    already at --steps, the note to print (it resumes to nothing: a job started again after it ended)."""
    if cfg.steps < done:
        raise ValueError(f"{cfg.out}: Expected --steps of at least the {done} steps the run has done, to resume it "
                         f"(got {cfg.steps}); --steps is the total, not the steps to add")
    if cfg.steps == done:
        return f"note: {cfg.out} has done its {done} steps already: nothing to train (raise --steps to go on)"
    return None


def check_training(cfg: TrainConfig, saved: dict[str, Any] | None = None) -> None:
    """Every refusal of :func:`train` that files alone decide, as a one-line ``ValueError``: the
    folders, the dataset (for the task), RUN (refused, started over or resumed), your model (it is
    imported and built here once, so its errors come before any rank starts) and, on resume, the
    settings and data the run's exactness depends on. ``saved``: RUN's checkpoint when the caller
    has read it already. ``meshshard train`` calls this before it starts any rank; :func:`train`
    makes the same checks on every rank."""
    folders = ((cfg.partition, "partition folder"), (cfg.data, "dataset folder"))
    check_input_folders(*folders)
    check_apart(cfg.out, *folders)
    data = open_dataset(cfg.data)
    task = get_task(cfg.task or dataset_task(data), asdict(cfg))
    task.check_dataset(data)
    _folder.check_run_folder(cfg.out, cfg.resume, cfg.force)
    if cfg.model:
        ModelRecipe.from_config(asdict(cfg)).build(*task.model_sizes(data))
    check_model_radius(asdict(cfg), cfg.partition)
    check_max_points(cfg)
    check_steps(cfg)
    if cfg.resume:
        saved = saved if saved is not None else load_checkpoint(Path(cfg.out) / CHECKPOINT)
        cfg = resumed_steps(cfg, saved)
        _check_steps_left(int(saved["step"]), cfg)  # its note is printed by rank 0
        _folder.check_resume(saved.get("config", {}), saved.get("identity"), asdict(cfg),
                             _folder.run_identity(check_partition_matches(data, cfg.partition), cfg.data))
