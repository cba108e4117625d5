"""Fixtures for the command tests: ``mesh_file``, the partition tests' small triangle mesh written as
VTU (``tests/partition/conftest.py``), which the partition commands' tests run on."""

from __future__ import annotations

from tests.partition.conftest import mesh_file  # noqa: F401 - a fixture: pytest finds it by its name

__all__ = ["mesh_file"]
