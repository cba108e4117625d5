"""The layer rules of DESIGN.md, and the rooms of the top layer.

- partition and comm never import each other nor the top layer (partition never torch); the
  dataset layer (``meshshard/data``, ``meshshard.data``) imports partition and no other layer, never
  torch, and only tasks, run and the commands import it (not the containers, ``nn`` or ``comm``);
- inside a layer, imports are relative (``from ._format import ...``), so a reader can follow them
  to the file next door; across layers they are absolute (``from meshshard.comm import ...``);
- across layers (and across the rooms of the top layer), imports go through public names: never
  another package's private module (``meshshard.comm._collectives``, ``meshshard.run._training``);
- the library never imports the commands (``meshshard/cli/`` and ``meshshard/__main__.py``);
- the rooms of the top layer, bottom up: the containers (the modules beside ``__init__.py``:
  ``_spec``, ``_tensor``, ``_graph``, ``_grid_tensor``) and ``nn``, then ``tasks``, then ``run``,
  then ``cli``; a room never imports one above it.

Checked statically, over every module of the four layers (every import statement, those inside
functions and under ``if TYPE_CHECKING:`` too, relative ones resolved), and at run time (importing
one layer in a fresh interpreter loads neither the other nor torch, for partition and data).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# folder -> (its import name, outside modules it must never import, with their submodules).
# Besides these, a lower layer imports nothing of meshshard but itself.
RULES = {
    "partition": ("meshshard.partition", ("torch",)),
    "comm": ("meshshard.comm", ()),
    "meshshard/data": ("meshshard.data", ("torch",)),
}

# lower layer -> the other layers it may import, by their public names (the dataset layer sits on
# the partition layer; partition and comm import no other).
ALLOWED = {"meshshard.data": ("meshshard.partition",)}

# The folders of the repository and the import names they are installed under (pyproject.toml's
# package-dir).
ROOTS = {"partition": "meshshard.partition", "comm": "meshshard.comm", "meshshard": "meshshard"}

# The commands: they sit on top of the library, which never imports them.
COMMANDS = ("meshshard.cli", "meshshard.__main__")

# room of the top layer -> the rooms above it, which it never imports.
ROOMS = {
    "containers": ("meshshard.data", "meshshard.run", "meshshard.tasks", "meshshard.cli"),
    "nn": ("meshshard.data", "meshshard.run", "meshshard.tasks", "meshshard.cli"),
    "tasks": ("meshshard.run", "meshshard.cli"),
    "run": ("meshshard.cli",),
}


def _is(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(source: str, package: str) -> list[str]:
    """Absolute names of every module imported by ``source``, a module inside ``package``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` statement in ``package`` reads."""
    if node.level:
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def violations(source: str, package: str, forbidden: tuple[str, ...], layer: str | None = None) -> list[str]:
    """What ``source`` (in ``package``, of the lower layer ``layer``, by default ``package``) imports
    of the top layer, the other lower layer or ``forbidden``."""
    layer = layer or package
    bad = set()
    for name in imports_of(source, package):
        own = any(_is(name, unit) for unit in (layer, *ALLOWED.get(layer, ())))
        top = name == "meshshard" or name.startswith("meshshard.")
        if (top and not own) or any(name == f or name.startswith(f + ".") for f in forbidden):
            bad.add(name)
    return sorted(bad)


def unit_of(name: str) -> str | None:
    """Which side of a layer boundary the module ``name`` is on: a lower layer, the commands, the
    library of the top layer; ``None`` outside meshshard."""
    for prefixes in (("meshshard.partition",), ("meshshard.comm",), ("meshshard.data",), COMMANDS):
        if any(_is(name, prefix) for prefix in prefixes):
            return prefixes[0]
    return "meshshard" if _is(name, "meshshard") else None


def style_violations(source: str, package: str, module: str | None = None) -> list[str]:
    """Imports in the wrong form in ``source`` (the module ``module``, by default ``package`` itself):
    ``absolute X`` for an absolute import from its own layer, ``relative X`` for a relative one that
    leaves it. The commands count as a layer of their own here: they import each other relatively and
    the library by its public names, as a user does."""
    own = unit_of(module or package)
    bad = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad |= {f"absolute {a.name}" for a in node.names if unit_of(a.name) == own}
        elif isinstance(node, ast.ImportFrom):
            read = _from_module(node, package)
            units = {unit_of(n) for n in [read] + [f"{read}.{a.name}" for a in node.names]}
            if node.level and units != {own}:
                bad.add(f"relative {read}")
            elif not node.level and own in units:
                bad.add(f"absolute {read}")
    return sorted(bad)


def _private_owner(name: str) -> str | None:
    """The package a private module or name belongs to (``meshshard.comm`` for
    ``meshshard.comm._collectives.X``); ``None`` when every part of ``name`` is public."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


def private_violations(source: str, package: str) -> list[str]:
    """Private modules and names of meshshard that ``source`` (in ``package``) imports from outside
    the package they belong to."""
    bad = set()
    for name in imports_of(source, package):
        owner = _private_owner(name)
        if _is(name, "meshshard") and owner is not None and not _is(package, owner):
            bad.add(name)
    return sorted(bad)


def command_violations(source: str, package: str) -> list[str]:
    """The commands, imported by ``source`` (a library module in ``package``)."""
    return sorted({name for name in imports_of(source, package) if any(_is(name, c) for c in COMMANDS)})


@functools.cache
def top_level_names() -> dict[str, str]:
    """``meshshard``'s lazy names (``train``, ``load_run``, ...) -> the module that defines each, read
    from its ``__init__.py`` without importing it."""
    for node in ast.parse((REPO / "meshshard" / "__init__.py").read_text()).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
                table = ast.literal_eval(node.value)
                return {name: importlib.util.resolve_name(module, "meshshard") for name, module in table.items()}
    raise AssertionError("meshshard/__init__.py has no _LAZY table")


def room_violations(source: str, package: str, above: tuple[str, ...],
                    lazy: dict[str, str] | None = None) -> list[str]:
    """The modules of the rooms ``above`` that ``source`` (in ``package``) imports, also through one of
    ``meshshard``'s lazy names (``from meshshard import train`` imports ``meshshard.run``)."""
    lazy = top_level_names() if lazy is None else lazy
    bad = set()
    for name in imports_of(source, package):
        parent, _, attribute = name.rpartition(".")
        for target in [name] + ([lazy[attribute]] if parent == "meshshard" and attribute in lazy else []):
            if any(_is(target, room) for room in above):
                bad.add(name if target == name else f"{name} ({target})")
    return sorted(bad)


def test_the_checker_catches_violations() -> None:
    src = "from meshshard.comm import all_to_all_v\nimport torch.distributed\nfrom ..nn import x\nfrom . import _format\n"
    assert violations(src, "meshshard.partition", RULES["partition"][1]) == [
        "meshshard.comm", "meshshard.comm.all_to_all_v", "meshshard.nn", "meshshard.nn.x", "torch.distributed",
    ]
    assert violations("from meshshard import ShardTensor\n", "meshshard.comm", ()) == ["meshshard", "meshshard.ShardTensor"]
    assert violations("from ..partition import load_partition\n", "meshshard.comm", RULES["comm"][1]) == [
        "meshshard.partition", "meshshard.partition.load_partition",
    ]
    # inside a layer relative, across layers absolute
    src = ("from meshshard.partition._format import read_metadata\nimport meshshard.partition._graph\n"
           "from meshshard.partition import plural\nfrom ._io import read_input\nfrom . import _text\nimport numpy\n")
    assert style_violations(src, "meshshard.partition") == [
        "absolute meshshard.partition", "absolute meshshard.partition._format", "absolute meshshard.partition._graph",
    ]
    src = ("from meshshard._tensor import ShardTensor\nfrom meshshard import ShardGraph\nfrom ..comm import HaloPlan\n"
           "from .. import partition\nfrom .._spec import ShardSpec\nfrom meshshard.comm import all_gather_v\n")
    assert style_violations(src, "meshshard.nn") == [
        "absolute meshshard", "absolute meshshard._tensor", "relative meshshard", "relative meshshard.comm",
    ]
    assert style_violations("from ..run import train\nfrom meshshard.cli._launch import x\n", "meshshard.cli") == [
        "absolute meshshard.cli._launch", "relative meshshard.run",
    ]
    assert style_violations("from meshshard.run import train\nfrom ._launch import x\n", "meshshard.cli") == []
    assert style_violations("from .cli import entry\n", "meshshard", "meshshard.__main__") == []
    # public names only, across layers and rooms
    src = ("from meshshard.comm._collectives import REPLICATED_RESULTS\nfrom meshshard.comm import _collectives\n"
           "from meshshard.run._training import TrainConfig\nfrom .._tensor import ShardTensor\n"
           "from ._reader import Normaliser\nfrom torch._C import _jit\n")
    assert private_violations(src, "meshshard.tasks") == [
        "meshshard.comm._collectives", "meshshard.comm._collectives.REPLICATED_RESULTS", "meshshard.run._training",
        "meshshard.run._training.TrainConfig",
    ]
    assert private_violations("from ..tasks._reader import Normaliser\nfrom . import _folder\n", "meshshard.run") == [
        "meshshard.tasks._reader", "meshshard.tasks._reader.Normaliser",
    ]
    assert private_violations("from meshshard.data._dataset import plural\n", "meshshard.cli") == [
        "meshshard.data._dataset", "meshshard.data._dataset.plural",
    ]
    src = "from meshshard import __version__\nfrom .._grid_tensor import _Place\n"
    assert private_violations(src, "meshshard.nn") == []
    # the library never imports the commands
    src = "from meshshard.cli import main\nfrom .. import cli\nimport meshshard.__main__\nfrom . import _folder\n"
    assert command_violations(src, "meshshard.run") == [
        "meshshard.__main__", "meshshard.cli", "meshshard.cli.main",
    ]
    # a room never imports one above it, not even through a lazy top-level name
    src = "from ..run import train\nfrom meshshard import load_run, ShardTensor\nfrom ..nn import MeshGraphNet\n"
    lazy = {"load_run": "meshshard.run", "ShardTensor": "meshshard._tensor"}
    assert room_violations(src, "meshshard.tasks", ROOMS["tasks"], lazy) == [
        "meshshard.load_run (meshshard.run)", "meshshard.run", "meshshard.run.train",
    ]
    assert room_violations("from meshshard.tasks import get_task\n", "meshshard.nn", ROOMS["nn"], lazy) == [
        "meshshard.tasks", "meshshard.tasks.get_task",
    ]
    assert room_violations("from ..tasks import get_task\n", "meshshard.run", ROOMS["run"], lazy) == []
    assert top_level_names()["train"] == "meshshard.run"


def _files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (REPO / folder).rglob("*.py"))


def package_of(path: Path) -> str:
    """The package a module file belongs to (``meshshard/run/_folder.py``: ``meshshard.run``;
    ``partition/_api.py``: ``meshshard.partition``), the base of its relative imports."""
    root, *folders = path.relative_to(REPO).parts[:-1]
    return ".".join([ROOTS[root], *folders])


def module_of(path: Path) -> str:
    package = package_of(path)
    return package if path.stem == "__init__" else f"{package}.{path.stem}"


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def is_command(path: Path) -> bool:
    return _name(path) == "meshshard/__main__.py" or _name(path).startswith("meshshard/cli/")


def room_of(path: Path) -> str | None:
    """The room of the top layer a module is in (``None``: a lower layer, the commands, or
    ``meshshard/__init__.py``, the front door)."""
    parts = path.relative_to(REPO).parts
    if parts[0] != "meshshard":
        return None
    if len(parts) == 2:
        return None if parts[1] in ("__init__.py", "__main__.py") else "containers"
    return parts[1] if parts[1] in ROOMS else None


def _params(files: list[Path], rule: str) -> list:
    return [pytest.param(path, id=_name(path)) for path in files]


@functools.cache
def _source(path: Path) -> str:
    return path.read_text()


ALL = _files(*ROOTS)
LIBRARY = [path for path in ALL if not is_command(path)]
IN_ROOMS = [path for path in ALL if room_of(path)]


def test_every_folder_is_checked() -> None:
    for folder in ROOTS:
        assert any(_name(path).startswith(folder + "/") for path in ALL), f"no modules found in {folder}/"
    assert {room_of(path) for path in IN_ROOMS} == set(ROOMS)
    assert package_of(REPO / "meshshard" / "run" / "_folder.py") == "meshshard.run"
    assert package_of(REPO / "partition" / "_api.py") == "meshshard.partition"
    assert package_of(REPO / "meshshard" / "__init__.py") == "meshshard"
    assert module_of(REPO / "meshshard" / "__main__.py") == "meshshard.__main__"


@pytest.mark.parametrize("folder", sorted(RULES))
def test_layer_imports_only_what_it_may(folder: str) -> None:
    package, forbidden = RULES[folder]
    files = _files(folder)
    assert files, f"no modules found in {folder}/"
    found = {}
    for path in files:
        bad = violations(_source(path), package_of(path), forbidden, package)
        if bad:
            found[_name(path)] = bad
    assert not found, f"{folder}/ imports across layers: {found}"


@pytest.mark.parametrize("path", _params(ALL, "relative"))
def test_imports_are_relative_inside_a_layer_and_absolute_across(path: Path) -> None:
    bad = style_violations(_source(path), package_of(path), module_of(path))
    assert not bad, (f"{_name(path)}: import the modules of its own layer relatively (from ._x import ...) and "
                     f"other layers by their absolute public names (from meshshard.comm import ...): {bad}")


@pytest.mark.parametrize("path", _params(ALL, "private"))
def test_other_packages_are_imported_by_their_public_names(path: Path) -> None:
    bad = private_violations(_source(path), package_of(path))
    assert not bad, f"{_name(path)} imports private modules or names of another package: {bad}"


@pytest.mark.parametrize("path", _params(LIBRARY, "commands"))
def test_the_library_never_imports_the_commands(path: Path) -> None:
    bad = command_violations(_source(path), package_of(path))
    assert not bad, f"{_name(path)} is library code but imports the commands: {bad}"


@pytest.mark.parametrize("path", _params(IN_ROOMS, "rooms"))
def test_a_room_never_imports_the_rooms_above_it(path: Path) -> None:
    room = room_of(path)
    assert room is not None
    bad = room_violations(_source(path), package_of(path), ROOMS[room])
    assert not bad, f"{_name(path)} ({room}) imports a room above it: {bad}"


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_partition_loads_neither_torch_nor_comm() -> None:
    loaded = _loaded_after("import meshshard.partition")
    assert "torch" not in loaded and "meshshard.comm" not in loaded


def test_importing_data_loads_no_torch_and_partition_not_data() -> None:
    loaded = _loaded_after("import meshshard.data; meshshard.data.open_dataset; meshshard.data.build_dataset")
    assert "torch" not in loaded and "meshshard.comm" not in loaded and "meshshard.nn" not in loaded
    loaded = _loaded_after("import meshshard.partition; meshshard.partition.build_graph")
    assert "meshshard.data" not in loaded


def test_importing_comm_does_not_load_partition() -> None:
    loaded = _loaded_after("import meshshard.comm")
    assert "meshshard.partition" not in loaded and "pymetis" not in loaded


def test_a_training_rank_loads_no_partitioning_libraries() -> None:
    # Every rank pays for what it imports (about 14 MB for scipy alone); loading a part, a dataset
    # sample and the layers needs numpy and torch only. Partitioning modules are imported on use.
    loaded = _loaded_after("import meshshard.nn, meshshard.comm, meshshard.run; "
                           "from meshshard import ShardGraph, ShardTensor, edge_features; "
                           "from meshshard.data import open_dataset\nfrom meshshard.partition import load_partition")
    assert not {"scipy", "pymetis", "meshio"} & loaded, sorted({"scipy", "pymetis", "meshio"} & loaded)
    from meshshard import partition

    assert partition.build_graph.__module__ == "meshshard.partition._api"  # still reachable, lazily


def test_layers_are_not_installed_under_bare_names() -> None:
    loaded = _loaded_after("import meshshard.partition, meshshard.comm")
    assert "partition" not in loaded and "comm" not in loaded
