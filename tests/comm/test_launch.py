"""``fix_mmap_threshold``, which every rank ``launch_local`` starts calls first: glibc's mmap threshold
is fixed unless the user set one, and a bad setting is refused in one line.

Each threshold case runs in a fresh interpreter, whose allocator no earlier test has tuned. The
launcher's own behaviour (signals, a rank dying) is tested through ``meshshard train --nproc`` in
``tests/cli/test_launch.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_MMAP_PROBE = """
import ctypes, sys
libc = ctypes.CDLL(None)
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
from meshshard.comm import fix_mmap_threshold
fixed = fix_mmap_threshold() if sys.argv[1] == "fix" else False
libc.free(ctypes.c_void_p(libc.malloc(8 << 20)))  # glibc's dynamic threshold rises to 8 MiB
before = libc.mallinfo2().hblks
block = libc.malloc(2 << 20)
print(fixed, libc.mallinfo2().hblks - before)
"""


@pytest.mark.parametrize(("how", "env", "expected"), [
    ("fix", {}, "True 1"),  # a 2 MiB block after an 8 MiB free: still its own mapping, given back when freed
    ("leave", {}, "False 0"),  # glibc's own: from the heap
    ("fix", {"MALLOC_MMAP_THRESHOLD_": "4194304"}, "False 0"),  # the user's choice stands
    ("fix", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4194304"}, "False 0"),
    ("fix", {"MESHSHARD_MMAP_THRESHOLD": "0"}, "False 0"),  # glibc's dynamic threshold, asked for
    ("fix", {"MESHSHARD_MMAP_THRESHOLD": "4194304"}, "True 0"),  # fixed above the 2 MiB block
])
def test_a_rank_gets_a_fixed_mmap_threshold_unless_the_user_set_one(how: str, env: dict, expected: str) -> None:
    import ctypes

    try:
        ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError, TypeError):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    base = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES", "MESHSHARD_MMAP_THRESHOLD")}
    done = subprocess.run([sys.executable, "-c", _MMAP_PROBE, how], env=base | env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_a_bad_threshold_setting_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshshard.comm import fix_mmap_threshold

    for name in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MESHSHARD_MMAP_THRESHOLD", "1MiB")
    with pytest.raises(ValueError, match=r"Expected MESHSHARD_MMAP_THRESHOLD to be a number of bytes, 0 for glibc's own "
                                         r"threshold \(got '1MiB'\)"):
        fix_mmap_threshold()
