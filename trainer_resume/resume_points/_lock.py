"""One writing process per resume-point directory.

Two runs taking points into one directory (a requeued job started while its
predecessor still runs) would remove each other's points and interleave two
histories. The process that writes points holds an exclusive lock on
``<directory>/.trainer-resume.lock`` (``flock``; ``msvcrt.locking`` on Windows) for
as long as it lives, and writes its pid, host and start time into the file, so
that a second writer is refused with a message naming the first.

The kernel releases the lock when its process ends, however it ends: a writer
that was killed leaves nothing to clean up. On a network file system a lock of a
machine that died is released by the server once that machine's lease expires
(NFSv4: about 90 s). Readers (``resume_latest``) take no lock.

Several ``ResumePoints`` of one process share the process's lock: the lock tells
processes apart, and one trainer per ``ResumePoints`` is checked where it is attached.
The process lets the lock go once no ``ResumePoints`` that took it is left (or the
run is finished), and at its end.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
import weakref

from ..errors import CheckpointWriteError, ResumePointsInUseError

__all__ = ["LOCK_NAME", "hold_writer_lock", "release_writer_lock"]

LOCK_NAME = ".trainer-resume.lock"

_log = logging.getLogger("trainer_resume")
_LOCKS_UNSUPPORTED = {
    errno.ENOLCK,
    errno.ENOSYS,
    errno.ENOTSUP,
    getattr(errno, "EOPNOTSUPP", errno.ENOTSUP),
}
# A directory's lock in this process: its locked file's descriptor, and the ids of
# the live objects that took it.
_Held = tuple[int, set[int]]
_held: dict[str, _Held] = {}  # by the directory's real path
# Reentrant: a holder's finalizer may run (garbage collection) while this thread holds it.
_guard = threading.RLock()


def hold_writer_lock(directory: str, holder: object) -> None:
    """Make this process the directory's one writer for as long as ``holder`` lives.

    A no-op (but for counting ``holder``) when this process holds the lock already.

    Raises:
        ResumePointsInUseError: another live process holds the lock (named with its
            pid, host and start time as it recorded them).
        CheckpointWriteError: the lock file cannot be created or locked (the cause
            chained). On a file system without locks the points are written unguarded,
            with a logged warning.
    """
    key = os.path.realpath(directory)
    with _guard:
        if key not in _held:
            _held[key] = (_locked(directory, key), set())
        holders = _held[key][1]
        if id(holder) not in holders:
            holders.add(id(holder))
            weakref.finalize(holder, _let_go, key, id(holder))


def _locked(directory: str, key: str) -> int:
    """The descriptor of the directory's lock file, locked by this process."""
    path = os.path.join(key, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise CheckpointWriteError(
            f"{directory}: cannot create the writer's lock file {path}: {exc!r}"
        ) from exc
    try:
        if not _try_lock(fd, path):
            raise ResumePointsInUseError(
                f"{directory} is written by {_holder(fd)}; it holds {path}"
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(record) + "\n").encode())
    except OSError as exc:
        os.close(fd)  # closing drops the lock if it was taken
        raise CheckpointWriteError(f"{directory}: cannot write {path}: {exc!r}") from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


def _let_go(key: str, holder: int) -> None:
    with _guard:
        held = _held.get(key)
        if held is None or holder not in held[1]:
            return
        held[1].discard(holder)
        if held[1]:
            return
        del _held[key]
    _close_quietly(held[0])  # releases the lock; the file stays for the next writer


def release_writer_lock(directory: str) -> None:
    """Give the directory's lock up and remove its file (the run is finished); a no-op when not held."""
    key = os.path.realpath(directory)
    with _guard:
        held = _held.pop(key, None)
    if held is None:
        return
    try:
        # Removed while still held: a process that opened it meanwhile is refused by
        # the lock on this file, and a later one creates a new file.
        os.remove(os.path.join(key, LOCK_NAME))
    except OSError:
        pass
    _close_quietly(held[0])  # releases the lock


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _try_lock(fd: int, path: str) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno not in _LOCKS_UNSUPPORTED:
            raise CheckpointWriteError(f"cannot lock {path}: {exc!r}") from exc
        # A file system without locks: points are still written, unguarded.
        _log.warning(
            "%s: this file system does not support locks (%s); a second process writing "
            "resume points into this directory would not be detected",
            path,
            exc.strerror,
        )
    return True


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        record = json.loads(os.read(fd, 4096).decode())
        return f"process {int(record['pid'])} on host {record['host']} (since {record['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        # Locked but not yet (or no longer readable as) a record: still a live writer.
        return "another process (its record is being written)"
