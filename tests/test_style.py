"""The style the code is held to: ``ruff check`` (configured in ``pyproject.toml``: line length
120 in the library, import order, pyflakes, pycodestyle, the library never importing the
commands), and a docstring on every public name and on the public methods of every public class
(``forward`` included), which ruff's pydocstyle cannot see in private modules."""

from __future__ import annotations

import importlib
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The public surfaces: every name in their ``__all__`` is documented.
PUBLIC = ("meshshard", "meshshard.nn", "meshshard.comm", "meshshard.partition", "meshshard.run", "meshshard.tasks")


def _ruff() -> list[str] | None:
    beside = Path(sys.executable).parent / "ruff"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ruff")
    return [found] if found else None


def test_ruff_finds_nothing() -> None:
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    done = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def undocumented(module_name: str) -> list[str]:
    """The public names of ``module_name`` without a docstring, and the public methods (and
    ``forward``) of its public classes, defined in meshshard, without one."""
    module = importlib.import_module(module_name)
    missing = []
    for name in getattr(module, "__all__", []):
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if not getattr(value, "__module__", "").startswith("meshshard"):
            continue
        if not (value.__doc__ or "").strip():
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(value):
            for attr, member in vars(value).items():
                if attr.startswith("_") or not inspect.isfunction(member):
                    continue
                if not (member.__doc__ or "").strip():
                    missing.append(f"{module_name}.{name}.{attr}")
    return missing


@pytest.mark.parametrize("module_name", PUBLIC)
def test_the_public_api_is_documented(module_name: str) -> None:
    assert undocumented(module_name) == []


def test_the_docstring_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "meshshard_probe.py").write_text(
        "__all__ = ['Layer', 'f']\n"
        "class Layer:\n    '''A layer.'''\n    def forward(self, x):\n        return x\n"
        "def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert undocumented("meshshard_probe") == ["meshshard_probe.Layer.forward", "meshshard_probe.f"]


def _markdown_files() -> list[Path]:
    """The pages a user reads: the README, docs/ and the examples' READMEs."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*/README.md"))]


def _cells(row: str) -> int:
    """The cells of a Markdown table row: its ``|`` outside code spans, not escaped, less the outer two."""
    count, code = 0, False
    for i, char in enumerate(row):
        if char == "`":
            code = not code
        elif char == "|" and not code and (i == 0 or row[i - 1] != "\\"):
            count += 1
    return count - 1


def test_markdown_tables_keep_their_columns() -> None:
    """Every row of every table in the README, docs/ and the examples' READMEs has as many cells as its
    header (a row that swallowed the next, a lost line break, would read as one wrong row), and a blank
    line ends each table (the text after it would be read as one more row)."""
    wrong = []
    for path in _markdown_files():
        header = None
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.startswith("|"):
                if header is not None and line.strip() and not line.startswith("<!--"):  # read as one more row
                    wrong.append(f"{path.relative_to(REPO)}:{number}: text right after a table, no blank line")
                header = None
                continue
            if header is None:
                header = _cells(line)
            elif _cells(line) != header:
                wrong.append(f"{path.relative_to(REPO)}:{number}: {_cells(line)} cells, its header {header}")
    assert not wrong, "\n".join(wrong)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks), repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            slug = _slug(line.lstrip("#"))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_markdown_links_reach_their_files_and_headings() -> None:
    """Every relative link of the README, docs/ and the examples' READMEs (inline or a reference) names
    a file of the repository (or of ``../shared``), and its ``#anchor`` a heading of that file."""
    wrong = []
    for path in _markdown_files():
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, flags=re.M)
        for target in targets:
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            goal = (path.parent / name).resolve() if name else path
            if goal.is_relative_to(REPO.parent / "shared"):  # ../shared sits beside a checkout, not in it
                continue
            if not goal.is_relative_to(REPO):
                wrong.append(f"{path.relative_to(REPO)}: {target}: outside the repository")
            elif not goal.exists():
                wrong.append(f"{path.relative_to(REPO)}: {target}: no such file")
            elif anchor and goal.suffix == ".md" and anchor not in _anchors(goal):
                wrong.append(f"{path.relative_to(REPO)}: {target}: no such heading")
    assert not wrong, "\n".join(wrong)
