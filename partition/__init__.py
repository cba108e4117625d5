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
targets=...)`` (``meshshard dataset``; ``read_vtk`` reads the ``.vtp``, ``.vtm``, ``.pvtu`` and
``.vtkhdf`` files meshio does not), ``write_dataset`` / ``write_dataset_from_pyg``,
``open_dataset(DATA)``, ``partition_dataset(DATA, PARTS, R)`` and
``check_partition_matches(DATA, PARTS)``; trajectories (``meshshard dataset --state``):
``build_trajectories``, ``write_trajectories``, ``open_trajectories(DATA)``.

Boundaries (:mod:`meshshard.partition._surface`): ``named_boundaries(mesh)`` (a mesh's patches,
node sets, gmsh groups), ``boundary_area_vectors`` (the area each boundary node stands for, out of
the mesh), ``surface_area_vectors`` (a surface's per-point normals times areas) and
``boundary_force`` (the force of a pressure and a wall shear stress on them).

Point clouds (:mod:`meshshard.partition._points`): ``parse_graph_rule`` / ``GraphRule``
(``--graph knn:K``), ``point_graph``, ``read_npz_cloud``, ``surface_fields`` (a surface's per-point
normal, area and area vectors), ``check_radius(parts_meta, model_radius)`` (a model's ball radius
against the halo radius a partition was made for).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time see __getattr__ below
    from ._api import GRAPHS, build_graph, partition_file, partition_graph, partition_mesh, partition_points
    from ._assign import METHODS, assign_parts, edge_cut, imbalance, refine_balance
    from ._dataset import (
        Dataset,
        Normalisation,
        check_partition_matches,
        dataset_partition_folder,
        open_dataset,
        write_dataset,
        write_dataset_from_pyg,
    )
    from ._dataset_build import build_dataset, partition_dataset
    from ._format import FORMAT_NAME, FORMAT_VERSION, load_partition, read_metadata, save_partition
    from ._graph import Graph
    from ._grid import GridLayout, grid_layout, partition_grid
    from ._io import InputData, read_input
    from ._partition import Partition
    from ._plan import build_partitions
    from ._points import GraphRule, check_radius, parse_graph_rule, point_graph, read_npz_cloud, surface_fields
    from ._surface import boundary_area_vectors, boundary_force, named_boundaries, surface_area_vectors
    from ._trajectories import (
        Trajectories,
        Trajectory,
        build_trajectories,
        is_trajectory_dataset,
        open_trajectories,
        write_trajectories,
    )
    from ._verify import check_partitions, verify_partition
    from ._vtk_io import VTK_SUFFIXES, read_vtk

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
    "Dataset": "._dataset",
    "Normalisation": "._dataset",
    "check_partition_matches": "._dataset",
    "dataset_partition_folder": "._dataset",
    "open_dataset": "._dataset",
    "write_dataset": "._dataset",
    "write_dataset_from_pyg": "._dataset",
    "build_dataset": "._dataset_build",
    "partition_dataset": "._dataset_build",
    "METHODS": "._assign",
    "assign_parts": "._assign",
    "edge_cut": "._assign",
    "imbalance": "._assign",
    "refine_balance": "._assign",
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
    "PARTITIONS_FILE": "._dataset",
    "is_dataset": "._dataset",
    "read_dataset_metadata": "._dataset",
    "read_partitions_metadata": "._dataset",
    "Steps": "._progress",
    "print_summary": "._report",
    "plot_partition": "._plot",
    "list_sources": "._dataset_build",
    "held_note": "._dataset_build",
    "read_parameters": "._dataset_build",
    "read_vtk": "._vtk_io",
    "VTK_SUFFIXES": "._vtk_io",
    "evaluate_expression": "._expressions",
    "check_expression": "._expressions",
    "evaluate_columns": "._expressions",
    "parse_target_scales": "._expressions",
    "check_output_dir": "._format",
    "halo_windows": "._grid",
    "window_plan": "._grid",
    "check_apart": "._safe_io",
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
    "FOLDER_KINDS": "._kinds",
    "FolderKind": "._kinds",
    "kinds_of": "._kinds",
    "Trajectories": "._trajectories",
    "Trajectory": "._trajectories",
    "build_trajectories": "._trajectories",
    "is_trajectory_dataset": "._trajectories",
    "open_trajectories": "._trajectories",
    "write_trajectories": "._trajectories",
    "boundary_area_vectors": "._surface",
    "boundary_force": "._surface",
    "named_boundaries": "._surface",
    "surface_area_vectors": "._surface",
    "GraphRule": "._points",
    "check_radius": "._points",
    "parse_graph_rule": "._points",
    "point_graph": "._points",
    "read_npz_cloud": "._points",
    "surface_fields": "._points",
}

#: Public names for attributes that carry another name in their module.
_ALIASES: dict[str, tuple[str, str]] = {
    "dump_partition_metadata": ("._format", "dump_metadata"),
    "dump_dataset_metadata": ("._dataset", "dump_metadata"),
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
    "Trajectories",
    "Trajectory",
    "VTK_SUFFIXES",
    "WriteError",
    "GraphRule",
    "assign_parts",
    "build_dataset",
    "boundary_area_vectors",
    "boundary_force",
    "build_graph",
    "build_partitions",
    "build_trajectories",
    "check_apart",
    "check_destination",
    "check_expression",
    "check_radius",
    "check_input_folders",
    "check_output_dir",
    "check_output_folder",
    "check_partition_matches",
    "check_partitions",
    "dataset_partition_folder",
    "dump_dataset_metadata",
    "dump_partition_metadata",
    "dumps_json",
    "edge_cut",
    "evaluate_columns",
    "evaluate_expression",
    "folder_lock",
    "grid_layout",
    "held_note",
    "halo_windows",
    "imbalance",
    "is_dataset",
    "is_lock_file",
    "is_trajectory_dataset",
    "kinds_of",
    "list_sources",
    "listed",
    "load_partition",
    "loads_json",
    "max_expansion",
    "named_boundaries",
    "naming_write_errors",
    "open_dataset",
    "open_trajectories",
    "parse_max_expansion",
    "partition_dataset",
    "partition_file",
    "partition_graph",
    "partition_grid",
    "partition_mesh",
    "partition_points",
    "parse_graph_rule",
    "parse_target_scales",
    "plot_partition",
    "point_graph",
    "plural",
    "print_summary",
    "read_dataset_metadata",
    "read_input",
    "read_json",
    "read_json_inside",
    "read_parameters",
    "read_vtk",
    "read_inside",
    "read_metadata",
    "read_npz_cloud",
    "read_partitions_metadata",
    "refine_balance",
    "save_partition",
    "surface_area_vectors",
    "surface_fields",
    "verify_partition",
    "window_plan",
    "write_dataset",
    "write_dataset_from_pyg",
    "write_text_file",
    "write_trajectories",
]


def __getattr__(name: str) -> Any:
    module, attribute = _ALIASES.get(name, (_LAZY.get(name), name))
    if module is None:
        raise AttributeError(f"module 'meshshard.partition' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_ALIASES))
