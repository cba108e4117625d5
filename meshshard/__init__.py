"""meshshard: domain-parallel graph neural networks on meshes and point clouds.

One sample (a mesh or a point cloud) is split across ranks: each rank holds its own nodes,
a halo of ghost nodes and the edges that end at its nodes. Three layers, each importable on
its own:

- :mod:`meshshard.partition`: offline partitioning and the on-disk format (numpy only, no torch).
- :mod:`meshshard.comm`: process groups and differentiable variable-size collectives (torch).
- :mod:`meshshard`: sharded tensors and layers built on both (:mod:`meshshard.nn`), the workloads
  (:mod:`meshshard.tasks`) and the run (:mod:`meshshard.run`: train, predict, load a trained model).
  The ``meshshard`` command (:mod:`meshshard.cli`) is built on these; the library never imports it.

The attributes of this top-level package are resolved lazily (PEP 562), so that
``import meshshard.partition`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it: this package's own modules relative to it (``._tensor`` is
# ``_tensor.py`` beside this file), a lower layer by its absolute name. The package's rooms: the
# containers (``_spec``, ``_tensor``, ``_graph``, ``_grid_tensor``), the layers (``nn``), the tasks
# (``tasks``), the run (``run``), all library; the commands (``cli``) sit on top and nothing here
# imports them.
_LAZY: dict[str, str] = {
    "ShardSpec": "._spec",
    "ShardTensor": "._tensor",
    "register_rowwise": "._tensor",
    "ShardGraph": "._graph",
    "edge_features": "._graph",
    "GridTensor": "._grid_tensor",
    "GridLayout": "._grid_tensor",
    "grid_layout": "._grid_tensor",
    "load_checkpoint": ".run",
    "CheckpointError": ".run",
    "load_run": ".run",
    "TrainedRun": ".run",
    "TransientRun": ".run",
    "TrainConfig": ".run",
    "train": ".run",
    "check_training": ".run",
    "PredictConfig": ".run",
    "predict": ".run",
    "ModelRecipe": ".run",
    "check_model_exact": ".run",
    "launch_local": "meshshard.comm",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'meshshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
