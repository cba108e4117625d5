"""Mirrored training cases: ``meshshard dataset --mirror AXIS[:VECTORS] [--mirror-params NAMES]``.

A flow about a body mirrored in a plane is the mirror of the body's flow. For a sweep whose family
is closed under that mirror (a cambered section at ``+aoa`` mirrors to the section of negated
camber at ``-aoa``), every training case gives a second one for free, exact by symmetry:

- the mesh: the coordinate ``AXIS`` (``x``, ``y`` or ``z``) negated at every node; each cell's
  nodes reordered so that it keeps its orientation (a triangle ``a, b, c`` becomes ``a, c, b``),
  so surface normals still point out and no cell is inside out;
- the fields: each named vector field (``VECTORS``, e.g. ``U``) has its component along ``AXIS``
  negated, in ``point_data`` and ``cell_data``; scalar fields (``p``) are kept. A field of several
  components that is read but not named is refused: a pseudovector (vorticity) or a tensor mirrors
  otherwise, and a wrong guess would be silently wrong data;
- the parameters (``--mirror-params``, columns of ``--params``): negated (``camber``, ``aoa``);
  the others kept. ``--target-scale`` is evaluated at the mirrored parameters.

Derived inputs (``--wall-distance``, ``--wall-normal``, ``--signed-distance``, a surface's
``normal`` and ``area``, ``pos``) are computed from the mirrored mesh as from any file, so they are
the mirrors of the original's. Only training samples are mirrored (the validation split is drawn
from the files first and left as it is). A mirror whose parameters equal its original's (a
symmetric section at 0 degrees: its own mirror) is not added, and a note says so. A mirrored
sample is named ``<name>~mirror-<axis>``. By default mirrors train the model and nothing else: a
prior (``--mean-field``) and ``meshshard baseline`` are made of the solved cases alone
(:func:`solved_training_samples`), and a mirror's prior is its original's, mirrored
(:mod:`meshshard.data._prior`). With ``--mirror-in-prior`` the mirrors are cases of the prior too
(each sample's prior made of the solved cases and the mirrors, the mirrors' own as any training
sample's); baselines stay of the solved cases. They are recorded in ``dataset.json`` as ``mirror``::

    {"axis": "y", "vectors": ["U"], "parameters": ["camber", "aoa"], "in_prior": false,
     "samples": {"case-3~mirror-y": "case-3", ...}}
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import listed, plural

__all__ = ["MirrorRequest", "parse_mirror", "mirror_mesh", "mirror_name", "mirror_plan", "MIRROR_SUFFIX",
           "mirror_originals", "mirror_record", "solved_training_samples", "mirrored_channels", "DERIVED_VECTORS"]

_AXES = {"x": 0, "y": 1, "z": 2}

#: Mirrored sample names: ``<name>~mirror-<axis>``.
MIRROR_SUFFIX = "~mirror-"

#: Per cell type, the node order of the mirrored cell that keeps its orientation (VTK/meshio order).
_REORDER: dict[str, list[int]] = {
    "vertex": [0],
    "line": [1, 0],
    "triangle": [0, 2, 1],
    "quad": [0, 3, 2, 1],
    "tetra": [0, 2, 1, 3],
    "pyramid": [0, 3, 2, 1, 4],
    "wedge": [0, 2, 1, 3, 5, 4],
    "hexahedron": [0, 3, 2, 1, 4, 7, 6, 5],
}


@dataclass(frozen=True)
class MirrorRequest:
    """``--mirror AXIS[:VECTORS]`` and ``--mirror-params NAMES``, checked."""
    axis: str
    vectors: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    in_prior: bool = False  # --mirror-in-prior: the mirrors are cases of the prior too

    @property
    def index(self) -> int:
        return _AXES[self.axis]

    def record(self) -> dict[str, Any]:
        return {"axis": self.axis, "vectors": list(self.vectors), "parameters": list(self.parameters),
                "in_prior": self.in_prior}


def parse_mirror(text: str | None, params: str | Sequence[str] | None,
                 table: Mapping[str, Any] | None, in_prior: bool = False) -> MirrorRequest | None:
    """``"y:U"`` (and ``"camber,aoa"``) as a :class:`MirrorRequest`, or None without ``--mirror``;
    ``--mirror-params`` must be columns of the ``--params`` table."""
    names = tuple(n.strip() for n in (params.split(",") if isinstance(params, str) else params or ()) if n.strip())
    if text is None or text is False:
        if names or in_prior:
            flag = "--mirror-params" if names else "--mirror-in-prior"
            raise ValueError(f"Expected --mirror with {flag} (it says how the mirrors are made or used)")
        return None
    axis, _, vectors = str(text).partition(":")
    axis = axis.strip().lower()
    if axis not in _AXES:
        raise ValueError(f"Expected --mirror as AXIS[:VECTOR,...], AXIS one of x, y, z (got {text!r})")
    fields = tuple(dict.fromkeys(v.strip() for v in vectors.split(",") if v.strip()))
    if any("[" in f for f in fields):
        raise ValueError(f"Expected --mirror to name whole vector fields (U, not U[1]) (got {text!r})")
    if names:
        known = [str(n) for n in (table or {}).get("names", [])]
        if table is None:
            raise ValueError("Expected --params with --mirror-params (they are columns of its table)")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"Expected --mirror-params among the --params columns {', '.join(known)} "
                             f"(got {', '.join(unknown)})")
    return MirrorRequest(axis, fields, names, bool(in_prior))


def mirror_record(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a mirror is, from a dataset's (or a run's) ``mirror`` record: its ``axis``, ``vectors``
    and ``parameters``; None without one. A run keeps it for ``predict --mirror-average``."""
    return {k: record.get(k, []) for k in ("axis", "vectors", "parameters")} if record else None


def mirror_originals(meta: Mapping[str, Any]) -> dict[int, int]:
    """``{mirror: original}``, sample indices of a dataset's ``meta`` (empty without ``--mirror``)."""
    pairs = (meta.get("mirror") or {}).get("samples", {})
    if not pairs:
        return {}
    index = {str(s["name"]): i for i, s in enumerate(meta["samples"])}
    return {index[str(m)]: index[str(o)] for m, o in pairs.items()}


def solved_training_samples(meta: Mapping[str, Any], prior: bool = False) -> np.ndarray:
    """The training samples of a dataset's ``meta`` that are not mirrors (the cases a solver gave):
    what baselines are made of, and priors unless ``--mirror-in-prior`` (with ``prior``: every
    training sample then)."""
    train = np.asarray(meta["split"]["train"], dtype=np.int64)
    mirrors = mirror_originals(meta)
    if not mirrors or (prior and (meta.get("mirror") or {}).get("in_prior")):
        return train
    return np.array([i for i in train.tolist() if i not in mirrors], dtype=np.int64)


#: Vectors a dataset derives from the mesh (positions, edge offsets, the nearest wall's offset and
#: normal, a surface's normal): computed from a mirrored mesh, so the mirror negates their component
#: along its axis, as it does a named vector field's.
DERIVED_VECTORS = ("pos", "dpos", "wall_offset", "wall_normal", "normal")


def mirrored_channels(meta: Mapping[str, Any], fields: Sequence[Mapping[str, Any]],
                      record: Mapping[str, Any] | None = None) -> np.ndarray:
    """``(F,)`` bool over the channels of ``fields`` (``[{"name", "components"}]``, as
    ``dataset.json``'s ``inputs`` and ``targets``; a channel name such as ``dpos[1]`` is a field of one
    component): the channels a mirror negates. Those are the components along its axis of its vectors,
    of :data:`DERIVED_VECTORS` and of a prior of a vector (``"mean_of"``), and the parameters it
    negates (``"parameter"``). ``record`` is the mirror (``axis``, ``vectors``, ``parameters``;
    default: ``meta``'s ``mirror``)."""
    record = (meta.get("mirror") or {}) if record is None else record
    axis = _AXES.get(str(record.get("axis")), -1)
    vectors = {*record.get("vectors", []), *DERIVED_VECTORS}
    flip: list[bool] = []
    for f in fields:
        name = str(f["name"])
        if f.get("parameter"):
            flip.append(name in record.get("parameters", []))
            continue
        of = str(f.get("mean_of") or f.get("position_prior_of") or name)  # a prior mirrors as the field it is of
        one = re.fullmatch(r"(.+)\[(\d+)\]", of)  # one component of a vector (U[1])
        if one is not None and int(f.get("components", 1)) == 1:
            flip.append(one.group(1) in vectors and int(one.group(2)) == axis)
        else:
            flip += [of in vectors and k == axis for k in range(int(f["components"]))]
    return np.array(flip, dtype=bool)


def mirror_name(name: str, request: MirrorRequest) -> str:
    return f"{name}{MIRROR_SUFFIX}{request.axis}"


def mirror_plan(request: MirrorRequest, names: Sequence[str], train: Sequence[int],
                table: Mapping[str, Any] | None,
                notes: Callable[[str], None] | None = None) -> tuple[list[int], list[str], list[list[float]]]:
    """Which training samples get a mirror, the mirrors' names and their parameter rows (the
    table's rows with ``request.parameters`` negated; empty without a table). A sample whose
    mirrored parameters equal its own is its own mirror: left out, with a note."""
    negate = np.array([n in request.parameters for n in (table or {}).get("names", [])], dtype=bool)
    picked, rows, same = [], [], []
    for i in train:
        row = list(table["values"][i]) if table is not None else []
        mirrored = [-v if flip else v for v, flip in zip(row, negate)]
        if table is not None and negate.any() and all(a == b for a, b in zip(mirrored, row)):
            same.append(names[i])
            continue
        picked.append(i)
        rows.append([float(v) + 0.0 for v in mirrored])  # + 0.0: -0.0 is 0.0
    if same and notes is not None:
        own = "is its own mirror" if len(same) == 1 else "are their own mirrors"
        notes(f"{plural(len(same), 'training sample')} {own} (--mirror-params {','.join(request.parameters)} all 0), "
              f"not mirrored: {listed(same)}")
    mirrored_names = [mirror_name(names[i], request) for i in picked]
    clash = sorted(set(mirrored_names) & set(names))
    if clash:
        raise ValueError(f"Expected no sample named as a mirror is ({listed(clash)}: a file of that name is a sample "
                         "already)")
    return picked, mirrored_names, rows


def mirror_mesh(mesh: Any, request: MirrorRequest, fields: Sequence[str], path: Path) -> Any:
    """A copy of ``mesh`` (a ``meshio.Mesh`` as read) mirrored as the module docstring says.

    ``fields`` are the names the dataset reads (``U``, ``U[1]``, ``pos``): every one of several
    components in the file must be a named vector, and every named vector must be read.
    """
    import meshio

    points = np.array(mesh.points, dtype=np.float64)
    k = request.index
    if points.ndim != 2 or k >= points.shape[1]:
        raise ValueError(f"{path}: Expected {request.axis} coordinates to mirror (got "
                         f"{points.shape[1] if points.ndim == 2 else 0}-D points)")
    point_data, cell_data = dict(mesh.point_data), dict(getattr(mesh, "cell_data", None) or {})
    bases = {f.split("[")[0] for f in fields}
    if "pos" not in point_data:
        bases.discard("pos")  # the coordinates, mirrored as the points are
    for base in sorted(bases):
        width = _width(point_data.get(base), cell_data.get(base))
        if width is None:
            continue  # not in the file: derived from the geometry (normal, area) or refused later
        named = base in request.vectors
        if width > 1 and not named:
            raise ValueError(f"{path}: Expected --mirror to name {base!r}, a field of {width} components, if it is a "
                             f"vector ({request.axis}:...,{base}: its {request.axis} component negated); a "
                             "pseudovector or a tensor mirrors otherwise, so leave it out of the fields")
        if named and width not in (2, 3):
            raise ValueError(f"{path}: Expected --mirror's vector {base!r} to have 2 or 3 components (got {width})")
        if named and k >= width:
            raise ValueError(f"{path}: Expected --mirror's vector {base!r} to have a {request.axis} component (got "
                             f"{width} components)")
    missing = [v for v in request.vectors if v not in bases]
    if missing:
        raise ValueError(f"{path}: Expected --mirror's vectors among the fields read (got {listed(missing)}, not "
                         f"among {listed(sorted(bases)) if bases else 'none'})")
    points[:, k] = -points[:, k]
    for name in request.vectors:
        if name in point_data:
            point_data[name] = _negated(point_data[name], k)
        if name in cell_data:
            cell_data[name] = [_negated(block, k) for block in cell_data[name]]
    cells = [meshio.CellBlock(b.type, _reoriented(b.type, np.asarray(b.data), path)) for b in mesh.cells]
    out = copy.copy(mesh)
    out.points, out.point_data, out.cell_data, out.cells = points, point_data, cell_data, cells
    return out


def _width(point_value: Any, cell_value: Any) -> int | None:
    if point_value is not None:
        a = np.asarray(point_value)
        return 1 if a.ndim == 1 else int(np.prod(a.shape[1:]))
    if cell_value is not None and len(cell_value):
        a = np.asarray(cell_value[0])
        return 1 if a.ndim == 1 else int(np.prod(a.shape[1:]))
    return None


def _negated(values: Any, k: int) -> np.ndarray:
    a = np.array(values)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    a[:, k] = -a[:, k]
    return a


def _reoriented(cell_type: str, conn: np.ndarray, path: Path) -> np.ndarray:
    """``conn`` with each cell's nodes in the order that keeps its orientation once mirrored."""
    if cell_type in _REORDER:
        return conn[:, _REORDER[cell_type]]
    if cell_type.startswith("polygon") and conn.ndim == 2:
        return conn[:, [0, *range(conn.shape[1] - 1, 0, -1)]]
    raise ValueError(f"{path}: Expected cells --mirror can reorder ({', '.join(_REORDER)}, polygon) (got "
                     f"{cell_type!r}: its mirrored node order is not known here)")
