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
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from ..errors import ResumePointsInUseError

__all__ = ["LOCK_NAME", "hold_writer_lock", "release_writer_lock"]

LOCK_NAME = ".trainer-resume.lock"

_held: dict[str, int] = {}  # real path of a directory -> descriptor of its locked lock file
_guard = threading.Lock()


def hold_writer_lock(directory: str) -> None:
    """Make this process the directory's one writer (a no-op once it is).

    Raises:
        ResumePointsInUseError: another live process holds the lock (named with its
            pid, host and start time as it recorded them).
    """
    key = os.path.realpath(directory)
    with _guard:
        if key in _held:
            return
        path = os.path.join(key, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if not _try_lock(fd):
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
        except BaseException:
            os.close(fd)  # closing drops the lock if it was taken
            raise
        _held[key] = fd


def release_writer_lock(directory: str) -> None:
    """Give the directory's lock up and remove its file (the run is finished); a no-op when not held."""
    key = os.path.realpath(directory)
    with _guard:
        fd = _held.pop(key, None)
    if fd is None:
        return
    try:
        # Removed while still held: a process that opened it meanwhile is refused by
        # the lock on this file, and a later one creates a new file.
        os.remove(os.path.join(key, LOCK_NAME))
    except OSError:
        pass
    try:
        os.close(fd)  # releases the lock
    except OSError:
        pass


def _try_lock(fd: int) -> bool:
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
    return True


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        record = json.loads(os.read(fd, 4096).decode())
        return f"process {int(record['pid'])} on host {record['host']} (since {record['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        # Locked but not yet (or no longer readable as) a record: still a live writer.
        return "another process (its record is being written)"
