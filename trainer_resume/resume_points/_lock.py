"""One writing process per resume-point directory.

Two runs taking points into one directory (a requeued job started while its
predecessor still runs) would remove each other's points and interleave two
histories. The process that writes points holds an exclusive lock on
``<directory>/.trainer-resume.lock`` (``flock``; ``msvcrt.locking`` on Windows) for
as long as it lives, and writes its name into the file (pid, host and start time,
and on Linux its boot and pid namespace: see ``processes.names``), so that a second writer
is refused with a message naming the first.

No other process holds the lock. The descriptor is closed on ``exec`` and, in an
``os.register_at_fork`` hook, in every child forked from the writer (DataLoader
workers, DALI's workers, ``multiprocessing``, user code). A child that never ran
that hook (one stuck inside ``os.fork`` itself, as CPython 3.11 can be) still holds a
duplicate of the locked descriptor, and with it the ``flock``, after the writer died:
a lock whose file names a writer that has certainly ended (same host, boot and pid
namespace; its pid gone, a zombie or reused) is taken over at once: its file is
removed and a new one locked. A lock whose writer may still run (or runs on another
machine) is never taken over.

Taking the lock and taking one over happen under a POSIX lock on a second file,
``<directory>/.trainer-resume.lock.guard`` (``lockf``, which no child inherits and
whose holder's death releases it), held for the microseconds of the check: so a
writer that just locked a file that still names its dead predecessor is never
mistaken for that predecessor. Its holder removes the guard file before releasing it
(a process waiting on it then finds it removed and locks a new one), so only a
process killed in those microseconds leaves it behind, for the next one to use.

Otherwise the kernel releases the lock when its process ends, however it ends: a
writer that was killed leaves nothing to clean up. On a network file system a lock of
a machine that died is released by the server once that machine's lease expires
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
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import CheckpointWriteError, ResumePointsInUseError
from ..processes.names import ended, this_process
from ..storage.urls import is_url
from ._object_lock import hold_object_lock, release_object_lock

__all__ = ["GUARD_NAME", "LOCK_NAME", "hold_writer_lock", "release_writer_lock"]

LOCK_NAME = ".trainer-resume.lock"
GUARD_NAME = LOCK_NAME + ".guard"

_log = logging.getLogger("trainer_resume")
_LOCKS_UNSUPPORTED = {
    errno.ENOLCK,
    errno.ENOSYS,
    errno.ENOTSUP,
    getattr(errno, "EOPNOTSUPP", errno.ENOTSUP),
}
# The guard is held for microseconds; this bounds the wait behind a holder that stopped
# (SIGSTOP, a hung network file system) without ever giving up on a busy one too soon.
_GUARD_WAIT_S = 30.0
_GUARD_POLL_S = 0.005
# Each round either locks, refuses, or removes a dead writer's file; a new file is
# locked on the next round unless another process was quicker (then it is refused).
_ROUNDS = 4
# A directory's lock in this process: its locked file's descriptor, and the ids of
# the live objects that took it.
_Held = tuple[int, set[int]]
_held: dict[str, _Held] = {}  # by the directory's real path
# Reentrant: a holder's finalizer may run (garbage collection) while this thread holds it.
_guard = threading.RLock()


def hold_writer_lock(directory: str, holder: object) -> None:
    """Make this process the directory's one writer for as long as ``holder`` lives.

    A no-op (but for counting ``holder``) when this process holds the lock already. A
    lock still held although the writer its file names has certainly ended (a child
    forked from that writer holds a duplicate of its descriptor) is taken over.

    Raises:
        ResumePointsInUseError: another process that may be running holds the lock
            (named with its pid, host and start time as it recorded them).
        CheckpointWriteError: the lock file cannot be created or locked (the cause
            chained). On a file system without locks the points are written unguarded,
            with a logged warning.
    """
    if is_url(directory):  # an object store: a lock object with a lease
        hold_object_lock(directory, holder)
        return
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
    with _directory_guard(directory, key):
        for _ in range(_ROUNDS):
            fd = _open(directory, path)
            try:
                if _try_lock(fd, path):
                    if _names_file(path, fd):
                        _record(directory, path, fd)
                        return fd
                    # Removed since it was opened (the run finished, or a dead writer's
                    # file was replaced): the lock on it guards nothing.
                    os.close(fd)
                    continue
                owner = _owner(fd)
                if owner is None or not ended(owner):
                    raise ResumePointsInUseError(
                        f"{directory} is written by {_described(owner)}; it holds {path}"
                    )
                _take_over(path, fd, owner)
                os.close(fd)
            except BaseException:
                _close_quietly(fd)
                raise
    raise ResumePointsInUseError(
        f"{directory}: other processes kept replacing the writer's lock file {path}"
    )


def _open(directory: str, path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise CheckpointWriteError(
            f"{directory}: cannot create the writer's lock file {path}: {exc!r}"
        ) from exc


def _record(directory: str, path: str, fd: int) -> None:
    """Write this process's name into the lock file it locked."""
    record = {**this_process(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(record) + "\n").encode())
    except OSError as exc:
        raise CheckpointWriteError(f"{directory}: cannot write {path}: {exc!r}") from exc


def _take_over(path: str, fd: int, owner: dict[str, Any]) -> None:
    """Remove the lock file of a writer that has ended (the guard is held)."""
    _log.warning(
        "%s: the writer that held it, %s, has ended, but a process it started still holds "
        "the lock; taking it over",
        path,
        _described(owner),
    )
    if _names_file(path, fd):
        _remove_quietly(path)


def _names_file(path: str, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd``."""
    try:
        named, opened = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


@contextmanager
def _directory_guard(directory: str, key: str) -> Iterator[None]:
    """Hold the directory's guard: no other process takes or takes over its lock meanwhile."""
    try:
        import fcntl
    except ImportError:  # Windows: no fork, so no duplicate outlives a writer
        yield
        return
    path = os.path.join(key, GUARD_NAME)
    deadline = time.monotonic() + _GUARD_WAIT_S
    while True:
        fd = _open(directory, path)
        try:
            taken = _guard_taken(fcntl, fd, path, deadline)
        except BaseException:
            os.close(fd)
            raise
        if taken and _names_file(path, fd):
            break
        os.close(fd)  # releases the POSIX lock, if taken
        if not taken:
            raise ResumePointsInUseError(
                f"{directory}: another process has been taking the writer's lock for "
                f"{_GUARD_WAIT_S:.0f} s (it holds {path})"
            )
        # Its holder removed it: lock the file now at the path.
    try:
        yield
    finally:
        # Removed before it is released, so the directory keeps only the lock file; a
        # process waiting on this file finds it removed once it has it, and goes on
        # with a new one.
        _remove_quietly(path)
        os.close(fd)


def _guard_taken(fcntl: Any, fd: int, path: str, deadline: float) -> bool:
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in _LOCKS_UNSUPPORTED:
                return True  # no locks here: _try_lock warns that nothing is guarded
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise CheckpointWriteError(f"cannot lock {path}: {exc!r}") from exc
        if time.monotonic() > deadline:
            return False
        time.sleep(_GUARD_POLL_S)


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
    if is_url(directory):
        release_object_lock(directory)
        return
    key = os.path.realpath(directory)
    with _guard:
        held = _held.pop(key, None)
    if held is None:
        return
    # Removed while still held: a process that opened it meanwhile finds it removed
    # once it has the lock, and locks a new file.
    _remove_quietly(os.path.join(key, LOCK_NAME))
    _close_quietly(held[0])  # releases the lock


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


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


def _owner(fd: int) -> dict[str, Any] | None:
    """The name the lock file's writer recorded, or None while it is being written."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        record = json.loads(os.read(fd, 4096).decode())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _described(owner: dict[str, Any] | None) -> str:
    try:
        return f"process {int(owner['pid'])} on host {owner['host']} (since {owner['since']})"  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        # Locked but not yet (or no longer readable as) a record: still a live writer.
        return "another process (its record is being written)"


def _forget_after_fork() -> None:
    # The child is not the writer: it must not keep the lock alive after the writer
    # dies. Closing (never unlocking: the lock belongs to the open file, which the
    # writer still has) drops only the child's duplicate.
    global _guard
    for fd, _ in _held.values():
        _close_quietly(fd)
    _held.clear()
    _guard = threading.RLock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
