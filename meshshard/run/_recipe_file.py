"""Recipes as files: a run's settings written as TOML and read back, checked.

``meshshard train --print-config`` writes the resolved :class:`~meshshard.run.TrainConfig` with
:func:`recipe_text`; ``meshshard train --config FILE`` reads one with :func:`read_recipe`; a run
folder keeps the recipe it ran with (``RUN/config.toml``, :func:`write_recipe`). The keys are the
config's field names (``latent_size``, ``message_passing_steps``, ``checkpoint_every``), one a
line, top-level only::

    # meshshard train: a recipe (keys: TrainConfig's fields)
    steps = 4000
    lr = 0.003
    latent_size = 32
    model_args = {width = 64, radius = [0.1, 0.2]}

Only what a config holds is written: strings, integers, floats (``inf`` and ``nan`` as TOML spells
them), booleans, lists of them and one level of inline table (``model_args``). Reading needs the
standard library's ``tomllib`` (Python 3.11) or the ``tomli`` package; without either,
:func:`read_recipe` says so in one line. Every refusal is one ``ValueError`` line naming the file
and, where there is one, the key.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from meshshard.partition import read_inside

__all__ = ["RECIPE_HEADER", "MAX_RECIPE_BYTES", "toml_text", "recipe_text", "write_recipe", "read_recipe",
           "parse_toml"]

#: The first line of a recipe meshshard writes (a run folder's ``config.toml`` is ours only with it).
RECIPE_HEADER = "# meshshard train: the resolved recipe (keys: TrainConfig's fields)"
#: The largest recipe file read.
MAX_RECIPE_BYTES = 1 << 20


def _toml_string(text: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return '"' + "".join(escapes.get(c, f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
                         for c in text) + '"'


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii() else _toml_string(key)


def _toml_value(value: Any, where: str, nested: bool = False) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")) if not math.isfinite(value) \
            else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, where, True) for v in value) + "]"
    if isinstance(value, Mapping) and not nested:
        return "{" + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v, where, True)}" for k, v in value.items()) + "}"
    raise ValueError(f"Expected {where} to be a string, number, boolean or a list of them "
                     f"(got {type(value).__name__}: {value!r}; TOML has no null)")


def toml_text(values: Mapping[str, Any], header: str = "") -> str:
    """``values`` as TOML, one ``key = value`` a line, under the comment lines of ``header``: a
    small writer for flat settings (scalars, lists of scalars, one level of inline table)."""
    lines = [f"# {line}".rstrip() if not line.startswith("#") else line for line in header.splitlines()]
    lines += [f"{_toml_key(k)} = {_toml_value(v, repr(k))}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def recipe_text(config: Any, leave_out: Iterable[str] = ()) -> str:
    """The recipe of ``config`` (a dataclass: :class:`~meshshard.run.TrainConfig`) as TOML: every
    field but ``leave_out``, in the class's order, under :data:`RECIPE_HEADER`."""
    skip = set(leave_out)
    values = {k: v for k, v in asdict(config).items() if k not in skip}
    return toml_text(values, RECIPE_HEADER + "\n# steps = -1 and warmup = -1 are auto; max_time is in seconds "
                     "(0: no budget)")


def write_recipe(path: str | os.PathLike[str], config: Any, leave_out: Iterable[str] = ()) -> None:
    """Write :func:`recipe_text` to ``path`` whole or not at all (a temporary file, renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(recipe_text(config, leave_out))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _loads(text: str) -> dict[str, Any]:
    try:
        import tomllib as toml
    except ImportError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ImportError:
            raise ValueError("reading a recipe needs Python 3.11 (tomllib) or the tomli package "
                             "(pip install tomli)") from None
    return toml.loads(text)


def parse_toml(data: bytes, label: object) -> dict[str, Any]:
    """The table of a TOML document; ``ValueError("LABEL: not TOML (...)")`` when it is not one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{label}: not TOML (not UTF-8 text: {err.reason} at byte {err.start})") from None
    try:
        return _loads(text)
    except ValueError as err:
        if type(err).__name__ != "TOMLDecodeError":
            raise ValueError(f"{label}: {err}") from None
        raise ValueError(f"{label}: not TOML ({err})") from None


#: A field's annotation -> (the Python types it takes, how an error names them).
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "str": ((str,), "a string"),
    "bool": ((bool,), "true or false"),
}


def _kind(annotation: Any) -> tuple[tuple[type, ...], str]:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    if name.startswith("dict"):
        return (dict, str), "a table of keyword arguments (or its JSON text)"
    return _KINDS.get(name, ((object,), "a value"))


def read_recipe(path: str | os.PathLike[str], config_class: Any,
                convert: Mapping[str, Callable[[Any], Any]] | None = None,
                other_names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings of the recipe file ``path``, checked against ``config_class``'s fields.

    ``path`` must be a regular file, not a link (it is read from its own folder, never through a
    link); every key must be a field of ``config_class`` and its value of the field's type (an
    integer is a number too). ``convert[key]`` first turns a value the field's type does not take
    into one it does (``max_time = "13m"``, ``warmup = "auto"``), raising ``ValueError`` if it cannot.
    ``other_names`` (a flag's name -> the field's: ``latent`` -> ``latent_size``) only words the
    refusal of such a key.

    Returns:
        ``{field name: value}``, only the keys the file holds.

    Raises:
        ValueError: one line naming the file (and the key): a link, a folder or a special file, not
            TOML, an unknown key, a value of the wrong type.
    """
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{path}: is a link; give the recipe file itself")
    table = parse_toml(read_inside(path.parent, path.name, max_bytes=MAX_RECIPE_BYTES), path)
    known = {f.name: f.type for f in fields(config_class)}
    convert = convert or {}
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            named = (other_names or {}).get(key.replace("-", "_"), key.replace("-", "_"))
            close = [named] if named in known else difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (the keys are {', '.join(known)})"
            raise ValueError(f"{path}: unknown key {key!r}{hint}")
        types, described = _kind(known[key])

        def fits(v: Any, types: tuple[type, ...] = types) -> bool:
            return isinstance(v, types) and (bool in types or not isinstance(v, bool))

        if key in convert and not fits(value):
            try:
                value = convert[key](value)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{path}: {key}: {err}") from None
        if not fits(value):
            raise ValueError(f"{path}: Expected {key!r} to be {described} (got {value!r}, "
                             f"{_TOML_NAMES.get(type(value).__name__, type(value).__name__)})")
        out[key] = float(value) if types == (int, float) else value
    return out


_TOML_NAMES = {"str": "a string", "int": "an integer", "float": "a float", "bool": "a boolean", "list": "an array",
               "dict": "a table", "datetime": "a date-time", "date": "a date", "time": "a time"}
