"""The geometric engine of a distributed partition: Morton order by a parallel sample sort.

Each of the ``P`` processes holds the points of its block of global ids (``pos_block``, ids
``first .. first + n_block - 1``). The engine

1. finds the bounding box of the whole mesh (an all-reduce of the blocks' minima and maxima) and
   each point's Morton code on it (:func:`meshshard.partition._assign.morton_codes`, as one
   process computes them);
2. sorts the keys ``(code, global id)`` over the processes: each sorts its own, sends a regular
   sample of them to all (``samples_per_process`` each), the ``P - 1`` splitters are taken from the
   sorted sample, and each key goes to the process of its range (one ``all_to_all_v``);
3. cuts the sorted curve into ``K`` runs balanced by node count, exactly as
   :func:`meshshard.partition._assign.morton_parts` cuts it in one process (the part of the key at
   global sorted position ``i`` is the run holding ``i + 1/2``), so the assignment is the
   one-process ``--method morton`` assignment, bit for bit;
4. sends ``(global id, part)`` back to the block owner of the id (the rendezvous).

``K`` may be larger than ``P`` and need not be a multiple of it. Memory per process is
``O(N / P)`` (with regular sampling no process receives more than about ``2 N / P`` keys). Another
engine plugs in with the same contract: the part of each id of the block (PT-Scotch:
:mod:`meshshard.partition._dist_scotch`).
"""

from __future__ import annotations

import numpy as np

from ._assign import morton_codes, target_weights
from ._exchange import Exchange, route
from ._vtkhdf import block_owner

__all__ = ["ENGINES", "morton_assign", "sample_sort"]

#: Distributed partitioners (``--engine``): the part of each node of a process's block.
ENGINES = ("geometric", "ptscotch")
#: Keys each process contributes to the splitter sample.
SAMPLES_PER_PROCESS = 64


def _dest(codes: np.ndarray, ids: np.ndarray, split_codes: np.ndarray, split_ids: np.ndarray) -> np.ndarray:
    """For each key ``(code, id)``, the number of splitters ``<=`` it (lexicographic): its process.

    One merge of the keys and the splitters (a splitter sorts before an equal key).
    """
    n, s = len(codes), len(split_codes)
    all_codes = np.concatenate([split_codes, codes])
    all_ids = np.concatenate([split_ids, ids])
    is_key = np.concatenate([np.zeros(s, dtype=np.int8), np.ones(n, dtype=np.int8)])
    order = np.lexsort((is_key, all_ids, all_codes))
    splitters_before = np.cumsum(is_key[order] == 0)
    dest = np.empty(n, dtype=np.int64)
    keys = is_key[order] == 1
    dest[order[keys] - s] = splitters_before[keys]
    return dest


def sample_sort(ex: Exchange, codes: np.ndarray, ids: np.ndarray,
                samples_per_process: int = SAMPLES_PER_PROCESS) -> tuple[np.ndarray, np.ndarray, int]:
    """Sort the keys ``(codes, ids)`` over the processes (``ids`` distinct).

    Returns:
        This process's run of the globally sorted keys ``(codes, ids)`` and the global sorted position
        of its first key (the processes' runs follow one another in rank order).

    Shapes:
        codes: ``(n,)`` uint64. ids: ``(n,)`` int64. Returns ``(m,)``, ``(m,)`` and an int.
    """
    order = np.lexsort((ids, codes))
    codes, ids = codes[order], ids[order]
    if ex.size > 1:
        picks = (np.arange(samples_per_process) * len(codes)) // samples_per_process if len(codes) else []
        sample = [[int(codes[i]), int(ids[i])] for i in np.unique(np.asarray(picks, dtype=np.int64))]
        pooled = sorted(key for keys in ex.all_gather(sample) for key in keys)
        at = [(q * len(pooled)) // ex.size for q in range(1, ex.size)]
        split_codes = np.array([pooled[i][0] for i in at], dtype=np.uint64)
        split_ids = np.array([pooled[i][1] for i in at], dtype=np.int64)
        dest = _dest(codes, ids, split_codes, split_ids)
        codes, ids = route(ex, dest, codes, ids)
        order = np.lexsort((ids, codes))
        codes, ids = codes[order], ids[order]
    counts = ex.all_gather(len(codes))
    return codes, ids, int(sum(counts[:ex.rank]))


def morton_assign(ex: Exchange, pos_block: np.ndarray, first: int, num_nodes: int, num_parts: int) -> np.ndarray:
    """The part of each node of this process's block (see the module docstring): equal to
    ``morton_parts(pos, num_parts)[first:first + len(pos_block)]`` of one process holding ``pos``.

    Shapes:
        pos_block: ``(n_block, D)`` float64. Returns ``(n_block,)`` int64 in ``[0, num_parts)``.
    """
    dim = pos_block.shape[1]
    empty = len(pos_block) == 0
    lo = ex.all_reduce(np.full(dim, np.inf) if empty else pos_block.min(axis=0), "min")
    hi = ex.all_reduce(np.full(dim, -np.inf) if empty else pos_block.max(axis=0), "max")
    codes = morton_codes(pos_block, bounds=(lo, hi))
    ids = first + np.arange(len(pos_block), dtype=np.int64)
    codes, ids, offset = sample_sort(ex, codes, ids)
    # morton_parts with unit weights: the key at sorted position i holds the weight (i, i + 1],
    # its middle i + 1/2, and its part is the run of the target shares that holds the middle
    middle = (offset + np.arange(1, len(ids) + 1, dtype=np.int64)).astype(np.float64) - 0.5
    bounds = np.cumsum(target_weights(num_parts, None))[:-1] * float(num_nodes)
    parts = np.searchsorted(bounds, middle, side="right").astype(np.int64)
    back_ids, back_parts = route(ex, block_owner(ids, num_nodes, ex.size), ids, parts)
    out = np.empty(len(pos_block), dtype=np.int64)
    out[back_ids - first] = back_parts
    return out
