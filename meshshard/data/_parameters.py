"""Per-sample parameters (``meshshard dataset --params``: a CSV table, :func:`read_parameters`) and
the target scales of them (``--target-scale``: non-dimensional targets, :func:`target_scales`):
each parameter becomes an input channel, the same at every node of its sample, and each target
field is divided by its scale (:func:`with_parameters`).
"""

from __future__ import annotations

import io
import math
import os
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural
from meshshard.partition.files import read_regular

from ._expressions import check_expression, evaluate_expression, parse_target_scales
from ._writer import Sample

#: The magnitudes a target scale may have: a float32 run multiplies its predictions back by it.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)

__all__ = ["MAX_PARAMS_BYTES", "read_parameters", "target_scales", "with_parameters"]

#: The largest parameter table read (a row per sample: a few dozen bytes each).
MAX_PARAMS_BYTES = 64 << 20


def read_parameters(path: str | os.PathLike[str], names: Sequence[str],
                    notes: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A CSV table of per-sample parameters: ``{"names": [...], "values": [[...] per sample of
    names]}``, in the order of ``names``.

    The first row names the columns: ``sample`` (the sample names, as ``meshshard dataset`` gives
    them: file names without extension), then one column per parameter, every value a finite
    number. Every sample needs exactly one row; rows of other samples are a note. Bad input is a
    one-line ``ValueError`` naming the file, the row and the column.
    """
    import csv

    label = Path(path)
    stored = io.BytesIO(read_regular(path, max_bytes=MAX_PARAMS_BYTES))  # decoded as read: never a copy as text
    reader = csv.reader(io.TextIOWrapper(stored, encoding="utf-8-sig", errors="replace", newline=""))
    rows = (r for r in reader if any(cell.strip() for cell in r))  # streamed: a row at a time, never all held
    try:
        header = [cell.strip() for cell in next(rows, [])]
        if not header:
            raise ValueError(f"{label}: Expected a CSV table with a header row (got an empty file)")
        if "sample" not in header:
            raise ValueError(f"{label}: Expected a 'sample' column of sample names (got columns "
                             f"{_shown(', '.join(header))})")
        key = header.index("sample")
        columns = [i for i in range(len(header)) if i != key]
        if not columns or any(not header[i] for i in columns) or len(set(header)) != len(header):
            raise ValueError(f"{label}: Expected named parameter columns besides 'sample', each once (got "
                             f"{_shown(', '.join(header))})")
        table: dict[str, int] = {}  # sample name -> its row among the values
        values = array("d")  # every row's values, one after another: 8 bytes a value
        for row in rows:
            n = reader.line_num
            if len(row) != len(header):
                raise ValueError(f"{label}: row {n}: Expected {len(header)} values (got {len(row)})")
            name = row[key].strip()
            if name in table:
                raise ValueError(f"{label}: row {n}: sample {_shown(name)!r} has a row already")
            table[name] = len(table)
            values.extend(_number(row[i], label, n, header[i]) for i in columns)
    except csv.Error as err:
        raise ValueError(f"{label}: line {reader.line_num}: not a readable CSV table ({err})") from None
    del stored
    width = len(columns)
    missing = [s for s in names if s not in table]
    if missing:
        raise ValueError(f"{label}: Expected a row for every sample (no row for {listed(missing)}; the samples are "
                         "named after their files, without extension)")
    extra = [s for s in table if s not in set(names)]
    if extra and notes is not None:
        notes(f"{label}: {plural(len(extra), 'row')} of samples not in this dataset, left out: {listed(extra)}")
    return {"names": [header[i] for i in columns],
            "values": [values[table[s] * width:(table[s] + 1) * width].tolist() for s in names]}


def _shown(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters for a message (a 100k-character cell is no line)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _number(cell: str, label: Path, n: int, column: str) -> float:
    """The finite number of a table's cell; a one-line ``ValueError`` naming the row and column."""
    try:
        if "_" in cell:  # Python's float() takes 1_000; a table of numbers does not
            raise ValueError
        value = float(cell)
    except ValueError:
        raise ValueError(f"{label}: row {n}, column {_shown(column)}: Expected a number (got {_shown(cell)!r})"
                         ) from None
    if not math.isfinite(value):
        raise ValueError(f"{label}: row {n}, column {_shown(column)}: Expected a finite number (got {cell!r})")
    return value


def target_scales(given: str | Mapping[str, str] | None, table: Mapping[str, Any] | None,
                   params: Any, out_names: list[str], names: Sequence[str]) -> dict[str, str]:
    """The checked ``--target-scale`` expressions, by target field; each is a finite, non-zero
    number for every sample (one line naming the sample otherwise)."""
    if not given:
        return {}
    scales = parse_target_scales(given) if isinstance(given, str) else {str(k): str(v) for k, v in given.items()}
    if table is None:
        raise ValueError("Expected --params with --target-scale (its expressions are of the parameters)")
    fields = [n.split("[")[0] for n in out_names]
    unknown = [f for f in scales if f not in fields]
    if unknown:
        raise ValueError(f"Expected --target-scale to name target fields ({', '.join(fields) or 'none'}) (got "
                         f"{listed(unknown)})")
    for field, expression in scales.items():
        check_expression(expression, table["names"])
        for i, row in enumerate(table["values"]):
            try:
                factor = evaluate_expression(expression, dict(zip(table["names"], row)))
            except ValueError as err:
                raise ValueError(f"{params}: sample {names[i]}: {err}") from None
            if factor == 0:
                raise ValueError(f"{params}: sample {names[i]}: Expected --target-scale {field}={expression} to be "
                                 "non-zero (got 0), since the targets are divided by it")
            if not _FLOAT32_TINY <= abs(factor) <= _FLOAT32_MAX:
                raise ValueError(f"{params}: sample {names[i]}: Expected --target-scale {field}={expression} within "
                                 f"float32's range ({_FLOAT32_TINY:.3g} to {_FLOAT32_MAX:.3g} in magnitude; got "
                                 f"{factor:g}), since a run's predictions are multiplied back by it in float32")
    return scales


def with_parameters(sample: Sample, table: Mapping[str, Any], i: int, scales: Mapping[str, str] | None = None,
                    target_fields: Sequence[Mapping[str, Any]] = ()) -> Sample:
    """``sample`` with sample ``i``'s parameters appended to its inputs, one column each, the same
    value at every node, and its targets divided by their ``scales`` (non-dimensional)."""
    values = np.asarray(table["values"][i], dtype=np.float64)
    columns = np.broadcast_to(values, (len(sample.inputs), len(values)))
    inputs = np.concatenate([np.asarray(sample.inputs, dtype=np.float64), columns], axis=1)
    targets = sample.targets
    if scales:
        named = dict(zip(table["names"], table["values"][i]))
        factors: list[float] = []
        for f in target_fields:
            expression = scales.get(str(f["name"]))
            factors += [evaluate_expression(expression, named) if expression else 1.0] * int(f["components"])
        targets = np.asarray(targets, dtype=np.float64) / np.asarray(factors)
    return replace(sample, inputs=inputs, targets=targets)
