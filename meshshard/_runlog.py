"""The run folder of ``meshshard train``: what may be written over, the banner, memory, ``loss.png``.

Everything here is about the user's view of a run, apart from the training step itself:

- :func:`check_run_folder`: an existing RUN is never silently replaced. A RUN holding a
  checkpoint or a log is refused without ``--resume`` (continue it) or ``--force`` (start over,
  deleting only the files ``meshshard train`` writes: :data:`RUN_FILES`, and only when they are
  a run's); ``--resume`` without a checkpoint is an error. Files with those names that are not a
  run (the user's own ``checkpoint.pt``, say) are refused, with ``--force`` too.
- :func:`check_resume`: a resumed run must keep what its exactness depends on (the model's shape,
  the dtype, the seed and the data-parallel schedule, the dataset, the partition's mesh); a changed
  learning rate is applied and logged (:func:`lr_change`).
- :func:`banner`: printed by rank 0 before the first step.
- :func:`peak_memory_mb`: this rank's peak resident memory (and CUDA allocation), gathered to
  every rank by :func:`gather_peak_memory` for ``log.jsonl``.
- :func:`write_loss_plot`: ``RUN/loss.png`` (training and validation loss), replaced atomically.

All checks run on every rank, from files only, before any collective, so a refusal stops every
rank with the same one-line message.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshshard._launch import check_output_folder

__all__ = [
    "RUN_FILES",
    "EXACTNESS_KEYS",
    "check_run_folder",
    "run_identity",
    "check_resume",
    "lr_change",
    "banner",
    "peak_memory_mb",
    "gather_peak_memory",
    "write_loss_plot",
    "read_log",
    "partition_counts",
    "data_summary",
    "delete_run_files",
]

#: The files ``meshshard train`` writes in RUN (and ``--force`` may delete); nothing else is touched.
RUN_FILES = ("checkpoint.pt", "log.jsonl", "first_step.pt", "loss.png")
#: Settings that a resumed run must keep, or its steps would not repeat the uninterrupted run's.
EXACTNESS_KEYS = ("model", "model_args", "latent_size", "hidden_layers", "message_passing_steps", "activation", "dtype",
                  "precision", "seed", "data_parallel")


def check_run_folder(out: str | os.PathLike[str], resume: bool, force: bool) -> list[Path]:
    """Raise a one-line ``ValueError`` unless RUN may be used as asked; return what ``--force``
    must delete (our files only)."""
    if resume and force:
        raise ValueError("Expected --resume or --force, not both (--resume continues RUN, --force starts it over)")
    out = check_output_folder(out)
    ckpt = out / "checkpoint.pt"
    ours = [out / name for name in RUN_FILES if (out / name).is_file() and not (out / name).is_symlink()]
    for name in RUN_FILES:
        if (out / name).is_symlink() or (out / name).exists() and not (out / name).is_file():
            raise ValueError(f"{out}: holds {name}, which is not a file meshshard train wrote (a link or a folder); "
                             "refusing to write over it: pick another --out")
    if ours:
        not_ours = _not_a_run(out)
        if not_ours:
            raise ValueError(f"{out}: holds {not_ours}; refusing to write over it, even with --force: pick another --out")
    if resume:
        if not ckpt.is_file():
            if (out / "log.jsonl").is_file():
                raise ValueError(f"{out}: nothing to resume (no checkpoint.pt): the run stopped before it saved one; "
                                 "pass --force instead of --resume to start it over")
            raise ValueError(f"{out}: nothing to resume (no checkpoint.pt); run without --resume to start")
        return []
    held = [p.name for p in ours if p.name in ("checkpoint.pt", "log.jsonl")]
    if held and not force:
        if not ckpt.is_file():  # a run that stopped before its first checkpoint: nothing to continue
            raise ValueError(f"{out}: holds a run that stopped before it saved a checkpoint (log.jsonl); pass "
                             "--force to start over")
        raise ValueError(
            f"{out}: holds a run ({', '.join(held)}); pass --resume to continue it or --force to start over"
        )
    return ours if force else []


def _not_a_run(out: Path) -> str | None:
    """None when the files of :data:`RUN_FILES` in ``out`` are a run of ``meshshard train``'s: a
    ``checkpoint.pt`` in its format, and a ``log.jsonl`` of its records (at least one of the two;
    ``first_step.pt`` and ``loss.png`` alone are no run). Else what is not ours."""
    from meshshard._checkpoint import peek

    ckpt, log = out / "checkpoint.pt", out / "log.jsonl"
    if ckpt.is_file():
        if (peek(ckpt) or {}).get("format") != "meshshard-checkpoint":
            return "checkpoint.pt, which is not a readable meshshard checkpoint (another program's, or damaged)"
    if log.is_file() and not log.is_symlink():
        with open(log, "rb") as f:
            first = f.readline(1 << 16)
        try:
            record = json.loads(first) if first.strip() else {"step": 0}  # empty: made, nothing logged yet
        except ValueError:
            record = None
        if not isinstance(record, dict) or "step" not in record:
            return "log.jsonl, which is not a log of meshshard train's"
    first = out / "first_step.pt"
    if first.is_file():
        if set(peek(first) or {}) != {"loss", "grads", "sample"}:
            return "first_step.pt, which is not the first step of a meshshard run"
    if not ckpt.is_file() and not log.is_file():
        present = [name for name in RUN_FILES if (out / name).is_file()]
        return f"{' and '.join(present)} but no run of meshshard train's (no checkpoint.pt or log.jsonl)"
    return None


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
        meta = json.loads((Path(data_path) / "dataset.json").read_text())
    except (OSError, ValueError):
        meta = {}
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


def partition_counts(parts: str | os.PathLike[str], partition_meta: Mapping[str, Any]) -> tuple[int, list[int], list[int]]:
    """(nodes of the largest mesh, owned counts, ghost counts) over every part of every mesh's
    partition, from the partitions' metadata files (no communication, no part file read)."""
    from meshshard.partition import dataset_partition_folder, read_metadata

    nodes, owned, ghost = 0, [], []
    for entry in partition_meta.get("meshes", []):
        meta = read_metadata(dataset_partition_folder(parts, int(entry["mesh"])))
        nodes = max(nodes, int(meta["num_nodes"]))
        owned += [int(p["num_owned"]) for p in meta["parts"]]
        ghost += [int(p["num_ghost"]) for p in meta["parts"]]
    return nodes, owned or [0], ghost or [0]


def banner(*, world_size: int, data_parallel: int, device: Any, backend: str, parameters: int,
           partition: str, partition_meta: Mapping[str, Any], data: str, steps: int, start: int,
           model: str = "MeshGraphNet") -> str:
    """The lines rank 0 prints before the first step (from metadata files: no communication)."""
    nodes, owned, ghost = partition_counts(partition, partition_meta)
    meshes = len(partition_meta.get("meshes", []))
    domain = world_size // max(data_parallel, 1)
    where = f"{nodes:,} nodes" if meshes <= 1 else f"{meshes} meshes of up to {nodes:,} nodes"
    lines = [
        f"meshshard train: {world_size} rank(s) = {data_parallel} data-parallel x {domain} domain-parallel; "
        f"device {device} ({backend}) on each rank",
        f"  model: {model}, {parameters:,} parameters",
        f"  partition: {partition}: {where} in {partition_meta.get('num_parts')} parts; per rank "
        f"owned {min(owned):,}..{max(owned):,}, ghosts {min(ghost):,}..{max(ghost):,}",
        f"  dataset: {data}: {data_summary(data)}",
        f"  steps {start}..{steps}" + (f" (resuming from step {start})" if start else ""),
    ]
    return "\n".join(lines)


def peak_memory_mb(device: Any = None) -> dict[str, float]:
    """This process's peak resident memory in MB (``ru_maxrss``), and its peak CUDA allocation."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"rss": rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024}
    if device is not None and getattr(device, "type", str(device)) == "cuda":
        import torch

        out["cuda"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def gather_peak_memory(device: Any = None) -> dict[str, list[float]]:
    """Every rank's :func:`peak_memory_mb`, in rank order (one small all-gather; a world of one
    needs none)."""
    import torch
    import torch.distributed as dist

    mine = peak_memory_mb(device)
    keys = sorted(mine)
    if not dist.is_initialized():
        return {f"peak_{k}_mb": [round(mine[k], 1)] for k in keys}
    from meshshard.comm import all_gather_v, communication_device

    world = dist.get_world_size()
    t = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=communication_device(None))
    rows = all_gather_v(t.reshape(1, -1), [1] * world).cpu().numpy()
    return {f"peak_{k}_mb": [round(float(v), 1) for v in rows[:, i]] for i, k in enumerate(keys)}


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl`` (an unreadable line is skipped; a link or a special file,
    such as a FIFO that would block the reader, reads as no records)."""
    records = []
    if Path(path).is_symlink() or not Path(path).is_file():
        return []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def write_loss_plot(records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], title: str = "") -> bool:
    """Training loss (every step) and validation loss (``eval_loss`` / ``val_loss`` records) on a
    log scale, written to a temporary file and renamed; ``False`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    key = "val_loss" if any("val_loss" in r for r in records) else "eval_loss"
    val = [(r["step"], r[key]) for r in records if key in r]
    fig, ax = plt.subplots(figsize=(6.4, 4), dpi=110)
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], lw=0.8, alpha=0.6, label="training loss (per step)")
    if val:
        label = "validation loss" if key == "val_loss" else "loss over fixed samples"
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", lw=1.8, ms=3, label=label)
    if any(v > 0 for _, v in train + val):
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (MSE of normalised targets)")
    ax.set_title(title or "meshshard train", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def data_summary(data: str | os.PathLike[str]) -> str:
    """One line about a dataset folder, from its ``dataset.json``."""
    try:
        meta = json.loads((Path(data) / "dataset.json").read_text())
    except (OSError, ValueError):
        return "no readable dataset.json"
    split = meta.get("split") or {}
    text = f"{meta.get('num_samples', '?')} samples"
    if split:
        text += f" (train {len(split.get('train', []))}, validation {len(split.get('val', []))})"
    if meta.get("input_channels"):
        text += f", inputs {', '.join(meta['input_channels'])} -> targets {', '.join(meta.get('target_channels', []))}"
    elif meta.get("num_nodes"):
        text += f" of {meta['num_nodes']:,} nodes"
    return text
