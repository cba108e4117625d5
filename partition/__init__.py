"""Offline partitioning of meshes, graphs and point clouds (numpy, scipy, pymetis; no torch)."""

from __future__ import annotations

__all__: list[str] = []
