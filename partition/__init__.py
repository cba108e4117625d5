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

Beyond one machine: ``partition_distributed(MESH.vtkhdf, DIR, K, exchange)``, called by each of
``P`` processes with an :class:`Exchange` (``meshshard.comm.ArrayExchange`` under torchrun,
``meshshard.comm.MPIExchange`` under mpirun: ``engine="ptscotch"``), writes the same folder with no
process holding the whole mesh (``_distributed.py``); ``read_assignment(DIR)`` reads back the part of
every node a folder stores; ``convert_mesh``
makes the ``.vtkhdf`` it reads in slices (``read_slice``, ``_vtkhdf.py``).

Datasets, the files they are built from, boundaries and surfaces are the dataset layer's,
:mod:`meshshard.data` (which imports this one, never the other way round). Their old names here
(``meshshard.partition.open_dataset`` ...) still work for one release, with a DeprecationWarning.

Point clouds (:mod:`meshshard.partition._points`): ``parse_graph_rule`` / ``GraphRule``
(``--graph knn:K``), ``point_graph``, ``check_radius(parts_meta, model_radius)`` (a model's ball
radius against the halo radius a partition was made for).

Safe files (:mod:`meshshard.partition.files`): the checked readers, staged writers, folder locks and
guards every layer and command uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # for type checkers and IDEs; at run time see __getattr__ below
    from ._api import GRAPHS, build_graph, partition_file, partition_graph, partition_mesh, partition_points
    from ._assign import METHODS, assign_parts, edge_cut, imbalance, refine_balance
    from ._assignment import read_assignment
    from ._convert import convert_mesh
    from ._dist_assign import ENGINES
    from ._dist_graph import BlockGraph, block_graph
    from ._distributed import partition_distributed
    from ._exchange import Exchange, LocalExchange, agree, lookup
    from ._format import FORMAT_NAME, FORMAT_VERSION, load_partition, read_metadata, save_partition
    from ._graph import Graph
    from ._grid import GridLayout, grid_layout, partition_grid
    from ._io import InputData, read_input
    from ._partition import Partition
    from ._plan import build_partitions
    from ._points import GraphRule, check_radius, parse_graph_rule, point_graph
    from ._verify import check_partitions, verify_partition
    from ._vtkhdf import VTKHDF_SUFFIX, block_start, read_point_data, read_slice, write_vtkhdf

# name -> module that defines it, relative to this package (``._api`` is ``_api.py`` beside this
# file). Resolved on first use, so that a training rank that only loads its part
# (``load_partition``) does not import scipy, pymetis or meshio.
_LAZY: dict[str, str] = {
    "GRAPHS": "._api",
    "build_graph": "._api",
    "partition_file": "._api",
    "partition_graph": "._api",
    "partition_mesh": "._api",
    "partition_points": "._api",
    "METHODS": "._assign",
    "assign_parts": "._assign",
    "edge_cut": "._assign",
    "imbalance": "._assign",
    "refine_balance": "._assign",
    "read_assignment": "._assignment",
    "FORMAT_NAME": "._format",
    "FORMAT_VERSION": "._format",
    "load_partition": "._format",
    "read_metadata": "._format",
    "save_partition": "._format",
    "Graph": "._graph",
    "GridLayout": "._grid",
    "grid_layout": "._grid",
    "partition_grid": "._grid",
    "InputData": "._io",
    "read_input": "._io",
    "Partition": "._partition",
    "build_partitions": "._plan",
    "check_partitions": "._verify",
    "verify_partition": "._verify",
    "MAX_LISTED": "._text",
    "listed": "._text",
    "plural": "._text",
    "Steps": "._progress",
    "print_summary": "._report",
    "plot_partition": "._plot",
    "check_output_dir": "._format",
    "halo_windows": "._grid",
    "window_plan": "._grid",
    "check_apart": "._safe_io",
    "lazy_names": "._lazy",
    "check_destination": "._safe_io",
    "check_input_folders": "._safe_io",
    "check_output_folder": "._safe_io",
    "folder_lock": "._safe_io",
    "is_lock_file": "._safe_io",
    "read_inside": "._readers",
    "read_json_inside": "._json_io",
    "parse_max_expansion": "._readers",
    "max_expansion": "._readers",
    "dumps_json": "._json_io",
    "loads_json": "._json_io",
    "read_json": "._json_io",
    "write_text_file": "._json_io",
    "WriteError": "._json_io",
    "naming_write_errors": "._json_io",
    "Refusals": "._safe_io",
    "GraphRule": "._points",
    "check_radius": "._points",
    "parse_graph_rule": "._points",
    "point_graph": "._points",
    "Cells": "._graph",
    "nodal_graph": "._graph",
    "meshio_failure": "._io",
    "run_pipeline": "._api",
    "check_num_parts": "._assign",
    "check_is_partition": "._format",
    "write_partitions": "._format",
    "check_halo_radius": "._points",
    "record_halo_radius": "._points",
    "sample_graph": "._points",
    "halo_radius_of": "._points",
    "geometric_halo_counts": "._points",
    "DEFAULT_POINT_GRAPH": "._points",
    "convert_mesh": "._convert",
    "ENGINES": "._dist_assign",
    "partition_distributed": "._distributed",
    "Exchange": "._exchange",
    "LocalExchange": "._exchange",
    "agree": "._exchange",
    "lookup": "._exchange",
    "BlockGraph": "._dist_graph",
    "block_graph": "._dist_graph",
    "VTKHDF_SUFFIX": "._vtkhdf",
    "block_start": "._vtkhdf",
    "read_point_data": "._vtkhdf",
    "read_slice": "._vtkhdf",
    "write_vtkhdf": "._vtkhdf",
}

#: Dataset names that lived here before the dataset layer moved to :mod:`meshshard.data`: they
#: keep working, for one release, with a DeprecationWarning naming the new place (the forwarded
#: object is the moved one itself; ``tests/data/test_forwarding.py`` checks each).
_MOVED: tuple[str, ...] = (
    "Dataset",
    "FOLDER_KINDS",
    "FolderKind",
    "Normalisation",
    "PARTITIONS_FILE",
    "Trajectories",
    "Trajectory",
    "VTK_SUFFIXES",
    "boundary_area_vectors",
    "boundary_force",
    "build_dataset",
    "build_trajectories",
    "check_expression",
    "check_partition_matches",
    "dataset_partition_folder",
    "dump_dataset_metadata",
    "evaluate_columns",
    "evaluate_expression",
    "held_note",
    "is_dataset",
    "is_trajectory_dataset",
    "kinds_of",
    "list_sources",
    "named_boundaries",
    "open_dataset",
    "open_trajectories",
    "parse_target_scales",
    "partition_dataset",
    "read_dataset_metadata",
    "read_npz_cloud",
    "read_parameters",
    "read_partitions_metadata",
    "read_vtk",
    "surface_area_vectors",
    "surface_fields",
    "write_dataset",
    "write_dataset_from_pyg",
    "write_trajectories",
)

#: Public names for attributes that carry another name in their module.
_ALIASES: dict[str, tuple[str, str]] = {
    "dump_partition_metadata": ("._format", "dump_metadata"),
    "PARTITION_METADATA_FILE": ("._format", "METADATA_FILE"),
}

__all__ = [
    "agree",
    "assign_parts",
    "block_graph",
    "block_start",
    "BlockGraph",
    "build_graph",
    "build_partitions",
    "Cells",
    "check_apart",
    "check_destination",
    "check_halo_radius",
    "check_input_folders",
    "check_is_partition",
    "check_num_parts",
    "check_output_dir",
    "check_output_folder",
    "check_partitions",
    "check_radius",
    "convert_mesh",
    "DEFAULT_POINT_GRAPH",
    "dump_partition_metadata",
    "dumps_json",
    "edge_cut",
    "ENGINES",
    "Exchange",
    "folder_lock",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "geometric_halo_counts",
    "Graph",
    "GraphRule",
    "GRAPHS",
    "grid_layout",
    "GridLayout",
    "halo_radius_of",
    "halo_windows",
    "imbalance",
    "InputData",
    "is_lock_file",
    "lazy_names",
    "LocalExchange",
    "listed",
    "load_partition",
    "lookup",
    "loads_json",
    "max_expansion",
    "MAX_LISTED",
    "meshio_failure",
    "METHODS",
    "naming_write_errors",
    "nodal_graph",
    "parse_graph_rule",
    "parse_max_expansion",
    "Partition",
    "partition_file",
    "partition_graph",
    "partition_grid",
    "partition_mesh",
    "PARTITION_METADATA_FILE",
    "partition_distributed",
    "partition_points",
    "plot_partition",
    "plural",
    "point_graph",
    "print_summary",
    "read_input",
    "read_inside",
    "read_json",
    "read_json_inside",
    "read_metadata",
    "read_assignment",
    "read_point_data",
    "read_slice",
    "record_halo_radius",
    "refine_balance",
    "Refusals",
    "run_pipeline",
    "sample_graph",
    "save_partition",
    "Steps",
    "verify_partition",
    "VTKHDF_SUFFIX",
    "window_plan",
    "write_partitions",
    "write_vtkhdf",
    "write_text_file",
    "WriteError",
]


# the one import of the dataset layer from here: lazy, and only for the old paths of _MOVED
__getattr__, __dir__ = lazy_names(globals(), _LAZY, _ALIASES, moved=(_MOVED, "meshshard.data"))
