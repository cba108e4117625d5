"""Training a sharded MeshGraphNet (or your own model) under torchrun: data x domain parallel, exact resume.

``torchrun --nproc-per-node R -m meshshard train PARTITION --data DATA --out RUN`` (or
``meshshard train ... --nproc R`` to start the ranks locally). The ranks form a
``data_parallel x domain_parallel`` mesh: each domain group (``domain_parallel`` ranks, one per part
of the partition) trains on one sample at a time; the data groups train on different samples.

Per step, for data rank ``d``: training sample ``schedule(seed, step, d)`` (of the dataset's
training split); each domain rank reads only its owned rows of that sample, normalised with the
dataset's statistics (``meshshard._data.DatasetReader``; a many-meshes dataset loads the
partition of the sample's mesh when a sample on it is first drawn); forward and backward of the sharded model; the loss is the mean over all
nodes of the mesh (not the mean of per-rank means); gradients are summed over the domain group and
averaged over the data group (``DomainParallel``, during the backward), so every rank applies the gradient of the
batch loss, equal to single-process training on the same batch.

The run folder::

    RUN/
      checkpoint.pt   model, optimizer, completed steps, loss history, RNG state, config;
                      tensors and plain values only, with a checksum; written by rank 0 to a
                      temporary file and renamed, so it is always whole (meshshard/_checkpoint.py)
      log.jsonl       one line per step: step, loss, seconds, nodes per second; with
                      --val-every K, a line {"step", "val_loss"} every K steps and at the end:
                      the mean loss over the dataset's validation split (forward only)
      first_step.pt   the batch-0 loss and the synced gradients of the first step (for checks)

A resumed run (``--resume``) continues from the checkpoint and its loss trajectory equals the
uninterrupted run's: the sample order is a pure function of (seed, step) and the computation is
deterministic on CPU. ``--model FILE.py:NAME`` trains your own model instead of MeshGraphNet
(``meshshard/_usermodel.py``). If a rank dies, the others fail their next collective and exit with an
error that names the step and the last checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshshard import _runlog

from ._checkpoint import atomic_save as _atomic_save
from ._checkpoint import load_checkpoint, save_checkpoint

__all__ = ["TrainConfig", "train", "load_checkpoint", "sample_index", "is_peer_failure"]


@dataclass
class TrainConfig:
    partition: str
    data: str
    out: str
    steps: int = 100
    lr: float = 1e-3
    latent_size: int = 64
    hidden_layers: int = 2
    message_passing_steps: int = 6
    activation: str = "relu"
    data_parallel: int = 1
    checkpoint_every: int = 20
    resume: bool = False
    force: bool = False
    seed: int = 0
    log_every: int = 10
    val_every: int = 0
    quiet: bool = False
    checkpoint_steps: bool = False
    dtype: str = "float32"
    precision: str = "fp32"
    model: str = ""  # "": the built-in MeshGraphNet; else FILE.py:NAME or MODULE:NAME (meshshard/_usermodel.py)
    model_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def _check_has_targets(data: Any) -> None:
    """Refuse, in one line, a dataset of inputs only (made without ``--targets``); ``data`` an open
    :class:`~meshshard.partition.Dataset`."""
    if not data.target_channels:
        raise ValueError(f"{data.path}: has no targets (made without --targets), so there is nothing to train on; "
                         "it holds cases for meshshard predict. Train on a dataset made with --targets")


def sample_index(seed: int, step: int, data_rank: int, data_parallel: int, num_samples: int) -> int:
    """The sample data rank ``data_rank`` trains on at ``step``: shuffled once per epoch."""
    k = step * data_parallel + data_rank
    epoch, i = divmod(k, num_samples)
    return int(np.random.default_rng([seed, epoch]).permutation(num_samples)[i])


class PeerFailure(RuntimeError):
    """A collective failed during training: a peer rank died or stopped responding."""


def _describe_checkpoint(path: Path) -> str:
    """What a failed run leaves to resume from; never raises (the failure being reported comes first)."""
    if not path.exists():
        return "none yet; rerun with --force to start over."
    try:
        return f"{path} (step {load_checkpoint(path)['step']}); rerun with --resume."
    except ValueError as err:
        return f"unusable ({err}); rerun from the start."


def _step_failure(err: Exception, where: str, ckpt_path: Path, user_model: Any, what: str = "forward or backward"
                  ) -> RuntimeError:
    """The one-line error for a step (or validation pass) that raised: a collective's failure (a
    peer died or stopped) or the model's own error, whatever its type, with a hint for a model
    whose PyG layers are not wrapped in ShardConv, and what is left to resume from."""
    from meshshard._usermodel import first_line, shard_hint

    first = f"{type(err).__name__}: {first_line(err)}"
    if is_peer_failure(err):
        return PeerFailure(f"{where} failed: a collective raised, so a peer rank probably died or stopped responding "
                           f"({first}). Last checkpoint: {_describe_checkpoint(ckpt_path)}")
    hint = shard_hint(user_model) if user_model is not None else ""
    return RuntimeError(f"{where} failed in the model's {what} ({first}){hint}. "
                        f"Last checkpoint: {_describe_checkpoint(ckpt_path)}")


def _maybe_fail(rank: int, step: int) -> None:
    """Testing hook: ``MESHSHARD_FAIL_AT=RANK:STEP`` kills that rank in the middle of that step."""
    spec = os.environ.get("MESHSHARD_FAIL_AT")
    if spec and spec == f"{rank}:{step}":
        print(f"rank {rank}: MESHSHARD_FAIL_AT={spec}: dying in the middle of step {step}", file=sys.stderr, flush=True)
        os._exit(17)


def is_peer_failure(err: BaseException) -> bool:
    """Whether an error raised during a step came from a collective (a dead or stopped peer), not
    from the model itself (a shape error in your own model, running out of memory)."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError | OSError):
        return True
    text = str(err).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket"))


class NonFiniteLoss(RuntimeError):
    """The loss or a gradient of a step is NaN or infinite: training stops before the optimizer step."""


_WHICH = ("inputs", "targets")


def _non_finite_row(x: torch.Tensor, y: torch.Tensor, owned: np.ndarray, sample: int) -> tuple | None:
    """``(sample, global node, "inputs" | "targets", value)`` of this rank's first non-finite row, or None."""
    for which, t in zip(_WHICH, (x, y), strict=True):
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            i = int(bad.any(dim=1).nonzero()[0])
            return sample, int(owned[i]), which, float(t[i][bad[i]][0])
    return None


def _local_flags(loss: torch.Tensor, bad_row: tuple | None, parameters: Any, *, rank: int, world: int) -> torch.Tensor:
    """This rank's loss, gradient flag and bad row, laid out so that one sum over the world combines them.

    ``[loss, grad_not_finite, then per rank: sample + 1, node + 1, which + 1, value]`` in float64;
    a rank writes only its own four slots.
    """
    flags = torch.zeros(2 + 4 * world, dtype=torch.float64, device=loss.device)
    flags[0] = loss.detach().to(torch.float64)
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
        flags[1] = 1.0
    if bad_row is not None:
        sample, node, which, value = bad_row
        flags[2 + 4 * rank: 6 + 4 * rank] = torch.tensor([sample + 1, node + 1, _WHICH.index(which) + 1, value])
    return flags


def _check_finite(flags: torch.Tensor, *, step: int, samples: list[int], data: str, last: str,
                  names: Sequence[str] = ()) -> float:
    """Raise on a non-finite row, loss or gradient (same verdict on every rank); else the batch loss.

    ``flags`` is the world-wide sum of every rank's :func:`_local_flags`; ``names`` are the
    dataset's sample names, to name the samples in the error.
    """
    def sample_of(i: int) -> str:
        return f"{i} ({names[i]})" if 0 <= i < len(names) else str(i)

    values = flags.tolist()
    world = (len(values) - 2) // 4
    for r in range(world):
        sample, node, which, value = values[2 + 4 * r: 6 + 4 * r]
        if sample:
            raise ValueError(
                f"Expected finite training data (got {value} in the {_WHICH[int(which) - 1]} of sample "
                f"{sample_of(int(sample) - 1)} at node {int(node) - 1}, read by rank {r} at step {step}); fix the "
                f"dataset {data}"
            )
    loss = values[0] / world
    tail = (f"on sample(s) {', '.join(sample_of(i) for i in samples)}; training stopped before the optimizer step, "
            f"so no non-finite weights are saved (last checkpoint: {last}). Lower --lr or check the data.")
    if not np.isfinite(loss):
        raise NonFiniteLoss(f"step {step}: the loss is not finite ({loss}) {tail}")
    if values[1]:
        raise NonFiniteLoss(f"step {step}: a gradient is not finite (loss {loss:.6g}) {tail}")
    return loss


def train(cfg: TrainConfig) -> list[float]:
    """Run (or resume) training; returns the loss of every step so far (on every rank)."""
    import torch.distributed as dist

    from meshshard._data import DatasetReader
    from meshshard._usermodel import ModelOutputError, build_user_model, check_output, model_digest
    from meshshard.comm import init_device_mesh_2d, init_distributed
    from meshshard.nn import DomainParallel, MeshGraphNet
    from meshshard.partition import check_partition_matches, open_dataset
    from meshshard.partition._dataset import plural

    ctx = init_distributed()
    if cfg.data_parallel < 1 or ctx.world_size % cfg.data_parallel:
        raise ValueError(f"Expected --data-parallel to divide the world size {ctx.world_size} (got {cfg.data_parallel})")
    domain = ctx.world_size // cfg.data_parallel
    dataset = open_dataset(cfg.data)  # once: the checks and the reader share it
    meta = check_partition_matches(dataset, cfg.partition)
    _check_has_targets(dataset)
    if meta["num_parts"] != domain:
        raise ValueError(
            f"Expected a partition into {plural(domain, 'part')} ({plural(ctx.world_size, 'rank')} / {cfg.data_parallel} "
            f"data-parallel) (got {plural(meta['num_parts'], 'part')} in {cfg.partition}); "
            + (f"train it on {meta['num_parts']} ranks with --nproc {meta['num_parts']}, or under torchrun"
               if ctx.world_size == 1 else
               f"make one with meshshard partition {cfg.data} --parts {domain} --out NEW_PARTS")
        )
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"Expected --dtype float32 or float64 (got {cfg.dtype!r})")
    dtype = getattr(torch, cfg.dtype)
    if cfg.precision not in ("fp32", "bf16-mixed") or (cfg.precision == "bf16-mixed" and cfg.dtype != "float32"):
        raise ValueError(f"Expected --precision fp32, or bf16-mixed with --dtype float32 (got {cfg.precision!r}, {cfg.dtype})")
    # bf16-mixed: matrix products in bfloat16 under autocast; weights, optimizer state, the
    # aggregation (MeshGraphNet sums half-precision messages in float32) and the loss stay float32
    def autocast() -> Any:
        return torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16-mixed")
    # RUN: refused, started over or resumed, decided on every rank from files, before any collective
    stale = _runlog.check_run_folder(cfg.out, cfg.resume, cfg.force)
    identity = _runlog.run_identity(meta, cfg.data)
    saved = load_checkpoint(Path(cfg.out) / "checkpoint.pt", "cpu") if cfg.resume else None
    if saved is not None:
        _runlog.check_resume(saved.get("config", {}), saved.get("identity"), asdict(cfg), identity)
    mesh = init_device_mesh_2d(domain)
    names = [str(x["name"]) for x in dataset.meta["samples"]]  # to name a sample in an error
    reader = DatasetReader(dataset, cfg.partition, mesh.domain_rank, mesh.domain_group, device=ctx.device, dtype=dtype)

    torch.manual_seed(cfg.seed)
    digest = model_digest(cfg.model) if cfg.model else None  # the model file as it is now, before it is run
    if cfg.model:
        inner = build_user_model(cfg.model, cfg.model_args, reader.num_inputs, reader.num_edge_features, reader.num_targets)
    else:
        inner = MeshGraphNet(
            reader.num_inputs, reader.num_edge_features, reader.num_targets, latent_size=cfg.latent_size,
            hidden_layers=cfg.hidden_layers, message_passing_steps=cfg.message_passing_steps,
            activation=cfg.activation, checkpoint_steps=cfg.checkpoint_steps,
        )
    # gradients: sum over the domain, mean over the data groups, in backward
    model = DomainParallel(inner.to(ctx.device, dtype), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    num_parameters = sum(p.numel() for p in model.parameters())  # the weights trained (not buffers)
    out = Path(cfg.out)
    ckpt_path = out / "checkpoint.pt"
    losses: list[float] = []
    start = 0
    old_lr = None
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        losses, start = list(saved["losses"]), int(saved["step"])
        note = _check_steps_left(start, cfg)
        if note and ctx.rank == 0 and not cfg.quiet:
            print(note, file=sys.stderr)
        torch.set_rng_state(saved["rng"].cpu())
        old_lr = _runlog.lr_change(saved.get("config", {}), cfg.lr)
        for group in opt.param_groups:
            group["lr"] = cfg.lr  # a changed learning rate is applied (and logged below)
    last_saved = f"{ckpt_path} (step {start})" if start else "none yet"
    if ctx.rank == 0:
        _runlog.delete_run_files(stale)
        out.mkdir(parents=True, exist_ok=True)
        _rewrite_log(out / "log.jsonl", losses)
        if not cfg.quiet:
            print(_runlog.banner(world_size=ctx.world_size, data_parallel=cfg.data_parallel, device=ctx.device,
                                 backend=dist.get_backend() if dist.is_initialized() else "single process",
                                 parameters=num_parameters, partition=cfg.partition,
                                 model=f"{type(inner).__name__} from {cfg.model}" if cfg.model else "MeshGraphNet",
                                 partition_meta=meta, data=cfg.data, steps=cfg.steps, start=start), flush=True)
    log = _Logger(ctx.rank == 0, cfg, start, round(reader.mean_nodes()) * cfg.data_parallel)
    if saved is not None:
        log.event(None, f"resuming from step {start}")
        was = saved.get("config", {}).get("model_sha256")
        if cfg.model and was and digest and was != digest:
            log.event({"step": start, "event": "model file changed", "from": was, "to": digest},
                      f"note: {cfg.model.rpartition(':')[0]} changed since step {start} was saved (SHA-256 {was[:12]} -> "
                      f"{digest[:12]}); the weights load, but the resumed steps repeat the uninterrupted run's only if "
                      "the model computes what it did")
    if old_lr is not None:
        log.event({"step": start, "event": "lr", "from": old_lr, "to": cfg.lr},
                  f"learning rate changed on resume: {old_lr:g} -> {cfg.lr:g} (applied from step {start})")

    def validate(at: int) -> float:
        """Mean loss over the validation split at step ``at``; data rank d takes every dp-th sample."""
        total = torch.zeros(1, dtype=torch.float64, device=ctx.device)
        with torch.no_grad():
            for s in reader.val[mesh.data_rank::cfg.data_parallel]:
                b = reader.sample(int(s))
                try:
                    with autocast():
                        pred = model(b.x, b.graph, b.edge_attr)
                except Exception as err:
                    raise _step_failure(err, f"rank {ctx.rank}: validation at step {at}", ckpt_path,
                                        inner if cfg.model else None, "forward") from err
                if cfg.model:
                    check_output(pred, len(b.owned_ids), reader.num_targets, cfg.model, sharded=True,
                                 group=mesh.domain_group)
                total += float(((pred.to(b.y.dtype) - b.y) ** 2).mean())
        if dist.is_initialized():
            dist.all_reduce(total)  # every domain rank of a data group holds that group's sum
        return float(total) / (domain * len(reader.val))

    validating = cfg.val_every > 0 and len(reader.val) > 0
    if cfg.val_every > 0 and not validating and ctx.rank == 0 and not cfg.quiet:
        print(f"note: {cfg.data} has no validation samples (meshshard dataset --val-fraction / --val-samples); "
              "no validation loss is logged", file=sys.stderr)
    checked: dict[int, tuple | None] = {}  # sample -> its first non-finite row on this rank, or None
    for step in range(start, cfg.steps):
        if validating and step % cfg.val_every == 0:
            log.eval(step, validate(step))
        t0 = time.perf_counter()
        s = int(reader.train[sample_index(cfg.seed, step, mesh.data_rank, cfg.data_parallel, len(reader.train))])
        b = reader.sample(s)
        if s not in checked:  # the data do not change: each sample is checked the first time it is read
            checked[s] = _non_finite_row(b.x.to_local(), b.y.to_local(), b.owned_ids, s)
        bad_row = checked[s]
        try:
            with autocast():
                pred = model(b.x, b.graph, b.edge_attr)
            if cfg.model and step == start:
                check_output(pred, len(b.owned_ids), reader.num_targets, cfg.model, sharded=True,
                             group=mesh.domain_group)
            loss = ((pred.to(b.y.dtype) - b.y) ** 2).mean()
            _maybe_fail(ctx.rank, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            flags = _local_flags(loss, bad_row, model.parameters(), rank=ctx.rank, world=ctx.world_size)
            if dist.is_initialized():
                dist.all_reduce(flags)  # each domain rank holds its sample's loss; and every rank's finite checks
        except ModelOutputError:
            raise
        except Exception as err:  # the model's own error (any type) or a collective's: said which, on one line
            raise _step_failure(err, f"rank {ctx.rank}: step {step}", ckpt_path, inner if cfg.model else None) from err
        batch = [int(reader.train[sample_index(cfg.seed, step, d, cfg.data_parallel, len(reader.train))])
                 for d in range(cfg.data_parallel)]
        batch_loss = _check_finite(flags, step=step, samples=batch, data=cfg.data, last=last_saved, names=names)
        if step == 0 and ctx.rank == 0:
            grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)  # unused: zeros,
                               for p in model.parameters()])  # as DomainParallel gives them on several ranks
            _atomic_save({"loss": batch_loss, "grads": grads.cpu(), "sample": s}, out / "first_step.pt")
        opt.step()
        losses.append(batch_loss)
        seconds, done = time.perf_counter() - t0, step + 1
        report = step % cfg.log_every == 0 or done == cfg.steps
        memory = _runlog.gather_peak_memory(ctx.device) if report else None  # every rank takes part
        log.step(step, batch_loss, seconds, memory)
        if report:
            log.plot()
        if ctx.rank == 0 and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
            save_checkpoint(ckpt_path, {
                "step": done, "model": model.state_dict(), "optimizer": opt.state_dict(), "losses": losses,
                "rng": torch.get_rng_state(),
                "config": {**asdict(cfg), "normalisation": reader.normaliser.to_dict(), "model_sha256": digest,
                           "target_fields": reader.dataset.meta["targets"],  # predict names its outputs by them
                           "num_parameters": num_parameters},
                "world_size": ctx.world_size, "identity": identity,
            })
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            last_saved = f"{ckpt_path} (step {done})"
    if validating and cfg.steps > start:
        log.eval(cfg.steps, validate(cfg.steps))
    log.plot()
    log.close()
    if dist.is_initialized():
        dist.barrier()
    return losses


def _rewrite_log(path: Path, losses: list[float]) -> None:
    """log.jsonl as of the checkpoint: its earlier records (with memory, evaluations) where they
    agree with the checkpoint's losses, else one line per loss."""
    kept = [r for r in _runlog.read_log(path) if isinstance(r.get("step"), int) and r["step"] < len(losses)]
    if [r["loss"] for r in kept if "loss" in r] != losses:
        kept = [{"step": i, "loss": v} for i, v in enumerate(losses)]
    tmp = path.with_name(".log.jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)


class _Logger:
    """Rank 0's view: a progress bar on a terminal, a line every ``log_every`` steps otherwise."""

    def __init__(self, is_main: bool, cfg: TrainConfig, start: int, nodes_per_step: int) -> None:
        self.enabled, self.cfg, self.nodes = is_main and not cfg.quiet, cfg, nodes_per_step
        self.file = open(Path(cfg.out) / "log.jsonl", "a") if is_main else None  # noqa: SIM115
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self.task = self.bar.add_task("train", total=cfg.steps, completed=start, info="")
            self.bar.start()

    def step(self, step: int, loss: float, seconds: float, memory: dict[str, list[float]] | None = None) -> None:
        if self.file is None:
            return
        rate = self.nodes / seconds if seconds > 0 else 0.0
        record = {"step": step, "loss": loss, "seconds": round(seconds, 4), "nodes_per_s": round(rate),
                  "samples_per_s": round(self.cfg.data_parallel / seconds, 3) if seconds > 0 else 0.0, **(memory or {})}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, advance=1, info=f"loss {loss:.4g}  {rate:,.0f} nodes/s")
        elif step % self.cfg.log_every == 0 or step + 1 == self.cfg.steps:
            print(f"step {step:>5}  loss {loss:.5f}  {seconds * 1e3:7.1f} ms  {rate:>10,.0f} nodes/s", flush=True)

    def eval(self, step: int, loss: float) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"step": step, "val_loss": loss}) + "\n")
            self.file.flush()
        if self.enabled and self.bar is None:
            print(f"step {step:>5}  validation loss {loss:.5f}", flush=True)

    def event(self, record: dict[str, Any] | None, message: str) -> None:
        """A line in log.jsonl (a learning-rate change) and, unless quiet, on the terminal."""
        if self.file is not None and record is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.enabled:
            print(message, flush=True)

    def plot(self) -> None:
        """Rewrite RUN/loss.png from log.jsonl (rank 0; a note once if matplotlib is missing)."""
        if self.file is None:
            return
        self.file.flush()
        out = Path(self.cfg.out)
        if not _runlog.write_loss_plot(_runlog.read_log(out / "log.jsonl"), out / "loss.png", f"meshshard train: {out}"):
            if self.enabled and not getattr(self, "_noted", False):
                print("note: matplotlib is not installed, so no loss.png (pip install matplotlib)", flush=True)
            self._noted = True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.file is not None:
            self.file.close()


def _train_worker(cfg_dict: dict[str, Any]) -> None:
    train(TrainConfig.from_dict(cfg_dict))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _check_counts(args: Any) -> str | None:
    """The first count or rate on the command line that cannot work, as a one-line error; else None."""
    for flag, value in (("--steps", args.steps), ("--every", args.every), ("--log-every", args.log_every),
                        ("--latent", args.latent), ("--mp-steps", args.mp_steps), ("--data-parallel", args.data_parallel)):
        if value < 1:
            return f"Expected {flag} to be a positive integer (got {value})"
    if args.hidden_layers < 0:
        return f"Expected --hidden-layers to be 0 or more (got {args.hidden_layers})"
    if args.val_every < 0:
        return f"Expected --val-every to be 0 (off) or a positive integer (got {args.val_every})"
    if args.nproc < 0:
        return f"Expected --nproc to be 0 (not launching) or a positive integer (got {args.nproc})"
    if not (np.isfinite(args.lr) and args.lr > 0):
        return f"Expected --lr to be a positive number (got {args.lr})"
    return None


#: The built-in MeshGraphNet's settings (argparse default None: given or not is known), and their defaults.
_MESHGRAPHNET_FLAGS = {"latent": "--latent", "hidden_layers": "--hidden-layers", "mp_steps": "--mp-steps",
                       "activation": "--activation", "checkpoint_steps": "--checkpoint-steps"}


#: Settings a resumed run takes from its checkpoint when they are not on the command line (argparse
#: default None), and their defaults for a new run: argument name -> (config key, default).
_RUN_SETTINGS = {"steps": ("steps", 100), "latent": ("latent_size", 64), "hidden_layers": ("hidden_layers", 2),
                 "mp_steps": ("message_passing_steps", 6), "activation": ("activation", "relu"),
                 "dtype": ("dtype", "float32"), "precision": ("precision", "fp32"), "seed": ("seed", 0),
                 "data_parallel": ("data_parallel", 1), "lr": ("lr", 1e-3), "every": ("checkpoint_every", 20),
                 "log_every": ("log_every", 10), "val_every": ("val_every", 0),
                 "checkpoint_steps": ("checkpoint_steps", False)}


def _saved_checkpoint(args: Any) -> dict[str, Any] | None:
    """With --resume, RUN/checkpoint.pt (read once here, for the settings left out and the checks);
    else, or when it is missing or unreadable, None: the run-folder check then refuses in one line."""
    if not args.resume:
        return None
    try:
        return load_checkpoint(Path(args.out) / "checkpoint.pt")
    except (ValueError, OSError):
        return None


def _check_steps_left(done: int, cfg: TrainConfig) -> str | None:
    """Refuse (one line) a resume whose --steps is below the steps the run has done; for a run
    already at --steps, the note to print (it resumes to nothing: a job started again after it ended)."""
    if cfg.steps < done:
        raise ValueError(f"{cfg.out}: Expected --steps of at least the {done} steps the run has done, to resume it "
                         f"(got {cfg.steps}); --steps is the total, not the steps to add")
    if cfg.steps == done:
        return f"note: {cfg.out} has done its {done} steps already: nothing to train (raise --steps to go on)"
    return None


def _model_settings(args: Any, saved: dict[str, Any]) -> str | None:
    """Fill the settings left out: on --resume the run's (``saved``), else the defaults; with
    --model, refuse MeshGraphNet's flags (one line) and read --model-args (on --resume with the
    run's --model, the run's arguments unless given). The model file itself is never taken from
    the checkpoint: code is imported only from a --model on the command line."""
    from ._usermodel import normalise_spec, parse_model_args

    if saved.get("model") and not args.model:
        return (f"{args.out}: the run trained your own model ({saved['model']}); pass --model "
                f"{shlex.quote(str(saved['model']))} to resume it (code is never imported from what a checkpoint says)")
    given = [flag for key, flag in _MESHGRAPHNET_FLAGS.items() if getattr(args, key) not in (None, False)]
    for key, (name, default) in _RUN_SETTINGS.items():
        if getattr(args, key) is None:
            setattr(args, key, saved.get(name, default) if not (args.model and key in _MESHGRAPHNET_FLAGS) else default)
    if not args.model:
        return "Expected --model-args only with --model" if args.model_args else None
    if given:
        return (f"{', '.join(given)} set(s) the built-in MeshGraphNet; with --model, give your model's settings "
                "as --model-args '{\"name\": value}'")
    try:
        args.model = normalise_spec(args.model)
        if args.model_args is None and saved.get("model") == args.model:
            args.model_args = dict(saved.get("model_args") or {})
        else:
            args.model_args = parse_model_args(args.model_args)
    except ValueError as err:
        return str(err)
    return None


def _run(args: Any) -> int:
    saved_ckpt = _saved_checkpoint(args)
    problem = _model_settings(args, dict(saved_ckpt.get("config") or {}) if saved_ckpt else {}) or _check_counts(args)
    if problem:
        print(f"meshshard train: error: {problem}", file=sys.stderr)
        return 2
    cfg = TrainConfig(
        partition=args.partition, data=args.data, out=args.out, steps=args.steps, lr=args.lr,
        latent_size=args.latent, hidden_layers=args.hidden_layers, message_passing_steps=args.mp_steps,
        activation=args.activation, data_parallel=args.data_parallel, checkpoint_every=args.every,
        resume=args.resume, force=args.force, seed=args.seed, log_every=args.log_every, quiet=args.quiet,
        val_every=args.val_every, dtype=args.dtype, precision=args.precision,
        checkpoint_steps=args.checkpoint_steps, model=args.model or "", model_args=args.model_args or {},
    )
    from ._launch import check_apart, check_input_folders, run_command

    def check() -> None:  # the RUN checks again here, so that a refusal is one line before any rank starts
        from meshshard.partition import check_partition_matches, open_dataset

        folders = ((cfg.partition, "partition folder"), (cfg.data, "dataset folder"))
        check_input_folders(*folders)
        check_apart(cfg.out, *folders)
        data = open_dataset(cfg.data)
        _check_has_targets(data)
        _runlog.check_run_folder(cfg.out, cfg.resume, cfg.force)
        if cfg.model:  # your model is imported and built once here: its errors come before any rank starts
            from ._usermodel import build_user_model

            build_user_model(cfg.model, cfg.model_args, len(data.input_channels), len(data.edge_channels),
                             len(data.target_channels))
        if cfg.resume:
            saved = saved_ckpt if saved_ckpt is not None else load_checkpoint(Path(cfg.out) / "checkpoint.pt")
            _check_steps_left(int(saved["step"]), cfg)  # its note is printed by rank 0
            _runlog.check_resume(saved.get("config", {}), saved.get("identity"), asdict(cfg),
                                 _runlog.run_identity(check_partition_matches(data, cfg.partition), cfg.data))

    return run_command("train", _train_worker, args.nproc, asdict(cfg), check, stopped=lambda: _resume_hint(cfg.out))


def _resume_hint(out: str) -> str | None:
    """What to do after a stopped run: resume from its last checkpoint, or start over without one."""
    ckpt = Path(out) / "checkpoint.pt"
    if not Path(out).is_dir():  # stopped before it made RUN: nothing to say
        return None
    if not ckpt.is_file():
        return f"{out} has no checkpoint yet: start it over with --force"
    from meshshard._checkpoint import peek

    step = (peek(ckpt) or {}).get("step")
    return f"{ckpt} holds step {int(step)}: continue with --resume" if isinstance(step, int) else None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train", help="train a sharded MeshGraphNet, or your own model, on a partition (under torchrun, or --nproc local ranks)",
        description="Train MeshGraphNet, or your own model (--model), on a partitioned mesh. Run under torchrun "
        "(torchrun --nproc-per-node R -m meshshard train ...) or start R local ranks with --nproc R.",
    )
    p.add_argument("partition", help="partitions of the dataset (meshshard partition DATA)")
    p.add_argument("--data", required=True, help="dataset folder (meshshard dataset)")
    p.add_argument("--out", required=True, help="run folder: checkpoint.pt, log.jsonl")
    p.add_argument("--steps", type=int, default=None,
                   help="total training steps (default 100; on --resume the run's: a resumed run goes on up to this many)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 1e-3; on --resume the run's, and a changed one is applied)")
    p.add_argument("--model", default=None, metavar="FILE.py:NAME",
                   help="your own model instead of MeshGraphNet: NAME(node_in, edge_in, node_out, **model_args) in a "
                   "Python file or module (docs/training.md)")
    p.add_argument("--model-args", default=None, metavar="JSON", help="keyword arguments of --model, a JSON object")
    p.add_argument("--latent", type=int, default=None, help="MeshGraphNet's latent size (default 64; paper: 128)")
    p.add_argument("--hidden-layers", type=int, default=None, help="MeshGraphNet's hidden layers per MLP (default 2)")
    p.add_argument("--mp-steps", type=int, default=None, help="MeshGraphNet's message-passing steps (default 6; paper: 15)")
    p.add_argument("--activation", default=None, help="MeshGraphNet's activation (default relu)")
    p.add_argument("--data-parallel", type=int, default=None,
                   help="data-parallel groups; domain size = world / this (default 1)")
    p.add_argument("--every", type=int, default=None, help="checkpoint every N steps (default 20)")
    p.add_argument("--resume", action="store_true",
                   help="continue from RUN/checkpoint.pt; settings left out are the run's (a changed --lr is applied)")
    p.add_argument("--force", action="store_true", help="start RUN over (deletes only the files train writes in it)")
    p.add_argument("--seed", type=int, default=None,
                   help="seeds the weights and the order of the training samples (default 0)")
    p.add_argument("--log-every", type=int, default=None, help="print and log every N steps (default 10)")
    p.add_argument("--val-every", "--eval-every", dest="val_every", type=int, default=None,
                   help="mean loss over the validation split every K steps and at the end (default 0: off)")
    p.add_argument("--checkpoint-steps", action="store_true", default=None,
                   help="MeshGraphNet: recompute each message-passing step in backward (less memory, more time)")
    p.add_argument("--dtype", default=None, choices=["float32", "float64"], help="parameters and data (default float32)")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16-mixed"],
                   help="fp32 (default), or bf16-mixed: bfloat16 matrix products under autocast, float32 weights, "
                   "sums and loss")
    p.add_argument("--nproc", type=int, default=0, help="start this many local ranks (when not under torchrun)")
    p.add_argument("--quiet", "-q", action="store_true", help="no banner, no per-step lines (errors and notes still print)")
    p.set_defaults(func=_run)
