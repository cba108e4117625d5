"""A warm ``meshshard`` command for tests that run many commands (docs pages, examples, command tests).

    subprocess.run([*warm_command(), "train", ...])   # or put its folder first on PATH

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

:func:`warm_python` is the same for ``python SCRIPT``, as the docs pages' Python blocks run: the
script runs as ``__main__`` in such a fork, with the same imports already made.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["warm_command", "warm_python"]

_CLIENT = """#!{python} -S
import json, os, signal, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket_path!r})
body = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "python": {python_mode!r}}}).encode()
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
    sys.argv = [*request["argv"]] if request.get("python") else ["meshshard", *request["argv"]]
    import meshshard.comm._launch as launch

    launch.START_METHOD = "fork"  # see the module's docstring
    code = 1
    try:
        if request.get("python"):  # python SCRIPT ARGS: the script as __main__, its folder first on sys.path
            import runpy

            sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
            runpy.run_path(sys.argv[0], run_name="__main__")
        else:
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401 - every optimizer imports it, at its first use
    import torch.distributed  # noqa: F401
    import torch_geometric.nn  # noqa: F401 - a model of one's own is often built on it

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
        ended = os.pidfd_open(pid)
        while ended not in select.select([ended, conn], [], [])[0]:
            if not conn.recv(1):  # the client was killed (a test's timeout): so is its command
                os.kill(pid, signal.SIGKILL)
                break
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        with contextlib.suppress(OSError):
            conn.sendall(f"{code if code >= 0 else 128 - code}\n".encode())
        os._exit(0)


_started: list = []  # [(server process, its folder)] of this process, at most one


def warm_command() -> list[str]:
    """The argv prefix of a warm ``meshshard`` (``[".../meshshard"]``), its server started at the first
    call in this process and stopped when the process exits."""
    if not _started:
        folder = tempfile.mkdtemp(prefix="meshshard-warm-")
        path = os.path.join(folder, "server.sock")
        repo = str(Path(__file__).resolve().parents[1])
        proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {repo!r}); "
                                 f"from tests._warm import _serve; _serve({path!r})"],
                                stdout=subprocess.PIPE, text=True, env=os.environ | {"MPLBACKEND": "Agg"})
        if proc.stdout.readline() != "ready\n":
            raise RuntimeError(f"the warm meshshard server did not start (exit code {proc.wait()})")
        for name, python_mode in (("meshshard", False), ("warm-python", True)):  # not "python": the folder goes on PATH
            client = Path(folder) / name
            client.write_text(_CLIENT.format(python=sys.executable, socket_path=path, python_mode=python_mode))
            client.chmod(0o755)
        _started.append((proc, folder))
        atexit.register(_stop)
    return [str(Path(_started[0][1]) / "meshshard")]


def warm_python() -> list[str]:
    """The argv prefix of a warm ``python`` that runs a script file (``[".../warm-python"]``, then
    ``SCRIPT ARGS``): the script runs as ``__main__`` in a fork of the same server, its folder first
    on ``sys.path``, with torch, meshshard and matplotlib (Agg) already imported."""
    return [str(Path(warm_command()[0]).parent / "warm-python")]


def _stop() -> None:
    for proc, folder in _started:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
