"""One writer per run folder: ``RUN/.flowgrpo.lock``.

A run takes the lock before it writes or deletes anything in its folder (``--overwrite``'s
clearing and the removal of unfinished checkpoint writes included), so a second
``flowgrpo train`` into the same folder, or an ablation re-run while one of its cells still
runs, is refused with the owner named instead of both writing.

The lock is an exclusive ``flock`` on the file, which the kernel drops when its process ends
however it ends (SIGKILL included); the file records the owner (pid, host, start time) for the
messages. A record left behind by a process that no longer holds the lock is a stale lock: the
next run names it in a warning and takes over. A record written on another host cannot be
checked from here (``flock`` need not reach across a network file system), so it is refused
with the way to remove it.

The lock is about processes: within one process it is shared, so several trainers of one
process may open one folder (``flowgrpo.testing`` builds one per sampler into the same folder);
the file is released when the last of them lets go.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowgrpo.errors import RunError

LOCK_NAME = ".flowgrpo.lock"


def _owner_text(owner: dict[str, Any]) -> str:
    since = owner.get("since")
    when = (f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
            if isinstance(since, (int, float)) else "")
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}{when}"


def _read(fd: int) -> dict[str, Any] | None:
    """The owner recorded in the open lock file (None: empty, a released lock); ``{}`` when the
    record cannot be read."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _release(fd: int, path: Path) -> None:
    try:
        if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)  # before the flock goes, so nobody locks a file about to vanish
    finally:
        os.close(fd)


class _Held:
    """A lock this process holds, shared by every :class:`RunLock` of its folder."""

    def __init__(self, key: str, path: Path, fd: int) -> None:
        self.key, self.path, self.fd, self.count = key, path, fd, 0

    def drop(self) -> None:
        with _GUARD:
            self.count -= 1
            if self.count:
                return
            _HELD.pop(self.key, None)
        _release(self.fd, self.path)


_HELD: dict[str, _Held] = {}  # resolved folder -> the lock this process holds on it
_GUARD = threading.RLock()  # a finalizer may run inside acquire (garbage collection)


class RunLock:
    """The lock of one run folder, held until :meth:`release` (or the object is collected, or
    the process ends)."""

    def __init__(self, held: _Held) -> None:
        held.count += 1
        self.path = held.path
        self._finalizer = weakref.finalize(self, held.drop)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        self._finalizer()


def acquire(folder: str | Path, warn: Callable[[str], None] | None = None) -> RunLock:
    """Take the lock of run folder ``folder`` (created if missing).

    Raises:
        RunError: another live process holds it (named), or a record from another host is
            there (named, with how to remove it).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    key = str(folder.resolve())
    with _GUARD:
        if key in _HELD:  # this process holds it already
            return RunLock(_HELD[key])
        return RunLock(_take(folder, path, key, warn))


def _take(folder: Path, path: Path, key: str, warn: Callable[[str], None] | None) -> _Held:
    """Lock ``path`` for this process (see :func:`acquire`)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read(fd) or {}
            os.close(fd)
            raise RunError(f"run folder {folder} is in use by {_owner_text(owner)}; wait for "
                           f"that run to end or choose another run.output_dir") from None
        try:  # the file may have been released (unlinked) between open and flock: retry
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                os.close(fd)
                continue
        except FileNotFoundError:
            os.close(fd)
            continue
        break
    owner = _read(fd)
    host = socket.gethostname()
    if owner and owner.get("host", host) != host:
        os.close(fd)
        raise RunError(f"run folder {folder} is locked by {_owner_text(owner)}, which cannot "
                       f"be checked from {host}; if that run has ended, delete {path}")
    if owner is not None and warn is not None:
        warn(f"took over the stale lock of {folder} (" + (
            f"{_owner_text(owner)}, no longer running" if owner else "unreadable") + ")")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": host, "since": time.time()}).encode())
    os.fsync(fd)
    _HELD[key] = _Held(key, path, fd)
    return _HELD[key]


def holder(folder: str | Path) -> dict[str, Any] | None:
    """The owner of ``folder``'s lock while a live process holds it, else None."""
    path = Path(folder) / LOCK_NAME
    with _GUARD:
        held = _HELD.get(str(Path(folder).resolve()))
    if held is not None:  # this process: flock would not see its own lock
        return {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(fd) or {}
    finally:
        os.close(fd)
    return None


def describe(owner: dict[str, Any]) -> str:
    """``pid N on host H since T`` of a lock's owner."""
    return _owner_text(owner)
