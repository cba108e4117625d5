"""The training cases' mean field: what a model on a parameter sweep learns the difference from.

On a sweep (every sample on one mesh, ``meshshard dataset --same-mesh``), the fields of the cases
differ from one another by a few percent, while the fields themselves vary by orders of magnitude
over the domain. A model asked for the whole field spends its accuracy on the part every case
shares; ``meshshard dataset --mean-field`` asks it for the difference instead:

- the **mean field** is the node-wise mean of the training samples' targets (as stored, so after
  ``--target-scale``: non-dimensional where the targets are);
- every sample gets it as input channels, one field ``<target>_mean`` per target field (``"mean_of":
  "<target>"`` in its field record), so the model also sees the mean flow's structure at each node;
- the targets' normalisation is taken over the difference ``target - mean field``, and
  ``normalisation.target_offset`` lists, per target channel, the input channel that is its offset:
  training applies ``(target - offset - mean) / scale``, prediction ``output * scale + mean +
  offset``. The model starts out as the mean-field baseline, and learns the variation between cases
  at O(1).

New cases to predict on are given the same input channels with ``meshshard dataset NEW ...
--mean-field-from DATA``: the mean field of the training dataset ``DATA`` (on another mesh, mapped
onto theirs: :mod:`meshshard.data._prior`). A run records ``target_offset`` in its normalisation, so
predict adds the offset back whichever dataset it predicts on.

This module is the one-mesh ``mean``, one field for every sample; a prior on many meshes, or of
the nearest cases (``--mean-field knn:K``), is :mod:`meshshard.data._prior`'s.

The mean field is stored with each sample, in its ``inputs.npy`` (``(N, F_out)`` more columns, in
the dataset's precision); the offset applied in training and added back in prediction is that
stored value, so the two agree exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._dataset import channel_names, save_npy
from ._statistics import ChannelStats, Normalisation, Running

__all__ = ["MEAN_SUFFIX", "add_mean_field", "append_mean_fields", "finish_prior", "mean_field_of",
           "target_offset_channels"]

#: The input field of a target field ``f``'s mean is named ``f`` + this.
MEAN_SUFFIX = "_mean"
#: The prior mapped by position, as inputs beside a prior along a wall: ``<target>_mean_by_position``.
POSITION_SUFFIX = "_by_position"


def target_offset_channels(input_channels: Sequence[str], target_fields: Sequence[Mapping[str, Any]],
                           input_fields: Sequence[Mapping[str, Any]]) -> list[int]:
    """Per target channel, the index of the input channel holding its mean (``ValueError`` when a
    target field has no ``<target>_mean`` input field marked ``"mean_of"``)."""
    means = {str(f["mean_of"]): f for f in input_fields if "mean_of" in f}
    out: list[int] = []
    for f in target_fields:
        name, k = str(f["name"]), int(f["components"])
        g = means.get(name)
        if g is None or int(g["components"]) != k:
            raise ValueError(f"Expected an input field {name}{MEAN_SUFFIX} with {k} component(s), the mean of target "
                             f"{name!r} (got {'none' if g is None else str(g['components']) + ' components'})")
        first = input_channels.index(str(g["name"]) if k == 1 else f"{g['name']}[0]")
        out += list(range(first, first + k))
    return out


def mean_field_of(data: Any) -> tuple[np.ndarray, list[dict[str, Any]], str, str]:
    """The mean field an open dataset made with ``--mean-field`` stores, ``(N, F_out)`` float64,
    with its target fields, its mesh checksum and its stored precision (what ``--mean-field-from``
    takes)."""
    meta = data.meta
    fields = [dict(f) for f in meta.get("inputs", []) if "mean_of" in f]
    if not fields or meta.get("kind") != "one-mesh":
        raise ValueError(f"{data.path}: Expected a dataset made with --mean-field (got "
                         f"{'a dataset of several meshes' if meta.get('kind') != 'one-mesh' else 'no mean field'})")
    targets = [{"name": f["mean_of"], "components": f["components"]} for f in fields]
    cols = target_offset_channels(data.input_channels, targets, fields)
    inputs, _ = data.sample_arrays(0)
    return (np.asarray(inputs[:, cols], dtype=np.float64), targets, str(meta["meshes"][0]["sha256"]),
            str(meta["dtype"]))


def add_mean_field(tmp: Path, meta: dict[str, Any], train: Sequence[int], dtype: np.dtype,
                   given: tuple[np.ndarray, list[dict[str, Any]], str, str] | None = None,
                   progress: Callable[[int], None] | None = None) -> None:
    """Append the mean field to every sample's inputs in the staged dataset ``tmp`` and redo the
    statistics (see the module docstring); ``meta`` is the dataset's metadata, updated in place.

    ``given``: :func:`mean_field_of` another dataset (``--mean-field-from``), else the mean of
    this dataset's training samples' targets. ``progress``: called with 1 after each sample.
    Priors on many meshes, or of the nearest cases: :func:`meshshard.data._prior.add_prior`."""
    if meta["kind"] != "one-mesh":
        raise ValueError(f"Expected every sample on one mesh for a mean field (got {len(meta['meshes'])} meshes); "
                         "--mean-field is for a sweep of cases on one mesh (--same-mesh checks it)")
    n, num = int(meta["meshes"][0]["num_nodes"]), int(meta["num_samples"])
    samples = tmp / "samples"

    def load(i: int, what: str) -> np.ndarray:
        return np.load(samples / f"{i:05d}" / f"{what}.npy", allow_pickle=False)

    if given is None:
        if not meta["target_channels"]:
            raise ValueError("Expected --targets for --mean-field (it is the mean of the training targets); for new "
                             "cases without targets, take a training dataset's with --mean-field-from DATA")
        targets = [dict(f) for f in meta["targets"]]
        total = np.zeros((n, len(meta["target_channels"])))
        for i in train:
            total += load(i, "targets")
        mean = (total / len(train)).astype(dtype).astype(np.float64)  # as stored, so offset and inputs agree
    else:
        mean, targets, sha, stored = given
        if np.dtype(stored) != dtype:
            raise ValueError(f"Expected --dtype {stored}, the precision of the --mean-field-from dataset (got "
                             f"{dtype.name}): its mean field is added back to the predictions as it is stored there")
        if sha != meta["meshes"][0]["sha256"] or len(mean) != n:
            raise ValueError(f"Expected the mesh of the --mean-field-from dataset ({len(mean)} nodes) in these cases "
                             f"(got {n} nodes, {'the same count but other' if len(mean) == n else 'other'} points or "
                             "cells): a mean field is node by node")
        if meta["targets"] and [(f["name"], f["components"]) for f in meta["targets"]] != \
                [(f["name"], f["components"]) for f in targets]:
            raise ValueError(f"Expected the targets of the --mean-field-from dataset ({channel_names(targets)}) "
                             f"(got {meta['target_channels']})")
    append_mean_fields(meta, targets)
    stored_mean = mean.astype(dtype)
    run_in = Running(len(meta["input_channels"]))
    run_out = Running(len(meta["target_channels"]))
    train_set = set(int(i) for i in train)
    has_targets = bool(meta["target_channels"])
    for i in range(num):
        inputs = np.concatenate([load(i, "inputs"), stored_mean], axis=1)
        save_npy(samples / f"{i:05d}" / "inputs.npy", inputs)
        if i in train_set:
            run_in.add(inputs.astype(np.float64))
            if has_targets:
                run_out.add(load(i, "targets").astype(np.float64) - mean)
        if progress is not None:
            progress(1)
    digest = hashlib.sha256(np.ascontiguousarray(stored_mean).tobytes()).hexdigest()
    record = ({"of": "training samples", "samples": len(train)} if given is None
              else {"of": "another dataset (--mean-field-from)"})
    finish_prior(meta, run_in, run_out, digest, record | {"method": "mean", "left_out": "none"})


def append_mean_fields(meta: dict[str, Any], targets: Sequence[Mapping[str, Any]], suffix: str = "") -> None:
    """Add the input fields ``<target>_mean`` (marked ``"mean_of"``) of the target fields
    ``targets`` to ``meta``'s inputs and input channels (a one-line refusal for a name taken);
    with ``suffix`` (:data:`POSITION_SUFFIX`), ``<target>_mean<suffix>`` marked ``"position_prior_of"``:
    the prior mapped by position, more inputs beside the offset (``--position-prior-inputs``)."""
    taken = set(meta["input_channels"]) | {str(f["name"]) for f in meta["inputs"]}
    key = "position_prior_of" if suffix else "mean_of"
    fields = [{"name": f"{f['name']}{MEAN_SUFFIX}{suffix}", "components": int(f["components"]), key: str(f["name"])}
              for f in targets]
    clash = [f["name"] for f in fields if f["name"] in taken]
    if clash:
        raise ValueError(f"Expected no input field named {', '.join(clash)}: --mean-field adds it")
    meta["inputs"] = [dict(f) for f in meta["inputs"]] + fields
    meta["input_channels"] = channel_names(meta["inputs"])


def finish_prior(meta: dict[str, Any], run_in: Running, run_out: Running, digest: str,
                 record: dict[str, Any]) -> None:
    """The statistics of the inputs with their prior and of the targets' difference from it (both
    over the training samples, in ``run_in`` / ``run_out``), the targets' offset, and the
    ``mean_field`` record (``digest`` its checksum) into ``meta``."""
    has_targets = bool(meta["target_channels"])
    offset = target_offset_channels(meta["input_channels"], meta["targets"], meta["inputs"]) if has_targets else None
    old = meta["normalisation"]
    norm = Normalisation(run_in.stats(meta["input_channels"]),
                         run_out.stats(meta["target_channels"]) if has_targets else
                         ChannelStats.from_dict(old["targets"], meta["target_channels"]),
                         ChannelStats.from_dict(old["edges"], meta["edge_channels"]),
                         tuple(offset) if offset is not None else None, digest if offset is not None else None)
    meta["normalisation"] = {k: v for k, v in norm.to_dict().items() if not k.endswith("_channels")}
    meta["mean_field"] = dict(record) | {"sha256": digest}
