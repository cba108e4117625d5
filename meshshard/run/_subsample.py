"""``--max-points N``: train a point model on a random subset of each sample's points.

Each time a sample is drawn for training, each of its ``n`` points is kept with probability
``N / n`` (all of them when ``n <= N``), so the model sees about ``N`` points of the sample. Whether
a point is kept is a pure function of ``(seed, epoch, sample, global id)`` (a 64-bit hash), so R
ranks keep, between them, exactly the points one process keeps, and the subset changes from epoch
to epoch. The model runs on the subset alone: for ``ball-attention`` the ball plan is built on the
subset's positions, for ``transolver`` the slice tokens sum over the subset. Validation and
prediction always use every point.

Only for point models (``--model ball-attention``, ``--model transolver``): a graph model's
message passing needs the mesh's edges, which a subset of the points does not have.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

__all__ = ["keep_points", "subsample_sample", "sample_epoch", "POINT_MODELS"]

#: The built-in models that take ``--max-points`` (they need no edges).
POINT_MODELS = ("ball-attention", "transolver")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: Any) -> Any:
    """SplitMix64's finaliser of ``z + golden``: a bijective 64-bit hash (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def keep_points(seed: int, epoch: int, sample: int, global_ids: Any, num_points: int, max_points: int) -> np.ndarray:
    """Which of the points ``global_ids`` (of a sample of ``num_points``) training keeps this epoch:
    each with probability ``max_points / num_points``, a pure function of its arguments.

    Shapes: global_ids ``(n,)`` int; result ``(n,)`` bool.
    """
    ids = np.asarray(global_ids, dtype=np.int64).astype(np.uint64)
    if max_points <= 0 or num_points <= max_points:
        return np.ones(len(ids), dtype=bool)
    key = _mix(_mix(_mix(np.uint64(seed & (2**64 - 1))) ^ np.uint64(epoch)) ^ np.uint64(sample))
    u = (_mix(key ^ ids) >> np.uint64(11)).astype(np.float64) * 2.0**-53  # uniform in [0, 1)
    return u < max_points / num_points


def sample_epoch(step: int, index: int, batch: int, data_parallel: int, data_rank: int, num_samples: int) -> int:
    """The epoch of the ``index``-th sample of ``step`` on data rank ``data_rank`` (the schedule of
    :func:`meshshard.run.sample_index`)."""
    return ((step * batch + index) * data_parallel + data_rank) // max(num_samples, 1)


def subsample_sample(b: Any, keep: np.ndarray) -> Any:
    """The :class:`~meshshard.tasks.LocalSample` ``b`` restricted to its owned points ``keep``: a
    ShardGraph without edges or halo whose ``pos`` holds the kept coordinates, the kept rows of ``x``
    and ``y``. Every rank of the sample's domain group must call it (one all-gather of the counts).
    When no rank keeps a point, every point is kept."""
    from meshshard.comm import all_gather_stacked

    from .._graph import ShardGraph
    from .._spec import ShardSpec
    from .._tensor import ShardTensor

    spec = b.graph.spec
    counts = all_gather_stacked(torch.tensor([int(keep.sum())], dtype=torch.int64), group=spec.group).view(-1)
    if int(counts.sum()) == 0:
        return b
    mask = torch.as_tensor(keep, device=b.x.to_local().device)
    sub = ShardSpec.from_counts(counts.tolist(), spec.group, owned_ids=spec.owned_ids[torch.as_tensor(keep)])
    pos = b.graph.pos[: spec.num_owned][mask]
    device = pos.device
    graph = ShardGraph(spec=sub, edge_index=torch.zeros(2, 0, dtype=torch.int64, device=device), num_owned_edges=0,
                       halo_hops=1, node_hops=torch.zeros(len(pos), dtype=torch.int64, device=device), pos=pos,
                       global_edge_ids=torch.zeros(0, dtype=torch.int64, device=device))
    return replace(b, graph=graph, x=ShardTensor.from_local(b.x.to_local()[mask], sub),
                   y=ShardTensor.from_local(b.y.to_local()[mask], sub), edge_attr=b.edge_attr[:0],
                   owned_ids=np.asarray(b.owned_ids)[keep])
