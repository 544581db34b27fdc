"""The checkpoint file header: layout, format versions, digests, signatures and keys.

Every checkpoint file is a fixed 88-byte header followed by an ordinary
``torch.save`` zip payload. All integers are little-endian:

======  ====  ==========================================================
offset  size  field
======  ====  ==========================================================
0       8     format marker ``b"\\x89TRCKPT\\n"``
8       2     format version (2; version 1 is still read)
10      2     flags (bit 0: signed)
12      4     CRC-32 of the 88 header bytes with this field zeroed
16      8     payload length in bytes
24      32    digest of the payload
56      32    signature, all zeros when unsigned
======  ====  ==========================================================

The signature covers the marker, the version, the flags, the payload length and
the payload digest, so one pass over the payload serves both checks.

Version 2 (written): the digest is BLAKE3 and the signature keyed BLAKE3. BLAKE3
is a cryptographic hash (collision and preimage resistant like SHA-256) that runs
several times faster than SHA-256 on one core and spreads over more cores, so
hashing no longer costs more than writing the bytes to the page cache. Its keyed
mode is a MAC in its own right (no HMAC construction needed); it takes a 32-byte
key, which is derived from the caller's key (any length from
:data:`MIN_KEY_BYTES`) with BLAKE3's key derivation mode and the fixed context
string :data:`KEY_CONTEXT`.

Version 1 (read only): SHA-256 digest, HMAC-SHA256 signature with the key as given.

Without a key the digest detects accidental damage (torn writes, bit rot,
truncation, a file swapped for another of this format would still have to carry
its own matching digest): anyone who can write the file can also write a matching
digest. Only a signature made with a key the writer does not hold detects
deliberate tampering.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

import blake3

from ..errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
)

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "KEY_CONTEXT",
    "MARKER",
    "MIN_KEY_BYTES",
    "Hasher",
    "Header",
    "check_key",
    "new_hasher",
    "usable_cores",
    "pack_header",
    "parse_header",
    "verify_signature",
]

MARKER = b"\x89TRCKPT\n"  # the non-ASCII first byte keeps text tools from taking it for text
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FLAG_SIGNED = 1
_KNOWN_FLAGS = FLAG_SIGNED
_LAYOUT = struct.Struct("<8sHHIQ32s32s")
HEADER_SIZE = _LAYOUT.size
_CRC_SLICE = slice(12, 16)
_NO_SIGNATURE = bytes(32)
ALGORITHMS = {1: "SHA-256", 2: "BLAKE3"}

# A key shorter than this is refused: a MAC is as strong as its key is hard to guess.
MIN_KEY_BYTES = 16
# BLAKE3 key derivation context: fixed, globally unique, never reused for another purpose.
KEY_CONTEXT = "trainer-resume 2026-11 checkpoint signing key for format version 2"
# Hashing a buffer from this size on may use several threads (BLAKE3 is tree-parallel).
THREADED_HASH_MIN = 4 << 20


class Hasher(Protocol):
    """The part of a hashlib / blake3 hasher the checkpoint code uses."""

    def update(self, data: Any, /) -> Any: ...

    def digest(self) -> bytes: ...


@dataclass(frozen=True)
class Header:
    """The fields of a header whose CRC, marker, version and flags were checked."""

    version: int
    flags: int
    length: int
    digest: bytes
    signature: bytes

    @property
    def signed(self) -> bool:
        return bool(self.flags & FLAG_SIGNED)

    @property
    def algorithm(self) -> str:
        return ALGORITHMS[self.version]


def check_key(key: Any) -> bytes | None:
    """Return ``key`` as bytes, or raise the argument error that names what is wrong.

    Raises:
        TypeError: ``key`` is neither None nor bytes / bytearray.
        ValueError: ``key`` is shorter than :data:`MIN_KEY_BYTES` bytes.
    """
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(
            f"key must be bytes (at least {MIN_KEY_BYTES} of them), got {type(key).__name__}; "
            "e.g. secrets.token_bytes(32), kept outside the checkpoint directory"
        )
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"key must be at least {MIN_KEY_BYTES} bytes long, got {len(key)}")
    return bytes(key)


# blake3's multithreaded mode runs on one process-wide thread pool, whose threads do
# not survive fork: a child forked after the pool started would wait for them forever
# in its first threaded update. Such a child hashes on its own thread instead.
_pool_used = False
_pool_lost = False


def _after_fork_in_child() -> None:
    global _pool_lost
    _pool_lost = _pool_lost or _pool_used


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def new_hasher(version: int, *, threads: int = 1) -> Hasher:
    """A fresh payload hasher of format ``version`` that may use up to ``threads`` cores."""
    global _pool_used
    if version == 1:
        return hashlib.sha256()
    if threads > 1 and not _pool_lost:
        _pool_used = True
        return blake3.blake3(max_threads=threads)
    return blake3.blake3(max_threads=1)


def _signature(version: int, key: bytes, flags: int, length: int, digest: bytes) -> bytes:
    message = MARKER + struct.pack("<HHQ", version, flags, length) + digest
    if version == 1:
        return hmac.new(key, message, hashlib.sha256).digest()
    derived = blake3.blake3(key, derive_key_context=KEY_CONTEXT).digest()
    return blake3.blake3(message, key=derived).digest()


def pack_header(length: int, digest: bytes, key: bytes | None) -> bytes:
    """The current version's header for a payload of ``length`` bytes with ``digest``."""
    flags = FLAG_SIGNED if key is not None else 0
    signature = (
        _signature(FORMAT_VERSION, key, flags, length, digest) if key is not None else _NO_SIGNATURE
    )
    header = bytearray(_LAYOUT.pack(MARKER, FORMAT_VERSION, flags, 0, length, digest, signature))
    header[_CRC_SLICE] = struct.pack("<I", zlib.crc32(header))
    return bytes(header)


def parse_header(head: bytes, size: int, path: str) -> Header:
    """Check the header bytes ``head`` of a file of ``size`` bytes; nothing of the payload.

    Raises:
        CheckpointFormatError: Not a checkpoint of a readable version (321).
        CheckpointCorruptedError: Truncated, damaged header, or a length that does
            not match the file (322).
    """
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
    _, version, flags, crc, length, digest, signature = _LAYOUT.unpack(head)
    unsummed = bytearray(head)
    unsummed[_CRC_SLICE] = bytes(4)
    if zlib.crc32(unsummed) != crc:
        raise CheckpointCorruptedError(f"{path}: header checksum mismatch")
    if version not in READABLE_VERSIONS:
        raise CheckpointFormatError(
            f"{path} has format version {version}; this version reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    if flags & ~_KNOWN_FLAGS:
        raise CheckpointFormatError(f"{path} has unknown flags {flags:#06x}")
    if not flags & FLAG_SIGNED and signature != _NO_SIGNATURE:
        raise CheckpointFormatError(f"{path} is not signed but its signature field is not zero")
    if HEADER_SIZE + length != size:
        raise CheckpointCorruptedError(
            f"{path}: header announces a {length}-byte payload, file holds {size - HEADER_SIZE}"
        )
    return Header(version, flags, length, digest, signature)


def verify_signature(header: Header, key: bytes | None, path: str) -> None:
    """Refuse the file unless ``key`` is None or the header's signature was made with it.

    Call it after the payload digest was checked: the signature covers the digest.

    Raises:
        CheckpointSignatureError: The file is unsigned, or signed with another key (339).
    """
    if key is None:
        return
    if not header.signed:
        raise CheckpointSignatureError(f"{path} is not signed")
    expected = _signature(header.version, key, header.flags, header.length, header.digest)
    if not hmac.compare_digest(header.signature, expected):
        raise CheckpointSignatureError(f"{path}: signature does not match the key")
