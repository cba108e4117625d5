"""Fixtures several run test files share (each built once per pytest worker)."""

from __future__ import annotations

import pytest

from tests.meshshard.run._cases import walls_on_grid


@pytest.fixture(scope="session")
def walls_case(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """:func:`walls_on_grid`: a trained run on a grid with the boundaries bottom and left,
    partitioned into 1, 2, 3 and 4 (test_near.py, test_boundaries.py)."""
    return walls_on_grid(tmp_path_factory.mktemp("walls"))
