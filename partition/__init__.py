"""Offline partitioning of meshes, graphs and point clouds (numpy, scipy, pymetis; no torch).

Pipeline, one function per step::

    data = read_input("mesh.vtu")                      # meshio mesh, METIS graph/mesh, .npy/.npz
    graph = build_graph(data)                          # nodal / dual / knn / radius
    parts = assign_parts(graph, 8, "metis")            # owning rank of every node
    partitions = build_partitions(graph, parts, 8)     # every rank's Partition (halo plan included)
    save_partition(partitions, "out/")                 # the folder format of _format.py
    p = load_partition("out/", rank)                   # one rank's Partition, checksum checked

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

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GRAPHS",
    "METHODS",
    "Dataset",
    "Graph",
    "GridLayout",
    "Normalisation",
    "InputData",
    "Partition",
    "assign_parts",
    "build_dataset",
    "build_graph",
    "build_partitions",
    "check_partition_matches",
    "check_partitions",
    "dataset_partition_folder",
    "edge_cut",
    "grid_layout",
    "imbalance",
    "load_partition",
    "open_dataset",
    "partition_dataset",
    "partition_file",
    "partition_graph",
    "partition_grid",
    "partition_mesh",
    "partition_points",
    "read_input",
    "read_metadata",
    "refine_balance",
    "save_partition",
    "verify_partition",
    "write_dataset",
    "write_dataset_from_pyg",
]
