"""The pause signals, and keeping them away from the processes a trainer starts.

Slurm, ``timeout`` and Kubernetes signal the whole process group. A DataLoader
worker killed by that SIGTERM takes the pause down with it: the main process sees
"worker killed by signal" in the middle of its last step or of the pause write.
So the processes a trainer starts must not react to the pause signals, from their
very first instruction (a handler set in ``worker_init_fn`` comes too late for
``spawn`` and ``forkserver``: the signal can land while the worker imports torch).

The rule: start processes inside :func:`pause_signals_blocked`. The starting
thread blocks the pause signals for the duration of the start; the signal mask is
inherited through ``fork`` and kept across ``exec``, so the new process (and the
``forkserver`` process, when it starts there) has them blocked for its whole life,
while a signal sent to the main process meanwhile stays pending and is delivered
the moment the block ends: none is lost. ``ResumableDataLoader`` starts its
workers this way; do the same for your own subprocesses (or plain DataLoaders:
``with pause_signals_blocked(): batches = iter(loader)``). A process started so
is stopped by ``SIGKILL``, not by ``SIGTERM``. Loader workers also block
:data:`GROUP_SIGNALS` (SIGINT, SIGHUP, SIGUSR2), so a loop that arms one of them after
its workers started still pauses on it; arming another signal a running worker does
not block is warned about.

Such a process would outlive a trainer killed with ``SIGKILL``, so it is tied to it
too: on Linux a child forked inside the block, and a DataLoader worker started by
:func:`worker_start` under any start method, dies with this process (see
``processes.parent_death``).

That includes multiprocessing's own clean-up: at interpreter exit it sends
``SIGTERM`` to every daemon child still running (a DataLoader iterator still alive
at exit keeps its workers) and then joins them, which would wait forever for a
child that keeps ``SIGTERM`` blocked. So the multiprocessing children started
inside the block are remembered, and an exit handler that runs before
multiprocessing's stops the ones still running with ``SIGKILL``.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # registers its exit handler first: ours must run before it
import os
import signal
import warnings
import weakref
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from ._signals import DEFAULT_PAUSE_SIGNALS, armed_signals
from .errors import PauseSignalWarning
from .processes.inherited_objects import frozen_in_forked_children
from .processes.parent_death import DieWithParent, children_die_with_this_process, tie

__all__ = [
    "DEFAULT_PAUSE_SIGNALS",
    "GROUP_SIGNALS",
    "pause_signals",
    "pause_signals_blocked",
    "quiet_child_exits",
    "warn_unprotected_children",
    "worker_start",
]

# Forkserver processes known to have been started with the pause signals blocked.
_PROTECTED_SERVERS: set[int] = set()
_WARNED: set[str] = set()
# multiprocessing children started inside the block: they ignore multiprocessing's SIGTERM.
_SHIELDED: weakref.WeakSet[Any] = weakref.WeakSet()
_EXIT_JOIN_S = 5.0  # a SIGKILLed child is gone at once; this only bounds a stuck reap


def pause_signals() -> frozenset[signal.Signals]:
    """The signals processes started by this one must not react to.

    ``SIGTERM`` and ``SIGUSR1``, plus any other signal ``pause_on_signal`` (or the
    Lightning ``ResumeCallback``) was given in this process.
    """
    return frozenset(DEFAULT_PAUSE_SIGNALS) | armed_signals()


# Signals a terminal (Ctrl-C, a closed session) or a launcher sends to a whole process
# group, which a loop may turn into pauses after its loader's workers started (the
# quickstart order: the iterator in __init__, pause_on_signal after): loader workers
# keep them blocked too, whenever pause_on_signal is called. A worker needs none of them:
# its loader stops it, and it dies with this process.
GROUP_SIGNALS: frozenset[signal.Signals] = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGHUP", "SIGUSR2") if hasattr(signal, name)
)


def pause_signals_blocked(context: Any = None) -> AbstractContextManager[None]:
    """Start processes inside this block: they keep the pause signals blocked for life.

    Blocks the pause signals in the calling thread for the block's duration (a
    signal arriving meanwhile is delivered when the block ends). Processes started
    inside inherit the block through fork and exec.

    Args:
        context: The multiprocessing context (or start-method name) the block starts
            processes with, when known: with ``forkserver`` a server started earlier,
            outside such a block, is checked (Linux) and warned about.

    Warns:
        PauseSignalWarning: the platform cannot block signals per thread, or the
            forkserver was started without the pause signals blocked.
    """
    return _signals_blocked(pause_signals(), context)


@contextmanager
def _signals_blocked(blocked: frozenset[signal.Signals], context: Any) -> Iterator[None]:
    if not hasattr(signal, "pthread_sigmask"):
        _warn_once(
            "platform",
            "this platform cannot block signals while processes start: DataLoader workers and other "
            "subprocesses may die on a pause signal sent to the whole process group",
        )
        yield
        return
    method = _start_method(context)
    if method in ("spawn", "forkserver"):
        # Started later, inside the block, it would unblock SIGTERM in this thread (it
        # blocks SIGINT/SIGTERM around its own start, then unblocks them).
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    server_before = _forkserver_pid() if method == "forkserver" else None
    if server_before is not None:
        _check_forkserver(server_before)
    children_before = set(multiprocessing.active_children())
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        with children_die_with_this_process():
            yield
    finally:
        _SHIELDED.update(set(multiprocessing.active_children()) - children_before)
        if server_before is None and method == "forkserver":
            started = _forkserver_pid()
            if started is not None:  # it started here, with the signals blocked
                _PROTECTED_SERVERS.add(started)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_start(loader: Any) -> AbstractContextManager[None]:
    """The block to create a DataLoader's iterator in (its workers start there): they
    keep the pause signals and :data:`GROUP_SIGNALS` blocked, die with this process and,
    forked, leave what they inherited to this process's garbage collector."""
    if not getattr(loader, "num_workers", 0):
        return nullcontext()
    return _worker_start(loader, getattr(loader, "multiprocessing_context", None))


@contextmanager
def _worker_start(loader: Any, context: Any) -> Iterator[None]:
    method = _start_method(context)
    # A forked worker is tied by the fork hook; one that starts a new interpreter ties
    # itself first thing in its worker_init_fn, which DataLoader reads when iter() starts.
    bond = None if method == "fork" else tie(direct=method != "forkserver")
    init_fn = loader.worker_init_fn
    if bond is not None:
        loader.worker_init_fn = DieWithParent(bond, init_fn)
    frozen = frozen_in_forked_children() if method == "fork" else nullcontext()
    try:
        with _signals_blocked(pause_signals() | GROUP_SIGNALS, context), frozen:
            yield
    finally:
        if bond is not None:
            loader.worker_init_fn = init_fn


def _start_method(context: Any) -> str | None:
    if context is None:
        return (
            multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_context().get_start_method()
        )
    if isinstance(context, str):
        return context
    getter = getattr(context, "get_start_method", None)
    return getter() if callable(getter) else None


def _forkserver_pid() -> int | None:
    try:
        from multiprocessing import forkserver
    except ImportError:  # no forkserver on this platform
        return None
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def _check_forkserver(pid: int) -> None:
    if pid in _PROTECTED_SERVERS:
        return
    wanted = 0
    for number in pause_signals():
        wanted |= 1 << (number - 1)
    masks = _signal_masks(pid)
    if masks is not None and (masks["SigBlk"] | masks["SigIgn"]) & wanted == wanted:
        _PROTECTED_SERVERS.add(pid)
        return
    _warn_once(
        f"forkserver-{pid}",
        f"the multiprocessing forkserver (pid {pid}) was started without the pause signals blocked: a "
        "signal to the whole process group kills it, and with it every later DataLoader worker start; "
        "start it inside trainer_resume.pause_signals_blocked() (for example by starting the first "
        "loader's workers before anything else uses the forkserver)",
    )


def warn_unprotected_children(signals: Iterable[int], where: str) -> None:
    """Warn when a process started inside the block before ``signals`` were armed, and still
    running, reacts to one of them: a signal to the process group would kill it (Linux,
    read from ``/proc``; elsewhere nothing is checked)."""
    wanted = {signal.Signals(number) for number in signals}
    for child in list(_SHIELDED):
        if not _alive(child) or child.pid is None:
            continue
        masks = _signal_masks(child.pid)
        if masks is None:
            continue
        held = masks["SigBlk"] | masks["SigIgn"]
        missing = sorted(number for number in wanted if not held >> (number - 1) & 1)
        if missing:
            names = ", ".join(signal.Signals(number).name for number in missing)
            _warn_once(
                f"unprotected-{child.pid}-{names}",
                f"{where}: a loader worker (pid {child.pid}) started before it does not block "
                f"{names}, so {names} sent to the whole process group kills it and the pause "
                "with it; call it before the loader's iter() starts its workers",
            )
            return


def _signal_masks(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            lines = status.read().splitlines()
    except OSError:
        return None
    masks = {}
    for line in lines:
        name, _, value = line.partition(":")
        if name in ("SigBlk", "SigIgn"):
            masks[name] = int(value.strip(), 16)
    return masks if len(masks) == 2 else None


def _warn_once(key: str, message: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, PauseSignalWarning, stacklevel=4)


def _alive(child: Any) -> bool:
    try:
        return bool(child.is_alive())
    except (AssertionError, ValueError, OSError):
        return False  # not our child (a forked copy of this registry) or already closed


def _quiet_sigchld() -> Any:
    """Set SIGCHLD to its default disposition; the previous handler, or None if none is set."""
    if not hasattr(signal, "SIGCHLD"):
        return None
    try:
        return signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # not the main thread: leave it
        return None


@contextmanager
def quiet_child_exits() -> Iterator[None]:
    """While workers are being stopped, their exits are not reported as failures.

    torch's SIGCHLD handler raises "DataLoader worker (pid N) is killed by signal" in
    whatever the main thread runs when a worker dies; a worker being stopped (killed
    at exit, or one that aborts in its own interpreter shutdown after its last batch)
    has nothing left to report. Elsewhere than the main thread this changes nothing.
    """
    previous = _quiet_sigchld()
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGCHLD, previous)


def _kill_shielded_children() -> None:
    # Runs before multiprocessing's exit handler, whose SIGTERM these children ignore.
    alive = [child for child in list(_SHIELDED) if _alive(child)]
    if not alive:
        return
    # torch's SIGCHLD handler would report each worker killed here as a failed worker
    # ("DataLoader worker (pid N) is killed by signal") in whatever code runs next; at
    # exit there is nothing to report, so the default disposition holds until they are
    # reaped. Exit handlers run in the main thread, where signal handlers may be set.
    with quiet_child_exits():
        for child in alive:
            child.kill()
        for child in alive:
            child.join(_EXIT_JOIN_S)


def _forget_after_fork() -> None:
    # A forked child starts its own forkserver, if it ever uses one, and has no children yet.
    _PROTECTED_SERVERS.clear()
    _SHIELDED.clear()


atexit.register(_kill_shielded_children)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
