"""The lock and bookkeeping behind ``@training_step`` and ``@serialized_training``.

One re-entrant lock per trainer serialises training steps, other state-changing
methods and ``pause()`` / ``resume()``. The guard also counts completed steps and
remembers whether the last step failed, whether the trainer is paused or locked,
and which pause was requested (by a signal handler or another thread).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ..distributed import is_distributed
from ..errors import PauseBlockedError, TrainerLockedError, TrainingPausedError
from ._boundary import loader_positions, record_boundary, refresh_boundary

__all__ = [
    "GUARD_ATTRIBUTE",
    "StepGuard",
    "guard_of",
    "require_step_boundary",
    "serialized_training",
    "training_step",
]

GUARD_ATTRIBUTE = "_training_resume_guard"

_Method = TypeVar("_Method", bound=Callable[..., Any])


class StepGuard:
    """Per-trainer lock, step counter and pause/lock flags.

    Args:
        at_boundary: Called with the trainer after an outermost step completes when a
            pause may be due; it writes a pending pause (the mixin's boundary check).
    """

    def __init__(self, at_boundary: Callable[[Any], object]) -> None:
        self.at_boundary = at_boundary
        self.lock = threading.RLock()
        self.depth = 0  # nesting of @training_step calls in the thread holding the lock
        self.completed_steps = 0
        self.failed = False
        self.paused = False
        self.locked_reason: str | None = None
        # The last step boundary (see _boundary): per loader, its deferred state (None:
        # not known, read live by a pause); those states once built, with the
        # state.deferred_revision() they were built at; whether a loader's epoch ended in
        # the step before it (the loop's epoch-end work has not run yet).
        self.boundary_positions: dict[str, Any] | None = None
        self.boundary_states: tuple[int, dict[str, Any]] | None = None
        self.boundary_ended: tuple[str, ...] = ()  # the names of those loaders
        # Outermost steps started plus pause_if_requested() calls: places a pause lands.
        self.landings = 0
        # One-shot check of the trainer for forgotten hooks (see _hook_audit); it may
        # return a second look for the next boundary.
        self.audit: Callable[[Any], Any] | None = None
        # Refuses, before the first step runs, what the hooks return that a pause could
        # not save (see checks.hook_results); cleared once it passed.
        self.start_check: Callable[[Any], None] | None = None
        # Written by signal handlers: plain attribute stores only, no locks and no I/O,
        # because a handler runs between two bytecodes of whatever the main thread does.
        self.requested_path: Any = None
        # The completed-step count of the boundary a pending pause was last handed on
        # from (a loader's epoch had just ended there), so it is handed on only once.
        self.deferred_at: int | None = None
        # Inside an outermost @serialized_training call (its loaders re-recorded after it).
        self.serializing = False
        # When the decision to pause is collective (all ranks at the same step), the
        # boundary hook must run after every step, not only after a local request.
        self.check_every_boundary = False
        # The trainer's ResumePoints, if it takes resume points (see resume_points/__init__.py).
        self.points: Any = None
        # pause()/resume() from another thread would otherwise starve: a thread running
        # steps in a loop re-acquires the lock before a waiting thread wakes up.
        self.exclusive_waiters = 0
        self._waiters_lock = threading.Lock()
        self._no_waiters = threading.Event()
        self._no_waiters.set()

    def yield_to_exclusive(self) -> None:
        """Let a waiting ``pause()`` / ``resume()`` go first (steps wait at their start)."""
        if self.exclusive_waiters and not self.lock._is_owned():  # type: ignore[attr-defined]
            self._no_waiters.wait()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock with priority over threads that are about to start a step."""
        with self._waiters_lock:
            self.exclusive_waiters += 1
            self._no_waiters.clear()
        try:
            self.lock.acquire()
        finally:
            with self._waiters_lock:
                self.exclusive_waiters -= 1
                if not self.exclusive_waiters:
                    self._no_waiters.set()
        try:
            yield
        finally:
            self.lock.release()

    def check_step_allowed(self) -> None:
        if self.locked_reason is not None:
            raise TrainerLockedError(self.locked_reason)
        if self.paused:
            raise TrainingPausedError("call resume(path) before the next training step")

    def check_pause_allowed(self) -> None:
        """Refuse a pause or resume point of a locked trainer or after a failed step."""
        if self.locked_reason is not None:
            raise TrainerLockedError(self.locked_reason)
        if self.failed:
            raise PauseBlockedError(
                f"step {self.completed_steps + 1} raised; run a step that succeeds first"
            )


def guard_of(trainer: Any, action: str) -> StepGuard:
    """Return the trainer's guard, or explain the missing initialisation call."""
    guard = trainer.__dict__.get(GUARD_ATTRIBUTE) if hasattr(trainer, "__dict__") else None
    if guard is None:
        raise RuntimeError(
            f"{type(trainer).__name__}.{action} needs self._initialize_training_resume(config, version=...) "
            "to be called first (usually at the end of __init__)"
        )
    return guard


def require_step_boundary(guard: StepGuard, action: str) -> None:
    """Refuse ``action()`` inside a training step (it runs between steps only)."""
    if guard.depth:
        hint = " use request_pause(path) to pause when the step ends" if action == "pause" else ""
        raise RuntimeError(f"{action}() was called inside a training step;{hint}")


def training_step(method: _Method) -> _Method:
    """Mark the outermost training step of a ``TrainingResumeMixin`` trainer.

    The call holds the trainer's re-entrant lock, so ``pause()`` / ``resume()``
    from another thread wait for it to finish. Nested decorated calls count once.
    A step that returns counts as completed and clears an earlier failure; a step
    that raises is marked failed (``pause()`` raises ``PauseBlockedError`` until a
    later step succeeds or ``resume()`` succeeds) and the exception propagates
    unchanged; retrying is allowed. A pause requested by ``request_pause`` or a
    signal is written when the outermost step returns (if that write fails, the
    step has still completed and its call raises the ``CheckpointWriteError``).

    Raises:
        TrainingPausedError: the trainer is paused.
        TrainerLockedError: a restore failed part-way.
        UnsupportedResumeConfigurationError: (first step only, before it runs) a
            resume object or loader the hooks return could not be saved by a pause.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        guard = self.__dict__.get(GUARD_ATTRIBUTE) or guard_of(self, f"{method.__name__}()")
        if guard.exclusive_waiters:
            guard.yield_to_exclusive()
        with guard.lock:
            if guard.depth:
                return method(self, *args, **kwargs)
            if guard.locked_reason is not None or guard.paused:
                guard.check_step_allowed()  # raises
            if guard.start_check is not None:
                guard.start_check(self)
                guard.start_check = None
            guard.depth = 1
            guard.landings += 1
            try:
                result = method(self, *args, **kwargs)
            except BaseException:
                guard.failed = True
                raise
            finally:
                guard.depth = 0
            guard.completed_steps += 1
            guard.failed = False
            record_boundary(self, guard)
            if guard.audit is not None:  # once, then its second look at the next boundary
                audit, guard.audit = guard.audit, None
                guard.audit = audit(self)
            # Under a process group every boundary is a collective agreement on pausing.
            points = guard.points
            if (
                guard.requested_path is not None
                or guard.check_every_boundary
                or is_distributed()
                or (points is not None and points.wants_boundary(guard.completed_steps))
            ):
                guard.at_boundary(self)
            return result

    return wrapper  # type: ignore[return-value]


def serialized_training(method: _Method) -> _Method:
    """Run a state-changing method under the trainer's training lock.

    ``pause()`` and ``resume()`` never interleave with it. It is not counted as a
    step and is allowed on a paused trainer.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        guard = self.__dict__.get(GUARD_ATTRIBUTE) or guard_of(self, f"{method.__name__}()")
        if guard.exclusive_waiters:
            guard.yield_to_exclusive()
        with guard.lock:
            if guard.depth or guard.serializing:  # inside a step, or nested: theirs
                return method(self, *args, **kwargs)
            before = loader_positions(self)
            guard.serializing = True
            try:
                result = method(self, *args, **kwargs)
            finally:
                guard.serializing = False
            # Between steps: loaders it read from or put in place are recorded as it
            # left them (see _boundary.refresh_boundary).
            refresh_boundary(guard, before, loader_positions(self))
            return result

    return wrapper  # type: ignore[return-value]
