"""Declared sizes are checked before anything is allocated (issue 11, item 5).

Each case runs ``meshshard partition`` in a child process whose address space is capped at
3 GiB, so code that trusts a declared size fails there with a MemoryError instead of taking
the machine's memory; the test wants the one-line refusal instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# 83 bytes of bzip2 that expand to 64 MiB of b"0"; 16 streams back to back give 1 GiB.
_BZ2_64MIB = bytes.fromhex(
    "425a6839314159265359e8b7a60f015f8e0800c0000008200030804d4642a025a90a80973141592653592091"
    "488b00a275c800c00040000008200020a534198e35454426c54544278bb9229c284878ff024a00")

_RUN = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from contextlib import redirect_stderr
import io
from meshshard.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def _run_capped(cases: list[list[str]]) -> list[tuple[int, str]]:
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(r) for r in json.loads(done.stdout)]


@pytest.mark.timeout(120)
def test_declared_sizes_are_checked_before_allocating(mesh_file: Path, tmp_path: Path) -> None:
    header = tmp_path / "huge.graph"
    header.write_bytes(b"2000000000 1\n2\n1\n")
    elements = tmp_path / "huge.mesh"
    elements.write_bytes(b"2000000000\n1 2 3\n")
    bomb = tmp_path / "bomb.graph.bz2"
    bomb.write_bytes(_BZ2_64MIB * 16)
    out = str(tmp_path / "out")
    cases = [
        [str(mesh_file), "-k", "3000000000"],
        [str(header), "-k", "2"],
        [str(elements), "-k", "2", "--format", "metis-mesh"],
        [str(bomb), "-k", "2"],
    ]
    results = _run_capped([["partition", *c, "-o", out, "-q"] for c in cases])
    expected = [
        "Expected at most one part per node: --parts <= 600 (got 3000000000)",
        "the header declares 2000000000 vertex lines but the file has 3",
        "the header declares 2000000000 element lines but the file has 2",
        "decompresses to more than 67,108,864 bytes (100 times its 1,328 bytes, or 64 MiB)",
    ]
    for case, (code, err), message in zip(cases, results, expected):
        assert code == 2, (case, err)
        assert message in err and err.count("\n") == 1, (case, err)
    assert not Path(out).exists()


def test_the_expansion_cap_is_configurable(monkeypatch) -> None:
    from meshshard.partition._readers import decompress

    with pytest.raises(ValueError, match="decompresses to more than 67,108,864 bytes"):
        decompress(_BZ2_64MIB * 2, ".bz2")
    assert len(decompress(_BZ2_64MIB * 2, ".bz2", expansion=1e7)) == 2 << 26
    monkeypatch.setenv("MESHSHARD_MAX_EXPANSION", "1e7")
    assert len(decompress(_BZ2_64MIB * 2, ".bz2")) == 2 << 26
    monkeypatch.setenv("MESHSHARD_MAX_EXPANSION", "lots")
    with pytest.raises(ValueError, match="Expected MESHSHARD_MAX_EXPANSION to be a positive"):
        decompress(_BZ2_64MIB, ".bz2")
