"""DCP's ``.metadata`` read without running pickled code.

``torch.distributed.checkpoint`` writes its index with the full pickler and reads it
back with ``pickle.load``: whoever can write a pause directory could make any
resume run code. torch's weights-only unpickler refuses DCP's classes, so this
module has its own: a ``pickle.Unpickler`` whose ``find_class`` resolves only the
names DCP's metadata is made of (its dataclasses, ``torch.Size``, dtypes, the
layout and path objects DCP pickles; listed from what DCP 2.13 writes), and
refuses every other global before it is imported. None of these classes runs
code on construction beyond storing its fields.

The loaded index is then checked as the plain data it must be (every entry of
the types above, every storage entry a file of the pause, no stream transforms),
because the unpickler alone only rules out code, not nonsense.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import CheckpointFormatError, UnsafeCheckpointError

__all__ = ["load_metadata", "storage_files"]

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# (module, name) pairs DCP's metadata pickle refers to, and nothing else.
_ALLOWED = {
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    # StorageMeta.checkpoint_id: the writer's path object (pathlib._local from Python 3.13).
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib._local", "PosixPath"),
    ("pathlib._local", "WindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the allowed globals and torch dtypes; refuses the rest unimported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and "." not in name:
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of DCP's metadata")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of DCP's metadata")


def load_metadata(data: bytes, where: str) -> Any:
    """Unpickle DCP's ``.metadata`` (already verified bytes) through the allowlist and check it.

    Args:
        data: The file's bytes.
        where: The file, for messages.

    Returns:
        The ``torch.distributed.checkpoint.metadata.Metadata`` it holds.

    Raises:
        UnsafeCheckpointError: the pickle needs a global outside DCP's metadata
            classes (none of its code ran).
        CheckpointFormatError: a malformed pickle, or an index of other shapes than
            DCP writes.
    """
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if "is not part of DCP's metadata" in str(exc):
            raise UnsafeCheckpointError(f"{where}: {exc}") from exc
        raise CheckpointFormatError(f"{where}: not a DCP metadata pickle ({exc})") from exc
    except Exception as exc:  # noqa: BLE001 - any malformed pickle (EOFError, TypeError, ...)
        raise CheckpointFormatError(
            f"{where}: not a DCP metadata pickle ({type(exc).__name__}: {exc})"
        ) from exc
    _check_index(metadata, where)
    return metadata


def storage_files(metadata: Any) -> set[str]:
    """The files (relative to the DCP directory) the index says hold the data."""
    return {info.relative_path for info in metadata.storage_data.values()}


def _check_index(metadata: Any, where: str) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    def bad(what: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{where}: {what}")

    if not isinstance(metadata, Metadata):
        raise bad(f"holds a {type(metadata).__name__}, not DCP's Metadata")
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict):
        raise bad("state_dict_metadata is not a mapping")
    for key, entry in entries.items():
        if not isinstance(key, str):
            raise bad(f"entry name {key!r} is not a str")
        if isinstance(entry, BytesStorageMetadata):
            continue
        if not isinstance(entry, TensorStorageMetadata):
            raise bad(f"entry {key!r} is a {type(entry).__name__}")
        properties = entry.properties
        if not isinstance(properties, TensorProperties) or not isinstance(
            properties.dtype, torch.dtype
        ):
            raise bad(f"entry {key!r} has no tensor dtype")
        if not _is_size(entry.size) or not isinstance(entry.chunks, list):
            raise bad(f"entry {key!r} has no size and chunk list")
        for chunk in entry.chunks:
            if not isinstance(chunk, ChunkStorageMetadata) or not (
                _is_size(chunk.offsets) and _is_size(chunk.sizes)
            ):
                raise bad(f"entry {key!r} has a malformed chunk")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise bad("storage_data is not a mapping")
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str):
            raise bad(f"storage key {index!r} is not an entry index")
        if (
            not isinstance(info, _StorageInfo)
            or not isinstance(info.relative_path, str)
            or not _are_sizes((info.offset, info.length))
        ):
            raise bad(f"storage of {index.fqn!r} is malformed")
        if getattr(info, "transform_descriptors", None):
            # The pause writer uses none; a transform would make DCP parse other bytes.
            raise bad(
                f"storage of {index.fqn!r} names stream transforms {info.transform_descriptors!r}"
            )


def _is_size(value: Any) -> bool:
    return isinstance(value, torch.Size) and _are_sizes(value)


def _are_sizes(values: Iterable[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
