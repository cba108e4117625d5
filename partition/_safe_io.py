"""Safe file handling for the offline folders a user may receive (partitions, datasets).

The standard library only. Two concerns, one function each (reading what the folders hold,
checked and bounded, is :mod:`._readers`):

- **Replacing a folder** (``--force``): :func:`check_destination` decides whether ``out`` may be
  written (absent, an empty folder, or with ``force`` a folder that the caller's ``is_ours``
  accepts; never the current folder, one of its parents, or a folder holding an input), after
  recovering from an interrupted replace. It is the one rule of every command's output folder
  (a partition, a dataset, a dataset's partitions, a run, a prediction: :mod:`._kinds`); each
  passes its own ``is_ours`` and the words of its refusals (:class:`Refusals`); a run and a
  prediction, written in place, skip what only a folder replaced whole needs.
  :func:`write_folder` then fills a staging folder next to ``out`` and swaps it in: rename the
  old folder aside, rename the new one in, delete the old. A crash at any point leaves either
  the old or the new folder whole: before the first rename ``out`` is the old one, after the
  second it is the new one, and in between the old one is whole under its aside name, which the
  next run renames back (:func:`recover_interrupted`).
  Staging and aside folders are siblings of ``out`` named ``.NAME.meshshard-new-PID`` and
  ``.NAME.meshshard-old-PID``; the next run removes those of dead processes and says so.
- **One writer per folder**: :func:`folder_lock` holds an OS lock (``flock``) on
  ``.NAME.meshshard-lock`` beside the output folder ``NAME`` for the whole command, so a second
  command into the same folder is refused at once, naming the holder (pid, host, command, start
  time, written into the lock file). The OS releases the lock when its process dies, so a lock
  left by a killed process is simply taken over; the holder removes the file when it is done.
Every problem is a one-line ``ValueError``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ._json_io import dumps_json, loads_json, own_descriptor

__all__ = [
    "Refusals",
    "check_apart",
    "check_destination",
    "check_input_folders",
    "check_output_folder",
    "folder_lock",
    "interrupted_hint",
    "is_lock_file",
    "lock_path",
    "recover_interrupted",
    "write_folder",
]

T = TypeVar("T")


_NEW, _OLD = "meshshard-new", "meshshard-old"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<tag>meshshard-new|meshshard-old)-(?P<pid>\d+)$")


_LOCK_SUFFIX = ".meshshard-lock"
_LOCK = re.compile(r"^\.(?P<name>.+)\.meshshard-lock$")
#: The lock files this process holds (:func:`folder_lock`), by path, with how deeply each is nested.
_held: dict[str, int] = {}
_held_guard = threading.Lock()


def _crash_point(step: str) -> None:
    """Called between the steps of :func:`write_folder` (``"staged"``, ``"aside"``, ``"in"``).
    Does nothing; tests replace it to simulate a crash at that point."""


def _temp(out: Path, tag: str, pid: int) -> Path:
    return out.parent / f".{out.name}.{tag}-{pid}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def interrupted_hint(out: str | os.PathLike[str]) -> str:
    """For a missing ``out``: where an interrupted replace left the old folder (``""`` when
    nothing was left), to append to a "no such folder" error."""
    out = Path(out)
    if not out.parent.is_dir():
        return ""
    for entry in sorted(out.parent.iterdir()):
        m = _TEMP.match(entry.name)
        if m and m["name"] == out.name and m["tag"] == _OLD:
            return (f"; an interrupted --force left the old partition in {entry.name} (the next "
                    "meshshard partition into this folder restores it)")
    return ""


def recover_interrupted(out: str | os.PathLike[str]) -> list[str]:
    """Tidy what an interrupted :func:`write_folder` of ``out`` left; returns one note per action.

    For each staging or aside folder of ``out`` whose process is gone: when ``out`` is missing
    and an aside folder holds the old one, rename it back; remove every other such folder.
    """
    out = Path(out)
    if not out.parent.is_dir():
        return []
    notes = []
    leftovers = []
    for entry in out.parent.iterdir():
        m = _TEMP.match(entry.name)
        if m and m["name"] == out.name and entry.is_dir() and not entry.is_symlink():
            if _alive(int(m["pid"])):
                notes.append(f"{entry}: left alone (process {m['pid']} is still running)")
            else:
                leftovers.append((m["tag"], entry))
    for tag, entry in sorted(leftovers, key=lambda t: t[0] != _OLD):
        if tag == _OLD and not out.exists() and not out.is_symlink():
            entry.rename(out)
            notes.append(f"{out}: restored from {entry.name}, left by an interrupted --force")
        else:
            shutil.rmtree(entry)
            notes.append(f"{entry}: removed (left by an interrupted run)")
    return notes


@dataclass(frozen=True)
class Refusals:
    """The words of :func:`check_destination`'s refusals, one ``str.format`` template each (of
    ``{out}``, and ``{input}`` for ``holds_input``); ``not_empty`` may instead be a function of
    the folder that returns the whole message. The defaults are a partition folder's."""

    #: ``out`` is the current folder or one of its parents.
    current: str = ("{out}: is the current folder or one of its parents; refusing to write there "
                    "(give a new folder)")
    #: ``out`` is, or holds, the input ``{input}``.
    holds_input: str = "{out}: holds the input {input}; refusing to write there"
    #: ``out`` is a symbolic link (to a folder or not, or dangling).
    link: str = "{out}: is a symbolic link; refusing to replace it"
    #: ``out`` is a file, or anything else that is not a folder.
    not_folder: str = "{out}: exists and is not a folder"
    #: ``out`` holds something and ``force`` was not given.
    not_empty: str | Callable[[Path], str] = "{out}: exists and is not empty (pass --force to replace it)"


def check_destination(
    out: str | os.PathLike[str],
    *,
    force: bool,
    is_ours: Callable[[Path], None],
    inputs: Sequence[str | os.PathLike[str]] = (),
    in_place: bool = False,
    holds: Callable[[Path], bool] | None = None,
    ours_first: bool = False,
    refusals: Refusals | None = None,
    current_ok: bool | None = None,
) -> list[str]:
    """Raise a one-line ``ValueError`` unless ``out`` may be written; the one rule of every
    command's output folder, whose kind says only what is its own (``is_ours``) and in which words.

    In this order:

    1. ``out`` is never the current folder or one of its parents (a folder replaced whole is
       renamed aside, see :func:`staged_folder`; ``current_ok``, by default ``in_place``, allows
       it), nor a folder that is or holds one of ``inputs``.
    2. What an interrupted replace of ``out`` left is tidied or put back
       (:func:`recover_interrupted`; not ``in_place``, where nothing is set aside).
    3. ``out`` is never a link, nor a file.
    4. An absent ``out``, or one that holds nothing (``holds(out)`` false; by default, an empty
       folder), may be written.
    5. Else, with ``ours_first``, ``is_ours(out)`` is asked first (what is not ours is refused
       even without ``force``); without ``force``, ``out`` is refused (``refusals.not_empty``);
       with it, ``is_ours(out)`` must accept it: it raises ``ValueError`` saying why the folder is
       not one of ours.

    Args:
        in_place: ``out`` is written in place, its own files replaced one by one (a run, a
            prediction), not replaced whole by :func:`write_folder`.
        holds: Whether ``out`` holds something to replace (default: any entry).
        refusals: The words of each refusal (default: a partition folder's).
        current_ok: ``out`` may be the current folder or a parent of it (default: ``in_place``).

    Returns:
        The notes of :func:`recover_interrupted`, one per action (none ``in_place``).
    """
    out = Path(out)
    refusals = refusals or Refusals()
    where = out.resolve()
    cwd = Path.cwd().resolve()
    if not (in_place if current_ok is None else current_ok) and (where == cwd or where in cwd.parents):
        raise ValueError(refusals.current.format(out=out))
    for given in inputs:
        if Path(given).resolve().is_relative_to(where):
            raise ValueError(refusals.holds_input.format(out=out, input=given))
    notes = [] if in_place else recover_interrupted(out)
    if out.is_symlink():
        raise ValueError(refusals.link.format(out=out))
    if not out.exists():
        return notes
    if not out.is_dir():
        raise ValueError(refusals.not_folder.format(out=out))
    if not (holds(out) if holds is not None else any(out.iterdir())):
        return notes
    if ours_first:
        is_ours(out)
    if not force:
        words = refusals.not_empty
        raise ValueError(words(out) if callable(words) else words.format(out=out))
    if not ours_first:
        is_ours(out)
    return notes


def check_input_folders(*folders: tuple[str | os.PathLike[str], str]) -> None:
    """Raise ``ValueError("PATH: no such WHAT")`` for the first ``(PATH, WHAT)`` that is not a folder."""
    for path, what in folders:
        if not Path(path).is_dir():
            raise ValueError(f"{path}: no such {what}")


def check_apart(out: str | os.PathLike[str], *folders: tuple[str | os.PathLike[str], str]) -> None:
    """Raise ``ValueError`` when the output folder ``out`` is one of the ``(PATH, WHAT)`` input
    folders, inside one, or holds one: a command's files never go among its inputs (where
    ``--force`` would then be asked to clear them, and a later command would find files that are
    not its own), nor its inputs among its files."""
    where = Path(out).resolve()
    for path, what in folders:
        inside = Path(path).resolve()
        if where == inside or inside in where.parents or where in inside.parents:
            got = ("that folder" if where == inside else "a folder inside it" if inside in where.parents
                   else "a folder that holds it")
            raise ValueError(f"{out}: Expected an output folder apart from the {what} {path} (got {got})")


def check_output_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``; an output folder may be missing, but one that exists must be a
    folder, not a link (else ``ValueError("PATH: exists and is not a folder")``)."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or path.is_symlink()):
        raise ValueError(f"{path}: exists and is not a folder")
    return path


@contextmanager
def staged_folder(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging folder next to ``out`` to fill; then replace ``out`` with it, atomically.

    An existing ``out`` is renamed aside, the staging folder renamed to ``out``, and the old folder
    deleted last, so a crash leaves the old folder or the new one whole (what a killed process
    set aside, :func:`recover_interrupted` puts back). Call :func:`check_destination` first: this
    replaces whatever is at ``out``. On an exception in the block every temporary folder is
    removed and an old ``out`` is put back.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging, aside = _temp(out, _NEW, os.getpid()), _temp(out, _OLD, os.getpid())
    for leftover in (staging, aside):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
    staging.mkdir()
    moved = False
    try:
        yield staging
        _crash_point("staged")
        if out.exists() or out.is_symlink():
            os.rename(out, aside)
            moved = True
        _crash_point("aside")
        os.rename(staging, out)
        _crash_point("in")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if moved and not out.exists():
            os.rename(aside, out)
        raise
    if moved:
        shutil.rmtree(aside)


def write_folder(out: str | os.PathLike[str], fill: Callable[[Path], T]) -> T:
    """Create or replace the folder ``out`` with what ``fill(staging)`` writes, atomically
    (:func:`staged_folder`).

    Returns:
        What ``fill`` returned.
    """
    with staged_folder(out) as staging:
        return fill(staging)


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock file of the output folder ``out``: ``.NAME.meshshard-lock`` in its parent (resolved,
    so that every spelling of one folder names one lock). Beside the folder, not in it: a folder
    replaced whole (:func:`staged_folder`) is renamed, and a missing one has nowhere to hold it."""
    where = Path(os.path.abspath(out))
    if not where.name:
        raise ValueError(f"{out}: Expected a folder with a name to write (got the root of the file system)")
    return where.parent.resolve() / f".{where.name}{_LOCK_SUFFIX}"


def is_lock_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a lock file of :func:`folder_lock` that no live process holds (one a
    killed process left): such a file counts as ours wherever a folder's own files are listed, and
    ``--force`` may remove it with them. A lock held now is not: its command is still writing."""
    path = Path(path)
    if not _LOCK.match(path.name) or path.is_symlink() or not path.is_file():
        return False
    if str(path.parent.resolve() / path.name) in _held:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # also lets go of the shared lock just taken
    return True


def _command_line() -> str:
    """This process's command line, as a user would type it (``meshshard train ...``)."""
    first = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if first == "__main__.py":  # python -m meshshard
        first = Path(sys.argv[0]).parent.name
    return shlex.join([first, *sys.argv[1:]])


def _holder(fd: int, wait: float = 2.0) -> str:
    """Who holds a lock, from what the holder wrote into it. A holder writes just after it takes
    the lock, and the file may still hold a killed holder's words: so what names a process that
    is gone from this host, or nothing readable, is read again for up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            info = loads_json(os.pread(fd, 1 << 16, 0) or b"null", "lock")
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["started"])))
            said = f"pid {int(info['pid'])} on {info['host']}, started {when}: {info['command']}"
            if info["host"] != socket.gethostname() or _alive(int(info["pid"])):
                return said
        except (OSError, ValueError, TypeError, KeyError):
            pass
        if time.monotonic() > deadline:  # nothing readable, or the words of a process that is gone
            return "a process that has not yet written who it is"
        time.sleep(0.05)


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; return those made, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        made.append(path)
    return made


def _remove_folders(made: Sequence[Path]) -> None:
    """Remove the folders :func:`_make_folders` made, innermost first, where they are still empty."""
    for path in reversed(made):
        try:
            path.rmdir()
        except OSError:
            return


def _take(out: Path, path: Path, command: str) -> tuple[int, list[Path]]:
    """Open and lock ``path`` (exclusive, not waiting), write who holds it; ``ValueError`` when
    another process holds it. Returns the descriptor and the folders made for it."""
    made: list[Path] = []
    for _ in range(100):
        made += _make_folders(path.parent)
        try:  # never a hard link to a user's file, a link, a folder or a FIFO in its place (a one-line ValueError)
            fd = own_descriptor(path, os.O_RDWR, what="lock file")
        except ValueError:
            _remove_folders(made)
            raise
        except FileNotFoundError:  # its folder was removed meanwhile by a holder letting go: again
            continue
        except OSError as err:  # the file system's refusal (its parent is a file, no permission): an OSError still
            _remove_folders(made)
            raise OSError(f"{out}: cannot make its lock file {path} ({err.strerror})") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            _remove_folders(made)
            raise ValueError(f"{out}: is being written by another meshshard command ({holder}); wait for it to "
                             f"end, or pick another folder (the lock is {path.name} beside it)") from None
        try:  # a holder letting go removes the file: what we locked must still be the file at path
            now, ours = os.stat(path, follow_symlinks=False), os.fstat(fd)
            same = (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino)
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (dumps_json(info) + "\n").encode(), 0)
        return fd, made
    raise ValueError(f"{out}: could not take its lock file {path} (it kept changing)")


@contextmanager
def folder_lock(out: str | os.PathLike[str], *, command: str | None = None) -> Iterator[Path]:
    """Hold the one-writer lock of the output folder ``out`` for the ``with`` block.

    An exclusive ``flock`` on :func:`lock_path` (``.NAME.meshshard-lock`` beside ``out``, made
    with its missing parent folders), taken without waiting: when another process holds it, a
    one-line ``ValueError`` names the holder (pid, host, command and start time, which the holder
    writes into the file); an ``OSError`` when the lock file cannot be made (its folder is a file,
    say). The OS lets go of a dead process's lock, so a lock a killed command left
    is taken over, its words written over. On leaving, the file and the folders made for it are
    removed. Nested use in one process (a command, then the library function it calls) holds the
    one lock. Processes the holder starts do not inherit it; they must not take it themselves.

    Args:
        command: What the holder is, for a refused command's message (default: this process's
            command line).

    Yields:
        The lock file's path.
    """
    path = lock_path(out)
    key = str(path)
    with _held_guard:
        nested = key in _held
        if nested:
            _held[key] += 1
    if nested:
        try:
            yield path
        finally:
            with _held_guard:
                _held[key] -= 1
        return
    fd, made = _take(Path(out), path, command if command is not None else _command_line())
    with _held_guard:
        _held[key] = 1
    try:
        yield path
    finally:
        with _held_guard:
            del _held[key]
        with contextlib.suppress(OSError):
            os.unlink(path)  # before letting go: a process that opened it meanwhile sees it gone, and retries
        os.close(fd)
        _remove_folders(made)
