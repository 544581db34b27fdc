"""Signal handlers that request a pause: the default signals, installing and restoring.

Shared by the mixin's ``pause_on_signal`` (``_pause_request.SignalPause``) and the
Lightning ``ResumeCallback``; both only record a request inside the handler.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

__all__ = [
    "DEFAULT_PAUSE_SIGNALS",
    "Handler",
    "armed_signals",
    "forward_signal",
    "install_handlers",
    "restore_handlers",
]

# SIGUSR1 does not exist everywhere (Windows); the defaults are the ones this platform has.
DEFAULT_PAUSE_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name)
)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# Every signal a handler here has turned into a pause request in this process: the
# processes it starts keep them blocked too (see pause_signals).
_ARMED: set[signal.Signals] = set()


def armed_signals() -> frozenset[signal.Signals]:
    """The signals that have requested pauses in this process, besides the defaults."""
    return frozenset(_ARMED)


def install_handlers(
    signals: Iterable[signal.Signals],
    handler: Handler,
    previous: dict[signal.Signals, Handler],
) -> None:
    """Install ``handler`` for each signal and record the handler it replaced in ``previous``.

    ``handler`` itself, left installed by an earlier call, is not a handler to go
    back to: the signal then goes back to its default. Should installing fail part
    way, the handlers installed so far are put back before the error propagates.
    """
    signals = tuple(signals)
    _ARMED.update(signal.Signals(number) for number in signals)
    try:
        for number in signals:
            replaced = signal.signal(number, handler)
            if replaced != handler:
                previous[number] = replaced
            else:
                previous.setdefault(number, signal.SIG_DFL)
    except BaseException:
        restore_handlers(previous)
        raise


def restore_handlers(previous: dict[signal.Signals, Handler]) -> None:
    """Put back the handlers recorded in ``previous`` (``None``, a handler set outside
    Python, becomes the default)."""
    for number, handler in previous.items():
        signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def forward_signal(signum: int, frame: FrameType | None, handler: Handler) -> None:
    """Act on a signal as ``handler`` would have: call it, ignore, or take the default action."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_IGN:
        return
    else:  # SIG_DFL (or unknown): take the default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
