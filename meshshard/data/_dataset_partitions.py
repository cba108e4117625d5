"""Partitions of a dataset (``meshshard partition DATA --parts K --out PARTS``): one partition of each
distinct mesh (:func:`partition_dataset`), where each lies (:func:`dataset_partition_folder`), what
they were made from (:func:`read_partitions_metadata`) and whether they belong to a dataset
(:func:`check_partition_matches`). The layout of PARTS is the format's
(:mod:`meshshard.data._dataset`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import plural
from meshshard.partition.files import (
    check_destination,
    dumps_json,
    folder_lock,
    is_lock_file,
    read_json,
    write_text_file,
)

from ._dataset import PARTITIONS_FILE, PARTITIONS_FORMAT
from ._folder_guard import atomic_folder
from ._reader import Dataset, Mesh, open_dataset

__all__ = ["partition_of_mesh", "partition_dataset", "dataset_partition_folder", "read_partitions_metadata",
           "check_partition_matches", "iter_meshes"]


def dataset_partition_folder(parts: str | os.PathLike[str], mesh: int) -> Path:
    """The partition folder of mesh ``mesh`` inside PARTS (PARTS itself for a one-mesh dataset)."""
    parts = Path(parts)
    if (parts / PARTITIONS_FILE).is_file():
        return parts / f"mesh-{mesh:05d}"
    return parts


def partition_of_mesh(made_from: Mapping[str, Any], mesh: Mapping[str, Any]) -> bool:
    """Whether a partition whose ``input`` entry is ``made_from`` numbers the nodes of the dataset
    mesh entry ``mesh``: made from that mesh (its checksum), or from the very mesh file the mesh was
    read from by the processes of :func:`meshshard.data.write_dataset_distributed` (``source_sha256``)."""
    digest = made_from.get("sha256")
    return digest == mesh["sha256"] or (made_from.get("kind") == "mesh" and digest in mesh.get("source_sha256", ()))


def read_partitions_metadata(parts: str | os.PathLike[str]) -> dict[str, Any]:
    """The partitions of a dataset, as ``{"num_parts", "meshes": [{"mesh", "num_nodes", "sha256"}]}``,
    from a ``partitions.json`` folder or a single partition folder."""
    from meshshard.partition import read_metadata

    parts = Path(parts)
    file = parts / PARTITIONS_FILE
    if file.is_file():
        meta = read_json(file)
        if not isinstance(meta, dict) or meta.get("format") != PARTITIONS_FORMAT or meta.get("format_version") != 1:
            raise ValueError(f"{file}: Expected format {PARTITIONS_FORMAT!r} version 1")
        for i, m in enumerate(meta.get("meshes", [])):
            if m.get("mesh") != i or m.get("folder") != f"mesh-{i:05d}":
                raise ValueError(f"{file}: Expected meshes in order with folders mesh-00000, ...")
        return meta
    meta = read_metadata(parts)
    source = meta.get("input", {})
    return {"format": None, "num_parts": meta["num_parts"],
            "meshes": [{"mesh": 0, "folder": ".", "num_nodes": meta["num_nodes"],
                        "sha256": source.get("sha256") if source.get("kind") == "dataset" else None}
                       | ({"file_sha256": source.get("sha256")} if source.get("kind") == "mesh" else {})],
            **({"halo_radius": meta["halo_radius"]} if "halo_radius" in meta else {})}


def check_partition_matches(dataset: Dataset | str | os.PathLike[str], parts: str | os.PathLike[str],
                            hint: str | None = None) -> dict[str, Any]:
    """Raise a one-line ``ValueError`` unless PARTS was made from this dataset's meshes (node
    counts and mesh checksums, or: a partition of a mesh file that a mesh of a distributed dataset
    was read from, its ``source_sha256``); return PARTS' metadata (see :func:`read_partitions_metadata`).

    The error ends with ``hint``; by default, how to partition the dataset into a new folder (never
    over PARTS, which may be another dataset's partition that something still needs)."""
    data = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    meta = read_partitions_metadata(parts)
    mine = data.meta["meshes"]
    theirs = meta["meshes"]
    if hint is None:
        hint = (f"partition it into a new folder: meshshard partition {data.path} --parts {meta['num_parts']} "
                "--out NEW_PARTS")
    if len(theirs) != len(mine):
        raise ValueError(f"{parts}: partition made for another dataset ({plural(len(theirs), 'mesh', 'meshes')}; "
                         f"{data.path} has {len(mine)}); {hint}")
    for i, (a, b) in enumerate(zip(theirs, mine)):
        if a["num_nodes"] == b["num_nodes"] and partition_of_mesh({"kind": "mesh", "sha256": a.get("file_sha256")}, b):
            continue  # a partition of the very file this mesh was read from (both number its nodes as it does)
        if a["num_nodes"] != b["num_nodes"] or a["sha256"] != b["sha256"]:
            why = (f"{a['num_nodes']} nodes vs {b['num_nodes']}" if a["num_nodes"] != b["num_nodes"] else
                   "not made from a dataset" if a["sha256"] is None else
                   f"mesh checksum {str(a['sha256'])[:12]} vs {b['sha256'][:12]}")
            raise ValueError(f"{parts}: partition made for another dataset (mesh {i}: {why} in {data.path}); {hint}")
    return meta


def iter_meshes(data: Dataset) -> Iterator[tuple[int, Mesh]]:
    for m in range(data.num_meshes):
        yield m, data.mesh(m)


def partition_dataset(
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    num_parts: int,
    *,
    method: str = "metis",
    halo_hops: int = 1,
    imbalance: float = 0.03,
    seed: int = 0,
    tries: int | None = None,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    radius: float | None = None,
) -> Path:
    """``meshshard partition DATA``: partition the one mesh of a dataset (PARTS is a partition
    folder), or every distinct mesh (PARTS holds one partition folder per mesh, see the format
    docstring). Each partition records the mesh's checksum as its ``input.sha256``.

    ``method`` ``"metis"`` partitions each mesh's graph (a point cloud's kNN graph), ``"rcb"`` and
    ``"morton"`` its points. ``radius`` (``--radius``): the geometric halo radius the partition is
    made for, recorded as ``"halo_radius"`` in every partition (and ``partitions.json``) with each
    part's exact ghost count at that radius, ``"radius_ghosts"``; a model with a larger ball
    radius is then refused (:func:`meshshard.partition._points.check_radius`)."""
    with folder_lock(out):  # one writer per folder (held already under meshshard partition)
        from meshshard.partition import (
            Steps,
            check_halo_radius,
            check_num_parts,
            record_halo_radius,
            run_pipeline,
            write_partitions,
        )

        dataset = open_dataset(data)
        out = Path(out)
        radius = check_halo_radius(radius)
        _check_parts_output(out, force)
        if num_parts < 1:
            raise ValueError(f"Expected --parts >= 1 (got {num_parts})")
        if tries is not None and tries < 1:
            raise ValueError(f"Expected --tries >= 1 (got {tries})")
        for entry in dataset.meta["meshes"]:
            check_num_parts(num_parts, entry["num_nodes"])

        def one(m: int, folder: Path) -> None:
            mesh = dataset.mesh(m)
            graph = mesh.graph()
            rule = dataset.meta["meshes"][m].get("graph") or {}
            source = {"kind": "dataset", "name": f"{dataset.path.name}/meshes/{m:05d}", "sha256": mesh.sha256}
            attrs = {"graph": rule.get("rule") or graph.kind, "input": source, "parameters": {}}
            metadata, partitions = run_pipeline(graph, num_parts, Steps(), method=method, halo_hops=halo_hops,
                                        imbalance=imbalance, seed=seed, tries=tries, attrs=attrs)
            owner = np.zeros(mesh.num_nodes, dtype=np.int64)

            def tapped() -> Iterator[Any]:  # each part's owned ids noted as it streams past
                for part in partitions:
                    owner[part.owned_ids] = part.rank
                    yield part

            write_partitions(metadata, tapped(), folder)
            if radius is not None:
                record_halo_radius(folder, mesh.points, owner, radius)
            if progress is not None:
                progress(1)

        with atomic_folder(out) as tmp:
            if dataset.kind == "one-mesh":
                one(0, tmp)
            else:
                meshes = []
                for m, entry in enumerate(dataset.meta["meshes"]):
                    one(m, tmp / f"mesh-{m:05d}")
                    meshes.append({"mesh": m, "folder": f"mesh-{m:05d}", "num_nodes": entry["num_nodes"],
                                   "sha256": entry["sha256"]})
                meta = {"format": PARTITIONS_FORMAT, "format_version": 1, "num_parts": num_parts,
                        "dataset": dataset.path.name, "num_meshes": len(meshes), "meshes": meshes}
                if radius is not None:
                    meta["halo_radius"] = radius
                write_text_file(tmp / PARTITIONS_FILE, dumps_json(meta, indent=2) + "\n")
        return out


def _check_parts_output(out: Path, force: bool) -> None:
    """As for a partition folder; with ``force`` a folder of a dataset's partitions may be replaced
    too, when it holds only ``partitions.json`` and ``mesh-NNNNN`` partition folders."""
    check_destination(out, force=force, is_ours=_check_is_partitions)


def _check_is_partitions(out: Path) -> None:
    """Raise unless ``out`` holds a dataset's partitions (``partitions.json`` and ``mesh-NNNNN``
    partition folders, each only a partition) or one partition, and nothing else."""
    from meshshard.partition import PARTITION_METADATA_FILE, check_is_partition

    if not (out / PARTITIONS_FILE).is_file():
        check_is_partition(out)
        return
    for child in out.iterdir():
        ours = child.name == PARTITIONS_FILE or is_lock_file(child) or (
            re.fullmatch(r"mesh-\d{5}", child.name) and child.is_dir() and not child.is_symlink()
            and (child / PARTITION_METADATA_FILE).is_file())
        if not ours:
            raise ValueError(f"{out}: holds {child.name}, which meshshard did not write; "
                             "refusing to replace it, even with --force")
        if child.is_dir():
            check_is_partition(child)  # a mesh's partition and nothing else in it
