"""Every process a test started, found and killed (children in sessions of their own
too), and whether a process has ended, read from ``/proc``.

A launcher that starts its workers in sessions of their own (torch elastic does, for
each rank) or a child that starts grandchildren leaves them running when only the
launched process is killed; a test that hangs must not leave processes behind.
"""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["descendants", "ended", "kill_tree", "state"]


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the name (state, ppid, ...); None once
    the process is reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    # "pid (name) state ppid ...": the name may hold spaces and parentheses.
    return text[text.rfind(")") + 2 :].split()


def state(pid: int) -> str | None:
    """The process's state letter, or None once it is reaped."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def ended(pid: int) -> bool:
    """Reaped, or a zombie (it has ended; its reaper may not be ours)."""
    return state(pid) in (None, "Z", "X")


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, their children, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None:  # it ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(children.get(child, []))
    return found


def kill_tree(process: subprocess.Popen, *, session: bool = False) -> None:
    """SIGKILL ``process`` and every process below it, if it is still running; with
    ``session``, its whole session too (it was started with ``start_new_session``)."""
    if process.poll() is not None:
        return
    for _ in range(3):  # again for what was being started during the first round
        for pid in descendants(process.pid):
            _kill(pid)
        if session:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            _kill(process.pid)
    process.wait(timeout=60)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
