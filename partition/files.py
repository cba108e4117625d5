"""File safety for the offline folders a user may receive (partitions, datasets, runs, predictions),
in one public place: the checked readers, the strict JSON, and the guards of an output folder.

- reading, checked and bounded (:mod:`._readers`): :func:`read_regular`, :func:`read_inside`,
  :func:`hash_regular`, :func:`open_regular`, :func:`decompress` (with :func:`max_expansion`,
  :func:`parse_max_expansion`, :data:`MAX_EXPANSION`), :func:`read_npy`, :func:`read_npz`;
- metadata JSON, strict both ways (:mod:`._json_io`): :func:`dumps_json`, :func:`loads_json`,
  :func:`read_json`, :func:`read_json_inside`, :func:`write_text_file` (with :func:`open_own`),
  :func:`naming_write_errors`, :class:`WriteError`;
- an output folder (:mod:`._safe_io`): :func:`check_destination` (with :class:`Refusals`),
  :func:`check_input_folders`, :func:`check_apart`, :func:`check_output_folder`,
  :func:`write_folder`, :func:`staged_folder`, :func:`recover_interrupted`,
  :func:`interrupted_hint`, and one writer per
  folder: :func:`folder_lock`, :func:`lock_path`, :func:`is_lock_file`.

Every problem is a one-line ``ValueError``.
"""

from __future__ import annotations

from ._json_io import (
    MAX_JSON_BYTES,
    WriteError,
    dumps_json,
    loads_json,
    naming_write_errors,
    open_own,
    read_json,
    read_json_inside,
    write_text_file,
)
from ._readers import (
    MAX_EXPANSION,
    decompress,
    hash_regular,
    max_expansion,
    open_regular,
    parse_max_expansion,
    read_inside,
    read_npy,
    read_npz,
    read_regular,
)
from ._safe_io import (
    Refusals,
    check_apart,
    check_destination,
    check_input_folders,
    check_output_folder,
    folder_lock,
    interrupted_hint,
    is_lock_file,
    lock_path,
    recover_interrupted,
    staged_folder,
    write_folder,
)

__all__ = [
    "MAX_EXPANSION",
    "MAX_JSON_BYTES",
    "Refusals",
    "WriteError",
    "check_apart",
    "check_destination",
    "check_input_folders",
    "check_output_folder",
    "decompress",
    "dumps_json",
    "folder_lock",
    "hash_regular",
    "interrupted_hint",
    "is_lock_file",
    "loads_json",
    "lock_path",
    "max_expansion",
    "naming_write_errors",
    "open_own",
    "open_regular",
    "parse_max_expansion",
    "read_inside",
    "read_json",
    "read_json_inside",
    "read_npy",
    "read_npz",
    "read_regular",
    "recover_interrupted",
    "staged_folder",
    "write_folder",
    "write_text_file",
]
