"""The file ``resume_latest`` resumes from, read once.

One process: the newest valid file of the directory (see
:func:`~trainer_resume.resume_points.files.newest_checkpoint`), resumed from the read
that chose it. Under a process group rank 0 chooses (reading the file once) and
every other rank reads the file chosen; when it vanished before some rank could read
it (a running writer's retention removed it), rank 0 chooses again without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .. import distributed as _distributed
from ..errors import CheckpointCorruptedError
from ..resume_points.files import Found, Load, newest_checkpoint
from ..state import StrPath

__all__ = ["latest_to_resume"]

# A chosen file's path and what reading it gave (the checkpoint, or this rank's error).
Chosen = tuple[str, Callable[[], Any]]

_GONE = object()  # a file that vanished before this rank read it
_CHOICES = 100  # choices under a process group whose file vanished, at most


def latest_to_resume(directory: StrPath, *, key: bytes | None, load: Load) -> Chosen | None:
    """Every rank: the file to resume from and its contents as read, or ``None`` (nothing yet).

    Raises:
        RunFinishedError, CheckpointSignatureError, UnsafeCheckpointError,
        CheckpointCorruptedError: as :func:`newest_checkpoint` (on every rank under a
            process group); ``CheckpointCorruptedError`` also when the file chosen
            vanished before every rank read it, 100 times in a row.
    """
    if not _distributed.is_distributed():
        found = newest_checkpoint(directory, key=key, load=load)
        return None if found is None else (found.path, functools.partial(_given, found.checkpoint))
    gone: list[str] = []
    for _ in range(_CHOICES):
        path, found = _chosen_on_rank_zero(directory, key, load, gone)
        if path is None:
            return None
        outcome: Any = found.checkpoint if found is not None else _read(load, path)
        if _distributed.any_rank(outcome is _GONE):
            gone.append(path)
            continue
        # A rank's failure to read is raised when the checkpoint is taken, where the
        # resume announces it to every rank.
        return path, functools.partial(_given, outcome)
    raise CheckpointCorruptedError(
        f"{directory}: every file chosen was removed before all ranks could read it, "
        f"{_CHOICES} times in a row"
    )


def _chosen_on_rank_zero(
    directory: StrPath, key: bytes | None, load: Load, gone: list[str]
) -> tuple[str | None, Found | None]:
    """Every rank: the path rank 0 chose; rank 0 also: the file as it read it."""
    found: Found | None = None

    def choose() -> str | None:
        nonlocal found
        found = newest_checkpoint(directory, key=key, load=load, exclude=gone)
        return None if found is None else found.path

    return _distributed.rank_zero_result(choose), found


def _read(load: Load, path: str) -> Any:
    try:
        return load(path)
    except FileNotFoundError:
        return _GONE
    except Exception as error:  # noqa: BLE001 - raised by _given, where the resume handles it
        return error


def _given(outcome: Any) -> Any:
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
