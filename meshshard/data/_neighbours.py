"""The nearest training cases in parameter space, and their weights: what ``meshshard baseline
--method nearest|knn:K|linear[:K]`` and ``meshshard dataset --mean-field knn:K|linear[:K]`` are
made of (numpy alone).

Distances are Euclidean between parameter vectors, each parameter divided by its standard
deviation over the training cases (:func:`parameter_scale`: 1 where it does not vary). The ``K``
nearest (:func:`nearest_cases`; a tie goes to the lower position) are weighted ``1 / d``,
normalised to sum to 1; cases at distance 0 (an exact parameter match) take it alone, equally
weighted; ``K = 1`` is the nearest case, weight 1.

:func:`linear_cases` (``linear``; ``linear:K``: over the ``K`` nearest only) is, at every node at
once, the least-squares fit of the cases' values by an affine function of the parameters,
evaluated at the sample's: ``y(v) = sum_c w_c y_c`` with ``w = 1/n + Z (Z^T Z)^+ (z - mean(z))``,
``Z`` the cases' scaled parameters less their mean. The design is the same at every node, so the
fit is a weighted sum of the cases (weights summing to 1, some negative), mapped between meshes as
the others are; a field affine in the parameters is reproduced exactly, and a parameter that does
not vary over the cases drops out (``(Z^T Z)^+`` is the pseudo-inverse: the minimum-norm fit where
there are fewer cases than parameters).
"""

from __future__ import annotations

import numpy as np

__all__ = ["linear_cases", "nearest_cases", "parameter_scale"]


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


def linear_cases(values: np.ndarray, value: np.ndarray, scale: np.ndarray, allowed: np.ndarray | None = None,
                 k: int | None = None) -> list[tuple[int, float]]:
    """The affine least-squares fit in parameter space at ``value`` ``(P,)``, as ``[(row, weight)]``
    over the rows of ``values`` ``(n, P)`` (those ``allowed``; with ``k``, the ``k`` nearest of them,
    as :func:`nearest_cases` picks them): the module docstring's weights. ``[]`` when no row is allowed."""
    z = np.asarray(values, dtype=np.float64) / scale
    zs = np.asarray(value, dtype=np.float64) / scale
    rows = np.arange(len(z)) if allowed is None else np.flatnonzero(allowed)
    if k is not None:
        rows = rows[np.argsort(np.linalg.norm(z[rows] - zs, axis=1), kind="stable")[:max(int(k), 1)]]
    if not len(rows):
        return []
    centre = z[rows].mean(axis=0)
    design = z[rows] - centre
    w = 1.0 / len(rows) + design @ (np.linalg.pinv(design.T @ design, rcond=1e-10, hermitian=True) @ (zs - centre))
    return [(int(i), float(v)) for i, v in zip(rows, w, strict=True)]
