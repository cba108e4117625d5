"""Words in messages: counts with their noun, and lists cut to their first few names.

Shared by every layer's errors and notes (standard library only), so that a message of one layer
reads like another's.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_LISTED", "listed", "plural"]


#: Names listed in a note or an error; the rest are counted (``... and 7 more``).
MAX_LISTED = 6


def listed(items: Sequence[str], total: int | None = None, limit: int = MAX_LISTED) -> str:
    """``a, b, c ... and 4 more``: the first ``limit`` of ``items`` (the first few of ``total``,
    default all of them), the rest counted."""
    total = len(items) if total is None else total
    shown = min(limit, len(items))
    return ", ".join(items[:shown]) + (f" ... and {total - shown} more" if total > shown else "")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 mesh``, ``2 meshes``: ``count`` and the noun in the right number (default: ``noun + "s"``)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"
