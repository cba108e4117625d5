"""The longest array a piece of code holds, traced line by line: for the "no process holds an array of
the global length" tests of the distributed partition and dataset."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np


def largest_array_held(run: Callable[[], Any], modules: Iterable[Any], skip_memmaps: bool = False) -> list[Any]:
    """Call ``run()`` with every line of ``modules`` traced; return ``[length, where]``: the largest
    dimension of a numpy array held by a local variable (or inside a list, tuple or dataclass held by
    one, two levels deep) or returned, and the variable, function and line. With ``skip_memmaps``, a
    memory map (an ``.npy`` file written or hashed in place) is not counted: only the slices read of it."""
    watched = {m.__file__ for m in modules}
    largest: list[Any] = [0, ""]

    def size(value: Any, depth: int = 0) -> int:
        if skip_memmaps and isinstance(value, np.memmap):
            return 0
        if isinstance(value, np.ndarray):
            return max(value.shape, default=0)
        if depth > 2:
            return 0
        if isinstance(value, (list, tuple)):
            return max((size(v, depth + 1) for v in value), default=0)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return max((size(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)), default=0)
        return 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        for name, value in [*frame.f_locals.items(), ("<returned>", arg if event == "return" else None)]:
            found = size(value)
            if found > largest[0]:
                largest[:] = [found, f"{name} in {frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}"
                                     f":{frame.f_lineno})"]
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename in watched else None

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return largest
