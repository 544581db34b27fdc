"""Processes a trainer starts die with it, at once, however it dies.

The library's loader workers keep the pause signals (SIGTERM) blocked for life (see
``pause_signals``), so nothing but SIGKILL stops them. When their trainer is killed
(``SIGKILL``, the OOM killer, a crashed rank under ``torchrun``, whose agent signals
the process groups of the ranks still running only), torch's worker watchdog notices
the orphan only when its index queue times out, up to 5 s later, and never for a
worker stuck elsewhere or a forkserver's worker (its parent is the server, which lives
on): meanwhile the orphan holds what it inherited (sockets, files, locks).

So on Linux a child started inside :func:`children_die_with_this_process` is tied to
the process that started it (the starter), first thing in the child: a forked child
in an ``os.register_at_fork`` hook, before any other code of the child runs; a
spawned or forkserver DataLoader worker in its ``worker_init_fn``, through
:class:`DieWithParent`.

- A child of the starter's main thread asks the kernel to SIGKILL it when its parent
  dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, through ``ctypes``), then checks that
  its parent is still the starter (one that died before the request left it
  orphaned already) and, if not, kills itself.
- The kernel sends that signal when the *thread* that started the child ends, and a
  forkserver's children have the server as their parent (which stays alive as long
  as they do). So the others (a child of another thread, a forkserver's) get a daemon
  thread that waits for the starter's end (a ``pidfd``, else a check every
  ``_POLL_S``) and then kills the child. That thread needs the GIL to act: a child
  stuck in C code holding it is left to the watchdogs.

Elsewhere than on Linux, torch's watchdog remains.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .names import ProcessName, ended, this_process

__all__ = ["DieWithParent", "Tie", "children_die_with_this_process", "die_with_parent", "tie"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_POLL_S = 0.2  # where no pidfd can wait for the starter: well within a second
_starting = threading.local()  # .tie: the Tie of the block this thread is in, if any
_prctl: Callable[..., int] | None = None


@dataclass(frozen=True)
class Tie:
    """What a child needs to die with the process that started it (picklable)."""

    starter: ProcessName  # the process that started the child
    direct: bool  # the child's parent is the starter itself (fork, spawn), not a server
    main_thread: bool  # the starter's main thread started it


def tie(*, direct: bool = True) -> Tie | None:
    """The tie for children the calling thread starts now; ``None`` off Linux.

    Args:
        direct: The children are the caller's own (``fork``, ``spawn``); ``False`` for
            children of a forkserver.
    """
    if not sys.platform.startswith("linux"):
        return None
    _load_prctl()  # here, in the parent: a forked child loads nothing
    main_thread = threading.current_thread() is threading.main_thread()
    return Tie(this_process(), direct, main_thread)


def die_with_parent(bond: Tie) -> None:
    """In a child: be SIGKILLed when the starter dies; die now if it died already."""
    if bond.direct and bond.main_thread and _pdeathsig():
        # A parent that died before the request above left this process orphaned already.
        if os.getppid() != bond.starter["pid"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return
    _watch(bond.starter)


def _load_prctl() -> Callable[..., int]:
    global _prctl
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = _no_prctl
    return _prctl


def _pdeathsig() -> bool:
    prctl = _load_prctl()  # in a spawned child, loaded here
    # Every argument as the unsigned long the kernel reads (prctl is variadic).
    arguments = (_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    return prctl(*map(ctypes.c_ulong, arguments)) == 0


def _no_prctl(*_: Any) -> int:
    return -1


def _watch(starter: ProcessName) -> None:
    """Kill this process once ``starter`` has ended (from a daemon thread)."""
    try:
        pidfd: int | None = os.pidfd_open(int(starter["pid"]))
    except (AttributeError, OSError):  # no pidfd here, or the starter is gone
        pidfd = None
    if ended(starter):  # also a pid reused before the pidfd was opened
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(
        target=_die_when_ended,
        args=(starter, pidfd),
        name="trainer-resume-starter-watch",
        daemon=True,
    ).start()


def _die_when_ended(starter: ProcessName, pidfd: int | None) -> None:
    if pidfd is not None:
        waiting = select.poll()
        waiting.register(pidfd, select.POLLIN)  # readable once the process has ended
        while not waiting.poll():
            pass
    else:
        while not ended(starter):
            time.sleep(_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def children_die_with_this_process() -> Iterator[None]:
    """Children forked by the calling thread inside the block die with this process (Linux)."""
    previous = getattr(_starting, "tie", None)
    _starting.tie = tie()
    try:
        yield
    finally:
        _starting.tie = previous


class DieWithParent:
    """A ``worker_init_fn`` that ties the worker to its starter, then calls the user's."""

    def __init__(self, bond: Tie, init_fn: Callable[[int], Any] | None) -> None:
        self.bond = bond
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        die_with_parent(self.bond)
        if self.init_fn is not None:
            self.init_fn(worker_id)


def _after_fork_in_child() -> None:
    bond = getattr(_starting, "tie", None)
    if bond is None:
        return
    _starting.tie = None  # the child's own children are not tied through this block
    die_with_parent(bond)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
