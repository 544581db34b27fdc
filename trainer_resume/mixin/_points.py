"""The trainer's resume points: one taken on demand, and the newest chosen to resume from.

``checkpoint()`` snapshots between steps at once, or asks for the next step boundary
(inside a step, and under a process group, where every rank takes part);
``resume_latest()`` waits for the write in flight, then takes the newest valid file
(see :mod:`._latest`). Automatic points are taken at the boundaries
(:func:`~._landing.pause_at_step_boundary`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from .. import distributed as _distributed
from ..errors import CheckpointCorruptedError, CheckpointFormatError, SkippedCheckpointWarning
from ..finished import refuse_if_finished
from ..resume_points import ResumePoint, ResumePoints
from ..resume_points.files import require_directory
from ..resume_points.sharded_points import committed_sharded
from ..state import StrPath
from ..storage import paths
from ._latest import Chosen, latest_to_resume
from ._pause import pause_checkpoint, point_shards
from ._resume import resume_from
from ._settings import settings_of
from ._step_guard import StepGuard, require_step_boundary

if TYPE_CHECKING:
    from . import TrainingResumeMixin

__all__ = ["choose_latest", "points_of", "resume_latest_sharded", "take_checkpoint"]


def points_of(guard: StepGuard, action: str) -> ResumePoints:
    """The trainer's ``ResumePoints``, or the error that says how to give it some."""
    if guard.points is None:
        raise RuntimeError(
            f"{action} needs resume points: pass resume_points=ResumePoints(directory, ...) "
            "to _initialize_training_resume"
        )
    return guard.points


def take_checkpoint(trainer: TrainingResumeMixin, guard: StepGuard) -> ResumePoint:
    """The body of ``checkpoint()``."""
    points = points_of(guard, "checkpoint()")
    if guard.depth or _distributed.is_distributed():
        return points.request()
    with guard.exclusive():
        guard.check_pause_allowed()
        key = settings_of(trainer, "checkpoint()").key
        return points.take(
            guard.completed_steps,
            lambda copy, sharded=None: pause_checkpoint(trainer, guard, copy, sharded=sharded),
            key=key,
            shards=lambda: point_shards(trainer),
        )


def choose_latest(
    trainer: TrainingResumeMixin, guard: StepGuard, directory: StrPath | None
) -> Chosen | None:
    """The file ``resume_latest(directory)`` resumes from, read once, or ``None`` (nothing yet)."""
    if directory is None:
        directory = points_of(guard, "resume_latest() without a directory").directory
    if guard.points is not None:
        guard.points.wait()
    key = settings_of(trainer, "resume_latest()").key
    # The file is read (and verified) once, to learn its step, and resumed from that read.
    return latest_to_resume(directory, key=key, load=trainer._load_pause_checkpoint)


def resume_latest_sharded(
    trainer: TrainingResumeMixin, guard: StepGuard, directory: StrPath | None, *, base: type
) -> str | None:
    """``resume_latest()`` of a trainer with a sharded model: the newest committed sharded point
    or pause that every rank opens and verifies; one that fails is skipped with a warning.

    Rank 0 lists the committed directories (by their manifests' steps) and every rank
    takes that list, so all ranks try the same directories in the same order; a resume
    refused on any rank is refused on all (nothing changed) and the next older is tried.
    """
    if directory is None:
        directory = points_of(guard, "resume_latest() without a directory").directory
    if guard.points is not None:
        guard.points.wait()
    key = settings_of(trainer, "resume_latest()").key
    require_directory(paths.location(directory))
    refuse_if_finished(directory, key=key)
    listed = (
        _distributed.rank_zero_result(lambda: committed_sharded(directory, key=key))
        if _distributed.is_distributed()
        else committed_sharded(directory, key=key)
    )
    for _, path in listed:
        try:
            with guard.exclusive():
                require_step_boundary(guard, "resume")
                resume_from(trainer, guard, path, base=base)
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            warnings.warn(SkippedCheckpointWarning(f"skipped {path}: {error}"), stacklevel=3)
            continue
        return path
    return None
