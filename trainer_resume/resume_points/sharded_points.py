"""Resume points of sharded models: a sharded pause directory per point, written in the background.

A point of a trainer with a model sharded by FSDP2 (``fully_shard``) or DTensor is a
sharded pause directory (the layout of :mod:`trainer_resume.sharded.write`) named
``point-<completed steps>.sharded`` in the resume-point directory. Every rank copies its
shards (:func:`~trainer_resume.sharded.write.host_copy`) and its rank state to host
memory at the step boundary, which is all the step waits for; each rank's writer thread
then writes its shards through ``torch.distributed.checkpoint``, its rank file and the
digests of its share of the files, and rank 0 commits the point with the manifest,
written last. The writers' collectives run on a gloo group of their own, so they never
interleave with the training thread's.

A point is either committed (its manifest names every file with its BLAKE3 digest) or
ignored: a rank killed mid-write leaves a directory without a manifest, never chosen.
Older points are removed by rank 0 only after the newer one is committed, keeping
``keep`` committed points; directories of incomplete points older than the newest
committed one go with them.
"""

from __future__ import annotations

import os
import re
import shutil

from .._atomic import fsync_directory
from ..durable import load_checkpoint
from ..errors import CheckpointCorruptedError, CheckpointFormatError
from ..sharded.manifest import MANIFEST_NAME, check_manifest
from ..state import StrPath

__all__ = [
    "committed_sharded",
    "is_sharded_point",
    "list_sharded_points",
    "retain_sharded_points",
    "sharded_point_name",
]

_SHARDED_POINT = re.compile(r"point-(\d{12})\.sharded")


def sharded_point_name(completed_steps: int) -> str:
    """The directory name of the sharded point taken after ``completed_steps`` steps."""
    return f"point-{completed_steps:012d}.sharded"


def is_sharded_point(path: StrPath) -> bool:
    """Whether ``path`` is named as a sharded resume point (not a pause directory)."""
    return _SHARDED_POINT.fullmatch(os.path.basename(os.fspath(path))) is not None


def list_sharded_points(directory: StrPath) -> list[tuple[int, str, bool]]:
    """``(completed_steps, path, committed)`` of every sharded point directory, oldest first."""
    location = os.fspath(directory)
    try:
        entries = sorted(os.listdir(location))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _SHARDED_POINT.fullmatch(entry)
        path = os.path.join(location, entry)
        if match and os.path.isdir(path) and not os.path.islink(path):
            committed = os.path.isfile(os.path.join(path, MANIFEST_NAME))
            found.append((int(match.group(1)), path, committed))
    return found


def committed_sharded(directory: StrPath, *, key: bytes | None) -> list[tuple[int, str]]:
    """``(completed_steps, path)`` of the committed sharded pauses of ``directory``, newest first.

    The sharded points and any other sharded pause directory there (a pause on a signal
    into the points directory), each by its verified manifest's step; a pause wins a tie.
    A manifest that fails verification is left out here; its directory's files are
    checked when it is opened.
    """
    location = os.fspath(directory)
    found: list[tuple[int, bool, str]] = []
    try:
        entries = sorted(os.listdir(location))
    except FileNotFoundError:
        return []
    for entry in entries:
        path = os.path.join(location, entry)
        manifest_path = os.path.join(path, MANIFEST_NAME)
        if os.path.islink(path) or not os.path.isfile(manifest_path):
            continue
        try:
            manifest = check_manifest(load_checkpoint(manifest_path, key=key), manifest_path)
        except (FileNotFoundError, CheckpointCorruptedError, CheckpointFormatError):
            continue
        is_point = _SHARDED_POINT.fullmatch(entry) is not None
        found.append((manifest["completed_steps"], not is_point, path))
    return [(steps, path) for steps, _, path in sorted(found, reverse=True)]


def retain_sharded_points(directory: StrPath, newest: int, keep: int) -> list[str]:
    """After the point at step ``newest`` is committed: keep the ``keep`` newest committed points
    up to it; remove older ones and incomplete points older than it.

    Returns:
        The removed directories.
    """
    points = [(steps, path, done) for steps, path, done in list_sharded_points(directory)]
    older_committed = [path for steps, path, done in points if done and steps < newest]
    doomed = older_committed[: max(0, len(older_committed) - (keep - 1))]
    doomed += [path for steps, path, done in points if not done and steps < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    if doomed:
        try:
            fsync_directory(os.fspath(directory))
        except OSError:
            pass  # a removal that is not durable leaves garbage for the next retention
    return doomed
