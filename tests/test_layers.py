"""The layer rule of DESIGN.md: partition and comm never import each other nor the top layer.

Checked twice: statically (every import statement in the two folders, relative ones resolved) and
at run time (importing one layer in a fresh interpreter loads neither the other nor torch, for
partition).
"""

from __future__ import annotations

import ast
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
}


def imports_of(source: str, package: str) -> list[str]:
    """Absolute names of every module imported by ``source``, a module inside ``package``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def violations(source: str, package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = set()
    for name in imports_of(source, package):
        own = name == package or name.startswith(package + ".")
        top = name == "meshshard" or name.startswith("meshshard.")
        if (top and not own) or any(name == f or name.startswith(f + ".") for f in forbidden):
            bad.add(name)
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


@pytest.mark.parametrize("folder", sorted(RULES))
def test_layer_imports_only_what_it_may(folder: str) -> None:
    package, forbidden = RULES[folder]
    files = sorted((REPO / folder).glob("*.py"))
    assert files, f"no modules found in {folder}/"
    found = {}
    for path in files:
        bad = violations(path.read_text(), package, forbidden)
        if bad:
            found[path.name] = bad
    assert not found, f"{folder}/ imports across layers: {found}"


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_partition_loads_neither_torch_nor_comm() -> None:
    loaded = _loaded_after("import meshshard.partition")
    assert "torch" not in loaded and "meshshard.comm" not in loaded


def test_importing_comm_does_not_load_partition() -> None:
    loaded = _loaded_after("import meshshard.comm")
    assert "meshshard.partition" not in loaded and "pymetis" not in loaded


def test_a_training_rank_loads_no_partitioning_libraries() -> None:
    # Every rank pays for what it imports (about 14 MB for scipy alone); loading a part, a dataset
    # sample and the layers needs numpy and torch only. Partitioning modules are imported on use.
    loaded = _loaded_after("import meshshard.nn, meshshard.comm, meshshard.run; "
                           "from meshshard import ShardGraph, ShardTensor, edge_features; "
                           "from meshshard.partition import load_partition, open_dataset")
    assert not {"scipy", "pymetis", "meshio"} & loaded, sorted({"scipy", "pymetis", "meshio"} & loaded)
    from meshshard import partition

    assert partition.build_graph.__module__ == "meshshard.partition._api"  # still reachable, lazily


def test_layers_are_not_installed_under_bare_names() -> None:
    loaded = _loaded_after("import meshshard.partition, meshshard.comm")
    assert "partition" not in loaded and "comm" not in loaded
