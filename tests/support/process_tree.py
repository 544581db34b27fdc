"""Every process a test started, found and killed: children in sessions of their own too.

A launcher that starts its workers in sessions of their own (torch elastic does, for
each rank) or a child that starts grandchildren leaves them running when only the
launched process is killed; a test that hangs must not leave processes behind.
"""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["descendants", "kill_tree"]


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, their children, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # "pid (name) state ppid ...": the name may hold spaces and parentheses.
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # it ended meanwhile
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
