"""Which process this is, and whether a process named earlier has certainly ended.

A pid alone names nothing for long: it is reused once its process is reaped, and a
pid read on another machine, after a reboot or in another pid namespace (another
container) names another process or none. So a process is named by its pid, its host
and, on Linux, the boot it runs in (``/proc/sys/kernel/random/boot_id``), its pid
namespace and its start time (clock ticks after boot, ``/proc/<pid>/stat``).

:func:`ended` answers only what it can prove: a process named in this process space
(same host, boot and pid namespace) whose pid is gone, is a zombie or started at
another time has ended. Anything it cannot check (another host, no ``/proc``, a name
without the Linux fields) counts as still running.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

__all__ = ["ProcessName", "checkable", "ended", "this_process"]

ProcessName = dict[str, Any]  # pid, host, boot, pidns, start: JSON-ready
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_ENDED_STATES = frozenset("ZX")  # a zombie has released everything; X: being reaped


def this_process() -> ProcessName:
    """This process's name: ``pid``, ``host`` and, on Linux, ``boot``, ``pidns``, ``start``."""
    pid = os.getpid()
    status = _status(pid)
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot": _read(_BOOT_ID),
        "pidns": _pid_namespace(),
        "start": None if status is None else status[1],
    }


def checkable(name: Mapping[str, Any]) -> bool:
    """Whether :func:`ended` can tell for ``name``: a process of this process space (same
    host, boot and pid namespace), named with its start time."""
    here = this_process()
    try:
        pid, start = int(name["pid"]), name["start"]
        same_space = all(
            name[key] == here[key] and here[key] is not None for key in ("host", "boot", "pidns")
        )
    except (KeyError, TypeError, ValueError):
        return False  # a name this check cannot read
    return same_space and isinstance(start, int) and pid > 0


def ended(name: Mapping[str, Any]) -> bool:
    """Whether the process ``name`` (from :func:`this_process`, maybe in another process)
    has certainly ended; ``False`` whenever that cannot be checked from here."""
    if not checkable(name):
        return False
    pid, start = int(name["pid"]), name["start"]
    status = _status(pid)
    if status is None:
        return not _exists(pid)
    state, started = status
    return state in _ENDED_STATES or started != start


def _status(pid: int) -> tuple[str, int] | None:
    """The state letter and start time of ``pid`` from ``/proc``, or None when unreadable."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields
    # after its closing parenthesis start with the state (field 3); starttime is 22.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process
        return True
    return True


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read().strip()
    except OSError:
        return None
