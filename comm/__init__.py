"""Process groups and differentiable variable-size collectives (torch, torch.distributed)."""

from __future__ import annotations

__all__: list[str] = []
