"""SLURM host lists: ``"rack1-node[01-02]-ib,gpu[3,5-6]x[1-2]"`` -> the host names, in order.

The grammar (SLURM's ``hostlist`` syntax, as ``scontrol show hostnames`` expands it):

- a host list is one or more *items* separated by commas outside brackets;
- an item is a sequence of literal text and bracket groups, at least one of them; each bracket
  group holds comma-separated numbers (``7``) or ranges (``01-04``, inclusive), and the item
  stands for every combination of one value per group, the first group varying slowest
  (``cn[1-2]x[3-4]`` -> ``cn1x3 cn1x4 cn2x3 cn2x4``);
- a number is written with at least as many digits as the range's low bound (``[08-10]`` ->
  ``08 09 10``; ``[8-10]`` -> ``8 9 10``).

A malformed list (unbalanced or nested brackets, an empty item or group, a range whose high bound
is below its low bound, a non-digit in a group) is a one-line ``ValueError``.
:func:`first_slurm_host` asks ``scontrol show hostnames`` when it is on ``PATH``, and falls back to
this parser otherwise.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Iterator

__all__ = ["expand_hostlist", "first_slurm_host"]

MAX_HOSTS = 1_000_000  # expand_hostlist refuses lists longer than this (first_slurm_host never expands)
_SCONTROL_TIMEOUT_S = 10.0
_EXAMPLE = "'node[01-04,07],gpu3'"

Segment = str | list[tuple[int, int, int]]  # literal text, or a bracket group of (low, high, width)


def _fail(nodelist: str, reason: str) -> ValueError:
    return ValueError(f"Expected a SLURM host list such as {_EXAMPLE} (got {nodelist!r}: {reason})")


def _parse_group(text: str, nodelist: str) -> list[tuple[int, int, int]]:
    if not text:
        raise _fail(nodelist, "an empty bracket group")
    ranges = []
    for part in text.split(","):
        lo_text, dash, hi_text = part.partition("-")
        if not lo_text.isdigit() or (dash and not hi_text.isdigit()) or not lo_text.isascii() or not hi_text.isascii():
            raise _fail(nodelist, f"{part!r} in a bracket group is not a number or a range of numbers")
        lo, hi = int(lo_text), int(hi_text) if dash else int(lo_text)
        if hi < lo:
            raise _fail(nodelist, f"the range {part!r} runs backwards")
        ranges.append((lo, hi, len(lo_text)))
    return ranges


def _parse_item(item: str, nodelist: str) -> list[Segment]:
    if not item:
        raise _fail(nodelist, "an empty host name")
    segments: list[Segment] = []
    at = 0
    while at < len(item):
        if item[at] == "[":
            close = item.find("]", at)
            if close < 0:
                raise _fail(nodelist, "a '[' without its ']'")
            inner = item[at + 1 : close]
            if "[" in inner:
                raise _fail(nodelist, "nested brackets")
            segments.append(_parse_group(inner, nodelist))
            at = close + 1
        elif item[at] == "]":
            raise _fail(nodelist, "a ']' without its '['")
        else:
            stop = min((i for i in (item.find("[", at), item.find("]", at)) if i >= 0), default=len(item))
            segments.append(item[at:stop])
            at = stop
    return segments


def _split_items(nodelist: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    return items


def _parse(nodelist: object) -> list[list[Segment]]:
    if not isinstance(nodelist, str):
        raise TypeError(f"Expected a SLURM host list as a string (got {type(nodelist).__name__})")
    text = nodelist.strip()
    if not text:
        raise _fail(nodelist, "an empty list")
    if any(ch.isspace() for ch in text):
        raise _fail(nodelist, "white space inside the list")
    return [_parse_item(item, nodelist) for item in _split_items(text)]


def _values(group: list[tuple[int, int, int]]) -> Iterator[str]:
    for lo, hi, width in group:
        for v in range(lo, hi + 1):
            yield str(v).zfill(width)


def _hosts(items: list[list[Segment]]) -> Iterator[str]:
    for segments in items:
        choices = [[s] if isinstance(s, str) else list(_values(s)) for s in segments]
        for combo in itertools.product(*choices):  # the first group varies slowest
            yield "".join(combo)


def _count(items: list[list[Segment]]) -> int:
    total = 0
    for segments in items:
        n = 1
        for s in segments:
            if not isinstance(s, str):
                n *= sum(hi - lo + 1 for lo, hi, _ in s)
        total += n
    return total


def expand_hostlist(nodelist: str) -> list[str]:
    """Every host name of a SLURM host list, in order (the module docstring gives the grammar).

    Raises:
        ValueError: on a malformed list, or one of more than ``MAX_HOSTS`` hosts.
    """
    items = _parse(nodelist)
    total = _count(items)
    if total > MAX_HOSTS:
        raise _fail(nodelist, f"{total} hosts, more than {MAX_HOSTS}")
    return list(_hosts(items))


def _first_host(nodelist: str) -> str:
    items = _parse(nodelist)
    return "".join(s if isinstance(s, str) else str(s[0][0]).zfill(s[0][2]) for s in items[0])


def first_slurm_host(nodelist: str) -> str:
    """The first host name of a SLURM host list: ``"gpu[07-09,12],cpu3"`` -> ``"gpu07"``.

    Asks ``scontrol show hostnames`` when it is on ``PATH`` (SLURM's own expansion); otherwise, or
    when it fails, expands the list here (:func:`expand_hostlist`'s grammar; nothing is expanded
    beyond the first host).

    Raises:
        ValueError: on a malformed list.
    """
    scontrol = shutil.which("scontrol")
    if scontrol is not None and isinstance(nodelist, str) and nodelist.strip():
        try:
            done = subprocess.run(
                [scontrol, "show", "hostnames", nodelist.strip()],
                capture_output=True, text=True, timeout=_SCONTROL_TIMEOUT_S, check=False,
            )
            hosts = done.stdout.split()
            if done.returncode == 0 and hosts:
                return hosts[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return _first_host(nodelist)
