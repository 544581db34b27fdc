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

import math
import os
import time
from typing import Any, NamedTuple

from .durable import load_checkpoint, save_checkpoint
from .errors import CheckpointFormatError, RunFinishedError
from .state import FinishedMarker, StrPath
from .storage import paths

__all__ = [
    "FINISHED_FORMAT",
    "FinishedRun",
    "check_finished_marker",
    "finished_marker_path",
    "is_finished_marker_name",
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
    location = paths.location(path)
    if paths.is_dir(location):
        return paths.join(location, _DIRECTORY_MARKER)
    return location + _FILE_SUFFIX


def is_finished_marker_name(name: str) -> bool:
    """Whether a file name is a finished marker's: a point directory's ``run.finished``,
    or a pause file's name with ``.finished`` appended."""
    return name == _DIRECTORY_MARKER or name.endswith(_FILE_SUFFIX)


def mark_finished(
    path: StrPath, *, completed_steps: int, key: bytes | None = None, retire: bool = True
) -> str:
    """Mark the run that pauses to ``path`` finished and retire its pause file.

    The marker is written durably first; only then is a pause file at ``path``
    removed (a directory's resume points are removed by their owner afterwards).

    Args:
        path: The run's pause file path, or its resume-point directory.
        completed_steps: The run's final step count, recorded in the marker.
        key: The run's signing key, if it signs its files.
        retire: ``False`` keeps a pause file at ``path`` (one the run did not resume
            from); the marker still wins over it.

    Returns:
        The marker's path.

    Raises:
        CheckpointWriteError: the marker could not be written; nothing was retired.
    """
    if isinstance(completed_steps, bool) or not isinstance(completed_steps, int):
        raise TypeError(f"completed_steps must be an int, got {completed_steps!r}")
    location = paths.location(path)
    marker = finished_marker_path(location)
    record: FinishedMarker = {
        "format": FINISHED_FORMAT,
        "completed_steps": completed_steps,
        "finished_at": time.time(),
    }
    save_checkpoint(record, marker, key=key)
    if retire and paths.is_file(location):
        paths.remove(location)
        paths.sync_directory(paths.parent(location))
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
            a marker exists but is damaged, foreign (also: a directory, a FIFO, a
            link to nothing, values of other types) or not signed with ``key``.
    """
    marker = finished_marker_path(path)
    if not (paths.exists(marker) if paths.is_url(marker) else os.path.lexists(marker)):
        return None
    try:
        record = load_checkpoint(marker, key=key)  # a directory or FIFO is refused, not opened
    except FileNotFoundError:
        raise CheckpointFormatError(
            f"{marker} is a link to nothing, not a trainer-resume finished marker"
        ) from None
    return check_finished_marker(record, marker)


def check_finished_marker(record: Any, where: str) -> FinishedRun:
    """Validate a loaded finished marker (its layout and every value's type).

    Raises:
        CheckpointFormatError: not a dict of the marker's format, a step count that
            is not an int >= 0, or a time that is not a number (names the entry).
    """

    def bad(what: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{where} is not a trainer-resume finished marker: {what}")

    if not isinstance(record, dict):
        raise bad(f"it holds a {type(record).__name__}, not a dict")
    if record.get("format") != FINISHED_FORMAT:
        raise bad(f"format {record.get('format')!r}, expected {FINISHED_FORMAT!r}")
    steps, finished_at = record.get("completed_steps"), record.get("finished_at")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise bad(f"completed_steps is {steps!r}, not an int >= 0")
    if (
        isinstance(finished_at, bool)
        or not isinstance(finished_at, (int, float))
        or not math.isfinite(finished_at)
    ):
        raise bad(f"finished_at is {finished_at!r}, not a time in seconds")
    return FinishedRun(where, steps, float(finished_at))


def refuse_if_finished(path: StrPath, *, key: bytes | None = None) -> None:
    """Raise ``RunFinishedError`` when the run that pauses to ``path`` is finished."""
    finished = run_finished(path, key=key)
    if finished is not None:
        raise RunFinishedError(
            f"{finished.marker} records the end of the run after step {finished.completed_steps}; "
            "to train the finished model further (a second fit, more epochs), give that "
            "training a pause path of its own, or remove the marker"
        )
