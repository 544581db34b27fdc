"""Durable, verified checkpoint files.

A checkpoint file is a fixed 88-byte header (marker, format version, flags,
header CRC, payload length, payload digest, signature) followed by an ordinary
``torch.save`` zip payload; :mod:`trainer_resume.durable._format` documents the
layout, the algorithms of each format version and what the digest protects
against with and without a key. Files are written in format version 2 (BLAKE3);
version 1 files (SHA-256) are still read.

Loading reads the payload once into private memory, its tensor records straight
into their own storages (:mod:`trainer_resume.durable._direct_copy`; or, when that cannot
be planned, the whole payload into sealed memory: :mod:`trainer_resume.durable._sealed_copy`),
verifies those bytes and unpickles those same bytes, weights-only: a file
rewritten while it is loaded is either refused or loaded exactly as verified.
Every malformed file is refused with a catalogue error.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._atomic import DigestingWriter, TempFile, replace_atomically
from ..errors import CheckpointCorruptedError, CheckpointFormatError, CheckpointWriteError
from ..storage.urls import check_location, is_url, local_path
from ._archive_check import Archive, Payload, check_archive
from ._byte_readers import Source, pread
from ._direct_copy import DirectCopy, Unplannable, is_tensor_record, plan_records
from ._format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MARKER,
    MIN_KEY_BYTES,
    THREADED_HASH_MIN,
    Header,
    check_key,
    new_hasher,
    pack_header,
    parse_header,
    usable_cores,
    verify_signature,
)
from ._remote import BufferCopy, ChunkSink, open_source, upload_checkpoint
from ._sealed_copy import SealedCopy
from ._torch_io import (
    check_nesting,
    crc32_skipped,
    load_payload,
    load_read_ahead,
    read_ahead_supported,
)

__all__ = [
    "FORMAT_VERSION",
    "MARKER",
    "MIN_KEY_BYTES",
    "CheckpointHeader",
    "load_checkpoint",
    "read_checkpoint_header",
    "save_checkpoint",
    "file_kind",
    "validate_key",
]

_ZIP_MAGIC = b"PK\x03\x04"

MapLocation = Any  # whatever torch.load accepts: str, torch.device, dict or callable


@dataclass(frozen=True)
class CheckpointHeader:
    """What a checkpoint file's verified header says about it.

    Attributes:
        format_version: Version of the file layout (1 or 2).
        payload_length: Size in bytes of the ``torch.save`` payload.
        digest: Hex digest of the payload (checked against the bytes).
        signed: Whether the file carries a signature.
        algorithm: The digest's algorithm: ``"BLAKE3"`` (version 2) or ``"SHA-256"`` (1).
    """

    format_version: int
    payload_length: int
    digest: str
    signed: bool
    algorithm: str


def validate_key(key: Any) -> bytes | None:
    """Check a signing key where it is given, long before it is used.

    Args:
        key: None (no signing) or bytes of at least :data:`MIN_KEY_BYTES` length.
            Keep the key outside the checkpoint directory: whoever can write a
            checkpoint and read the key can forge signed checkpoints.

    Returns:
        The key as ``bytes`` (or None).

    Raises:
        TypeError: ``key`` is not bytes (a ``str`` is refused: encode it yourself).
        ValueError: ``key`` is shorter than :data:`MIN_KEY_BYTES` bytes.
    """
    return check_key(key)


def save_checkpoint(obj: Any, path: str | os.PathLike[str], *, key: bytes | None = None) -> None:
    """Write ``obj`` to ``path`` durably, replacing the previous file atomically.

    The payload is streamed to a temp file next to ``path`` through its own file
    descriptor while it is hashed, so no second serialized copy is held in memory;
    torch's per-record CRC-32 is skipped (the file's digest covers every byte).
    ``obj`` should hold only weights-only-safe values (tensors, numbers, str, None,
    lists, tuples, dicts); anything else is written but :func:`load_checkpoint`
    refuses it.

    Args:
        obj: The state to save.
        path: Target file. Its directory must exist.
        key: Optional signing key (bytes, at least :data:`MIN_KEY_BYTES`); the file is
            then signed so that ``load_checkpoint(..., key=key)`` detects tampering.

    Raises:
        CheckpointWriteError: Serialization or any write step before the rename
            failed (the cause is chained). The previous file at ``path`` is intact
            and no temp file is left; a retry may succeed.
        CheckpointNotDurableError: The new file is in place but its directory
            could not be synced (a subclass of ``CheckpointWriteError``).
        TypeError, ValueError: ``key`` is not valid (see :func:`validate_key`), or
            ``obj`` nests containers deeper than 200 levels; nothing was written.
    """
    key = check_key(key)
    check_nesting(obj, "the checkpoint")
    target = local_path(os.fsdecode(path))
    if is_url(target):
        check_location(target)  # a scheme nothing installed reads: refused before any work
        payload = ChunkSink()
        try:
            header = _serialize(obj, payload, key)
        except Exception as exc:
            raise CheckpointWriteError(f"could not write {target}: {exc!r}") from exc
        upload_checkpoint(target, header, payload)
        return

    def fill(out: TempFile) -> None:
        out.write(bytes(HEADER_SIZE))  # placeholder: the digest is known only at the end
        header = _serialize(obj, out, key)
        out.seek(0)
        out.write(header)

    replace_atomically(target, fill)


def _serialize(obj: Any, out: Any, key: bytes | None) -> bytes:
    """``torch.save`` ``obj`` into ``out`` while hashing it; returns the header for it."""
    # The write keeps one core busy; the hash runs beside it on the others (on two
    # cores a hashing pool would compete with the writer: twice as slow, measured).
    hasher = new_hasher(FORMAT_VERSION, threads=usable_cores() - 1)
    with DigestingWriter(out, hasher) as sink:
        try:
            with crc32_skipped():
                torch.save(obj, sink)
        except Exception:
            sink.raise_write_error()
            raise
        sink.raise_write_error()
    return pack_header(sink.length, sink.hasher.digest(), key)


def load_checkpoint(
    path: str | os.PathLike[str], *, map_location: MapLocation = "cpu", key: bytes | None = None
) -> Any:
    """Verify and load a file written by :func:`save_checkpoint`.

    The payload is read once into memory, each tensor record straight into a
    storage of its own; marker, version, length, digest, (with ``key``) the
    signature and the archive's structure are checked on those bytes before
    anything is unpickled, and those same bytes are unpickled by
    ``torch.load``'s weights-only unpickler, which is given the storages already
    read. Peak memory is about 1x the payload. When the zip directory does not
    allow reading record by record (or the file changed between reading its
    directory and reading its bytes), the payload is copied whole into sealed
    memory, verified and loaded from there (peak about 2x, see
    :mod:`trainer_resume.durable._sealed_copy`).

    Args:
        path: The checkpoint file.
        map_location: Passed to ``torch.load``.
        key: When given, the file must carry a valid signature made with it.

    Returns:
        The saved object.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointFormatError: Not a regular file (a directory, a FIFO: never waited
            on), not a checkpoint of a readable format, or a payload that is no
            readable torch archive or nests too deeply (321).
        CheckpointCorruptedError: Truncated or altered bytes (322).
        CheckpointSignatureError: ``key`` given and the signature is missing or wrong (339).
        UnsafeCheckpointError: The payload needs objects outside the weights-only set (328);
            none of its code ran.
        TypeError, ValueError: ``key`` is not valid (see :func:`validate_key`).
    """
    key = check_key(key)
    where = local_path(os.fsdecode(path))
    with _verified_copy(where, key) as (_, load):
        return load(map_location)


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
        CheckpointSignatureError, TypeError, ValueError: As for :func:`load_checkpoint`.
    """
    key = check_key(key)
    where = local_path(os.fsdecode(path))
    with _verified_copy(where, key) as (header, _):
        return CheckpointHeader(
            header.version, header.length, header.digest.hex(), header.signed, header.algorithm
        )


@contextlib.contextmanager
def _verified_copy(path: str, key: bytes | None) -> Iterator[tuple[Header, _Load]]:
    """Check ``path``'s header, read its payload once into memory, verify those bytes.

    Yields the header and a function that unpickles the verified bytes. The tensor
    records are read straight into their own storages when the zip directory
    allows it (:mod:`trainer_resume.durable._direct_copy`); otherwise, or when the file
    changed between reading its directory and reading it whole, the payload is
    copied whole into sealed memory (:mod:`trainer_resume.durable._sealed_copy`).
    """
    if is_url(path):
        reader = open_source(path)
        source, size, close = reader, reader.size, reader.close
    else:
        fd = os.open(path, _READ_FLAGS)
        source, close = fd, lambda: os.close(fd)
    try:
        if isinstance(source, int):
            found = os.fstat(source)
            if not stat.S_ISREG(found.st_mode):
                raise CheckpointFormatError(
                    f"{path} is not a regular file ({file_kind(found.st_mode)})"
                )
            size = found.st_size
        header = parse_header(_read_head(source), size, path)
        direct = _read_ahead(source, header, key, path)
        if direct is not None:
            copy, prefix = direct
            with copy:
                yield header, lambda location: load_read_ahead(copy, prefix, location, path)
            return
        sealed: SealedCopy | BufferCopy = (
            SealedCopy(source, HEADER_SIZE, header.length, path)
            if isinstance(source, int)
            else BufferCopy(source, HEADER_SIZE, header.length, path)
        )
    finally:
        close()
    with sealed:
        hasher = new_hasher(header.version, threads=_hash_threads(header))
        hasher.update(sealed.view)
        _verify(header, hasher.digest(), key, sealed, path)
        yield header, lambda location: load_payload(sealed, location, path)


_Load = Callable[[MapLocation], Any]
# O_NONBLOCK: a FIFO (or device) at the path is opened without waiting for a writer,
# then refused as not a regular file; reads of a regular file never block anyway.
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)


def file_kind(mode: int) -> str:
    """What a ``stat`` mode that is not a regular file's is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


def _read_ahead(
    fd: Source, header: Header, key: bytes | None, path: str
) -> tuple[DirectCopy, str] | None:
    """The payload read record by record and verified, with its archive's folder;
    None when it must be copied whole instead."""
    if not read_ahead_supported():
        return None
    # One core reads, the others hash (on two cores a hashing pool would compete
    # with the reads: slower, measured).
    hasher = new_hasher(header.version, threads=_hash_threads(header) - 1)
    try:
        copy = DirectCopy(
            fd,
            HEADER_SIZE,
            header.length,
            plan_records(fd, HEADER_SIZE, header.length),
            hasher,
            path,
        )
    except Unplannable:
        return None
    try:
        archive = _verify(header, hasher.digest(), key, copy, path, tensors=False)
        placed = copy.placement()
        tensor_records = {name for name in archive.records if is_tensor_record(name)}
        if tensor_records == set(placed) and all(
            archive.records[name] == span for name, span in placed.items()
        ):
            return copy, archive.prefix
    except BaseException:
        copy.close()
        raise
    copy.close()  # the file changed after its directory was read: copy it whole
    return None


def _verify(
    header: Header,
    digest: bytes,
    key: bytes | None,
    payload: Payload,
    path: str,
    *,
    tensors: bool = True,
) -> Archive:
    """Check the payload's digest, signature and archive structure (in that order)."""
    if digest != header.digest:
        raise CheckpointCorruptedError(f"{path}: payload {header.algorithm} mismatch")
    verify_signature(header, key, path)
    if payload.read(0, len(_ZIP_MAGIC)) != _ZIP_MAGIC:
        raise CheckpointFormatError(f"{path}: payload is not a torch.save archive")
    return check_archive(payload, path, tensors=tensors)


def _hash_threads(header: Header) -> int:
    return usable_cores() if header.length >= THREADED_HASH_MIN else 1


def _read_head(source: Source) -> bytes:
    head = bytearray(HEADER_SIZE)
    view = memoryview(head)
    done = 0
    while done < HEADER_SIZE:
        got = pread(source, view[done:], done)
        if not got:
            break
        done += got
    return bytes(head[:done])
