"""The prediction folder PRED: what ``predict`` (steady or rollout) wrote there, recorded in its
``metrics.json``, the only files ``--force`` may delete, and the summary ``meshshard info PRED``
prints from it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import (
    Refusals,
    check_destination,
    dumps_json,
    is_lock_file,
    read_json,
    read_json_inside,
    write_text_file,
)

__all__ = ["MAX_METRICS_BYTES", "METRICS_FILE", "METRICS_FORMAT", "check_prediction_folder", "delete_paths",
           "file_stem", "mean_known", "prediction_summary", "write_metrics"]

#: PRED's record of what predict wrote there: rewritten after each sample (``complete`` is false
#: until the last), it lists every file and piece folder (``files``), which ``--force`` alone may delete.
METRICS_FILE = "metrics.json"
METRICS_FORMAT = "meshshard-predictions"
_STEM = r"[A-Za-z0-9_+=@-][A-Za-z0-9._+=@-]*"  # what file_stem gives: a plain name, never "." or ".."
_OUR_FILE = re.compile(rf"^{_STEM}\.(vtu|pvtu|vtp|pvtp|png|pvd|gif)$")
_OUR_FOLDER = re.compile(rf"^{_STEM}$")
_PIECE = re.compile(r"^part-\d{5}\.(vtu|vtp)$")
_STEP = re.compile(r"^step-\d{5}(\.vtu|\.pvtu)?$")  # a rollout's folder: its steps' files and piece folders


def file_stem(name: str) -> str:
    """A sample name made safe as a file name: letters, digits and ``._+=@-`` are kept (``aoa+02``
    keeps its sign), every other run of characters becomes ``_``; never a leading ``-`` (which a
    shell would read as an option)."""
    stem = re.sub(r"[^A-Za-z0-9._+=@-]+", "_", name).strip("._").lstrip("-").strip("._") or "sample"
    return stem


def _written_here(out: Path) -> tuple[list[str], bool] | None:
    """The names PRED's ``metrics.json`` says predict wrote there, and whether that prediction
    finished; None when it has none, or one that is not ours. (One written before ``files`` was
    recorded lists its samples' files.)"""
    file = out / METRICS_FILE
    if file.is_symlink() or not file.is_file():  # a link, a FIFO (a reader would block): not our record
        return None
    try:
        meta = read_json(file, max_bytes=MAX_METRICS_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("samples"), list):
        return None
    if "format" in meta:
        if meta["format"] != METRICS_FORMAT or not isinstance(meta.get("files"), list):
            return None
        names = meta["files"]
    else:
        names = []
        for record in meta["samples"]:
            if isinstance(record, dict):
                names += [record.get("file"), record.get("picture")]
                if str(record.get("file")).endswith(".pvtu"):
                    names.append(str(record["file"])[:-5])
        names = [n for n in names if n is not None]
    if not all(isinstance(n, str) and (_OUR_FILE.match(n) or _OUR_FOLDER.match(n)) for n in names):
        return None  # a name predict never gives (a path, say): not our record
    return names, meta.get("complete") is not False


def _holds_a_prediction(out: Path) -> str:
    """The refusal of a PRED that holds something, without ``--force``."""
    record = _written_here(out)
    if record is not None and not record[1]:
        return (f"{out}: holds a prediction that stopped part-way ({METRICS_FILE} lists the samples it finished); "
                "pass --force to replace it")
    return f"{out}: exists and is not empty (pass --force to replace earlier predictions)"


#: A prediction folder's words for ``check_destination``'s refusals.
_REFUSALS = Refusals(link="{out}: exists and is not a folder", not_empty=_holds_a_prediction)


def _check_is_a_prediction(out: Path) -> None:
    """Raise unless everything in PRED is what its ``metrics.json`` says predict wrote there."""
    entries = [path for path in out.iterdir() if not is_lock_file(path)]  # a killed command's lock is ours
    for path in entries:
        if path.is_symlink():
            raise ValueError(f"{out}: holds a link ({path.name}); refusing to replace it, even with --force")
        if not (path.is_file() and (_OUR_FILE.match(path.name) or path.name in (METRICS_FILE, METRICS_FILE + ".part"))
                or path.is_dir() and _OUR_FOLDER.match(path.name)):
            raise ValueError(f"{out}: holds {path.name}, which meshshard predict did not write; refusing to replace "
                             "it, even with --force")
    record = _written_here(out)
    if record is None:
        raise ValueError(f"{out}: holds no {METRICS_FILE} of meshshard predict's, so none of its files is known to be "
                         "ours; refusing to replace them, even with --force")
    ours = set(record[0]) | {METRICS_FILE, METRICS_FILE + ".part"}
    for path in entries:
        if path.name not in ours:
            raise ValueError(f"{out}: holds {path.name}, which meshshard predict did not write "
                             f"(its {METRICS_FILE} does not list it); refusing to replace it, even with --force")
        if path.is_dir() and not _ours_inside(path):
            raise ValueError(f"{out}: holds {path.name}/ with files meshshard predict did not write; "
                             "refusing to replace it, even with --force")


def check_prediction_folder(out: Path, force: bool) -> list[Path]:
    """Refuse an existing non-empty PRED unless ``force``; with ``force`` return what to delete:
    the files and piece folders that PRED's ``metrics.json`` lists, and that file (anything else
    there, or no such record, refuses). ``meshshard.partition.check_destination``'s rule for a
    folder written in place."""
    check_destination(out, force=force, is_ours=_check_is_a_prediction, in_place=True, refusals=_REFUSALS)
    return list(Path(out).iterdir()) if force and Path(out).is_dir() else []


def write_metrics(out: Path, record: dict[str, Any]) -> None:
    """Replace ``PRED/metrics.json`` whole (written aside, then renamed), so a crash leaves the last one."""
    part = out / (METRICS_FILE + ".part")
    write_text_file(part, dumps_json(record, indent=2) + "\n")
    os.replace(part, out / METRICS_FILE)


def delete_paths(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            delete_paths(list(path.iterdir()))  # piece folders, and a rollout's folder of steps (checked: ours)
            path.rmdir()
        else:
            path.unlink()


def _ours_inside(path: Path) -> bool:
    """A folder predict writes: one piece per rank (``part-00000.vtu``), or a rollout's steps
    (``step-00000.vtu`` / ``.pvtu``, and ``step-00000/`` folders of pieces)."""
    for p in path.iterdir():
        if p.is_symlink():
            return False
        if p.is_file() and (_PIECE.match(p.name) or _STEP.match(p.name) and p.suffix):
            continue
        if p.is_dir() and _STEP.match(p.name) and not p.suffix and all(
                q.is_file() and not q.is_symlink() and _PIECE.match(q.name) for q in p.iterdir()):
            continue
        return False
    return True


def mean_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None



#: The largest metrics.json info reads (a record per sample: a few hundred bytes each).
MAX_METRICS_BYTES = 64 << 20


def _error_figure(value: Any, where: str) -> float | None:
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    raise ValueError(f"{where}: Expected a number or null (got {value!r})")


def prediction_summary(pred: str | Path) -> dict[str, Any]:
    """The facts ``meshshard info PRED`` prints, from ``PRED/metrics.json`` of ``meshshard predict``
    (read as JSON only, from inside PRED; the paths it names are printed, never opened)."""
    file = Path(pred) / METRICS_FILE
    meta = read_json_inside(pred, METRICS_FILE, max_bytes=MAX_METRICS_BYTES)
    if not isinstance(meta, dict) or meta.get("format", METRICS_FORMAT) != METRICS_FORMAT:
        raise ValueError(f"{file}: Expected format {METRICS_FORMAT!r} "
                         f"(got {meta.get('format') if isinstance(meta, dict) else type(meta).__name__!r})")
    samples = meta.get("samples")
    if not isinstance(samples, list) or not all(isinstance(r, dict) and isinstance(r.get("fields"), dict)
                                                for r in samples):
        raise ValueError(f"{file}: Expected a list of samples, each with its fields' errors "
                         "(not a metrics.json of meshshard predict)")
    complete = meta.get("complete") is not False  # one from before "complete" was recorded was written at the end
    keys = ("rmse", "rel_l2")
    weighted = {name for r in samples for name, e in r["fields"].items()  # surfaces: area-weighted too
                if isinstance(e, dict) and "rel_l2_area" in e}

    def keys_of(name: str) -> tuple[str, ...]:
        return keys + (("rel_l2_area",) if name in weighted else ())

    errors = [{name: {key: _error_figure((e if isinstance(e, dict) else {}).get(key),
                                         f"{file}: samples[{i}].fields.{name}.{key}") for key in keys_of(name)}
               for name, e in r["fields"].items()} for i, r in enumerate(samples)]
    recorded = meta.get("mean")
    if complete and isinstance(recorded, dict):
        mean = {str(name): {key: _error_figure((e if isinstance(e, dict) else {}).get(key),
                                               f"{file}: mean.{name}.{key}")
                            for key in keys_of(str(name))} for name, e in recorded.items()}
    else:  # a prediction that stopped part-way: the mean over the samples it finished
        fields = list(dict.fromkeys(name for e in errors for name in e))
        mean = {name: {key: mean_known([e[name].get(key) for e in errors if name in e]) for key in keys_of(name)}
                for name in fields}
    return {
        "prediction": str(pred),
        "run": meta.get("run"),
        "baseline": meta.get("baseline") if isinstance(meta.get("baseline"), dict) else None,
        "data": meta.get("data"),
        "step": meta.get("step"),
        "world_size": meta.get("world_size"),
        "complete": complete,
        "targets_known": meta.get("targets_known", any(e["rmse"] is not None for e in mean.values())),
        "samples": [{"name": r.get("name"), "num_nodes": r.get("num_nodes"), "file": r.get("file")} for r in samples],
        "mean": mean,
    }
