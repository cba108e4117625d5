"""The suite's one tolerance policy for "on shards equals one process" (DESIGN.md's correctness rule).

    from tests._tolerance import assert_close

    assert_close(y.to_local(), y_ref[own], torch.float64, "forward")   # 1e-10 relative
    assert_close(g, p_ref.grad, torch.float32, "grad of w")             # 1e-5 relative

:func:`assert_close` is elementwise: ``|actual - expected| <= tol * |expected| + tol * scale``,
with ``tol = TOL[dtype]`` (1e-10 in float64, 1e-5 in float32) and ``scale = max(1, max |expected|)``:
relative to each element and to the tensor's size, since a gradient summed over thousands of terms
has elements that cancel to far below the size of those terms. ``scale=1.0`` makes the absolute
part plain ``tol`` (tensors of order one); ``tol=`` overrides the dtype's tolerance.

Two documented exceptions, each a function of its own:

- :func:`assert_close_float32_normwise`: in float32, a result that sums over so many terms of both
  signs that the float32 reference is itself about 1e-5 off is compared normwise, allowing 1e-5 or
  twice the float32 reference's own error against float64, whichever is larger; float64 stays
  elementwise.
- :func:`assert_max_relative`: the largest difference against the largest value, with no
  elementwise part (the grid layers, whose values are all of one size).
"""

from __future__ import annotations

import torch

__all__ = ["TOL", "assert_close", "assert_close_float32_normwise", "assert_max_relative", "assert_normwise_close"]

#: Relative tolerance by dtype: float64 and float32 as DESIGN.md states; the half types for the
#: collectives, which move them without arithmetic but accumulate in them.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def _same_shape(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, *,
                 tol: float | None = None, scale: float | None = None, cast: bool = False) -> None:
    """``actual`` equals ``expected`` to ``TOL[dtype]`` (or ``tol``), elementwise (see the module).

    An integer ``dtype`` asks for exact equality. ``scale`` (default ``max(1, max |expected|)``)
    sets the absolute part, ``tol * scale``. Shapes must match, and dtypes too unless ``cast``:
    then ``expected`` is rounded to ``actual``'s dtype first (a float64 reference for a float32 result).
    """
    _same_shape(actual, expected, what)
    if not dtype.is_floating_point:
        assert torch.equal(actual, expected), f"{what}: not equal"
        return
    tol = TOL[dtype] if tol is None else tol
    if scale is None:
        scale = max(1.0, float(expected.detach().abs().max())) if expected.numel() else 1.0
    if cast:
        expected = expected.to(actual.dtype)
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * scale, msg=lambda m: f"{what}: {m}")


def assert_normwise_close(actual: torch.Tensor, expected: torch.Tensor, what: str, *, truth: torch.Tensor | None = None,
                          tol: float = TOL[torch.float32]) -> None:
    """``|actual - expected| / |truth| <= max(tol, 2 * |expected - truth| / |truth|)`` in the 2-norm.

    ``truth`` is the float64 result that ``expected`` (a float32 reference) approximates; without
    it, ``expected`` itself, and the bound is ``tol``.
    """
    _same_shape(actual, expected, what)
    truth = expected.double() if truth is None else truth.double()
    norm = max(truth.norm().item(), 1e-30)
    own_error = (expected.double() - truth).norm().item() / norm
    bound = max(tol, 2 * own_error)
    error = (actual.double() - expected.double()).norm().item() / norm
    assert error <= bound, (f"{what}: normwise relative difference {error:.2e} > {bound:.2e} "
                            f"(the float32 reference's own error {own_error:.2e})")


def assert_close_float32_normwise(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str,
                                  truth: torch.Tensor | None = None) -> None:
    """float64: :func:`assert_close`; float32: :func:`assert_normwise_close` against ``truth``."""
    if dtype == torch.float64:
        assert_close(actual, expected, dtype, what)
    else:
        assert_normwise_close(actual, expected, what, truth=truth, tol=TOL[dtype])


def assert_max_relative(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    """``max |actual - expected| <= tol * max |expected|`` (nothing to compare when empty)."""
    _same_shape(actual, expected, what)
    if expected.numel() == 0:
        return
    scale = max(expected.abs().max().item(), 1e-30)
    err = (actual - expected).abs().max().item()
    if err > tol * scale:
        raise AssertionError(f"{what}: max error {err:.3e} (scale {scale:.3e})")
