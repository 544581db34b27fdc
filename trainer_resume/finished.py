"""A run's end on disk: the finished marker, and the one rule that reads it.

Every way of resuming (the mixin's ``resume()``, resume points' ``resume_latest``,
the Lightning callback's ``ckpt_path``) follows one rule: once a run is finished,
the place that held something to resume holds a small durable *finished marker*,
and every call that looks for something to resume finds nothing and says the run
is finished. A requeued job whose run already completed can then exit 0 instead of
training the tail again.

Where the marker lives, for the path a run pauses to or keeps its points in:

- a pause file ``run.pt`` -> ``run.pt.finished`` beside it; the pause file itself
  is removed only after the marker is durable (a crash in between leaves both, and
  the marker wins);
- a directory (resume points) -> ``<dir>/run.finished``; the points in it are
  removed by their owner after the marker is durable.

The marker is a checkpoint file like any other (verified header, weights-only
payload): ``{"format": "trainer-resume-finished", "completed_steps": int,
"finished_at": float}``, signed when the run uses a key.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from ._atomic import fsync_directory
from .durable import load_checkpoint, save_checkpoint
from .errors import CheckpointFormatError, RunFinishedError
from .state import FinishedMarker, StrPath

__all__ = [
    "FINISHED_FORMAT",
    "FinishedRun",
    "finished_marker_path",
    "mark_finished",
    "refuse_if_finished",
    "run_finished",
]

FINISHED_FORMAT = "trainer-resume-finished"
_FILE_SUFFIX = ".finished"
_DIRECTORY_MARKER = "run.finished"


class FinishedRun(NamedTuple):
    """What a finished marker records."""

    marker: str
    completed_steps: int
    finished_at: float


def finished_marker_path(path: StrPath) -> str:
    """Return where the finished marker of a pause file or point directory lives."""
    location = os.fspath(path)
    if os.path.isdir(location):
        return os.path.join(location, _DIRECTORY_MARKER)
    return location + _FILE_SUFFIX


def mark_finished(path: StrPath, *, completed_steps: int, key: bytes | None = None) -> str:
    """Mark the run that pauses to ``path`` finished and retire its pause file.

    The marker is written durably first; only then is a pause file at ``path``
    removed (a directory's resume points are removed by their owner afterwards).

    Args:
        path: The run's pause file path, or its resume-point directory.
        completed_steps: The run's final step count, recorded in the marker.
        key: The run's signing key, if it signs its files.

    Returns:
        The marker's path.

    Raises:
        CheckpointWriteError: the marker could not be written; nothing was retired.
    """
    if isinstance(completed_steps, bool) or not isinstance(completed_steps, int):
        raise TypeError(f"completed_steps must be an int, got {completed_steps!r}")
    location = os.fspath(path)
    marker = finished_marker_path(location)
    record: FinishedMarker = {
        "format": FINISHED_FORMAT,
        "completed_steps": completed_steps,
        "finished_at": time.time(),
    }
    save_checkpoint(record, marker, key=key)
    if os.path.isfile(location):
        os.remove(location)
        fsync_directory(os.path.dirname(os.path.abspath(location)))
    return marker


def run_finished(path: StrPath, *, key: bytes | None = None) -> FinishedRun | None:
    """Say whether the run that pauses to ``path`` (file or directory) is finished.

    Args:
        path: A pause file path (it need not exist) or a resume-point directory.
        key: The run's signing key, if it signs its files; the marker is verified.

    Returns:
        The marker's record, or ``None`` when the run is not marked finished.

    Raises:
        CheckpointCorruptedError, CheckpointFormatError, CheckpointSignatureError:
            a marker exists but is damaged, foreign or not signed with ``key``.
    """
    marker = finished_marker_path(path)
    if not os.path.exists(marker):
        return None
    record = load_checkpoint(marker, key=key)
    steps = record.get("completed_steps") if isinstance(record, dict) else None
    if record.get("format") != FINISHED_FORMAT or not isinstance(steps, int):
        raise CheckpointFormatError(f"{marker} is not a trainer-resume finished marker")
    return FinishedRun(marker, steps, float(record.get("finished_at", 0.0)))


def refuse_if_finished(path: StrPath, *, key: bytes | None = None) -> None:
    """Raise ``RunFinishedError`` when the run that pauses to ``path`` is finished."""
    finished = run_finished(path, key=key)
    if finished is not None:
        raise RunFinishedError(
            f"{finished.marker} records the end of the run after step {finished.completed_steps}"
        )
