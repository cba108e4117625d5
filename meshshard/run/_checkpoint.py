"""Training checkpoints: tensors and plain values only, written atomically, checked on every read.

Read a run's checkpoint with :func:`load_checkpoint` (``meshshard predict`` and ``--resume`` do);
never with ``torch.load(..., weights_only=False)``: a checkpoint is a file a user may have received,
and unpickling one can run arbitrary code.

The file is an ordinary ``torch.save`` zip holding one dict::

    {
      "format": "meshshard-checkpoint", "format_version": 2,
      "step": 40,                        # completed steps
      "model": {name: Tensor},           # model.state_dict()
      "optimizer": {"state": ..., "param_groups": [...]},   # optimizer.state_dict()
      "losses": [float, ...],            # the loss of every completed step
      "rng": Tensor (uint8),             # torch.get_rng_state()
      "config": {name: value},           # the TrainConfig as a dict
      "world_size": 4,
      "sha256": "9f2c...",               # over every entry above (see below)
    }

Only tensors, numbers, strings, booleans, ``None``, lists, tuples and dicts are stored, so the file
loads with ``torch.load(weights_only=True)``, which refuses anything else (a class, a function, a
call) instead of running it. ``sha256`` is a SHA-256 digest over every entry but itself, walked in
order: each tensor contributes its dtype, shape and raw bytes, each plain value its type and text.
A bit flipped anywhere in a weight, a loss or the optimizer state is refused with one line instead
of silently changing the resumed run. Weights that are not finite (NaN, inf) are never written, so
the last good checkpoint survives a diverged step.

Writes go to a temporary file beside the target, are flushed and ``fsync``-ed, then renamed over it
(and the folder is synced), so a checkpoint on disk is always either the old one or the new one,
whole.

Every error a user can act on is a :class:`CheckpointError` (a ``ValueError``) on one line that
names the file.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from meshshard.partition.files import open_regular

__all__ = ["CheckpointError", "FORMAT", "FORMAT_VERSION", "REQUIRED", "atomic_save", "load_checkpoint",
           "save_checkpoint"]

FORMAT = "meshshard-checkpoint"
FORMAT_VERSION = 2
REQUIRED = ("step", "model", "optimizer", "losses", "rng", "config", "world_size")
_PLAIN = (bool, int, float, str, type(None))


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: unreadable, altered, incomplete or from elsewhere."""


def _check_plain(value: Any, where: str) -> None:
    """Raise ``TypeError`` unless ``value`` is made of tensors, plain values, lists and dicts."""
    if isinstance(value, (torch.Tensor, *_PLAIN)):
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, _PLAIN):
                raise TypeError(f"Expected only plain dict keys in a checkpoint (got {type(k).__name__} in {where})")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"Expected only tensors, numbers, strings, lists and dicts in a checkpoint (got {type(value).__name__} "
        f"at {where})"
    )


def _update(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(value.shape)}:".encode())
        h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
    elif isinstance(value, Mapping):
        h.update(f"D{len(value)}:".encode())
        for k, v in value.items():
            _update(h, k)
            _update(h, v)
    elif isinstance(value, list | tuple):
        h.update(f"L{len(value)}:".encode())
        for v in value:
            _update(h, v)
    elif isinstance(value, float):
        h.update(f"F{value.hex()};".encode())
    else:  # bool, int, str, None (bool before int: repr tells them apart)
        text = repr(value)
        h.update(f"{type(value).__name__}{len(text)}:{text}".encode())


def _digest(body: Mapping[str, Any]) -> str:
    """SHA-256 over every entry of ``body`` except ``sha256``, in order."""
    h = hashlib.sha256()
    _update(h, {k: v for k, v in body.items() if k != "sha256"})
    return h.hexdigest()


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` ``obj`` (tensors and plain values only) to a temporary file, fsync, rename.

    Raises:
        TypeError: if ``obj`` holds anything ``torch.load(weights_only=True)`` would refuse.
    """
    _check_plain(obj, "the top level")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # some file systems do not open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _first_non_finite(model: Mapping[str, Any]) -> tuple[str, str] | None:
    for name, t in model.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = t[~torch.isfinite(t)].reshape(-1)[0]
            return name, str(float(bad))
    return None


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a training checkpoint atomically, with its format, version and checksum.

    Args:
        path: the file to write (replaced whole, or left as it was).
        state: the entries of :data:`REQUIRED` (``model`` and ``optimizer`` as ``state_dict()``,
            ``rng`` as a tensor, ``config`` as a dict), plus any other plain entries.

    Raises:
        ValueError: if an entry is missing, or a model weight is NaN or infinite (the file on disk,
            the last good checkpoint, is kept).
        TypeError: if an entry is not made of tensors and plain values.
    """
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        needs = ", ".join(REQUIRED)
        raise ValueError(f"Expected a checkpoint state with {', '.join(map(repr, missing))} "
                         f"(missing; it needs {needs})")
    bad = _first_non_finite(state["model"])
    if bad is not None:
        raise ValueError(
            f"{path}: refusing to save non-finite weights ({bad[0]!r} holds {bad[1]}); the last good checkpoint is kept"
        )
    body = {"format": FORMAT, "format_version": FORMAT_VERSION, **state}
    _check_plain(body, "the top level")
    atomic_save(body | {"sha256": _digest(body)}, path)


def peek(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The top-level entries of a ``torch.save`` file of plain values, without reading its tensors'
    data (``mmap``) and never unpickling code (``weights_only``): for a quick look (whose file is
    it, which step); ``None`` when it does not load that way. Not checked: read a checkpoint with
    :func:`load_checkpoint`."""
    try:
        with open_regular(path) as file:  # a FIFO or a folder is none of ours, never opened for a blocking read
            proc = Path(f"/proc/self/fd/{file.fileno()}")  # the file just checked, not whatever the name is now
            value = torch.load(proc if proc.exists() else path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - whatever does not load this way is not ours to look into
        return None
    return value if isinstance(value, dict) else None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if "WeightsUnpickler error:" in text:  # torch's restricted unpickler: keep its reason, drop its advice
        detail = text.split("WeightsUnpickler error:", 1)[1].split(" Check the documentation")[0].strip()
        if detail.startswith("Unsupported global"):
            return (f"it holds something other than tensors and plain values "
                    f"({detail.removeprefix('Unsupported global: ')}), which is never unpickled")
        return f"not a torch.save file: {detail}"
    if "Weights only load failed" in text:  # torch 2.13's wording: keep the reason, never the advice to turn it off
        found = re.search(r"(unsupported GLOBAL \S+|Unsupported global: \S+|Unsupported operand \S+)", text)
        what = f" ({found.group(1)})" if found else ""
        return f"it holds something other than tensors and plain values{what}, which is never unpickled"
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _check_entries(path: Any, ckpt: Mapping[str, Any]) -> None:
    expected = {
        "step": int, "model": Mapping, "optimizer": Mapping, "losses": list, "rng": torch.Tensor,
        "config": Mapping, "world_size": int,
    }
    for name, kind in expected.items():
        if name not in ckpt:
            raise CheckpointError(f"{path}: incomplete meshshard checkpoint (no {name!r} entry)")
        if not isinstance(ckpt[name], kind) or isinstance(ckpt[name], bool):
            got = type(ckpt[name]).__name__
            raise CheckpointError(f"{path}: Expected the checkpoint's {name!r} to be a {kind.__name__} (got {got})")
    for name in ("state", "param_groups"):
        if name not in ckpt["optimizer"]:
            raise CheckpointError(f"{path}: incomplete meshshard checkpoint (no {name!r} in 'optimizer')")
    if ckpt["step"] < 0 or len(ckpt["losses"]) != ckpt["step"]:
        step, got = ckpt["step"], len(ckpt["losses"])
        raise CheckpointError(f"{path}: Expected {step} losses in a checkpoint of step {step} (got {got})")


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Read and check a checkpoint written by :func:`save_checkpoint` (``meshshard train``).

    Loads with ``weights_only=True`` (nothing is unpickled but tensors and plain values), then
    checks the format, the version, the checksum and that every entry of :data:`REQUIRED` is there.

    Args:
        path: the checkpoint file (``RUN/checkpoint.pt``).
        map_location: where tensors are loaded, as for ``torch.load``.

    Returns:
        The checkpoint dict (see the module docstring).

    Raises:
        CheckpointError: (a ``ValueError``) one line naming the file and the problem.
    """
    with ExitStack() as stack:
        try:  # a FIFO (that would block), a device or a folder: refused in one line, never opened for reading
            file = stack.enter_context(open_regular(path))
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        try:
            ckpt = torch.load(file, map_location=map_location, weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file is reported the same way, on one line
            raise CheckpointError(f"{path}: not a readable meshshard checkpoint ({_one_line(err)})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a meshshard checkpoint (no 'format': {FORMAT!r} entry)")
    version = ckpt.get("format_version")
    if version != FORMAT_VERSION:
        if isinstance(version, int) and version < FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: meshshard checkpoint format_version {version} has no checksum and is not resumed; "
                f"start a new run (this meshshard writes version {FORMAT_VERSION})"
            )
        raise CheckpointError(f"{path}: Expected checkpoint format_version {FORMAT_VERSION} (got {version!r})")
    if not isinstance(ckpt.get("sha256"), str) or _digest(ckpt) != ckpt["sha256"]:
        raise CheckpointError(
            f"{path}: checksum mismatch (the file was changed or damaged after it was written); "
            "refusing to resume from it"
        )
    _check_entries(path, ckpt)
    return ckpt

