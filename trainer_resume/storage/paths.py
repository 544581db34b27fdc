"""What the package does with a path that may be a local path or a URL.

Each function does the local thing for a local path (``file://`` included) and the
object-store thing for a URL (:mod:`.objects`). A URL's "directory" is a key prefix:
it exists once an object lies under it and needs no creating.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import torch

from .. import _atomic
from ..errors import CheckpointWriteError
from . import objects
from .urls import (
    basename,
    check_local_path,
    check_location,
    is_url,
    join,
    local_path,
    normalized,
    parent,
)

__all__ = [
    "basename",
    "check_location",
    "exists",
    "is_dir",
    "is_file",
    "is_url",
    "join",
    "list_names",
    "location",
    "make_parent_directory",
    "parent",
    "remove",
    "open_binary",
    "same_location",
    "save_plain_torch_file",
    "size_of",
    "sync_directory",
    "write_file",
]


def location(path: Any) -> str:
    """A path as the package keeps it: a URL as given (scheme checked, 353), a local
    path as a string (``file://`` removed)."""
    path = local_path(os.fspath(path) if isinstance(path, os.PathLike) else path)
    if is_url(path):
        check_location(path)
        return normalized(path).rstrip("/")
    if isinstance(path, str):
        check_local_path(path)
    return os.fspath(path)


def exists(path: Any) -> bool:
    """Whether a file (or object) exists at ``path`` (a local directory counts too)."""
    path = location(path)
    return objects.exists(path) if is_url(path) else os.path.exists(path)


def is_file(path: Any) -> bool:
    path = location(path)
    return objects.exists(path) if is_url(path) else os.path.isfile(path)


def is_dir(path: Any) -> bool:
    """A local directory, or a prefix with objects under it."""
    path = location(path)
    return objects.is_dir(path) if is_url(path) else os.path.isdir(path)


def remove(path: Any) -> None:
    """Remove a file or object (``FileNotFoundError`` when there is none)."""
    path = location(path)
    if is_url(path):
        objects.remove(path)
    else:
        os.remove(path)


def list_names(directory: Any) -> list[str]:
    """The entries of a directory (the object names under a prefix), sorted; [] if none."""
    directory = location(directory)
    if is_url(directory):
        return objects.list_names(directory)
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def make_parent_directory(path: Any) -> None:
    """Create a local file's missing folder durably; nothing for a URL (no folders there)."""
    path = location(path)
    if not is_url(path):
        _atomic.make_parent_directory(path)


def sync_directory(directory: Any) -> None:
    """fsync a local directory after a removal; an object store's removals are durable."""
    directory = location(directory)
    if not is_url(directory):
        _atomic.fsync_directory(directory)


def same_location(a: Any, b: Any) -> bool:
    """Whether two paths name the same place (local ones compared absolute)."""
    a, b = location(a), location(b)
    if is_url(a) or is_url(b):
        return a == b
    return os.path.abspath(a) == os.path.abspath(b)


def size_of(path: Any) -> int:
    path = location(path)
    return objects.size_of(path) if is_url(path) else os.path.getsize(path)


def open_binary(path: Any) -> Any:
    """A seekable binary file object for reading a file or object."""
    path = location(path)
    return objects.open_for_read(path) if is_url(path) else open(path, "rb")


def write_file(path: Any, fill: Callable[[Any], None]) -> None:
    """Write a file durably (:func:`_atomic.replace_atomically`) or an object whole.

    For a URL, ``fill`` writes into memory, which is then uploaded (files written this
    way are exports, not pause files: see ``durable`` for those).

    Raises:
        CheckpointWriteError: nothing was replaced; the previous file or object is intact.
    """
    path = location(path)
    if not is_url(path):
        _atomic.replace_atomically(path, fill)
        return
    buffer = io.BytesIO()
    try:
        fill(buffer)
        objects.upload(path, [buffer.getbuffer()])
    except Exception as exc:
        raise CheckpointWriteError(f"could not write {path}: {exc!r}") from exc


def save_plain_torch_file(obj: Any, path: Any) -> None:
    """``torch.save`` ``obj`` as a plain file or object at ``path`` (see :func:`write_file`)."""
    write_file(path, lambda out: torch.save(obj, out))
