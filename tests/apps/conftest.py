"""Fixtures of the application tests (docs pages, examples, benchmarks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._warm import warm_meshshard


@pytest.fixture(scope="session")
def warm_bin() -> Iterator[Path]:
    """A folder with a warm ``meshshard`` (:mod:`tests._warm`) to put first on PATH, one server per
    test process for the whole session: the documented commands run without importing torch anew."""
    with warm_meshshard() as folder:
        yield folder
