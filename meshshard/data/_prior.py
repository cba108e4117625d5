"""Priors: ``meshshard dataset --mean-field [mean|knn:K|linear[:K]]`` on many meshes, and of the nearest cases.

What a sample gets as its input channels ``<target>_mean`` (marked ``"mean_of"``), and what the
model learns the difference from (``normalisation.target_offset``, :mod:`meshshard.data._mean_field`),
is its **prior**: a weighted mean of training cases' stored targets (after ``--target-scale``, so
non-dimensional where the targets are), each mapped onto the sample's **own** mesh with
:func:`meshshard.data.node_map` (identical meshes: the identity; else Delaunay-linear inside the
source's points' hull, the nearest source node outside; point clouds by inverse distance):

- ``mean`` (the bare flag): every training case the sample may use, equally weighted;
- ``knn:K``: the ``K`` of them nearest in parameter space (``--params``, each parameter divided by
  its standard deviation over all the training cases), weighted by inverse distance, an exact
  match alone (:mod:`meshshard.data._neighbours`, as ``meshshard baseline --method knn:K``);
- ``linear``: at every node, the least-squares fit of the cases by an affine function of the
  parameters (scaled as for ``knn:K``), evaluated at the sample's; ``linear:K``: over its ``K``
  nearest cases only. It is a weighted sum of the cases too (weights summing to 1, some
  negative: :func:`meshshard.data.linear_cases`), as ``meshshard baseline --method linear``;
  ``linear:K,bound=B``: damped where the weights would sum to more than ``B`` in absolute value (an
  extrapolation, as a training shape at a corner of the sweep gets with its own shape left out).

A training sample must not see itself in its prior (the prior would be its target). Which cases a
sample may use is recorded as ``mean_field.left_out``:

- ``"none"``: a sweep on **one mesh** with ``mean``: every sample gets the same mean of every
  training case (its own included, at weight ``1 / n``), as before knn and many meshes existed;
- ``"sample"``: one mesh with ``knn:K``: a training sample uses every *other* training case;
- ``"mesh"``: **many meshes** (a shape sweep): a training sample uses the training cases on
  *other* meshes only (leave-one-mesh-out). Where the cases of a shape share its mesh, its prior is
  so made the way a new shape's is, from other shapes alone; where each case has a mesh of its
  own, this leaves out the case alone, and the same shape at its other operating points stays in
  the prior (the shape sweep's recipe: with few shapes that paid over leaving out the shape).

- ``"shape"`` (``--shape-params NAMES``, the parameters that make a shape): a training sample
  uses only the training cases of *other shapes*, those whose values of NAMES differ from its own
  (and on other meshes), as a new shape's prior has none of its shape; at the corners of a sweep
  that makes the training priors extrapolations, worse than a new shape's. ``mean_field.shape``
  records NAMES.

Mirrors (``meshshard dataset --mirror``, :mod:`meshshard.data._mirror`) are in no prior: a prior
is made of the solved training cases alone, and a mirror's prior is its original's prior, mirrored
(the channels of its vectors along the axis negated), so that the mirrors add the symmetry to
what the model learns without changing any other sample's prior. With ``--mirror-in-prior`` they
are training cases of the prior like any other (``mean_field.mirrors`` says which). Where the solved cases share one
mesh (a sweep on one mesh, whose mirrors are on the mirrored mesh), a training sample leaves out
itself (``"sample"``), as on one mesh.

Validation samples (every sample outside the training split) use every training case. A
validation case that shares its mesh with training cases (split by case rather than by shape)
takes them too, so its prior is better informed than the training samples' were.

New cases (``meshshard dataset NEW --mean-field-from DATA``, meshes of their own and no targets
needed) take their prior from DATA's training cases, every one, with DATA's method and ``K``, the
parameters scaled by DATA's training standard deviations; DATA's precision, targets and, for
``knn:K``, parameter names are required of them. A one-mesh ``mean`` DATA gives its stored mean
field, mapped onto their meshes (the identity on DATA's own).

Cost: one :class:`~meshshard.data.NodeMap` per (source mesh, target mesh) pair, built once in a
build; samples are visited mesh by mesh, and a mesh's maps are let go after its samples. With
``mean``, each source mesh's training targets are summed once and mapped as one field.

Checksum. ``mean_field.sha256`` (and ``normalisation.offset_sha256``) names the prior's source:
the SHA-256 of the method, the target fields, the parameter names and, per training case, its
mesh checksum, parameters and stored targets (the one-mesh ``mean``: of the stored mean field). A
dataset made ``--mean-field-from DATA`` records DATA's, so runs trained on DATA predict on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from meshshard.partition import plural

from ._dataset import channel_names, save_npy
from ._mapping import MapsOnto, NodeMap
from ._mean_field import POSITION_SUFFIX, add_mean_field, append_mean_fields, finish_prior, mean_field_of
from ._mirror import mirror_originals, mirrored_channels, solved_training_samples
from ._morph import along_columns, peak_column
from ._neighbours import linear_cases, method_text, nearest_cases, parameter_scale, parse_linear
from ._statistics import Running

__all__ = ["PriorCases", "PriorMethod", "PriorRequest", "add_prior", "check_prior_request", "parse_prior",
           "prior_cases_of"]


@dataclass(frozen=True)
class PriorMethod:
    """A parsed ``--mean-field``: ``kind`` ``"mean"``, ``"knn"`` (with ``k``) or ``"linear"`` (``k``
    None: every case)."""

    kind: str
    k: int | None = None
    bound: float | None = None  # linear: the most its weights may sum to in absolute value (damped beyond)

    def __str__(self) -> str:
        return method_text(self.kind, self.k, self.bound)


def parse_prior(text: str | bool | None) -> PriorMethod:
    """``mean`` (also ``True``, the bare flag), ``knn:K`` (K >= 1), ``linear``, ``linear:K`` (K >= 2), or
    either with ``,bound=B`` (:func:`meshshard.data.linear_cases`); a one-line ``ValueError`` otherwise."""
    if text is True or text == "mean":
        return PriorMethod("mean")
    kind, _, rest = str(text).strip().partition(":")
    if kind == "knn" and rest.strip().isdigit() and int(rest) >= 1:
        return PriorMethod("knn", int(rest))
    if kind.startswith("linear"):
        k, bound = parse_linear(str(text).strip()[len("linear"):], "--mean-field")
        return PriorMethod("linear", k, bound)
    raise ValueError(f"Expected --mean-field mean, knn:K (K >= 1), linear, linear:K (K >= 2) or linear:K,bound=B "
                     f"(got {text!r}; a bare "
                     "--mean-field takes the word after it as its method: put it after the sources)")


@dataclass(frozen=True, eq=False)
class PriorCases:
    """The training cases a prior is made of, and how it is made of them.

    Case ``c`` is sample ``samples[c]`` of its dataset, on mesh ``mesh_of[c]`` (whose dataset entry is
    ``meshes[mesh_of[c]]``), with parameters ``values[c]`` (``(n, P)``, named ``names``);
    ``targets(c)`` its stored targets ``(N_m, F_out)`` as float64 and ``points(m)`` mesh ``m``'s
    coordinates. ``where(m)`` names mesh ``m`` in a message."""

    method: PriorMethod
    samples: np.ndarray
    mesh_of: np.ndarray
    meshes: list[dict[str, Any]]
    values: np.ndarray
    names: list[str]
    fields: list[dict[str, Any]]
    dtype: str
    targets: Callable[[int], np.ndarray]
    points: Callable[[int], np.ndarray]
    where: Callable[[int], str]
    sha256: str = ""
    label: str = "the training cases"
    folder: Callable[[int], Path] | None = None  # mesh m's folder (its wall, for maps along it)
    walls: tuple[str, ...] = ()  # --map-along: maps along these walls (meshshard.data._morph)
    along_fields: tuple[str, ...] = ()  # --map-along PATCHES:FIELDS: these fields alone (() every one)
    position_inputs: bool = False  # --position-prior-inputs: the prior by position too, as more inputs
    peak: str | None = None  # --map-along ...,peak=FIELD: FIELD's peak on the wall a landmark of the maps


def prior_cases_of(data: Any) -> PriorCases:
    """The training cases of an open dataset made with ``--mean-field`` (what ``--mean-field-from
    DATA`` takes), with its method and checksum; a one-line refusal otherwise."""
    meta = data.meta
    record = meta.get("mean_field") or {}
    if not record or not any("mean_of" in f for f in meta.get("inputs", [])):
        raise ValueError(f"{data.path}: Expected a dataset made with --mean-field (got no mean field)")
    method = parse_prior(record.get("method", "mean"))
    label = f"the training cases of {data.path}"
    if meta.get("kind") == "one-mesh" and method.kind == "mean":  # one stored field, every sample's
        mean, targets, _, stored = mean_field_of(data)
        return PriorCases(method, np.array([-1]), np.zeros(1, np.int64), [dict(meta["meshes"][0])], np.zeros((1, 0)),
                          [], targets, stored, lambda c: mean, lambda m: np.asarray(data.mesh_points(m)),
                          lambda m: str(data.mesh_folder(m)), str(record["sha256"]), label)
    if str(record.get("of")) != "training samples" or not len(data.train):
        raise ValueError(f"{data.path}: Expected a dataset whose own training cases made its prior (got one made "
                         "with --mean-field-from: pass the dataset it was made from)")
    train = solved_training_samples(meta, prior=True)  # a dataset's mirrors: only with --mirror-in-prior
    table = meta.get("parameters") or {"names": [], "values": []}
    names = [str(n) for n in table["names"]]
    values = np.asarray(table["values"], dtype=np.float64).reshape(data.num_samples, len(names))[train]
    return PriorCases(method, train, np.array([data.sample_mesh(int(i)) for i in train], dtype=np.int64),
                      [dict(m) for m in meta["meshes"]], values, names, [dict(f) for f in meta["targets"]],
                      str(meta["dtype"]), lambda c: np.asarray(data.sample_arrays(int(train[c]))[1], np.float64),
                      lambda m: np.asarray(data.mesh_points(m)), lambda m: str(data.mesh_folder(m)),
                      str(record["sha256"]), label, data.mesh_folder, tuple(record.get("along", [])),
                      tuple(record.get("along_fields", [])), bool(record.get("position_inputs")),
                      record.get("along_peak"))


def _staged_cases(tmp: Path, meta: dict[str, Any], train: Sequence[int], method: PriorMethod,
                  walls: tuple[str, ...] = (), along_fields: tuple[str, ...] = (),
                  position_inputs: bool = False, peak: str | None = None) -> PriorCases:
    """The training cases of the dataset being written in ``tmp``, with the checksum of them."""
    train_ids = np.asarray(train, dtype=np.int64)
    if not meta["target_channels"]:
        raise ValueError("Expected --targets for --mean-field (it is made of the training targets); for new cases "
                         "without targets, take a training dataset's with --mean-field-from DATA")
    if not len(train_ids):
        raise ValueError("Expected training samples for --mean-field (the split has none)")
    table = meta.get("parameters") or {"names": [], "values": []}
    names = [str(n) for n in table["names"]]
    values = np.asarray(table["values"], dtype=np.float64).reshape(int(meta["num_samples"]), len(names))[train_ids]

    def stored(c: int) -> np.ndarray:
        return np.load(tmp / "samples" / f"{int(train_ids[c]):05d}" / "targets.npy", allow_pickle=False)

    mesh_of = np.array([int(meta["samples"][int(i)]["mesh"]) for i in train_ids], dtype=np.int64)
    along = (f"along {','.join(walls)}:{','.join(along_fields)}{' +position' * position_inputs}"
             f"{f' peak={peak}' if peak else ''}\n" if walls else "")
    digest = hashlib.sha256(f"meshshard prior {method}\n{along}{channel_names(meta['targets'])}\n{names}\n".encode())
    for c in range(len(train_ids)):
        digest.update(str(meta["meshes"][mesh_of[c]]["sha256"]).encode())
        digest.update(np.ascontiguousarray(values[c]).tobytes())
        digest.update(np.ascontiguousarray(stored(c)).tobytes())
    return PriorCases(method, train_ids, mesh_of, [dict(m) for m in meta["meshes"]], values, names,
                      [dict(f) for f in meta["targets"]], str(meta["dtype"]),
                      lambda c: stored(c).astype(np.float64),
                      lambda m: np.load(tmp / "meshes" / f"{m:05d}" / "points.npy", allow_pickle=False),
                      lambda m: f"mesh {m} of the training cases", digest.hexdigest(),
                      folder=lambda m: tmp / "meshes" / f"{m:05d}", walls=walls, along_fields=along_fields,
                      position_inputs=position_inputs, peak=peak)


def _check_given(cases: PriorCases, meta: Mapping[str, Any], dtype: np.dtype) -> None:
    """Refuse new cases whose prior cannot be made as ``cases``' dataset made its own, in one line."""
    if np.dtype(cases.dtype) != dtype:
        raise ValueError(f"Expected --dtype {cases.dtype}, the precision of the --mean-field-from dataset (got "
                         f"{dtype.name}): its mean field is added back to the predictions as it is stored there")
    if meta["targets"] and [(f["name"], f["components"]) for f in meta["targets"]] != \
            [(f["name"], f["components"]) for f in cases.fields]:
        raise ValueError(f"Expected the targets of the --mean-field-from dataset ({channel_names(cases.fields)}) "
                         f"(got {meta['target_channels']})")
    if cases.method.kind in ("knn", "linear"):
        mine = [str(n) for n in (meta.get("parameters") or {}).get("names", [])]
        missing = [n for n in cases.names if n not in mine]
        if missing:
            raise ValueError(f"Expected --params with {', '.join(missing)} for these cases: the --mean-field-from "
                             f"dataset's prior is {cases.method}, the nearest cases in its parameters "
                             f"({', '.join(cases.names)}) (got {', '.join(mine) if mine else 'no --params'})")


def check_prior_request(mean_field: Any, given: PriorCases | None, dtype: str,
                        target_fields: Sequence[Mapping[str, Any]], table: Mapping[str, Any] | None) -> None:
    """The refusals :func:`add_prior` would make that the request alone decides (no targets,
    knn:K without ``--params``, new cases unlike ``given``'s dataset), before any sample is read."""
    meta = {"targets": list(target_fields), "target_channels": channel_names(target_fields),
            "parameters": table}
    if given is not None:
        _check_given(given, meta, np.dtype(dtype))
        return
    if mean_field in (None, False):
        return
    method = parse_prior(mean_field)
    if not target_fields:
        raise ValueError("Expected --targets for --mean-field (it is made of the training targets); for new cases "
                         "without targets, take a training dataset's with --mean-field-from DATA")
    if method.kind != "mean" and not (table or {}).get("names"):
        raise ValueError(f"Expected --params for --mean-field {method}, which measures distances in parameter space "
                         "(--mean-field mean needs none)")


class _Combiner:
    """Weighted sums of the training cases' targets mapped onto one target mesh at a time: the
    maps of the current target mesh, and (``mean``) each source mesh's sum of targets."""

    def __init__(self, cases: PriorCases) -> None:
        self.cases = cases
        # each training mesh triangulated once, not once per target mesh; along walls as --map-along says
        self.maps = MapsOnto(cases.walls, along_columns(cases.fields, cases.along_fields) if cases.walls else None,
                             peak_column(cases.fields, cases.peak) if cases.walls else None)
        self.target: Any = None
        self.sums: dict[int, np.ndarray] = {}
        self.last: tuple[Any, np.ndarray] | None = None

    def to_mesh(self, key: Any, points: Callable[[], np.ndarray], entry: Mapping[str, Any],
                folder: Path | None = None) -> None:
        """Map onto this mesh from now on (``key`` names it, ``folder`` holds it; its maps are built as needed)."""
        if key != self.target:
            self.target, self.last = key, None
            self._points, self._entry, self._folder = points, entry, folder

    def _map(self, m: int, landmark: tuple[float, float] | None = None) -> NodeMap | None:
        source_folder = self.cases.folder(m) if self.cases.folder is not None else None
        return self.maps.get(m, self.cases.meshes[m], lambda: self.cases.points(m), self.target, self._entry,
                             self._points, self.cases.where(m), source_folder, self._folder, landmark)

    def _aligned(self, sources: list[tuple[int, float]]) -> np.ndarray:
        """``combine`` with the peaks as landmarks: each case mapped with its own peak onto the
        target's, which is where its sources' peaks are, weighted as they are."""
        cases = self.cases
        landmarks = self.maps.landmarks(
            [(c, cases.meshes[int(cases.mesh_of[c])],
              cases.folder(int(cases.mesh_of[c])) if cases.folder is not None else None,
              lambda c=c: cases.targets(c)) for c, _ in sources], [w for _, w in sources])
        total: np.ndarray | float = 0.0
        for (c, w), landmark in zip(sources, landmarks):
            mapping = self._map(int(cases.mesh_of[c]), landmark)
            y = cases.targets(c)
            total = total + w * (y if mapping is None else mapping.apply(y))
        return np.asarray(total, dtype=np.float64)

    def _sum(self, m: int) -> np.ndarray:
        if m not in self.sums:
            self.sums[m] = sum(self.cases.targets(c) for c in np.flatnonzero(self.cases.mesh_of == m).tolist())
        return self.sums[m]

    def combine(self, sources: list[tuple[int, float]]) -> np.ndarray:
        """``sum_c w_c map(targets(c))`` on the current mesh, ``(N, F_out)`` float64."""
        key = tuple(sources)
        if self.last is not None and self.last[0] == key:
            return self.last[1]
        if self.maps.peak is not None:
            self.last = (key, self._aligned(sources))
            return self.last[1]
        by_mesh: dict[int, list[tuple[int, float]]] = {}
        for c, w in sources:
            by_mesh.setdefault(int(self.cases.mesh_of[c]), []).append((c, w))
        total: np.ndarray | float = 0.0
        for m, items in by_mesh.items():
            weights = {w for _, w in items}
            if self.cases.method.kind == "mean" and len(weights) == 1 and \
                    len(items) == int((self.cases.mesh_of == m).sum()):
                local = self._sum(m) * weights.pop()  # every case of mesh m, equally weighted
            else:
                local = sum(w * self.cases.targets(c) for c, w in items)
            mapping = self._map(m)
            total = total + (local if mapping is None else mapping.apply(local))
        out = np.asarray(total, dtype=np.float64)
        self.last = (key, out)
        return out


@dataclass(frozen=True)
class PriorRequest:
    """``--mean-field METHOD --shape-params NAMES``: the method, and the parameters that make a shape
    (a training sample's prior leaves out the cases of its own shape: the module docstring)."""

    method: Any
    shape: tuple[str, ...]
    walls: tuple[str, ...] = ()  # --map-along: maps between meshes along these walls
    along_fields: tuple[str, ...] = ()  # the target fields mapped so (() every one)
    position_inputs: bool = False  # --position-prior-inputs: the prior by position too, as more inputs
    peak: str | None = None  # --map-along ...,peak=FIELD


def _allowed(cases: PriorCases, left_out: str, sample: int, mesh: int, training: bool,
             shape: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The cases sample ``sample`` (on mesh ``mesh``) may use, ``(n,)`` bool; ``shape``: the cases'
    values of the shape parameters ``(n, S)`` and the sample's ``(S,)`` (``left_out == "shape"``)."""
    if not training or left_out == "none":
        return np.ones(len(cases.samples), bool)
    if left_out == "sample":
        return cases.samples != sample
    allowed = cases.mesh_of != mesh
    if left_out == "shape" and shape is not None:
        allowed &= ~np.all(shape[0] == shape[1][None, :], axis=1)
    return allowed


def _sources(cases: PriorCases, allowed: np.ndarray, value: np.ndarray, scale: np.ndarray, name: str,
             left_out: str) -> list[tuple[int, float]]:
    """The cases of one sample's prior and their weights; a one-line refusal when too few are allowed."""
    method, count = cases.method, int(allowed.sum())
    need = int(method.k or 1) if method.kind == "knn" else 1
    if count < need:
        rule = {"mesh": f"the training cases on other meshes than {name}'s (leave-one-mesh-out)",
                "shape": f"the training cases of other shapes than {name}'s (--shape-params)",
                "sample": f"the training cases other than {name} (leave-one-out)"}.get(left_out, cases.label)
        raise ValueError(f"Expected --mean-field {method} to find {plural(need, 'case')} among {rule} (got {count})")
    if method.kind == "mean":
        rows = np.flatnonzero(allowed)
        return [(int(c), 1.0 / len(rows)) for c in rows]
    if method.kind == "linear":
        return linear_cases(cases.values, value, scale, allowed, method.k, method.bound)
    return nearest_cases(cases.values, value, need, scale, allowed)


def add_prior(tmp: Path, meta: dict[str, Any], train: Sequence[int], dtype: np.dtype,
              mean_field: Any = True, progress: Callable[[int], None] | None = None) -> None:
    """Append every sample's prior to its inputs in the staged dataset ``tmp`` and redo the
    statistics (the module docstring); ``meta`` is the dataset's metadata, updated in place.

    ``mean_field``: ``True`` / ``"mean"`` / ``"knn:K"`` (``--mean-field``), a :class:`PriorCases`
    (``--mean-field-from``), or :func:`meshshard.data.mean_field_of`'s tuple (the one-mesh mean of
    another dataset, on its mesh). ``progress``: called with 1 after each sample."""
    if isinstance(mean_field, tuple):
        return add_mean_field(tmp, meta, train, dtype, mean_field, progress)
    shape: tuple[str, ...] = ()
    walls: tuple[str, ...] = ()
    along_fields: tuple[str, ...] = ()
    position_inputs = False
    peak = None
    if isinstance(mean_field, PriorRequest):
        request = mean_field
        mean_field, shape, walls, along_fields = request.method, request.shape, request.walls, request.along_fields
        position_inputs, peak = request.position_inputs, request.peak
    given = isinstance(mean_field, PriorCases)
    method = mean_field.method if given else parse_prior(mean_field)
    if not given and method.kind == "mean" and meta["kind"] == "one-mesh":
        return add_mean_field(tmp, meta, train, dtype, None, progress)  # one field for every sample, as before
    if method.kind != "mean" and not given and not (meta.get("parameters") or {}).get("names"):
        raise ValueError(f"Expected --params for --mean-field {method}, which measures distances in parameter space "
                         "(--mean-field mean needs none)")
    if given:
        cases = mean_field
        _check_given(cases, meta, dtype)
        left_out = "none"
    else:
        cases = _staged_cases(tmp, meta, solved_training_samples(meta, prior=True), method, walls, along_fields,
                              position_inputs, peak)
        left_out = "shape" if shape else "sample" if _one_mesh(meta) else "mesh"
    if shape and not set(shape) <= set(cases.names):
        raise ValueError(f"Expected --shape-params among the parameters {', '.join(cases.names) or '(none)'} "
                         f"(got {', '.join(shape)})")
    append_mean_fields(meta, cases.fields)
    if cases.position_inputs:  # the prior by position too, as more inputs (not the offset)
        append_mean_fields(meta, cases.fields, POSITION_SUFFIX)
    run_in, run_out, largest = _write_priors(tmp, meta, train, dtype, cases, left_out, progress, shape)
    record: dict[str, Any] = {"of": "another dataset (--mean-field-from)" if given else "training samples",
                              "method": str(method)}
    if method.k is not None:
        record["k"] = int(method.k)
    record["left_out"] = left_out
    if shape:
        record["shape"] = list(shape)
    if cases.walls:
        record["along"] = list(cases.walls)  # maps between meshes along these walls (--map-along)
        if cases.along_fields:
            record["along_fields"] = list(cases.along_fields)  # of these fields; the others by position
        if cases.position_inputs:
            record["position_inputs"] = True  # <target>_mean_by_position: the prior by position, as inputs
        if cases.peak:
            record["along_peak"] = cases.peak  # its peak on the wall a landmark of the maps
    if cases.samples[0] >= 0:  # not the stored mean field of a one-mesh dataset
        record["samples"] = len(cases.samples)
    if method.kind == "linear":  # how far the fits extrapolate: what --mean-field linear:K,bound=B is chosen by
        record["largest_weights"] = largest
    if meta.get("mirror"):
        record["mirrors"] = ("cases of every prior, as any training sample (--mirror-in-prior)"
                             if meta["mirror"].get("in_prior") else
                             "each mirror's prior is its original's, mirrored; no prior is made of a mirror")
    finish_prior(meta, run_in, run_out, cases.sha256, record)
    return None


def _one_mesh(meta: Mapping[str, Any]) -> bool:
    """Whether the dataset's solved cases share one mesh (its mirrors are on the mirrored mesh)."""
    mirrors = mirror_originals(meta)
    solved = {int(s["mesh"]) for i, s in enumerate(meta["samples"]) if i not in mirrors}
    return meta["kind"] == "one-mesh" or len(solved) == 1


def _write_priors(tmp: Path, meta: dict[str, Any], train: Sequence[int], dtype: np.dtype, cases: PriorCases,
                  left_out: str, progress: Callable[[int], None] | None,
                  shape: tuple[str, ...] = ()) -> tuple[Running, Running, dict[str, Any]]:
    """Every sample's inputs with its prior appended, mesh by mesh; returns the statistics of the
    training samples' inputs and of their targets' difference from the prior, and the largest sum of
    a prior's weights in absolute value, of the training samples and of the others, with the sample's
    name (``{"training": [sum, name], "other": [sum, name]}``: 1 for a blend, more for an extrapolation)."""
    samples = tmp / "samples"
    names = [str(s["name"]) for s in meta["samples"]]
    mesh_of = [int(s["mesh"]) for s in meta["samples"]]
    train_set = set(int(i) for i in train)
    table = meta.get("parameters") or {"names": [], "values": []}
    mine = [str(n) for n in table["names"]]
    values = np.asarray(table["values"], dtype=np.float64).reshape(len(names), len(mine))
    columns = [mine.index(n) for n in cases.names] if set(cases.names) <= set(mine) else []
    scale = parameter_scale(cases.values)
    shape_of_cases = cases.values[:, [cases.names.index(n) for n in shape]] if shape else None
    shape_columns = [mine.index(n) for n in shape] if shape else []
    has_targets = bool(meta["target_channels"])
    run_in, run_out = Running(len(meta["input_channels"])), Running(len(meta["target_channels"]))
    combiner = _Combiner(cases)
    by_position = _Combiner(replace(cases, walls=(), along_fields=(), peak=None)) if cases.position_inputs else None
    in_prior = (meta.get("mirror") or {}).get("in_prior")
    mirrors = {} if in_prior else mirror_originals(meta)  # each a mirrored copy of its original's
    largest: dict[str, list] = {}
    for s in sorted(set(range(len(names))) - set(mirrors), key=lambda i: (mesh_of[i], i)):
        m = mesh_of[s]
        entry = meta["meshes"][m]
        combiner.to_mesh(m, lambda m=m: np.load(tmp / "meshes" / f"{m:05d}" / "points.npy", allow_pickle=False),
                         entry, tmp / "meshes" / f"{m:05d}")
        training = s in train_set
        allowed = _allowed(cases, left_out, s, m, training,
                           None if shape_of_cases is None else (shape_of_cases, values[s, shape_columns]))
        value = values[s, columns] if columns else np.zeros(len(cases.names))
        sources = _sources(cases, allowed, value, scale, names[s], left_out)
        amplification = round(sum(abs(w) for _, w in sources), 4)
        side = "training" if training else "other"
        if side not in largest or amplification > largest[side][0]:
            largest[side] = [amplification, names[s]]
        prior = combiner.combine(sources)
        extra = None
        if by_position is not None:
            by_position.to_mesh(m, lambda m=m: np.load(tmp / "meshes" / f"{m:05d}" / "points.npy", allow_pickle=False),
                                entry, tmp / "meshes" / f"{m:05d}")
            extra = by_position.combine(sources).astype(dtype)
        _append_prior(samples / f"{s:05d}", prior.astype(dtype), training, has_targets, run_in, run_out, extra)
        if progress is not None:
            progress(1)
    flip = mirrored_channels(meta, cases.fields)
    sets = 2 if by_position is not None else 1  # the prior, and the one by position after it
    for s, original in sorted(mirrors.items()):  # after every original: a mirror's prior is its original's, mirrored
        stored = np.load(samples / f"{original:05d}" / "inputs.npy", allow_pickle=False)[:, -sets * len(flip):]
        stored = np.where(np.tile(flip, sets), -stored, stored)
        _append_prior(samples / f"{s:05d}", stored[:, :len(flip)], True, has_targets, run_in, run_out,
                      stored[:, len(flip):] if sets == 2 else None)
        if progress is not None:
            progress(1)
    return run_in, run_out, largest


def _append_prior(folder: Path, stored: np.ndarray, training: bool, has_targets: bool, run_in: Running,
                  run_out: Running, extra: np.ndarray | None = None) -> None:
    """A sample's inputs with its prior ``stored`` appended (and ``extra``, the prior by position,
    after it); a training sample's inputs and targets' difference from the prior added to the
    statistics."""
    inputs = np.concatenate([np.load(folder / "inputs.npy", allow_pickle=False), stored,
                             *([extra] if extra is not None else [])], axis=1)
    save_npy(folder / "inputs.npy", inputs)
    if training:
        run_in.add(inputs.astype(np.float64))
        if has_targets:
            y = np.load(folder / "targets.npy", allow_pickle=False).astype(np.float64)
            run_out.add(y - stored.astype(np.float64))  # the offset as stored, as training applies it
