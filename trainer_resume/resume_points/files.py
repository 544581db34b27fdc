"""The files of a resume-point directory: names, the newest valid one, retention.

A resume-point directory holds resume points (``point-<completed steps>.ckpt``, 12
digits, so names sort by step), pause files written into it under any other name,
and, once the run is finished, the ``run.finished`` marker. Temp files of a writer
that was killed mid-write (hidden names ending in ``.tmp``) are never taken for a
checkpoint and are removed once their writer is gone.

"Newest" means the most completed steps; a pause file wins a tie with a point (both
hold the same state). A candidate that fails verification (truncated, altered,
foreign) is skipped with a :class:`SkippedCheckpointWarning` naming it and the
reason, and the next older one is tried. A wrong signature or a file that is not
weights-only safe is not skipped: it is raised, because it is not an accident.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from .._atomic import fsync_directory, remove_stale_temps
from ..durable import load_checkpoint, read_checkpoint_header
from ..errors import CheckpointCorruptedError, CheckpointFormatError, SkippedCheckpointWarning
from ..finished import finished_marker_path, refuse_if_finished
from ..state import StrPath

__all__ = [
    "Candidate",
    "candidates",
    "latest_checkpoint",
    "list_points",
    "point_name",
    "point_steps",
    "remove_points",
    "remove_stale_temp_files",
    "retain_points",
]

_POINT = re.compile(r"point-(\d{12})\.ckpt")
# The temp-file names of _atomic.replace_atomically: ".<target>.<pid>.<16 hex>.tmp".
_TEMP = re.compile(r"\.(?P<target>.+)\.\d+\.[0-9a-f]{16}\.tmp")

# Reads the completed steps out of a loaded pause file (the layouts differ by trainer).
StepsOf = Callable[[Any], int]


class Candidate(NamedTuple):
    """A file that may hold the newest state of the run."""

    path: str
    completed_steps: int
    is_point: bool


def point_name(completed_steps: int) -> str:
    """The file name of the resume point taken after ``completed_steps`` steps."""
    return f"point-{completed_steps:012d}.ckpt"


def point_steps(path: StrPath) -> int | None:
    """The completed steps of the resume point at ``path``, from its name; ``None`` for another file."""
    match = _POINT.fullmatch(os.path.basename(os.fspath(path)))
    return int(match.group(1)) if match else None


def list_points(directory: StrPath) -> list[tuple[int, str]]:
    """``(completed_steps, path)`` of every resume point in ``directory``, oldest first."""
    location = os.fspath(directory)
    points = []
    for entry in _entries(location):
        match = _POINT.fullmatch(entry)
        if match:
            points.append((int(match.group(1)), os.path.join(location, entry)))
    return sorted(points)


def completed_steps_of(checkpoint: Any) -> int:
    """The step count of a mixin pause file (``completed_steps``)."""
    steps = checkpoint.get("completed_steps") if isinstance(checkpoint, dict) else None
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise CheckpointFormatError("no 'completed_steps' entry: not a pause file")
    return steps


def candidates(
    directory: StrPath, *, key: bytes | None = None, steps_of: StepsOf = completed_steps_of
) -> list[Candidate]:
    """Every point and pause file of ``directory``, newest first.

    A point's step comes from its name; a pause file is loaded (verified) to read
    its step, and skipped with a warning when that fails.
    """
    location = os.fspath(directory)
    marker = os.path.basename(finished_marker_path(location))
    found = [Candidate(path, steps, True) for steps, path in list_points(location)]
    for entry in _entries(location):
        path = os.path.join(location, entry)
        if (
            entry.startswith(".")
            or entry == marker
            or _POINT.fullmatch(entry)
            or not os.path.isfile(path)
        ):
            continue
        try:
            found.append(Candidate(path, steps_of(load_checkpoint(path, key=key)), False))
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            _skip(path, error)
    # Most steps first; at equal steps the pause file first (it was written synchronously).
    return sorted(found, key=lambda c: (c.completed_steps, not c.is_point), reverse=True)


def latest_checkpoint(
    directory: StrPath, *, key: bytes | None = None, steps_of: StepsOf = completed_steps_of
) -> str | None:
    """The newest complete, verified point or pause file of ``directory``, or ``None``.

    Temp files of killed writers are removed first. Damaged candidates are skipped
    with a :class:`SkippedCheckpointWarning`.

    Raises:
        RunFinishedError: the directory holds the run's finished marker.
        CheckpointSignatureError: ``key`` given and the newest file is not signed with it.
    """
    location = os.fspath(directory)
    if not os.path.isdir(location):
        return None
    refuse_if_finished(location, key=key)
    remove_stale_temp_files(location)
    for candidate in candidates(location, key=key, steps_of=steps_of):
        if not candidate.is_point:
            return candidate.path  # verified while its step was read
        try:
            read_checkpoint_header(candidate.path, key=key)
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            _skip(candidate.path, error)
            continue
        return candidate.path
    return None


def retain_points(directory: StrPath, newest: int, keep: int) -> list[str]:
    """Remove points older than the durable point at step ``newest`` beyond the ``keep`` newest.

    Points at later steps than ``newest`` (left by a run that was resumed from an
    older file) are left alone: the run overwrites them as it passes their steps.

    Returns:
        The removed paths.
    """
    older = [path for steps, path in list_points(directory) if steps < newest]
    doomed = older[: max(0, len(older) - (keep - 1))]
    for path in doomed:
        _remove(path)
    if doomed:
        fsync_directory(os.fspath(directory))
    return doomed


def remove_points(directory: StrPath) -> list[str]:
    """Remove every resume point of ``directory`` (after the run's finished marker is durable)."""
    doomed = [path for _, path in list_points(directory)]
    for path in doomed:
        _remove(path)
    remove_stale_temp_files(directory)
    fsync_directory(os.fspath(directory))
    return doomed


def remove_stale_temp_files(directory: StrPath) -> None:
    """Remove the temp files of writers (any target name) that are no longer running."""
    location = os.fspath(directory)
    targets = {
        match.group("target") for entry in _entries(location) if (match := _TEMP.fullmatch(entry))
    }
    for target in sorted(targets):
        remove_stale_temps(location, target)


def _entries(location: str) -> list[str]:
    try:
        return sorted(os.listdir(location))
    except FileNotFoundError:
        return []


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _skip(path: str, error: BaseException) -> None:
    warnings.warn(SkippedCheckpointWarning(f"skipped {path}: {error}"), stacklevel=3)
