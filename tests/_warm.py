"""A warm ``meshshard`` command for tests that run the documented commands by name (docs pages).

    with warm_meshshard() as bin_dir:     # a folder holding a ``meshshard`` to put first on PATH
        subprocess.run(["bash", "-c", "meshshard train ..."], env=os.environ | {"PATH": f"{bin_dir}:..."})

A command started on a 2-core machine spends seconds importing torch, torch._dynamo (every
optimizer loads it) and matplotlib before it does anything, and each ``--nproc`` rank again; a docs
page runs dozens of commands. Here one server process imports them once, and each ``meshshard``
the test runs is a small client (no site-packages) that hands the server its arguments, working
folder, environment and standard streams; the server forks a process that runs the command's own
entry point (``meshshard.cli.entry``) with them and returns its exit code. Its ``--nproc`` ranks are
forked from that process, which has run no torch work in parallel threads (the server sets one
thread) and has no GPU context (the suite runs on gloo), instead of from a fork server.

What runs is the command's code with the user's arguments, from a clean process each time; what
differs is only how the process starts. How ranks start for real (fork server, signals, a launcher
killed while ranks start) is tested by tests/cli/test_launch.py and tests/comm/test_launch.py with
``python -m meshshard``. SIGINT and SIGTERM sent to a client go on to its command.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["warm_meshshard"]

_CLIENT = """#!{python} -S
import json, os, signal, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket_path!r})
body = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [struct.pack("!I", len(body)) + body], [0, 1, 2])
f = s.makefile("r")
pid = int(f.readline())
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda n, _: os.kill(pid, n))
line = f.readline()
sys.exit(int(line) if line else 1)
"""


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("the client left")
        body += chunk
    return json.loads(body), fds


def _run_command(request: dict, fds: list[int]) -> None:
    """In a fresh fork: become the command the client asked for, and exit with its code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["meshshard", *request["argv"]]
    import multiprocessing

    import meshshard.comm._launch as launch

    launch._rank_context = lambda fn: multiprocessing.get_context("fork")  # see the module's docstring
    code = 1
    try:
        from meshshard.cli import entry

        entry()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _serve(path: str) -> None:
    import signal

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401 - every optimizer imports it, at its first use
    import torch.distributed  # noqa: F401

    import meshshard.cli
    import meshshard.data  # noqa: F401
    import meshshard.run  # noqa: F401

    torch.set_num_threads(1)
    meshshard.cli.build_parser()
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters below are reaped by the kernel
    while True:
        conn, _ = server.accept()
        if os.fork():  # the server: on to the next client
            conn.close()
            continue
        server.close()  # a waiter: start the command, tell the client its pid, then its exit code
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            request, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            os._exit(1)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run_command(request, fds)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(f"{pid}\n".encode())
        status = os.waitpid(pid, 0)[1]
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            conn.sendall(f"{code if code >= 0 else 128 - code}\n".encode())
        os._exit(0)


@contextlib.contextmanager
def warm_meshshard() -> Iterator[Path]:
    """A folder with a ``meshshard`` that runs each command in a fork of one warm server; the server
    lives as long as the ``with`` block."""
    with tempfile.TemporaryDirectory(prefix="meshshard-warm-") as tmp:
        path = os.path.join(tmp, "server.sock")
        repo = str(Path(__file__).resolve().parents[1])
        proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {repo!r}); "
                                 f"from tests._warm import _serve; _serve({path!r})"],
                                stdout=subprocess.PIPE, text=True, env=os.environ | {"MPLBACKEND": "Agg"})
        try:
            if proc.stdout.readline() != "ready\n":
                raise RuntimeError(f"the warm meshshard server did not start (exit code {proc.wait()})")
            client = Path(tmp) / "meshshard"
            client.write_text(_CLIENT.format(python=sys.executable, socket_path=path))
            client.chmod(0o755)
            yield Path(tmp)
        finally:
            proc.kill()
            proc.wait()
