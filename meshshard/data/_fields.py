"""Field names (``--inputs`` / ``--targets`` / ``--state``) and where their channels come from in a
mesh file.

A name is a ``point_data`` array (all its components: ``u`` of shape ``(N, 3)`` is the channels
``u[0..2]``), one component of it (``u[1]``), or the name ``pos`` for the node coordinates
(``pos[0]``... for one coordinate), unless ``point_data`` has a field of that name. Only the named
fields are read: every file must hold them, with the same meaning and component count as the
first file (:class:`FieldSource`); other fields may differ from file to file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._mesh_ops import cell_data_to_points

__all__ = ["parse_field_names", "FieldSource", "select_fields", "field_records", "point_field"]

_COMPONENT = re.compile(r"^(.+)\[(\d+)\]$")


def parse_field_names(text: str | Sequence[str], what: str) -> list[str]:
    """Field names from ``"T,u"``, or from a list of such strings (a repeated ``--inputs`` flag:
    the lists add up); each name once."""
    items = [text] if isinstance(text, str) else list(text)
    names = [t.strip() for item in items for t in str(item).split(",")]
    if not names or not all(names):
        raise ValueError(f"Expected {what} as comma-separated field names (got {','.join(map(str, items))!r})")
    twice = [n for n, k in Counter(names).items() if k > 1]
    if twice:
        raise ValueError(f"Expected each field once in {what} (got {', '.join(map(repr, twice))} more than once)")
    return names


def point_field(mesh: Any, name: str, path: Path) -> np.ndarray:
    """The ``point_data`` array ``name`` as ``(N, components)``, its length and dtype checked."""
    n = len(mesh.points)
    a = np.asarray(mesh.point_data[name])
    if a.ndim == 0 or a.shape[0] != n:
        raise ValueError(f"{path}: Expected point_data field {name!r} to have one value per node, {n} "
                         f"(got shape {a.shape})")
    if not np.issubdtype(a.dtype, np.number) and a.dtype != bool:
        raise ValueError(f"{path}: Expected a numeric point_data field {name!r} (got dtype {a.dtype})")
    return a.reshape(n, -1)


def _describe(point_data: dict[str, Any]) -> str:
    """``T, u (3 components)``: the ``point_data`` fields of a file."""
    out = []
    for k, v in point_data.items():
        shape = np.shape(v)
        width = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        out.append(k if width == 1 else f"{k} ({width} components)")
    return ", ".join(out)


@dataclass(frozen=True)
class FieldSource:
    """Where a named field's channels come from: the node coordinates (``coords``) or the
    ``point_data`` field ``base`` (the ``cell_data`` field ``base`` averaged onto the nodes, with
    ``cell``), all of it or its component ``comp``; ``components`` channels."""
    base: str
    comp: int | None
    coords: bool
    components: int
    cell: bool = False

    def __str__(self) -> str:
        what = ("the node coordinates" if self.coords else
                f"cell_data field {self.base!r} averaged onto the nodes" if self.cell else
                f"point_data field {self.base!r}")
        if self.comp is not None:
            return f"component {self.comp} of {what}"
        return what + ("" if self.components == 1 else f" ({self.components} components)")


def select_fields(names: list[str], mesh: Any, pos: np.ndarray, path: Path,
            cell_to_points: bool = False) -> tuple[np.ndarray, list[FieldSource]]:
    """The channels of ``names`` from the mesh's ``point_data`` (or ``pos``; with
    ``cell_to_points``, a field only in ``cell_data`` averaged onto the nodes), and where each
    name's channels come from. Only the named fields are read and checked."""
    columns, sources = [np.zeros((len(pos), 0))], []  # no names (no targets): zero channels
    point_data = mesh.point_data
    cell_data = getattr(mesh, "cell_data", None) or {}
    for name in names:
        base, comp = name, None
        match = _COMPONENT.match(name)
        if name not in point_data and name != "pos" and match and not (cell_to_points and name in cell_data):
            base, comp = match.group(1), int(match.group(2))
        coords = base == "pos" and base not in point_data
        cell = False
        if coords:
            array = pos
        elif base in point_data:
            array = point_field(mesh, base, path)
        elif cell_to_points and base in cell_data:
            array, cell = cell_data_to_points(mesh, base, path), True
        elif cell_to_points:
            raise ValueError(f"{path}: Expected field {name!r} in point_data or cell_data (available: "
                             f"{_describe(point_data) or 'none'}; cell_data: {_describe_cells(cell_data) or 'none'}; "
                             "and pos for the coordinates)")
        else:
            hint = (f"; {base!r} is there as cell data (a value per cell), and meshshard needs point fields: "
                    "interpolate it to the nodes first (ParaView: Cell Data to Point Data)"
                    if base in cell_data else "")
            raise ValueError(f"{path}: Expected field {name!r} in point_data (available: "
                             f"{_describe(point_data) or 'none'}; and pos for the coordinates){hint}")
        if comp is not None:
            if comp >= array.shape[1]:
                raise ValueError(f"{path}: Expected a component of {base!r} in 0..{array.shape[1] - 1} (got {name!r})")
            array = array[:, comp:comp + 1]
        columns.append(np.asarray(array, dtype=np.float64))
        sources.append(FieldSource(base, comp, coords, array.shape[1], cell))
    return np.concatenate(columns, axis=1), sources


def _describe_cells(cell_data: Mapping[str, Any]) -> str:
    """``k, U (3 components)``: the ``cell_data`` fields of a file (per block lists)."""
    return _describe({k: v[0] if isinstance(v, list | tuple) and len(v) else v for k, v in cell_data.items()})


def field_records(names: list[str], sources: list[FieldSource]) -> list[dict[str, Any]]:
    """The field records ``[{"name", "components"}]`` the dataset stores."""
    return [{"name": n, "components": s.components} for n, s in zip(names, sources)]
