"""Pause requests from signal handlers: install, remember and restore handlers."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType, TracebackType

from .._signals import DEFAULT_PAUSE_SIGNALS, Handler, install_handlers, restore_handlers
from ._step_guard import StepGuard

__all__ = ["DEFAULT_PAUSE_SIGNALS", "SignalPause"]


class SignalPause:
    """Handlers that turn a signal into a pause request; restores the previous ones.

    Use as a context manager or call :meth:`restore`. ``previous`` maps each signal
    to the handler that was installed before.
    """

    def __init__(
        self, guard: StepGuard, path: str | os.PathLike[str], signals: Iterable[int]
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

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Attribute stores only: the handler may interrupt the main thread anywhere,
        # including inside the training lock or a file write.
        self.received = signal.Signals(signum)
        self._guard.requested_path = self.path

    def restore(self) -> None:
        """Put back the handlers that were installed before (idempotent)."""
        restore_handlers(self.previous)
        self.previous.clear()

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
