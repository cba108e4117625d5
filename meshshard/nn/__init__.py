"""Sharded neural-network layers: the same module runs on a whole graph and on a shard."""

from __future__ import annotations

from ._meshgraphnet import MLP, MeshGraphNet, ProcessorBlock

__all__ = ["MLP", "MeshGraphNet", "ProcessorBlock"]
