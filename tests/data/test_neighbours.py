"""``meshshard.data.linear_cases``: the affine least-squares fit in parameter space as weights of
the cases, checked against numpy's own least squares on a field affine in the parameters and on one
that is not, over the ``k`` nearest, with a parameter that does not vary, and with fewer cases than
parameters; ``bound``: an extrapolation damped to the bound, a fit within it unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from meshshard.data import linear_cases, nearest_cases, parameter_scale, parse_linear, parse_prior


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


def test_a_bound_damps_an_extrapolation_to_it_and_leaves_an_interpolation_alone() -> None:
    rng = np.random.default_rng(2)
    values = rng.random((12, 3))
    scale = parameter_scale(values)
    inside = values.mean(axis=0)
    plain = linear_cases(values, inside, scale)
    assert sum(abs(w) for _, w in plain) < 2  # the centre of the cases: an interpolation
    assert linear_cases(values, inside, scale, bound=2.0) == plain  # within the bound: not one weight changed
    far = np.array([3.0, -2.0, 4.0])  # far outside the unit cube the cases fill
    wild = linear_cases(values, far, scale)
    assert sum(abs(w) for _, w in wild) > 10
    for bound in (1.0, 1.5, 3.0):
        damped = linear_cases(values, far, scale, bound=bound)
        assert [i for i, _ in damped] == [i for i, _ in wild]
        assert abs(sum(w for _, w in damped) - 1) < 1e-12  # still reproduces a constant
        assert bound - 1e-6 <= sum(abs(w) for _, w in damped) <= bound + 1e-12  # damped to the bound, not past it
    convex = linear_cases(values, far, scale, bound=1.0)  # the bound 1: no weight negative, a blend of the cases
    assert min(w for _, w in convex) > -1e-9
    # the damped fit is ridge regression's: numpy's least squares of the augmented system at the same lambda
    fields = rng.random((12, 4))
    z, zs = values / scale, far / scale
    damped = linear_cases(values, far, scale, bound=3.0)
    centre = z.mean(axis=0)
    design = z - centre
    def ridge(lam: float) -> np.ndarray:
        return 1 / 12 + design @ np.linalg.solve(design.T @ design + lam * np.eye(3), zs - centre)

    grid = np.geomspace(1e-6, 1e6, 200)
    first = next(g for g in grid if np.abs(ridge(g)).sum() <= 3.0)  # the first lambda of the grid within the bound
    lam = brentq(lambda g: np.abs(ridge(g)).sum() - 3.0, first / grid[1] * grid[0], first, xtol=1e-14, rtol=1e-12)
    w = ridge(lam)
    np.testing.assert_allclose(_apply(damped, fields), w @ fields, rtol=1e-6)


@pytest.mark.parametrize("text", ["linear:1", "linear:12,bound=0.5", "linear:12,bnd=2", "linearx",
                                  "linear:12,bound=inf", "linear:12,bound=nan", "linear:,bound=2"])
def test_the_linear_method_refuses_a_bad_k_or_bound_in_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="Expected --mean-field linear, linear:K or linear:K,bound=B") as err:
        parse_prior(text)
    assert "\n" not in str(err.value)
    assert parse_linear(":12,bound=2.5", "--method") == (12, 2.5)
    assert str(parse_prior("linear:12,bound=2.5")) == "linear:12,bound=2.5" and str(parse_prior("linear")) == "linear"
