"""Durable, verified checkpoint files.

A checkpoint file is a fixed 88-byte header followed by an ordinary ``torch.save``
zip payload. All integers are little-endian:

======  ====  ==========================================================
offset  size  field
======  ====  ==========================================================
0       8     format marker ``b"\\x89TRCKPT\\n"``
8       2     format version (1)
10      2     flags (bit 0: signed)
12      4     CRC-32 of the 88 header bytes with this field zeroed
16      8     payload length in bytes
24      32    SHA-256 of the payload
56      32    HMAC-SHA256 signature, all zeros when unsigned
======  ====  ==========================================================

The signature is HMAC-SHA256, keyed with the caller's key, over the marker, the
version, the flags, the payload length and the payload's SHA-256 (one pass over
the payload serves both checks). Everything is verified before a single byte is
unpickled, and unpickling is weights-only.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

from ._atomic import DigestingWriter, TempFile, replace_atomically
from ._weights_only import refusal_reason
from .errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    UnsafeCheckpointError,
)

__all__ = ["CheckpointHeader", "save_checkpoint", "load_checkpoint", "read_checkpoint_header"]

MARKER = b"\x89TRCKPT\n"  # the non-ASCII first byte keeps text tools from taking it for text
FORMAT_VERSION = 1
FLAG_SIGNED = 1
_KNOWN_FLAGS = FLAG_SIGNED
_HEADER = struct.Struct("<8sHHIQ32s32s")
HEADER_SIZE = _HEADER.size
_CRC_SLICE = slice(12, 16)
_ZIP_MAGIC = b"PK\x03\x04"
_NO_SIGNATURE = bytes(32)
_CHUNK = 1 << 20

MapLocation = Any  # whatever torch.load accepts: str, torch.device, dict or callable


@dataclass(frozen=True)
class CheckpointHeader:
    """What a checkpoint file's verified header says about it.

    Attributes:
        format_version: Version of the file layout.
        payload_length: Size in bytes of the ``torch.save`` payload.
        sha256: Hex SHA-256 of the payload (checked against the bytes).
        signed: Whether the file carries an HMAC signature.
    """

    format_version: int
    payload_length: int
    sha256: str
    signed: bool


def save_checkpoint(obj: Any, path: str | os.PathLike[str], *, key: bytes | None = None) -> None:
    """Write ``obj`` to ``path`` durably, replacing the previous file atomically.

    The payload is streamed to a temp file next to ``path`` while it is hashed,
    so no second serialized copy is held in memory. ``obj`` should hold only
    weights-only-safe values (tensors, numbers, str, None, lists, tuples, dicts);
    anything else is written but :func:`load_checkpoint` refuses it.

    Args:
        obj: The state to save.
        path: Target file. Its directory must exist.
        key: Optional HMAC key; the file is then signed so that
            ``load_checkpoint(..., key=key)`` detects tampering.

    Raises:
        CheckpointWriteError: Serialization or any write step failed (the cause
            is chained). The previous file at ``path`` is intact and no temp
            file is left; a retry may succeed.
        TypeError, ValueError: ``key`` is not non-empty bytes.
    """
    key = _check_key(key)
    target = os.fsdecode(path)

    def fill(out: TempFile) -> None:
        out.write(bytes(HEADER_SIZE))  # placeholder: the digest is known only at the end
        with DigestingWriter(out) as sink:
            try:
                torch.save(obj, sink)
            except Exception:
                sink.raise_write_error()
                raise
            sink.raise_write_error()
        out.seek(0)
        out.write(_pack_header(sink.length, sink.sha256.digest(), key))

    replace_atomically(target, fill)


def load_checkpoint(
    path: str | os.PathLike[str], *, map_location: MapLocation = "cpu", key: bytes | None = None
) -> Any:
    """Verify and load a file written by :func:`save_checkpoint`.

    Marker, version, length, SHA-256 and (with ``key``) the signature are checked
    before anything is unpickled; unpickling is ``torch.load(weights_only=True)``.

    Args:
        path: The checkpoint file.
        map_location: Passed to ``torch.load``.
        key: When given, the file must carry a valid signature made with it.

    Returns:
        The saved object.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointFormatError: Not a checkpoint of this format (321).
        CheckpointCorruptedError: Truncated or altered bytes (322).
        CheckpointSignatureError: ``key`` given and the signature is missing or wrong (339).
        UnsafeCheckpointError: The payload needs objects outside the weights-only set (328);
            none of its code ran.
    """
    key = _check_key(key)
    where = os.fsdecode(path)
    with open(where, "rb", buffering=0) as raw:
        header = _verify(raw, where, key)
        payload = _PayloadReader(raw, HEADER_SIZE, header.payload_length)
        try:
            return torch.load(payload, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(f"{where}: {refusal_reason(exc)}") from exc


def read_checkpoint_header(
    path: str | os.PathLike[str], *, key: bytes | None = None
) -> CheckpointHeader:
    """Verify a checkpoint file without unpickling it and describe it.

    Args:
        path: The checkpoint file.
        key: When given, the signature is verified too.

    Returns:
        The verified header.

    Raises:
        FileNotFoundError, CheckpointFormatError, CheckpointCorruptedError,
        CheckpointSignatureError: As for :func:`load_checkpoint`.
    """
    key = _check_key(key)
    where = os.fsdecode(path)
    with open(where, "rb", buffering=0) as raw:
        return _verify(raw, where, key)


def _check_key(key: Any) -> bytes | None:
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if not key:
        raise ValueError("key must not be empty")
    return bytes(key)


def _signature(key: bytes, flags: int, length: int, digest: bytes) -> bytes:
    message = MARKER + struct.pack("<HHQ", FORMAT_VERSION, flags, length) + digest
    return hmac.new(key, message, hashlib.sha256).digest()


def _pack_header(length: int, digest: bytes, key: bytes | None) -> bytes:
    flags = FLAG_SIGNED if key is not None else 0
    signature = _signature(key, flags, length, digest) if key is not None else _NO_SIGNATURE
    header = bytearray(_HEADER.pack(MARKER, FORMAT_VERSION, flags, 0, length, digest, signature))
    header[_CRC_SLICE] = struct.pack("<I", zlib.crc32(header))
    return bytes(header)


def _verify(raw: BinaryIO, path: str, key: bytes | None) -> CheckpointHeader:
    size = os.fstat(raw.fileno()).st_size
    head = raw.read(HEADER_SIZE) or b""
    marker = head[: len(MARKER)]
    if marker != MARKER:
        if MARKER.startswith(marker):
            raise CheckpointCorruptedError(f"{path} is truncated ({size} bytes)")
        if sum(a != b for a, b in zip(marker, MARKER)) == 1:
            # One damaged byte of the marker is damage, not some other kind of file.
            raise CheckpointCorruptedError(f"{path}: format marker is damaged")
        raise CheckpointFormatError(f"{path} does not start with the trainer-resume marker")
    if len(head) < HEADER_SIZE:
        raise CheckpointCorruptedError(f"{path} is truncated inside the header ({size} bytes)")
    _, version, flags, crc, length, digest, signature = _HEADER.unpack(head)
    unsummed = bytearray(head)
    unsummed[_CRC_SLICE] = bytes(4)
    if zlib.crc32(unsummed) != crc:
        raise CheckpointCorruptedError(f"{path}: header checksum mismatch")
    if version != FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{path} has format version {version}; this version reads {FORMAT_VERSION}"
        )
    if flags & ~_KNOWN_FLAGS:
        raise CheckpointFormatError(f"{path} has unknown flags {flags:#06x}")
    if HEADER_SIZE + length != size:
        raise CheckpointCorruptedError(
            f"{path}: header announces a {length}-byte payload, file holds {size - HEADER_SIZE}"
        )
    signed = bool(flags & FLAG_SIGNED)
    if key is not None and not signed:
        raise CheckpointSignatureError(f"{path} is not signed")
    if _payload_sha256(raw, length) != digest:
        raise CheckpointCorruptedError(f"{path}: payload SHA-256 mismatch")
    if key is not None and not hmac.compare_digest(
        signature, _signature(key, flags, length, digest)
    ):
        raise CheckpointSignatureError(f"{path}: signature does not match the key")
    raw.seek(HEADER_SIZE)
    if raw.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
        raise CheckpointFormatError(f"{path}: payload is not a torch.save archive")
    return CheckpointHeader(FORMAT_VERSION, length, digest.hex(), signed)


def _payload_sha256(raw: BinaryIO, length: int) -> bytes:
    sha = hashlib.sha256()
    buffer = memoryview(bytearray(min(_CHUNK, max(length, 1))))
    raw.seek(HEADER_SIZE)
    remaining = length
    while remaining:
        got = raw.readinto(buffer[: min(len(buffer), remaining)])
        if not got:
            break  # shrank while being read: the digest cannot match
        sha.update(buffer[:got])
        remaining -= got
    return sha.digest()


class _PayloadReader(io.RawIOBase):
    """Read-only view of ``length`` bytes of ``raw`` from ``offset``, for ``torch.load``."""

    def __init__(self, raw: BinaryIO, offset: int, length: int) -> None:
        super().__init__()
        self._raw = raw
        self._offset = offset
        self._length = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        if base + pos < 0:
            raise ValueError(f"negative seek position {base + pos}")
        self._pos = base + pos
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self._length - self._pos)
        if wanted <= 0:
            return 0
        self._raw.seek(self._offset + self._pos)
        done = 0
        while done < wanted:
            got = self._raw.readinto(view[done:wanted])
            if not got:
                break
            done += got
        self._pos += done
        return done
