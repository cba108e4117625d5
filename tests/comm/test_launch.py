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
from pathlib import Path

import pytest

from tests._processes import local_ranks

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


def _never(*_: object) -> None:  # pragma: no cover - the launch is refused before any rank starts
    raise AssertionError("a rank started")


def test_local_ranks_are_capped_by_the_cores_with_an_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36, defect 8: ``selftest --ranks 100000`` started ranks without a cap."""
    from meshshard.comm import launch_local, max_local_ranks

    monkeypatch.delenv("MESHSHARD_MAX_LOCAL_RANKS", raising=False)
    cap = max_local_ranks()
    assert cap >= 8 and cap >= len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=rf"^Expected at most {cap} local ranks on this machine \(4 per core; "
                                         rf"MESHSHARD_MAX_LOCAL_RANKS sets another cap\) \(got 100000\)$"):
        launch_local(_never, 100000)
    monkeypatch.setenv("MESHSHARD_MAX_LOCAL_RANKS", "1")
    with pytest.raises(ValueError, match=r"^Expected at most 1 local ranks"):
        launch_local(_never, 2)
    monkeypatch.setenv("MESHSHARD_MAX_LOCAL_RANKS", "many")
    with pytest.raises(ValueError, match=r"^Expected MESHSHARD_MAX_LOCAL_RANKS to be a positive number of ranks"):
        launch_local(_never, 2)


_SLOW_LAUNCHER = """
import os, sys, time
if __name__ != "__main__":  # a rank imports this file first: it is still starting when the launcher dies
    time.sleep(4)

def forever(folder):
    open(os.path.join(folder, f"rank-{os.environ['RANK']}"), "w").close()
    time.sleep(600)

if __name__ == "__main__":
    from meshshard.comm import launch_local
    print("launching", flush=True)
    launch_local(forever, 2, sys.argv[1])
"""


def test_every_rank_dies_with_its_launcher_even_one_still_starting(tmp_path: Path) -> None:
    """Issue 36, defect 8: after the launcher was killed (SIGKILL), ranks kept running: those still
    starting had not yet asked for a parent-death signal. Each rank ends when its launcher is gone."""
    import signal
    import time

    script = tmp_path / "launcher.py"
    script.write_text(_SLOW_LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"MESHSHARD_BACKEND": "gloo"})
    try:
        assert proc.stdout.readline() == "launching\n"
        deadline = time.monotonic() + 60
        ranks: list[int] = []
        while len(ranks) < 2 and time.monotonic() < deadline:
            ranks = local_ranks(proc.pid)
            time.sleep(0.05)
        assert len(ranks) == 2, "the launcher did not start its ranks"
        proc.send_signal(signal.SIGKILL)  # while the ranks are still importing the launcher's file
        proc.wait()
        deadline = time.monotonic() + 90
        alive = ranks
        while alive and time.monotonic() < deadline:
            alive = [r for r in alive if _running(r)]
            time.sleep(0.2)
        for r in alive:
            os.kill(r, signal.SIGKILL)
        assert not alive, "ranks outlived their launcher"
        assert not list(tmp_path.glob("rank-*")), "a rank ran its work after its launcher died"
    finally:
        proc.kill()
        proc.wait()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_each_rank_takes_omp_num_threads_where_it_is_set_else_its_share_of_the_cores(monkeypatch) -> None:
    """Two runs side by side (an ensemble's members) give each rank one thread with OMP_NUM_THREADS=1;
    without it (or with a value that is no positive number) a rank takes its share of the cores."""
    from meshshard.comm._launch import rank_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [rank_threads(w) for w in (1, 2, 3, 16)] == [8, 4, 2, 1]
    for given, want in (("3", 3), ("1", 1), ("0", 4), ("-2", 4), ("many", 4), ("", 4)):
        monkeypatch.setenv("OMP_NUM_THREADS", given)
        assert rank_threads(2) == want, given
