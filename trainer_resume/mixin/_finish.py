"""``finish()``: the run's finished marker replaces its pause file (or sharded pause
directory); its resume points retire.

See :mod:`trainer_resume.finished`: from then on ``resume(path)`` refuses and
``run_finished`` returns the marker, so a requeued job that already finished can exit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import distributed as _distributed
from ..errors import TrainerLockedError
from ..finished import finished_marker_path, mark_finished
from ..sharded.write import retire_pause
from ..state import StrPath
from ..storage.paths import is_url, make_parent_directory
from ..storage.paths import location as checked_location
from ._settings import settings_of
from ._step_guard import StepGuard

if TYPE_CHECKING:
    from . import TrainingResumeMixin

__all__ = ["finish_run"]


def finish_run(trainer: TrainingResumeMixin, guard: StepGuard, path: StrPath) -> str:
    """The body of ``finish()`` (under the lock, between steps); returns the marker's path."""
    if guard.locked_reason is not None:
        raise TrainerLockedError(guard.locked_reason)
    key = settings_of(trainer, "finish()").key
    location = checked_location(path)

    def write() -> None:
        make_parent_directory(location)
        mark_finished(location, completed_steps=guard.completed_steps, key=key)
        if not is_url(location):
            retire_pause(location)  # a sharded pause directory goes as a pause file does
        if guard.points is not None:  # the resume points retire with the pause file
            guard.points.retire(completed_steps=guard.completed_steps, key=key)

    if _distributed.is_distributed():
        _distributed.commit(write, location)
    else:
        write()
    return finished_marker_path(location)
