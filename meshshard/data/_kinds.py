"""The kinds of folder meshshard writes, each known by one marker file, in one table.

``meshshard info`` tells the kinds apart by it, and the command that writes each kind guards its
output folder with :func:`meshshard.partition.check_destination`, passing the kind's own
``is_ours``. The markers of the partition layer's own kinds come from their format modules; a
run's and a prediction's are owned by ``meshshard.run`` (``CHECKPOINT``, ``METRICS_FILE``), which
this layer may not import: a test asserts that they agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from meshshard.partition import PARTITION_METADATA_FILE as _PARTITION_FILE

from ._dataset import METADATA_FILE as _DATASET_FILE
from ._dataset import PARTITIONS_FILE as _PARTITIONS_FILE

__all__ = ["FOLDER_KINDS", "FolderKind", "kinds_of"]


@dataclass(frozen=True)
class FolderKind:
    """A kind of folder meshshard writes: its ``name``, the ``marker`` file that identifies it,
    and a one-line ``description``."""

    name: str
    marker: str
    description: str


#: Every kind, by name, in the order messages name them.
FOLDER_KINDS: dict[str, FolderKind] = {kind.name: kind for kind in (
    FolderKind("partition", _PARTITION_FILE, "one mesh's partition into parts (meshshard partition MESH)"),
    FolderKind("dataset", _DATASET_FILE, "samples of fields on meshes, with their statistics (meshshard dataset)"),
    FolderKind("partitions", _PARTITIONS_FILE,
               "a dataset's partitions, one partition folder per mesh (meshshard partition DATA)"),
    FolderKind("run", "checkpoint.pt", "a training run: checkpoint, log and loss plot (meshshard train)"),
    FolderKind("prediction", "metrics.json", "a run's predictions on a dataset, with their errors (meshshard predict)"),
)}


def kinds_of(folder: str | os.PathLike[str]) -> list[FolderKind]:
    """The kinds whose marker ``folder`` holds (by name only: whether the marker is sound is for
    the kind's reader to say), in the order of :data:`FOLDER_KINDS`."""
    folder = Path(folder)
    return [kind for kind in FOLDER_KINDS.values() if (folder / kind.marker).exists()]
