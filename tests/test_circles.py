"""No import circles in the library: the modules of every layer, with every import statement
(those inside functions too, since an import inside a function is how a circle is usually hidden),
form a graph without cycles.

``from package import name`` is an edge to the module ``package.name`` when that is a module, else
to the module that defines ``name`` in the package's lazy ``_LAZY`` table, else to the package's
``__init__``. Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.test_layers import ALL, _from_module, module_of

MODULES = {module_of(path): path for path in ALL}


@functools.cache
def lazy_table(package: str) -> dict[str, str]:
    """A package's ``_LAZY`` table (name -> absolute module), read without importing it."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
            table = ast.literal_eval(node.value)
            return {name: (package + module if module.startswith(".") else module) for name, module in table.items()}
    return {}


def _statements(tree: ast.AST):
    """Every import statement of ``tree``, those under ``if TYPE_CHECKING:`` left out."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (s for child in node.orelse for s in _statements(child))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _statements(node)


def targets(source: str, module: str, package: str) -> set[str]:
    """The library modules ``source`` (the module ``module`` in ``package``) imports."""
    found = set()
    for node in _statements(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            read = _from_module(node, package)
            names = []
            for alias in node.names:
                full = f"{read}.{alias.name}"
                names.append(full if full in MODULES else lazy_table(read).get(alias.name, read))
        for name in names:
            while name and name not in MODULES:  # meshshard.nn.x -> meshshard.nn
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        graph[module] = targets(path.read_text(), module, package) & set(modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle_hidden_in_a_function() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    src = "def f():\n    from ._safe_io import read_regular\n"
    assert targets(src, "meshshard.partition._json_io", "meshshard.partition") == {"meshshard.partition._safe_io"}
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._safe_io import x\n"
    assert targets(src, "meshshard.partition._json_io", "meshshard.partition") == set()
    src = "from meshshard.data import read_dataset_metadata\n"
    assert targets(src, "meshshard.run._x", "meshshard.run") == {"meshshard.data._dataset"}


def test_the_library_has_no_import_circles() -> None:
    found = cycles(import_graph(MODULES))
    assert not found, "import circles (break each by moving what both sides need into a module of its own): " + (
        "; ".join(" <-> ".join(c) for c in found))
