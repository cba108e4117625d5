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

``linear:K,bound=B`` bounds how far the fit may extrapolate. Its weights' absolute sum
``sum_c |w_c|`` is how much the fit can amplify an error of the cases (1 for an interpolation with
weights all positive). Outside the cases' range, and where they hardly span a direction, it
grows without limit: a training case at a corner of the parameter box, whose own shape is left out
of its prior, may get weights summing to 67 in absolute value and a prior off by 342% on the body
(``examples/shape_sweep``). There the fit is damped as ridge regression damps it,
``(Z^T Z + lambda I)^-1``, with the smallest ``lambda`` (found by bisection) at which the sum is
``B``. A fit already within the bound is unchanged, and a large ``lambda`` tends to the cases'
plain mean (sum 1), so ``B >= 1``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["linear_cases", "method_text", "nearest_cases", "parameter_scale", "parse_linear"]


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


def method_text(kind: str, k: int | None = None, bound: float | None = None) -> str:
    """A method as its flag spells it (``knn:4``, ``linear``, ``linear:12,bound=2.5``): what
    :func:`parse_linear` and the ``--mean-field`` / ``--method`` parsers read back."""
    text = kind if k is None else f"{kind}:{k}"
    return text if bound is None else f"{text},bound={bound:g}"


def parse_linear(rest: str, flag: str) -> tuple[int | None, float | None]:
    """What follows ``linear`` in ``flag`` (``--mean-field``, ``--method``): ``""``, ``":K"``, ``",bound=B"``
    or ``":K,bound=B"``, as ``(K or None, B or None)``; a one-line ``ValueError`` unless K >= 2 and B >= 1."""
    spec, _, extra = rest.partition(",")
    if spec and not spec.startswith(":"):
        spec = "?"
    k_text = spec[1:].strip()
    bound_text = extra.strip()[len("bound="):] if extra.strip().startswith("bound=") else None
    try:
        k = int(k_text) if k_text else None
        bound = float(bound_text) if bound_text is not None else None
    except ValueError:
        k, bound = 0, None
    if (spec and (k is None or k < 2)) or (extra and (bound is None or not bound >= 1.0 or bound == float("inf"))):
        raise ValueError(f"Expected {flag} linear, linear:K or linear:K,bound=B, with K a whole number >= 2 and "
                         f"B >= 1, the most the fit's weights may sum to in absolute value (got {'linear' + rest!r})")
    return k, bound


def linear_cases(values: np.ndarray, value: np.ndarray, scale: np.ndarray, allowed: np.ndarray | None = None,
                 k: int | None = None, bound: float | None = None) -> list[tuple[int, float]]:
    """The affine least-squares fit in parameter space at ``value`` ``(P,)``, as ``[(row, weight)]``
    over the rows of ``values`` ``(n, P)`` (those ``allowed``; with ``k``, the ``k`` nearest of them,
    as :func:`nearest_cases` picks them): the module docstring's weights, damped to ``bound`` when
    given. ``[]`` when no row is allowed."""
    z = np.asarray(values, dtype=np.float64) / scale
    zs = np.asarray(value, dtype=np.float64) / scale
    rows = np.arange(len(z)) if allowed is None else np.flatnonzero(allowed)
    if k is not None:
        rows = rows[np.argsort(np.linalg.norm(z[rows] - zs, axis=1), kind="stable")[:max(int(k), 1)]]
    if not len(rows):
        return []
    centre = z[rows].mean(axis=0)
    design = z[rows] - centre
    gram, offset = design.T @ design, zs - centre

    def weights(ridge: float) -> np.ndarray:
        if ridge == 0.0:
            return 1.0 / len(rows) + design @ (np.linalg.pinv(gram, rcond=1e-10, hermitian=True) @ offset)
        return 1.0 / len(rows) + design @ np.linalg.solve(gram + ridge * np.eye(len(gram)), offset)

    w = weights(0.0)
    if bound is not None and np.abs(w).sum() > bound:
        high = max(float(np.trace(gram)), 1.0)
        while np.abs(weights(high)).sum() > bound:  # the mean's weights sum to 1 <= bound: this ends
            high *= 16.0
        low = high * 1e-12
        while high > low * (1.0 + 1e-9):  # bisection in log lambda: the sum falls as the fit is damped
            mid = float(np.sqrt(low * high))
            low, high = (mid, high) if np.abs(weights(mid)).sum() > bound else (low, mid)
        w = weights(high)
    return [(int(i), float(v)) for i, v in zip(rows, w, strict=True)]
