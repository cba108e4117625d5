"""``meshshard.data.linear_cases``: the affine least-squares fit in parameter space as weights of
the cases, checked against numpy's own least squares on a field affine in the parameters and on one
that is not, over the ``k`` nearest, with a parameter that does not vary, and with fewer cases than
parameters."""

from __future__ import annotations

import numpy as np

from meshshard.data import linear_cases, nearest_cases, parameter_scale


def _fit(values: np.ndarray, fields: np.ndarray, value: np.ndarray) -> np.ndarray:
    """numpy's least squares of ``fields`` ``(n, F)`` on ``[1, values]``, at ``value``: the minimum-norm solution."""
    coef = np.linalg.lstsq(np.c_[np.ones(len(values)), values], fields, rcond=None)[0]
    return np.r_[1.0, value] @ coef


def _apply(weights: list[tuple[int, float]], fields: np.ndarray) -> np.ndarray:
    return sum(w * fields[i] for i, w in weights)


def test_an_affine_field_is_reproduced_and_the_weights_are_numpys_fit() -> None:
    rng = np.random.default_rng(0)
    values = rng.random((9, 3)) * [1.0, 10.0, 0.1]  # parameters of very different spreads
    value = np.array([0.4, 6.0, 0.05])
    scale = parameter_scale(values)
    nodes = rng.random((50, 4))  # 50 nodes, a field per node: a(node) + b(node) . parameters
    affine = nodes[:, 0] + values @ nodes[:, 1:].T  # (9, 50)
    weights = linear_cases(values, value, scale)
    assert sorted(i for i, _ in weights) == list(range(9))
    assert abs(sum(w for _, w in weights) - 1) < 1e-12
    np.testing.assert_allclose(_apply(weights, affine), nodes[:, 0] + nodes[:, 1:] @ value, rtol=1e-10)
    curved = np.sin(3 * values[:, :1] + nodes[:, 0]) + values[:, 1:2] ** 2  # not affine: the fit, not the field
    np.testing.assert_allclose(_apply(weights, curved), _fit(values, curved, value), rtol=1e-9, atol=1e-12)


def test_the_k_nearest_alone_and_the_allowed_cases() -> None:
    rng = np.random.default_rng(1)
    values, fields = rng.random((12, 2)), rng.random((12, 5))
    value = np.array([0.5, 0.5])
    scale = parameter_scale(values)
    allowed = np.ones(12, bool)
    allowed[[0, 3]] = False
    weights = linear_cases(values, value, scale, allowed, k=6)
    near = [i for i, _ in nearest_cases(values, value, 6, scale, allowed)]
    assert sorted(i for i, _ in weights) == sorted(near) and not {0, 3} & set(near)
    np.testing.assert_allclose(_apply(weights, fields), _fit(values[near], fields[near], value), rtol=1e-9)
    assert linear_cases(values, value, scale, np.zeros(12, bool)) == []


def test_a_parameter_that_does_not_vary_drops_out_and_few_cases_give_the_minimum_norm_fit() -> None:
    values = np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]])  # the second parameter is 1 in every case
    fields = np.array([[1.0], [3.0], [5.0]])  # 1 + 2 a
    weights = linear_cases(values, np.array([1.5, 7.0]), parameter_scale(values))
    np.testing.assert_allclose(_apply(weights, fields), [4.0], rtol=1e-12)  # b = 7 unseen: no effect, no blow-up
    two = linear_cases(values[:2] * [1, 0] + [[0, 0], [0, 1]], np.array([0.5, 0.5]), np.ones(2))  # 2 cases, 3 unknowns
    assert abs(sum(w for _, w in two) - 1) < 1e-12
    np.testing.assert_allclose(_apply(two, fields[:2]), [2.0], rtol=1e-12)  # midway between them
