"""Datasets: what a sample is on disk, where samples come from, and what is done to them (numpy,
scipy, meshio, vtk; no torch).

The format (one module: :mod:`meshshard.data._dataset`): a versioned folder of meshes and samples,
each array a ``.npy`` read one rank's rows at a time, the statistics and normalisation of the
training split in ``dataset.json``. Writing: ``write_dataset(DATA, points=..., inputs=...)`` from
numpy, ``write_dataset_from_pyg`` from a list of PyG ``Data``; reading: ``open_dataset(DATA)``
(a :class:`Dataset`), ``open_trajectories(DATA)`` for time series.

Where samples come from (``meshshard dataset``): ``build_dataset(files, DATA, inputs=...,
targets=...)`` reads any mesh meshio reads, plus ``.vtp``, ``.vtm``, ``.pvtu`` and ``.vtkhdf``
through the ``vtk`` package (``read_vtk``), OpenFOAM's ``foamToVTK`` layout, point clouds
(``read_npz_cloud``) and time series (``build_trajectories``); ``read_parameters`` reads a
``--params`` table.

What is done to them: target scales (``parse_target_scales``), mean fields (``add_mean_field``),
derived fields (``wall_distance``, ``collapse_2d``, a surface's ``normal`` and ``area``), named
boundaries and their forces (``named_boundaries``, ``boundary_force``).

Partitioning a dataset: ``partition_dataset(DATA, PARTS, R)`` partitions each distinct mesh with
:mod:`meshshard.partition`; ``check_partition_matches(DATA, PARTS)``.

This layer may import :mod:`meshshard.partition`; the tasks, the run and the commands import
this one; the containers, ``nn`` and ``comm`` never do (``tests/test_layers.py``).
"""

from __future__ import annotations

from meshshard.partition import lazy_names

# name -> module that defines it, relative to this package; resolved on first use, so importing
# meshshard.data costs nothing until a name is used (meshio, vtk and scipy load only then).
_LAZY: dict[str, str] = {
    "FORMAT_NAME": "._dataset",
    "FORMAT_VERSION": "._dataset",
    "METADATA_FILE": "._dataset",
    "KINDS": "._dataset",
    "PARTITIONS_FORMAT": "._dataset",
    "PARTITIONS_FILE": "._dataset",
    "Sample": "._writer",
    "Mesh": "._reader",
    "ChannelStats": "._statistics",
    "Normalisation": "._statistics",
    "Dataset": "._reader",
    "write_dataset": "._writer",
    "write_dataset_from_pyg": "._writer",
    "write_samples": "._writer",
    "open_dataset": "._reader",
    "read_dataset_metadata": "._dataset",
    "read_partitions_metadata": "._dataset_partitions",
    "dump_metadata": "._dataset",
    "is_dataset": "._dataset",
    "mesh_checksum": "._dataset",
    "channel_names": "._dataset",
    "split_samples": "._split",
    "check_dataset_output": "._folder_guard",
    "check_partition_matches": "._dataset_partitions",
    "dataset_partition_folder": "._dataset_partitions",
    "list_sources": "._sources",
    "sample_names": "._sources",
    "build_dataset": "._dataset_build",
    "partition_dataset": "._dataset_partitions",
    "parse_field_names": "._fields",
    "held_note": "._statistics",
    "read_parameters": "._parameters",
    "TASK": "._trajectories",
    "Trajectory": "._trajectory_writer",
    "Trajectories": "._trajectory_reader",
    "build_trajectories": "._trajectory_build",
    "write_trajectories": "._trajectory_writer",
    "open_trajectories": "._trajectory_reader",
    "is_trajectory_dataset": "._trajectories",
    "trajectory_steps": "._trajectory_steps",
    "MEAN_SUFFIX": "._mean_field",
    "add_mean_field": "._mean_field",
    "mean_field_of": "._mean_field",
    "target_offset_channels": "._mean_field",
    "check_expression": "._expressions",
    "evaluate_columns": "._expressions",
    "evaluate_expression": "._expressions",
    "parse_target_scales": "._expressions",
    "foam_iteration": "._foam",
    "sample_stem": "._foam",
    "foam_folder": "._foam",
    "foam_sources": "._foam",
    "VTK_SUFFIXES": "._vtk_io",
    "read_vtk": "._vtk_io",
    "match_nodes": "._vtk_io",
    "boundary_area_vectors": "._surface",
    "boundary_force": "._surface",
    "named_boundaries": "._surface",
    "surface_area_vectors": "._surface",
    "cell_data_to_points": "._mesh_ops",
    "collapse_2d": "._mesh_ops",
    "one_cell_thick_note": "._mesh_ops",
    "wall_distance": "._mesh_ops",
    "WALL_DISTANCE": "._mesh_ops",
    "FOLDER_KINDS": "._kinds",
    "FolderKind": "._kinds",
    "kinds_of": "._kinds",
    "SURFACE_FIELDS": "._clouds",
    "read_npz_cloud": "._clouds",
    "is_legacy_polydata": "._clouds",
    "triangulate": "._clouds",
    "surface_faces": "._clouds",
    "surface_fields": "._clouds",
    "add_surface_fields": "._clouds",
    "iter_meshes": "._dataset_partitions",
    "HOLD_RELATIVE": "._statistics",
    "edge_channel_names": "._dataset",
    "held_channels": "._statistics",
}

#: Public names for attributes that carry another name in their module.
_ALIASES: dict[str, tuple[str, str]] = {
    "dump_dataset_metadata": ("._dataset", "dump_metadata"),
}

__all__ = [
    "add_mean_field",
    "add_surface_fields",
    "boundary_area_vectors",
    "boundary_force",
    "build_dataset",
    "build_trajectories",
    "cell_data_to_points",
    "channel_names",
    "ChannelStats",
    "check_dataset_output",
    "check_expression",
    "check_partition_matches",
    "collapse_2d",
    "Dataset",
    "dataset_partition_folder",
    "dump_metadata",
    "edge_channel_names",
    "evaluate_columns",
    "evaluate_expression",
    "foam_folder",
    "foam_iteration",
    "foam_sources",
    "FOLDER_KINDS",
    "FolderKind",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "held_channels",
    "held_note",
    "HOLD_RELATIVE",
    "is_dataset",
    "is_legacy_polydata",
    "is_trajectory_dataset",
    "iter_meshes",
    "KINDS",
    "kinds_of",
    "list_sources",
    "match_nodes",
    "mean_field_of",
    "MEAN_SUFFIX",
    "Mesh",
    "mesh_checksum",
    "METADATA_FILE",
    "named_boundaries",
    "Normalisation",
    "one_cell_thick_note",
    "open_dataset",
    "open_trajectories",
    "parse_field_names",
    "parse_target_scales",
    "partition_dataset",
    "PARTITIONS_FILE",
    "PARTITIONS_FORMAT",
    "read_dataset_metadata",
    "read_npz_cloud",
    "read_parameters",
    "read_partitions_metadata",
    "read_vtk",
    "Sample",
    "sample_names",
    "sample_stem",
    "split_samples",
    "surface_area_vectors",
    "surface_faces",
    "SURFACE_FIELDS",
    "surface_fields",
    "target_offset_channels",
    "TASK",
    "Trajectories",
    "Trajectory",
    "trajectory_steps",
    "triangulate",
    "VTK_SUFFIXES",
    "WALL_DISTANCE",
    "wall_distance",
    "write_dataset",
    "write_dataset_from_pyg",
    "write_samples",
    "write_trajectories",
    "dump_dataset_metadata",
]


__getattr__, __dir__ = lazy_names(globals(), _LAZY, _ALIASES)
