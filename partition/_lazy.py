"""Names a package resolves on first use: the ``__getattr__`` and ``__dir__`` of a package whose
``__init__.py`` lists its public names in a table instead of importing every module, so that
importing the package costs nothing until a name is used (a training rank that only loads its
part never imports scipy, pymetis or meshio)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(namespace: dict[str, Any], table: Mapping[str, str],
               aliases: Mapping[str, tuple[str, str]] | None = None,
               moved: tuple[tuple[str, ...], str] | None = None
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``(__getattr__, __dir__)``, to assign in its ``__init__.py``.

    Args:
        namespace: The package's ``globals()``: a resolved name is kept there, so it is looked up
            once.
        table: Public name -> the module that defines it, relative to the package (``"._api"``).
        aliases: Public name -> ``(module, attribute)`` for a name its module calls otherwise.
        moved: ``(names, package)``: names that moved to another package; they resolve there, with a
            DeprecationWarning that names the new place.
    """
    package = namespace["__name__"]
    aliases = aliases or {}
    gone, home = moved or ((), "")

    def getattr_(name: str) -> Any:
        if name in gone:
            warnings.warn(f"{package}.{name} moved to {home}.{name}; import it from there (the old path goes in "
                          "the next release)", DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(home), name)
        module, attribute = aliases.get(name, (table.get(name), name))
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), attribute)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table) | set(aliases) | set(gone))

    return getattr_, dir_
