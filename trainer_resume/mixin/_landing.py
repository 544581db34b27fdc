"""A requested pause and the step boundary it lands at.

``request_pause()`` and the signal handlers only record a path. The boundary check,
:func:`pause_at_step_boundary`, writes it after an outermost ``@training_step`` or in
``pause_if_requested()``, and takes a resume point that is due there. Where a loader's
epoch just ended, both are handed on once, to the next boundary, so that the loop's
epoch-end work is saved: also from ``pause_if_requested()``, which cannot tell whether
the loop calls it before that work or after it, unless the loop says it is after
(``epoch_end_done=True``). Under a process group the ranks agree on both.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from .. import distributed as _distributed
from ..state import StrPath
from ..storage.urls import check_location, is_url
from ._boundary import refresh_after_epoch_end
from ._hook_audit import warn_request_without_step
from ._pause import pause_checkpoint, point_shards
from ._settings import settings_of
from ._step_guard import GUARD_ATTRIBUTE, StepGuard

if TYPE_CHECKING:
    from . import TrainingResumeMixin

__all__ = ["land_requested_pause", "pause_at_step_boundary", "record_pause_request"]


def record_pause_request(trainer: TrainingResumeMixin, guard: StepGuard, path: StrPath) -> None:
    """The body of ``request_pause()``: safe from any thread and from signal handlers."""
    if is_url(path):  # a scheme nothing installed reads: refused now, not at the boundary
        check_location(path)
    guard.requested_path = os.fspath(path)
    # Only off the main thread: there a signal handler may be the caller, and it
    # must not write (pause_on_signal's watcher warns for signals).
    if not guard.landings and threading.current_thread() is not threading.main_thread():
        warn_request_without_step(type(trainer).__name__, "request_pause() from another thread")


def land_requested_pause(
    trainer: TrainingResumeMixin, guard: StepGuard, *, epoch_end_done: bool = False
) -> bool:
    """The body of ``pause_if_requested()`` (under the lock, between steps)."""
    guard.landings += 1
    if guard.requested_path is None and not _distributed.is_distributed():
        return False
    if epoch_end_done:
        refresh_after_epoch_end(trainer, guard)  # what the epoch-end work read
    return pause_at_step_boundary(trainer, epoch_end_done=epoch_end_done)


def pause_at_step_boundary(trainer: TrainingResumeMixin, *, epoch_end_done: bool = False) -> bool:
    """Take a due resume point and write the pending pause request, if any (under the lock, between steps).

    A boundary where a loader's epoch just ended hands the pause and a due resume point
    to the next boundary, once, so that the loop's epoch-end work is saved; unless
    ``epoch_end_done``: ``pause_if_requested(epoch_end_done=True)``, which the loop
    calls after that work.
    """
    guard: StepGuard = trainer.__dict__[GUARD_ATTRIBUTE]
    epoch_ended = not epoch_end_done and bool(guard.boundary_ended)
    failure = None
    if guard.points is not None:
        failure = guard.points.at_step_boundary(
            guard.completed_steps,
            lambda copy, sharded=None: pause_checkpoint(trainer, guard, copy, sharded=sharded),
            key=settings_of(trainer, "checkpoint()").key,
            defer=epoch_ended,
            shards=lambda: point_shards(trainer),
        )
    requested = guard.requested_path
    guard.requested_path = None
    # At most one boundary later: a step that spans a whole epoch ends one at every boundary.
    defer = epoch_ended and guard.deferred_at != guard.completed_steps - 1
    if _distributed.is_distributed():
        # A request on any rank pauses every rank at this same boundary, and a deferral
        # on any rank defers it on every rank (one all-reduce for both).
        path, deferred = _distributed.agreed_pause(requested, defer=defer)
    else:
        deferred = defer and requested is not None
        path = None if deferred else requested
    if deferred:
        guard.deferred_at = guard.completed_steps
        if requested is not None and guard.requested_path is None:  # a newer request wins
            guard.requested_path = requested
    if path is not None:
        trainer.pause(path)
    if failure is not None:  # a background write of an earlier point failed
        raise failure
    return path is not None
