"""One file per dataset index holding a prepared sample and the key it was built for.

A file is served only when every field of its record matches the requested key,
so a changed seed, lifetime or fingerprint over the same directory never serves
an old sample. Files are replaced atomically (temp file in the same directory,
then ``os.replace``): a reader sees the old file or the new one, never a part.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...checks.weights_only import refused_entry
from ...state import SampleRecord
from .policy import ReuseKey

__all__ = [
    "RECORD_FORMAT",
    "TEMP_SUFFIX",
    "SampleRecord",
    "SaveFn",
    "LoadFn",
    "MISSING",
    "UNREADABLE",
    "check_storable",
    "default_load",
    "default_save",
    "make_record",
    "read_record",
    "record_matches",
    "remove_stale_temporaries",
    "sample_path",
    "write_record",
]

RECORD_FORMAT = "trainer_resume.reuse/1"
TEMP_SUFFIX = ".tmp"

SaveFn = Callable[[Any, str], None]
"""``save(record, path)``: write ``record`` to the file ``path`` (exactly that name)."""
LoadFn = Callable[[str], Any]
"""``load(path) -> record``: read back what ``save`` wrote."""

MISSING: Any = object()
UNREADABLE: Any = object()


def sample_path(directory: Path, index: int) -> Path:
    """The file of ``index``: ``00000123.pt`` (eight digits, more when needed)."""
    return directory / f"{index:08d}.pt"


def make_record(
    key: ReuseKey, *, lifetime: int, fingerprint: str | int | None, sample: Any
) -> SampleRecord:
    """The record stored for ``sample``, built for ``key``."""
    return {
        "format": RECORD_FORMAT,
        "index": key.index,
        "generation": key.generation,
        "seed": key.seed,
        "lifetime": lifetime,
        "fingerprint": fingerprint,
        "sample": sample,
    }


def _same(stored: Any, expected: Any) -> bool:
    # Exact type first: a corrupted record may hold a tensor, whose == is elementwise.
    return type(stored) is type(expected) and stored == expected


def record_matches(
    record: Any, key: ReuseKey, *, lifetime: int, fingerprint: str | int | None
) -> bool:
    """Whether ``record`` holds the sample of ``key`` under this lifetime and fingerprint."""
    return (
        isinstance(record, dict)
        and "sample" in record
        and _same(record.get("format"), RECORD_FORMAT)
        and _same(record.get("index"), key.index)
        and _same(record.get("generation"), key.generation)
        and _same(record.get("seed"), key.seed)
        and _same(record.get("lifetime"), lifetime)
        and _same(record.get("fingerprint"), fingerprint)
    )


def default_save(record: Any, path: str) -> None:
    """``torch.save``; run :func:`check_storable` first so :func:`default_load` can read it back."""
    torch.save(record, path)


def default_load(path: str) -> Any:
    """``torch.load(weights_only=True)`` to CPU: no pickled code runs.

    The content is trusted, though: a file whose record matches the key is served
    as the sample. Point a loader only at directories this library wrote.
    """
    return torch.load(path, map_location="cpu", weights_only=True)


def check_storable(sample: Any, *, index: int) -> None:
    """Check that :func:`default_load` (``weights_only=True``) can read ``sample`` back.

    Raises:
        TypeError: ``sample`` holds a value a weights-only load refuses (see
            :func:`trainer_resume.checks.weights_only.refused_entry`); the message names
            where and the type.
    """
    problem = refused_entry(sample, "sample")
    if problem is not None:
        raise TypeError(
            f"the sample built for index {index} cannot be stored by the default save: {problem}; return "
            "tensors, numbers, str, bytes, None and lists/tuples/sets/dicts of them, or pass save= and load= "
            "callables that handle it"
        )


def read_record(path: Path, load: LoadFn) -> Any:
    """The record at ``path``; :data:`MISSING` when there is none, :data:`UNREADABLE`
    when loading it fails (truncated, corrupt, written by something else)."""
    try:
        return load(os.fspath(path))
    except FileNotFoundError:
        return MISSING
    except Exception:  # any failure to read means "not cached": the caller rebuilds
        return UNREADABLE


def write_record(path: Path, record: Any, save: SaveFn) -> None:
    """Write ``record`` to ``path`` through a temp file in the same directory and
    ``os.replace``; the temp file is removed when anything fails.

    No fsync: these files are a cache. A file that a crash leaves empty or
    truncated fails to load and is rebuilt from the same key with the same result,
    and a file that loads is served only when its record matches the key, so
    flushing to stable storage would cost time on every write and buy nothing.
    """
    # pid + random suffix: two processes writing the same index never share a temp file.
    temp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        save(record, os.fspath(temp))
        os.replace(temp, path)
    except BaseException:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass  # the original error matters more; a leftover is removed at the next start
        raise


def remove_stale_temporaries(directory: Path) -> int:
    """Remove the ``*.tmp`` files an interrupted run left in ``directory``; return how many."""
    removed = 0
    for temp in directory.glob(f"*{TEMP_SUFFIX}"):
        if temp.is_file():
            temp.unlink(missing_ok=True)
            removed += 1
    return removed
