"""What rank 0 tells the user about a run: the banner, every rank's peak memory, ``loss.png``.

- :func:`banner`: printed by rank 0 before the first step (from metadata files: no communication).
- :func:`peak_memory_mb`: this rank's peak resident memory (and CUDA allocation), gathered to
  every rank by :func:`gather_peak_memory` for ``log.jsonl`` and ``metrics.json``;
  :func:`resident_memory_mb`: what it holds now (a rollout's memory along its steps).
- :func:`write_loss_plot`: ``RUN/loss.png`` (training and validation loss), replaced atomically.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshshard.partition import read_json

__all__ = ["banner", "data_summary", "gather_peak_memory", "partition_counts", "peak_memory_mb", "resident_memory_mb",
           "write_loss_plot"]


def partition_counts(parts: str | os.PathLike[str],
                     partition_meta: Mapping[str, Any]) -> tuple[int, list[int], list[int]]:
    """(nodes of the largest mesh, owned counts, ghost counts) over every part of every mesh's
    partition, from the partitions' metadata files (no communication, no part file read)."""
    from meshshard.data import dataset_partition_folder
    from meshshard.partition import read_metadata

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


def resident_memory_mb() -> float | None:
    """This process's resident memory now, in MB (Linux ``/proc/self/statm``; ``None`` where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def gather_peak_memory(device: Any = None) -> dict[str, list[float]]:
    """Every rank's :func:`peak_memory_mb`, in rank order (one small all-gather; a world of one
    needs none)."""
    import torch

    from meshshard.comm import all_gather_v, communication_device, group_rank_and_size, is_distributed

    mine = peak_memory_mb(device)
    keys = sorted(mine)
    if not is_distributed():
        return {f"peak_{k}_mb": [round(mine[k], 1)] for k in keys}
    _, world = group_rank_and_size()
    t = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=communication_device(None))
    rows = all_gather_v(t.reshape(1, -1), [1] * world).cpu().numpy()
    return {f"peak_{k}_mb": [round(float(v), 1) for v in rows[:, i]] for i, k in enumerate(keys)}


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
    val = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]  # null: a NaN loss
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
        meta = read_json(Path(data) / "dataset.json")
    except (OSError, ValueError):
        return "no readable dataset.json"
    if not isinstance(meta, dict):
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
