"""Reading any checkpoint file safely and saying what it is.

trainer-resume's own files (a verified header in front of a ``torch.save``
archive) are verified before anything is unpickled. Other ``torch.save`` archives
(a plain Lightning checkpoint, a state dict) have nothing to verify; they are read
weights-only, so no code in them runs. Anything else is refused.

The kind of a file comes from its content, whichever way it was stored:

=====================  ==========================================================
kind                   content
=====================  ==========================================================
``pause``              a pause file of ``TrainingResumeMixin`` (one process or several)
``lightning pause``    a Lightning checkpoint with ``ResumeCallback``'s pause entry
``lightning``          any other Lightning checkpoint
``finished``           the marker of a finished run (``mark_finished``)
``checkpoint``         anything else in trainer-resume's format (``save_checkpoint``)
``torch``              anything else ``torch.save`` wrote
``safetensors``        a ``.safetensors`` file (its header only: names, dtypes, shapes)
=====================  ==========================================================
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..checks.weights_only import refusal_reason
from ..durable import (
    MARKER,
    CheckpointHeader,
    file_kind,
    load_checkpoint,
    read_checkpoint_header,
)
from ..errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    UnsafeCheckpointError,
)
from ..finished import FINISHED_FORMAT
from ..state import PAUSE_FORMAT
from ..storage import paths
from .lightning import PAUSE_KEY, is_lightning_checkpoint

__all__ = [
    "CHECKPOINT",
    "FINISHED",
    "LIGHTNING",
    "LIGHTNING_PAUSE",
    "PAUSE",
    "SAFETENSORS",
    "TORCH",
    "CheckpointFile",
    "is_trainer_resume_file",
    "kind_of",
    "read_checkpoint_file",
    "tensor_totals",
]

PAUSE = "pause"
LIGHTNING_PAUSE = "lightning pause"
LIGHTNING = "lightning"
FINISHED = "finished"
CHECKPOINT = "checkpoint"
TORCH = "torch"
SAFETENSORS = "safetensors"

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format (the default since torch 1.6)
_SAFETENSORS_LENGTH = struct.Struct("<Q")
_SAFETENSORS_MAX_HEADER = 100 << 20  # the limit safetensors itself enforces


@dataclass(frozen=True)
class CheckpointFile:
    """A checkpoint file, read.

    Attributes:
        path: The file.
        kind: What it holds (see the module docstring).
        content: The loaded object (CPU tensors).
        header: The verified trainer-resume header; ``None`` for a file without one
            (a plain ``torch.save`` archive: read weights-only, nothing verified).
        file_bytes: Size of the file.
    """

    path: str
    kind: str
    content: Any
    header: CheckpointHeader | None
    file_bytes: int

    @property
    def verified(self) -> bool:
        """Whether the bytes were verified against a trainer-resume header."""
        return self.header is not None


def kind_of(content: Any) -> str:
    """The kind of a loaded checkpoint (module docstring); ``checkpoint`` for other content."""
    if isinstance(content, Mapping) and content.get("format") == PAUSE_FORMAT:
        return PAUSE
    if isinstance(content, Mapping) and content.get("format") == FINISHED_FORMAT:
        return FINISHED
    if is_lightning_checkpoint(content):
        return LIGHTNING_PAUSE if PAUSE_KEY in content else LIGHTNING
    return CHECKPOINT


def is_trainer_resume_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file (or object) that starts with trainer-resume's marker:
    a pause file, resume point, finished marker or ``save_checkpoint`` file, whole or not."""
    where = paths.location(path)
    if not paths.is_file(where):
        return False
    with paths.open_binary(where) as handle:
        return bool(handle.read(len(MARKER)) == MARKER)


def read_checkpoint_file(
    path: str | os.PathLike[str], *, key: bytes | None = None, plain: bool = True
) -> CheckpointFile:
    """Verify (when it is ours) and load ``path`` weights-only.

    Args:
        path: The file.
        key: The signing key: the file must then be a trainer-resume file with a
            valid signature.
        plain: Accept a plain ``torch.save`` archive (loaded weights-only, not verified).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointFormatError: Neither a trainer-resume file nor (with ``plain``) a
            ``torch.save`` archive that ``torch.load`` reads, or not a regular file (321).
        CheckpointCorruptedError: A trainer-resume file with truncated or altered bytes, or
            a safetensors file whose tensors' bytes lie beyond its end (322).
        CheckpointSignatureError: ``key`` given and the signature is missing or wrong (339).
        UnsafeCheckpointError: The file holds objects outside the weights-only set (328).
    """
    where = paths.location(path)
    if paths.is_url(where) and not paths.exists(where):
        if paths.is_dir(where):
            raise CheckpointFormatError(f"{where} is a prefix of objects, not a checkpoint file")
        raise FileNotFoundError(where)
    if not paths.is_url(where):
        found = os.stat(where)  # FileNotFoundError as open() would; never blocks (a FIFO)
        if stat.S_ISDIR(found.st_mode):
            raise CheckpointFormatError(f"{where} is a directory, not a checkpoint file")
        if not stat.S_ISREG(found.st_mode):
            raise CheckpointFormatError(
                f"{where} is not a regular file ({file_kind(found.st_mode)})"
            )
    with paths.open_binary(where) as handle:
        start = handle.read(len(_ZIP_MAGIC))
    size = paths.size_of(where)
    tensors = _safetensors_header(where, size)
    if tensors is not None:
        if key is not None or not plain:
            raise CheckpointFormatError(f"{where} is a safetensors file, not a trainer-resume file")
        return CheckpointFile(where, SAFETENSORS, tensors, None, size)
    if start != _ZIP_MAGIC:
        header = read_checkpoint_header(where, key=key)
        content = load_checkpoint(where, key=key)
        return CheckpointFile(where, kind_of(content), content, header, size)
    if key is not None:
        raise CheckpointSignatureError(
            f"{where} is a plain torch.save file without a trainer-resume header"
        )
    if not plain:
        raise CheckpointFormatError(
            f"{where} is a plain torch.save file (no trainer-resume header): "
            "there is nothing to verify"
        )
    content = _load_plain(where)
    kind = kind_of(content)
    return CheckpointFile(where, TORCH if kind == CHECKPOINT else kind, content, None, size)


def _safetensors_header(path: str, size: int) -> dict[str, Any] | None:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON), or None.

    Only the header is read: it names every tensor with its dtype, shape and byte range.
    """
    with paths.open_binary(path) as handle:
        prefix = handle.read(_SAFETENSORS_LENGTH.size)
        if len(prefix) < _SAFETENSORS_LENGTH.size:
            return None
        (length,) = _SAFETENSORS_LENGTH.unpack(prefix)
        if not 2 <= length <= min(size - _SAFETENSORS_LENGTH.size, _SAFETENSORS_MAX_HEADER):
            return None
        text = handle.read(length)
    if not text.startswith(b"{"):
        return None
    try:
        header = json.loads(text)
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    _check_byte_ranges(path, header, size - _SAFETENSORS_LENGTH.size - length)
    return header


def _check_byte_ranges(path: str, header: Mapping[str, Any], data_bytes: int) -> None:
    """Refuse a safetensors file whose tensors' byte ranges lie beyond its data (322)."""
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, Mapping):
            continue
        offsets = info.get("data_offsets")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(offset) is int for offset in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_bytes
        ):
            raise CheckpointCorruptedError(
                f"{path}: safetensors tensor {name!r} has bytes {offsets} but the file holds "
                f"{data_bytes} bytes of tensor data (truncated or altered)"
            )


def _load_plain(path: str) -> Any:
    try:
        if paths.is_url(path):
            with paths.open_binary(path) as handle:
                return torch.load(handle, map_location="cpu", weights_only=True)
        # mmap: a large file is described without reading every tensor into memory.
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(f"{path}: {refusal_reason(error)}") from error
    except (RuntimeError, ValueError, EOFError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise CheckpointFormatError(f"{path}: torch.load cannot read it ({error})") from error


def tensor_totals(value: Any, seen: set[int] | None = None) -> tuple[int, int]:
    """Number and bytes of the distinct tensors in nested state (a shared tensor counts once).

    Pass the same ``seen`` to several calls to count a tensor shared between them once.
    """
    seen = set() if seen is None else seen
    count = size = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if id(item) not in seen:
                seen.add(id(item))
                count += 1
                size += item.numel() * item.element_size()
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count, size
