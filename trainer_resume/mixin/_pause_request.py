"""Pause requests from signal handlers: install, remember and restore handlers.

:func:`arm_signals` and :func:`disarm_signals` are the bodies of ``pause_on_signal()``
and ``restore_signal_handlers()``: a trainer holds one :class:`SignalPause` at a time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Iterable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from .._signals import DEFAULT_PAUSE_SIGNALS, Handler, install_handlers, restore_handlers
from ..launch_directory import warn_if_in_launch_directory
from ..pause_signals import warn_unprotected_children
from ..sharded.detect import sharded_objects
from ..state import StrPath
from ..storage.paths import is_url, make_parent_directory
from ._hook_audit import warn_if_no_step, warn_request_without_step
from ._pause import refuse_sharded_url
from ._step_guard import StepGuard
from ._training_start import refuse_epoch_start_loaders

if TYPE_CHECKING:
    from . import TrainingResumeMixin

__all__ = ["DEFAULT_PAUSE_SIGNALS", "SignalPause", "arm_signals", "disarm_signals"]

SIGNALS_ATTRIBUTE = "_training_resume_signals"

_WATCH_INTERVAL_S = 0.05  # how soon a signal that came before any step is warned about


class SignalPause:
    """Handlers that turn a signal into a pause request; restores the previous ones.

    Use as a context manager or call :meth:`restore`. ``previous`` maps each signal
    to the handler that was installed before. With ``warn_without_step_after``, a
    watcher thread warns (``UnsavedStateWarning``) as soon as a signal arrives while
    no ``@training_step`` call has started since arming, and after that many
    seconds without one.
    """

    def __init__(
        self,
        guard: StepGuard,
        path: str | os.PathLike[str],
        signals: Iterable[int],
        *,
        trainer_name: str = "trainer",
        warn_without_step_after: float | None = None,
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "pause_on_signal() must be called from the main thread: Python runs signal handlers there "
                "and only the main thread may install them"
            )
        self.path = os.fspath(path)
        self.signals = tuple(signal.Signals(number) for number in signals)
        if not self.signals:
            raise ValueError("pause_on_signal() needs at least one signal")
        self.previous: dict[signal.Signals, Handler] = {}
        self.received: signal.Signals | None = None
        self._guard = guard
        install_handlers(self.signals, self._handle, self.previous)
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        if warn_without_step_after is not None:
            # A thread, not the handler, warns: a handler may interrupt the main thread
            # inside a write to stderr or a lock that warnings.warn would take. It holds
            # this object weakly: a daemon thread that dropped the last reference to the
            # trainer's objects would free them during interpreter shutdown, which aborts
            # the process when a native library (a DALI pipeline, CUDA) frees with them.
            self._watcher = threading.Thread(
                target=_watch,
                args=(
                    weakref.ref(self),
                    self._stop_watching,
                    trainer_name,
                    guard.landings,
                    warn_without_step_after,
                ),
                name="trainer-resume-signal-watch",
                daemon=True,
            )
            self._watcher.start()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Attribute stores only: the handler may interrupt the main thread anywhere,
        # including inside the training lock or a file write.
        self.received = signal.Signals(signum)
        self._guard.requested_path = self.path
        # Another trainer of this process armed the signal before this one: it pauses too.
        previous = self.previous.get(self.received)
        if getattr(previous, "__func__", None) is SignalPause._handle:
            previous(signum, frame)  # type: ignore[operator]

    def restore(self) -> None:
        """Put back the handlers that were installed before (idempotent)."""
        restore_handlers(self.previous)
        self.previous.clear()
        self._stop_watching.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()  # it wakes at once: no thread outlives the handlers

    @property
    def active(self) -> bool:
        return bool(self.previous)

    def __enter__(self) -> SignalPause:  # noqa: PYI034  (typing.Self needs Python 3.11)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.restore()


def _watch(
    ref: weakref.ref[SignalPause],
    stop: threading.Event,
    trainer_name: str,
    landings: int,
    seconds: float,
) -> None:
    # Polls plain attributes (the handler stores them without a lock) until a step
    # starts, the handlers are restored, a signal arrives or the time is up; holds the
    # SignalPause only while it looks.
    deadline = time.monotonic() + seconds
    while not stop.wait(_WATCH_INTERVAL_S):
        pause = ref()
        if pause is None or not pause.active or pause._guard.landings != landings:
            return
        received, guard = pause.received, pause._guard
        del pause
        if received is not None:
            warn_request_without_step(trainer_name, f"signal {received.name}")
            return
        if time.monotonic() >= deadline:
            warn_if_no_step(trainer_name, guard, landings, seconds)
            return
        del guard


def arm_signals(
    trainer: TrainingResumeMixin,
    guard: StepGuard,
    path: StrPath,
    signals: Iterable[int],
    *,
    warn_without_step_after: float | None,
) -> SignalPause:
    """The body of ``pause_on_signal()``: the previous handle restored, a new one armed."""
    warn_if_in_launch_directory(path, "the pause path")
    make_parent_directory(path)  # a missing folder is created now, or refused with the reason
    if is_url(path):
        try:
            objects = trainer._resume_objects()
        except Exception:  # noqa: BLE001 - not built yet: pause() refuses it later
            objects = {}
        refuse_sharded_url(path, sharded_objects(objects))
    if guard.start_check is None:  # training started (else refused as it starts)
        refuse_epoch_start_loaders(trainer, "signals (pause_on_signal())")
    trainer.restore_signal_handlers()
    handle = SignalPause(
        guard,
        path,
        signals,
        trainer_name=type(trainer).__name__,
        warn_without_step_after=warn_without_step_after,
    )
    trainer.__dict__[SIGNALS_ATTRIBUTE] = handle
    warn_unprotected_children(handle.signals, f"{type(trainer).__name__}.pause_on_signal()")
    return handle


def disarm_signals(trainer: TrainingResumeMixin) -> None:
    """The body of ``restore_signal_handlers()``: no-op when no signals are armed."""
    handle: SignalPause | None = trainer.__dict__.pop(SIGNALS_ATTRIBUTE, None)
    if handle is not None:
        handle.restore()
