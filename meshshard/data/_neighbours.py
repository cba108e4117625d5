"""The nearest training cases in parameter space, and their weights: what ``meshshard baseline
--method nearest|knn:K`` and ``meshshard dataset --mean-field knn:K`` are made of (numpy alone).

Distances are Euclidean between parameter vectors, each parameter divided by its standard
deviation over the training cases (:func:`parameter_scale`: 1 where it does not vary). The ``K``
nearest (:func:`nearest_cases`; a tie goes to the lower position) are weighted ``1 / d``,
normalised to sum to 1; cases at distance 0 (an exact parameter match) take it alone, equally
weighted; ``K = 1`` is the nearest case, weight 1.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nearest_cases", "parameter_scale"]


def parameter_scale(values: np.ndarray) -> np.ndarray:
    """``(P,)``: each parameter's standard deviation over the rows of ``values`` ``(n, P)``, 1
    where it is 0 (or where there are no rows)."""
    v = np.asarray(values, dtype=np.float64)
    std = v.std(0) if len(v) else np.ones(v.shape[1] if v.ndim == 2 else 0)
    return np.where(std > 0, std, 1.0)


def nearest_cases(values: np.ndarray, value: np.ndarray, k: int, scale: np.ndarray,
                  allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The ``k`` rows of ``values`` ``(n, P)`` nearest ``value`` ``(P,)`` in the scaled distance
    (among the rows ``allowed``, an ``(n,)`` bool mask, when given), as ``[(row, weight)]`` with
    the weights of the module docstring. ``[]`` when no row is allowed."""
    z = np.asarray(values, dtype=np.float64) / scale
    dist = np.linalg.norm(z - np.asarray(value, dtype=np.float64) / scale, axis=1)
    rows = np.arange(len(z)) if allowed is None else np.flatnonzero(allowed)
    order = rows[np.argsort(dist[rows], kind="stable")[:max(int(k), 1)]]
    exact = [int(i) for i in order if dist[i] == 0.0]
    if exact:
        return [(i, 1.0 / len(exact)) for i in exact]
    if len(order) <= 1:
        return [(int(i), 1.0) for i in order]
    w = 1.0 / dist[order]
    return [(int(i), float(v)) for i, v in zip(order, w / w.sum())]
