"""Offline partitioning of meshes, graphs and point clouds (numpy, scipy, pymetis; no torch).

Pipeline, one function per step::

    data = read_input("mesh.vtu")                      # meshio mesh, METIS graph/mesh, .npy/.npz
    graph = build_graph(data)                          # nodal / dual / knn / radius
    parts = assign_parts(graph, 8, "metis")            # owning rank of every node
    partitions = build_partitions(graph, parts, 8)     # every rank's Partition (halo plan included)
    save_partition(partitions, "out/")                 # the folder format of _format.py
    p = load_partition("out/", rank)                   # one rank's Partition, checksums and
                                                       # the shard's own invariants checked

or in one call: ``partition_file(...)`` (the ``meshshard partition`` command), or in memory:
``partition_graph(edge_index | Data | Graph, R)``, ``partition_mesh(points, cells, R)``,
``partition_points(pos, R)``, ``partition_grid(shape, R, proc_grid=...)`` (a structured grid's
box decomposition, see ``_grid.py``). ``verify_partition(DIR)`` checks every invariant of a folder.

Datasets (format: :mod:`meshshard.partition._dataset`): ``build_dataset(files, DATA, inputs=...,
targets=...)`` (``meshshard dataset``), ``write_dataset`` / ``write_dataset_from_pyg``,
``open_dataset(DATA)``, ``partition_dataset(DATA, PARTS, R)`` and
``check_partition_matches(DATA, PARTS)``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time see __getattr__ below
    from meshshard.partition._api import (GRAPHS, build_graph, partition_file, partition_graph,
                                          partition_mesh, partition_points)
    from meshshard.partition._dataset import (Dataset, Normalisation, check_partition_matches,
                                              dataset_partition_folder, open_dataset, write_dataset,
                                              write_dataset_from_pyg)
    from meshshard.partition._dataset_build import build_dataset, partition_dataset
    from meshshard.partition._assign import (METHODS, assign_parts, edge_cut, imbalance,
                                             refine_balance)
    from meshshard.partition._format import (FORMAT_NAME, FORMAT_VERSION, load_partition,
                                             read_metadata, save_partition)
    from meshshard.partition._graph import Graph
    from meshshard.partition._grid import GridLayout, grid_layout, partition_grid
    from meshshard.partition._io import InputData, read_input
    from meshshard.partition._partition import Partition
    from meshshard.partition._plan import build_partitions
    from meshshard.partition._verify import check_partitions, verify_partition

# name -> module that defines it. Resolved on first use, so that a training rank that only
# loads its part (``load_partition``) does not import scipy, pymetis or meshio.
_LAZY: dict[str, str] = {
    "GRAPHS": "meshshard.partition._api",
    "build_graph": "meshshard.partition._api",
    "partition_file": "meshshard.partition._api",
    "partition_graph": "meshshard.partition._api",
    "partition_mesh": "meshshard.partition._api",
    "partition_points": "meshshard.partition._api",
    "Dataset": "meshshard.partition._dataset",
    "Normalisation": "meshshard.partition._dataset",
    "check_partition_matches": "meshshard.partition._dataset",
    "dataset_partition_folder": "meshshard.partition._dataset",
    "open_dataset": "meshshard.partition._dataset",
    "write_dataset": "meshshard.partition._dataset",
    "write_dataset_from_pyg": "meshshard.partition._dataset",
    "build_dataset": "meshshard.partition._dataset_build",
    "partition_dataset": "meshshard.partition._dataset_build",
    "METHODS": "meshshard.partition._assign",
    "assign_parts": "meshshard.partition._assign",
    "edge_cut": "meshshard.partition._assign",
    "imbalance": "meshshard.partition._assign",
    "refine_balance": "meshshard.partition._assign",
    "FORMAT_NAME": "meshshard.partition._format",
    "FORMAT_VERSION": "meshshard.partition._format",
    "load_partition": "meshshard.partition._format",
    "read_metadata": "meshshard.partition._format",
    "save_partition": "meshshard.partition._format",
    "Graph": "meshshard.partition._graph",
    "GridLayout": "meshshard.partition._grid",
    "grid_layout": "meshshard.partition._grid",
    "partition_grid": "meshshard.partition._grid",
    "InputData": "meshshard.partition._io",
    "read_input": "meshshard.partition._io",
    "Partition": "meshshard.partition._partition",
    "build_partitions": "meshshard.partition._plan",
    "check_partitions": "meshshard.partition._verify",
    "verify_partition": "meshshard.partition._verify",
    "MAX_LISTED": "meshshard.partition._text",
    "listed": "meshshard.partition._text",
    "plural": "meshshard.partition._text",
    "PARTITIONS_FILE": "meshshard.partition._dataset",
    "is_dataset": "meshshard.partition._dataset",
    "read_dataset_metadata": "meshshard.partition._dataset",
    "read_partitions_metadata": "meshshard.partition._dataset",
    "Steps": "meshshard.partition._progress",
    "print_summary": "meshshard.partition._report",
    "plot_partition": "meshshard.partition._plot",
    "list_sources": "meshshard.partition._dataset_build",
    "check_output_dir": "meshshard.partition._format",
    "halo_windows": "meshshard.partition._grid",
    "window_plan": "meshshard.partition._grid",
    "check_apart": "meshshard.partition._safe_io",
    "check_destination": "meshshard.partition._safe_io",
    "check_input_folders": "meshshard.partition._safe_io",
    "check_output_folder": "meshshard.partition._safe_io",
    "read_inside": "meshshard.partition._safe_io",
    "Refusals": "meshshard.partition._safe_io",
    "FOLDER_KINDS": "meshshard.partition._kinds",
    "FolderKind": "meshshard.partition._kinds",
    "kinds_of": "meshshard.partition._kinds",
}

#: Public names for attributes that carry another name in their module.
_ALIASES: dict[str, tuple[str, str]] = {
    "dump_partition_metadata": ("meshshard.partition._format", "dump_metadata"),
    "dump_dataset_metadata": ("meshshard.partition._dataset", "dump_metadata"),
}

__all__ = [
    "Dataset",
    "FOLDER_KINDS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FolderKind",
    "GRAPHS",
    "Graph",
    "GridLayout",
    "InputData",
    "MAX_LISTED",
    "METHODS",
    "Normalisation",
    "PARTITIONS_FILE",
    "Partition",
    "Refusals",
    "Steps",
    "assign_parts",
    "build_dataset",
    "build_graph",
    "build_partitions",
    "check_apart",
    "check_destination",
    "check_input_folders",
    "check_output_dir",
    "check_output_folder",
    "check_partition_matches",
    "check_partitions",
    "dataset_partition_folder",
    "dump_dataset_metadata",
    "dump_partition_metadata",
    "edge_cut",
    "grid_layout",
    "halo_windows",
    "imbalance",
    "is_dataset",
    "kinds_of",
    "list_sources",
    "listed",
    "load_partition",
    "open_dataset",
    "partition_dataset",
    "partition_file",
    "partition_graph",
    "partition_grid",
    "partition_mesh",
    "partition_points",
    "plot_partition",
    "plural",
    "print_summary",
    "read_dataset_metadata",
    "read_input",
    "read_inside",
    "read_metadata",
    "read_partitions_metadata",
    "refine_balance",
    "save_partition",
    "verify_partition",
    "window_plan",
    "write_dataset",
    "write_dataset_from_pyg",
]


def __getattr__(name: str) -> Any:
    module, attribute = _ALIASES.get(name, (_LAZY.get(name), name))
    if module is None:
        raise AttributeError(f"module 'meshshard.partition' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_ALIASES))
