"""Reading and writing files safely: the utilities every layer and command uses.

Everything meshshard reads from a folder a user may have received goes through these: a file is
read only when it is a regular file inside its folder (no links out, no FIFOs or devices, no
``..``), within a size bound, and arrays are parsed without unpickling (:func:`read_npy`,
:func:`read_npz`). What meshshard writes is staged in a temporary folder and renamed into place
(:func:`write_folder`, :func:`staged_folder`), under a lock per output folder (:func:`folder_lock`),
and ``--force`` replaces only a folder that holds nothing but meshshard's own files
(:func:`check_destination` with the kind's ``is_ours``). JSON is written and read with the limits
and one-line errors of :func:`dumps_json`, :func:`read_json`, :func:`write_text_file`.

This is the public face of the private modules ``_safe_io`` and ``_json_io``; the dataset layer
(:mod:`meshshard.data`), the run and the commands import these names from here.
"""

from __future__ import annotations

from ._json_io import (
    MAX_JSON_BYTES,
    WriteError,
    dumps_json,
    loads_json,
    naming_write_errors,
    read_json,
    write_text_file,
)
from ._safe_io import (
    MAX_EXPANSION,
    Refusals,
    check_apart,
    check_destination,
    check_input_folders,
    check_output_folder,
    decompress,
    folder_lock,
    hash_regular,
    interrupted_hint,
    is_lock_file,
    lock_path,
    max_expansion,
    parse_max_expansion,
    read_inside,
    read_json_inside,
    read_npy,
    read_npz,
    read_regular,
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
