"""The classification of PyG's convolutions: every ``MessagePassing`` class of
``torch_geometric.nn.conv`` is exact on shards (an adapter of ``SUPPORTED`` or the multi-hop halo of
``MULTIHOP``) or refused with its reason (``REFUSED``), and ``docs/porting-pyg.md`` shows exactly that table.

Regenerate the doc's table after changing the classification:

    .venv/bin/python -m tests.meshshard.test_pyg_coverage
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from meshshard.nn import ShardConv
from meshshard.nn._multihop import MULTIHOP, REFUSED, coverage_table
from meshshard.nn._pyg import SUPPORTED

DOC = Path(__file__).resolve().parents[2] / "docs" / "porting-pyg.md"
START, END = "<!-- pyg-coverage:start -->", "<!-- pyg-coverage:end -->"


def _pyg_classes() -> dict[str, list[str]]:
    """Class name -> the names torch_geometric.nn.conv exports it under (aliases: ECConv, PointConv)."""
    import torch_geometric.nn.conv as conv
    from torch_geometric.nn import MessagePassing

    found: dict[str, list[str]] = {}
    for name in dir(conv):
        obj = getattr(conv, name)
        if inspect.isclass(obj) and issubclass(obj, MessagePassing) and obj is not MessagePassing:
            found.setdefault(obj.__name__, []).append(name)
    return found


def coverage_markdown() -> str:
    """The table between the doc's markers, generated from the classification in the code."""
    import torch_geometric

    classes = _pyg_classes()
    rows = coverage_table(SUPPORTED)
    exact = sum(1 for _, verdict, _ in rows if verdict == "exact")
    names = sum(len(v) for v in classes.values())
    lines = [
        f"PyG {torch_geometric.__version__}: {len(rows)} `MessagePassing` classes in `torch_geometric.nn.conv` "
        f"({names} names with the aliases), {exact} exact on shards "
        f"({exact - len(MULTIHOP)} by an adapter, {len(MULTIHOP)} on the multi-hop halo), {len(rows) - exact} refused.",
        "",
        "| class | on shards | how, or why not |",
        "|---|---|---|",
    ]
    for name, verdict, how in rows:
        aliases = [a for a in classes.get(name, []) if a != name]
        label = f"`{name}`" + (f" (also `{'`, `'.join(aliases)}`)" if aliases else "")
        lines.append(f"| {label} | {verdict} | {how} |")
    return "\n".join(lines)


def _doc_block() -> str:
    text = DOC.read_text()
    match = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert match, f"{DOC} has no {START} ... {END} block"
    return match.group(1)


def test_every_pyg_convolution_is_classified_once() -> None:
    pytest.importorskip("torch_geometric")
    classes = set(_pyg_classes())
    adapters, multihop, refused = set(SUPPORTED), set(MULTIHOP), set(REFUSED)
    assert not (adapters & multihop or adapters & refused or multihop & refused), "a class in two places"
    missing = classes - adapters - multihop - refused
    assert not missing, f"MessagePassing classes of torch_geometric.nn.conv missing from the table: {sorted(missing)}"
    stale = (adapters | multihop | refused) - classes
    assert not stale, f"classes in the table that torch_geometric.nn.conv does not have: {sorted(stale)}"


def test_the_doc_table_is_the_code_table() -> None:
    pytest.importorskip("torch_geometric")
    assert _doc_block() == coverage_markdown(), (
        "docs/porting-pyg.md's PyG table differs from the code: run .venv/bin/python -m tests.meshshard.test_pyg_coverage"
    )


def test_refused_classes_say_why() -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    # (DynamicEdgeConv and GravNetConv cannot be built here: they need pyg-lib)
    for layer in (pyg.SignedConv(3, 2, first_aggr=True), pyg.HypergraphConv(3, 2), pyg.PANConv(3, 2, 2),
                  pyg.SuperGATConv(3, 2), pyg.MeshCNNConv(3, 2)):
        name = type(layer).__name__
        with pytest.raises(TypeError, match=rf"ShardConv refuses {name}: {re.escape(REFUSED[name])}"):
            ShardConv(layer)


if __name__ == "__main__":
    text = DOC.read_text()
    block = re.compile(re.escape(START) + r"\n(.*?\n)?" + re.escape(END), re.S)
    DOC.write_text(block.sub(lambda _: START + "\n" + coverage_markdown() + "\n" + END, text, count=1))
    print(f"wrote the PyG coverage table into {DOC}")
