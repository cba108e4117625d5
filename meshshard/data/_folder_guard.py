"""What a dataset folder may be written over, and how it is written: staged beside it, renamed at the end.

``--force`` replaces a dataset folder only when it holds a dataset and only the files meshshard
writes (:func:`check_dataset_output`); :func:`atomic_folder` stages the new folder beside the old
one, so that nothing is left behind on error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from meshshard.partition.files import Refusals, check_destination, is_lock_file, read_json

from ._dataset import FORMAT_NAME, METADATA_FILE

__all__ = ["check_dataset_output", "atomic_folder"]

_OUR_FILE = re.compile(
    r"^(dataset\.json|meshes/\d{5}/(points|edge_index|cells-[A-Za-z0-9_]+|boundary-\d{3}(-area)?|surface-area|surface-point-area)\.npy|"
    r"samples/\d{5}/(inputs|targets|state|node_type)\.npy)$")
_OUR_DIR = re.compile(r"^(meshes|samples)(/\d{5})?$")


def _is_ours(out: Path) -> str | None:
    """None when ``out`` holds a dataset and only our files; otherwise why not."""
    meta = out / METADATA_FILE
    try:
        if read_json(meta).get("format") != FORMAT_NAME:
            return f"{METADATA_FILE} is not a {FORMAT_NAME} file"
    except (OSError, ValueError, AttributeError):
        return f"no readable {METADATA_FILE}"
    for path in out.rglob("*"):
        rel = path.relative_to(out).as_posix()
        if is_lock_file(path):  # left by a killed command: ours
            continue
        if path.is_symlink():
            return f"it holds a link ({rel})"
        if path.is_dir() and not _OUR_DIR.match(rel) or path.is_file() and not _OUR_FILE.match(rel):
            return f"it holds {rel}, which meshshard did not write"
    return None


#: A dataset folder's words for :func:`check_destination`'s refusals.
_REFUSALS = Refusals(
    current="{out}: refusing to write a dataset over the current folder or a parent of it",
    holds_input="{out}: refusing to write a dataset over a folder holding the source {input}",
    link="{out}: exists and is not a folder",
    not_empty="{out}: exists and is not empty (pass --force to replace a dataset folder)")


def _check_is_dataset(out: Path) -> None:
    """Raise unless ``out`` holds a dataset and only our files (what ``--force`` may replace)."""
    why = _is_ours(out)
    if why is not None:
        raise ValueError(f"{out}: is not a meshshard dataset folder ({why}); refusing to replace it, even with --force")


def check_dataset_output(out: str | os.PathLike[str], force: bool,
                         sources: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Raise unless ``out`` may be written: absent, an empty folder, or with ``force`` a dataset
    folder holding only our files; never ``.``, a parent of the current folder, or a folder that
    is or contains a source (:func:`check_destination`, which first puts back what an interrupted
    replace set aside)."""
    check_destination(out, force=force, is_ours=_check_is_dataset, inputs=sources, refusals=_REFUSALS)
    return Path(out)


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """Yield an empty staging folder beside ``out`` to fill; on success it replaces ``out``
    (whose safety the caller checked), on any error it is removed and the old ``out`` kept
    (:func:`meshshard.partition._safe_io.staged_folder`). What a killed run left beside ``out``
    is tidied, or put back, first."""
    from meshshard.partition.files import recover_interrupted, staged_folder

    recover_interrupted(out)
    with staged_folder(out) as staging:
        yield staging
