"""The assignment a partition folder stores: the part of every node, read back from its part files.

Every part file holds its part's owned nodes (``owned_ids``), and every node is owned by exactly one
part, so a folder stores its assignment whatever made it. That is what keeps a nondeterministic engine's
result (PT-Scotch, KaMinPar) reproducible: one process given it (``partition_file(..., parts=...)``)
writes the same part files again.
"""

from __future__ import annotations

import os

import numpy as np

from ._format import load_partition, read_metadata

__all__ = ["read_assignment"]


def read_assignment(folder: str | os.PathLike[str]) -> np.ndarray:
    """The part of every node of the partition in ``folder`` (one process: an array of the mesh's length).

    Every part file is loaded and checked (:func:`meshshard.partition.load_partition`).

    Shapes:
        Returns ``(N,)`` int64 in ``[0, K)``, by global node id.
    """
    meta = read_metadata(folder)
    parts = np.full(int(meta["num_nodes"]), -1, dtype=np.int64)
    for k in range(int(meta["num_parts"])):
        parts[load_partition(folder, k).owned_ids] = k
    missing = np.flatnonzero(parts < 0)
    if len(missing):
        raise ValueError(f"{folder}: node {int(missing[0])} is owned by no part")
    return parts
