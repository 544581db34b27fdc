"""The files of a resume-point directory: names, the newest valid one, retention.

A resume-point directory holds resume points (``point-<completed steps>.ckpt``, 12
digits, so names sort by step), pause files written into it under any other name,
and, once the run is finished, the ``run.finished`` marker. Temp files of a writer
that was killed mid-write (hidden names ending in ``.tmp``) are never taken for a
checkpoint and are removed once their writer is gone; so is the writer's lock file
(see :mod:`._lock`).

Only regular files are candidates: an entry is checked with ``lstat`` (a symlink
is not followed) and opened without waiting (a FIFO put in its place is refused,
never blocked on).

"Newest" means the most completed steps, as the verified contents say: a point's
name only orders the search. A candidate that fails verification (truncated,
altered, foreign), or a point whose contents hold another step than its name (a
point copied or renamed), is skipped with a :class:`SkippedCheckpointWarning`
naming it and the reason, and the next older one is tried; so is one that
vanished since the directory was listed (a running writer's retention removed
it), without a warning. A pause file wins a tie with a point (both hold the same
state). A wrong signature or a file that is not weights-only safe is not skipped:
it is raised, because it is not an accident.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from .._atomic import remove_stale_temps
from ..durable import load_checkpoint
from ..errors import CheckpointCorruptedError, CheckpointFormatError, SkippedCheckpointWarning
from ..finished import is_finished_marker_name, refuse_if_finished
from ..state import StrPath
from ..storage import objects, paths

__all__ = [
    "Candidate",
    "Found",
    "candidates",
    "latest_checkpoint",
    "newest_checkpoint",
    "list_points",
    "point_name",
    "point_steps",
    "remove_points",
    "remove_stale_temp_files",
    "require_directory",
    "retain_points",
]

_POINT = re.compile(r"point-(\d{12})\.ckpt")

# Reads the completed steps out of a loaded pause file (the layouts differ by trainer).
StepsOf = Callable[[Any], int]
# Reads and verifies one file (default: load_checkpoint with the run's key).
Load = Callable[[str], Any]
# Listings of a directory whose chosen points all vanished before they were read, at most.
_RESCANS = 100


class Candidate(NamedTuple):
    """A file that may hold the newest state of the run."""

    path: str
    completed_steps: int
    is_point: bool


class Found(NamedTuple):
    """The newest valid file of a directory, loaded (verified) once."""

    path: str
    completed_steps: int
    checkpoint: Any


def point_name(completed_steps: int) -> str:
    """The file name of the resume point taken after ``completed_steps`` steps."""
    return f"point-{completed_steps:012d}.ckpt"


def point_steps(path: StrPath) -> int | None:
    """The completed steps of the resume point at ``path``, from its name; ``None`` for another file."""
    match = _POINT.fullmatch(paths.basename(path))
    return int(match.group(1)) if match else None


def list_points(directory: StrPath) -> list[tuple[int, str]]:
    """``(completed_steps, path)`` of every resume point in ``directory`` by name, oldest first."""
    location = paths.location(directory)
    points = []
    for entry in _entries(location):
        match = _POINT.fullmatch(entry)
        if match:
            points.append((int(match.group(1)), paths.join(location, entry)))
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
    """Every point and pause file of ``directory``, newest first (read-only: for describing it).

    A point's step comes from its name; a pause file is loaded (verified) to read
    its step, and skipped with a warning when that fails.
    """
    location = paths.location(directory)
    points, pauses, _ = _listing(location)
    found = [Candidate(path, steps, True) for steps, path in points]
    for path in pauses:
        try:
            found.append(Candidate(path, steps_of(load_checkpoint(path, key=key)), False))
        except FileNotFoundError:
            continue
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            _skip(path, error)
    # Most steps first; at equal steps the pause file first (it was written synchronously).
    return sorted(found, key=lambda c: (c.completed_steps, not c.is_point), reverse=True)


def newest_checkpoint(
    directory: StrPath,
    *,
    key: bytes | None = None,
    steps_of: StepsOf = completed_steps_of,
    load: Load | None = None,
    exclude: Collection[str] = (),
) -> Found | None:
    """The newest complete, valid point or pause file of ``directory``, loaded once; or ``None``.

    Temp files of killed writers are removed first. Every candidate is read whole
    and verified, and its step is taken from its contents; damaged candidates and
    points whose contents disagree with their names are skipped with a
    :class:`SkippedCheckpointWarning`, candidates that vanish while they are read
    are passed over (and the directory listed again when nothing else is left).

    Args:
        directory: The resume-point directory.
        key: The run's signing key (for the finished marker, and for ``load``'s default).
        steps_of: Reads the completed steps out of a loaded file.
        load: Reads and verifies one file (default: ``load_checkpoint(path, key=key)``).
        exclude: Paths not to take (already found gone elsewhere).

    Raises:
        RunFinishedError: the directory holds the run's finished marker.
        CheckpointSignatureError: ``key`` given and the newest file is not signed with it.
        UnsafeCheckpointError: the newest file holds objects outside the weights-only set.
        CheckpointCorruptedError: every point chosen was removed before it could be
            read, listing after listing (something removes points as fast as they
            are listed).
    """
    location = paths.location(directory)
    require_directory(location)
    read = load if load is not None else (lambda path: load_checkpoint(path, key=key))
    for _ in range(_RESCANS):
        # A prefix with nothing under it is no "directory", but may have a finished
        # marker beside it (a run finished before its first point): looked for below.
        if not paths.is_url(location) and not os.path.isdir(location):
            return None
        refuse_if_finished(location, key=key)
        if not paths.is_url(location):  # a live writer's upload is not visible as stale
            remove_stale_temp_files(location)
        found, vanished = _newest_listed(location, read, steps_of, set(exclude))
        if found is not None or not vanished:
            return found
    raise CheckpointCorruptedError(
        f"{location}: the newest point vanished before it could be read in {_RESCANS} listings "
        "in a row; is another process removing points?"
    )


def require_directory(location: str) -> None:
    """Refuse a file given where a resume-point directory is expected (321): taken for an
    empty directory, it would start the run over beside its pause file."""
    if paths.is_file(location):
        raise CheckpointFormatError(
            f"{location} is a file, not a resume-point directory: resume(path) resumes from "
            "one pause file, resume_latest(directory) from the newest file of a directory"
        )


def latest_checkpoint(
    directory: StrPath, *, key: bytes | None = None, steps_of: StepsOf = completed_steps_of
) -> str | None:
    """The path of :func:`newest_checkpoint` (``None`` when there is none); same errors."""
    found = newest_checkpoint(directory, key=key, steps_of=steps_of)
    return None if found is None else found.path


def _newest_listed(
    location: str, read: Load, steps_of: StepsOf, exclude: set[str]
) -> tuple[Found | None, bool]:
    """The newest valid file of one listing, and whether a candidate vanished on the way."""
    # A listing that lost an entry may have missed the point that replaced it.
    points, pauses, vanished = _listing(location)
    best: Found | None = None  # the pause file with the most steps: its step is in its contents
    for path in pauses:
        if path in exclude:
            continue
        try:
            checkpoint = read(path)
            found = Found(path, steps_of(checkpoint), checkpoint)
        except FileNotFoundError:
            vanished = True
            continue
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            _skip(path, error)
            continue
        if best is None or found.completed_steps > best.completed_steps:
            best = found
    for named, path in reversed(points):
        if best is not None and best.completed_steps >= named:
            break  # the pause file wins the tie
        if path in exclude:
            continue
        try:
            checkpoint = read(path)
            steps = steps_of(checkpoint)
        except FileNotFoundError:
            vanished = True
            continue
        except (CheckpointCorruptedError, CheckpointFormatError) as error:
            _skip(path, error)
            continue
        if steps != named:
            _skip(path, f"it holds step {steps}, its name says {named} (copied or renamed)")
            continue
        return Found(path, steps, checkpoint), vanished
    return best, vanished


def _listing(location: str) -> tuple[list[tuple[int, str]], list[str], bool]:
    """The regular files of a directory: points by step from their names, oldest first,
    the other (pause) files, and whether a listed entry vanished before it was looked
    at (a writer's retention removed it: a newer point may have come in its place). A
    point name that is no regular file is skipped with a warning; symlinks are not
    followed."""
    points: list[tuple[int, str]] = []
    pauses: list[str] = []
    vanished = False
    for entry in _entries(location):
        # The directory's finished marker, or a pause file's: not a pause file itself.
        if entry.startswith(".") or is_finished_marker_name(entry):
            continue
        path = paths.join(location, entry)
        match = _POINT.fullmatch(entry)
        if paths.is_url(path):  # a listed object is a whole object, never a link or a FIFO
            if match:
                points.append((int(match.group(1)), path))
            else:
                pauses.append(path)
            continue
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            vanished = True
            continue
        if not stat.S_ISREG(mode):
            if match:
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                _skip(path, f"it is {kind}; only regular files are resume points")
            continue
        if match:
            points.append((int(match.group(1)), path))
        else:
            pauses.append(path)
    return sorted(points), pauses, vanished


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
        paths.sync_directory(directory)
    return doomed


def remove_points(directory: StrPath) -> list[str]:
    """Remove every resume point of ``directory`` (after the run's finished marker is durable)."""
    doomed = [path for _, path in list_points(directory)]
    for path in doomed:
        _remove(path)
    remove_stale_temp_files(directory)
    paths.sync_directory(directory)
    return doomed


def remove_stale_temp_files(directory: StrPath) -> None:
    """Remove the temp files of writers (any target name) that are no longer running; at a
    URL, abort the incomplete uploads under it that this process is not sending."""
    location = paths.location(directory)
    if paths.is_url(location):
        objects.abort_stale_uploads(location)
    else:
        remove_stale_temps(location)


def _entries(location: str) -> list[str]:
    return paths.list_names(location)


def _remove(path: str) -> None:
    try:
        paths.remove(path)
    except FileNotFoundError:
        pass


def _skip(path: str, error: BaseException) -> None:
    warnings.warn(SkippedCheckpointWarning(f"skipped {path}: {error}"), stacklevel=3)
