"""Sharded neural-network layers: the same module runs on a whole graph and on a shard."""

from __future__ import annotations

__all__: list[str] = []
