"""The payload read once, front to back, straight into the memory of its tensors.

``torch.load`` of a file reads every tensor record into a storage of its own. To
verify the bytes first and still read them only once, the zip directory is read
first (from the file, unverified: it only says where records are), then the
whole payload is read in order, each tensor record (``<archive>/data/<key>``)
straight into a fresh storage of its size and everything between records (local
headers, the pickle, small records, the directory) into small buffers. A helper
thread hashes each piece as soon as it is read, so the digest costs little more
than the read, and where the system allows, another maps the fresh storages' pages
ahead of the reads (:mod:`~trainer_resume.durable._prefault`), so the reader does not
stop for their page faults. Once the digest (and signature) match, these in-memory bytes are
the verified payload: the archive is checked on them and ``torch.load``'s
unpickler gets the storages themselves, so nothing is copied a second time and
nothing is read from the file again.

The placement is taken from the unverified directory, so it is trusted only if
the verified bytes agree: after verification the caller compares it with the
records found in the verified archive (:meth:`DirectCopy.placement`) and falls
back to a whole-payload copy when they differ (a file rewritten between the two
reads) or when the directory cannot be planned from at all.

Memory: the loaded storages (1x the tensor bytes) plus the bytes between records;
the storages become the loaded tensors' own memory, as with ``torch.load``. (A
copy of the whole payload loaded with ``mmap=True`` would make every tensor a view
of that one copy: an optimizer adopting its loaded state would keep all of it, the
model's weights included, for the rest of the run, so each tensor would need a
second copy of its own. Reading each record into its own storage in the first
place costs one pass over the bytes and 1x the memory.)
"""

from __future__ import annotations

import ctypes
import io
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CheckpointCorruptedError
from ._archive_check import LOCAL_HEADER, is_stored, names_entry
from ._byte_readers import FileWindow, PiecesReader, Source, piece_at, pread
from ._prefault import Prefaulter

__all__ = ["DirectCopy", "Record", "Unplannable", "is_tensor_record", "plan_records"]

# Regions at least this long are read straight into their destination; shorter
# ones are served from blocks of _BLOCK bytes (one system call for many records).
_DIRECT_MIN = 256 << 10
_BLOCK = 1 << 20
# Direct reads go in pieces of this size, each hashed while the next is read; over the
# payload's last bytes they shrink to a quarter of what is left (not below _TAIL_PIECE),
# since the digest is ready only once the last piece read has been hashed.
_PIECE = 4 << 20
_TAIL_PIECE = 256 << 10
# Room for a local header's name and extra field (torch pads records to 64 bytes).
_HEADER_SLACK = 256


class Unplannable(Exception):
    """The payload cannot be read record by record; copy it whole instead."""


@dataclass(frozen=True)
class Record:
    """A tensor record: its zip entry name, local header offset and length."""

    name: str
    header_offset: int
    length: int


def plan_records(fd: Source, offset: int, length: int) -> list[Record]:
    """The tensor records of the payload at ``offset``, from its zip directory.

    The directory is read from the file as it is now, unverified; the plan is only
    a guess of where records lie until :class:`DirectCopy` has read and hashed
    every byte and the caller has compared it with the verified archive.

    Raises:
        Unplannable: No readable directory of stored, ordered, non-overlapping
            entries (the whole-payload copy then verifies and reports the damage).
    """
    try:
        with zipfile.ZipFile(FileWindow(fd, offset, length)) as archive:
            entries = archive.infolist()
    except Exception as exc:  # whatever a damaged directory makes zipfile raise
        raise Unplannable(str(exc)) from exc
    records: list[Record] = []
    names: set[str] = set()
    end = 0
    for entry in sorted(entries, key=lambda item: item.header_offset):
        if entry.filename in names:
            raise Unplannable(f"entry {entry.filename!r} is repeated")
        names.add(entry.filename)
        if not is_stored(entry):
            raise Unplannable(f"entry {entry.filename!r} is compressed")
        if entry.header_offset < end:
            raise Unplannable(f"entry {entry.filename!r} overlaps the one before it")
        end = entry.header_offset + LOCAL_HEADER.size + entry.file_size
        if end > length:
            raise Unplannable(f"entry {entry.filename!r} ends outside the payload")
        if is_tensor_record(entry.filename):
            records.append(Record(entry.filename, entry.header_offset, entry.file_size))
    return records


def is_tensor_record(name: str) -> bool:
    """Whether zip entry ``name`` is a tensor record (``<archive>/data/<key>``)."""
    parts = name.split("/")
    return len(parts) == 3 and parts[1] == "data" and bool(parts[0]) and bool(parts[2])


class DirectCopy:
    """``length`` bytes of ``fd`` (a descriptor, or an object read by range) from
    ``offset``, read once into memory and hashed.

    Each record of ``records`` is read into a storage of its own; every byte of the
    payload is fed to ``hasher``, in order, on a helper thread.

    Raises:
        Unplannable: A local header disagrees with the plan (the whole-payload
            copy takes over).
        CheckpointCorruptedError: The file ends before ``length`` bytes (322).
    """

    def __init__(
        self, fd: Source, offset: int, length: int, records: list[Record], hasher: Any, where: str
    ) -> None:
        self.size = length
        self._storages: dict[str, torch.Tensor] = {}
        self._placed: dict[str, tuple[int, int]] = {}
        starts: list[int] = []
        views: list[memoryview] = []
        # Every storage made first, so a helper maps their pages ahead of the reads.
        storages = [torch.empty(record.length, dtype=torch.uint8) for record in records]
        stream = _HashedStream(fd, offset, length, hasher, where)
        horizons = _horizons(records, length)
        prefault = Prefaulter(storages)
        try:
            for record, horizon, storage in zip(records, horizons, storages):
                stream.horizon = horizon
                if record.header_offset < stream.position:
                    raise Unplannable(f"entry {record.name!r} overlaps the one before it")
                gap_start, gap = self._gap(stream, record.header_offset + LOCAL_HEADER.size)
                magic, name_length, extra_length = LOCAL_HEADER.unpack(gap[-LOCAL_HEADER.size :])
                tail = bytearray(name_length + extra_length)
                stream.read_into(memoryview(tail))
                if not names_entry(magic, bytes(tail[:name_length]), record.name):
                    raise Unplannable(f"entry {record.name!r} has no matching local header")
                starts.append(gap_start)
                views.append(memoryview(bytes(gap) + bytes(tail)))
                data_start = stream.position
                if data_start + record.length > length:
                    raise Unplannable(f"entry {record.name!r} ends outside the payload")
                view = _writable_view(storage)
                stream.read_into(view)
                if record.length:
                    starts.append(data_start)
                    views.append(view)
                self._storages[record.name] = storage
                self._placed[record.name] = (data_start, data_start + record.length)
            stream.horizon = length
            start, rest = self._gap(stream, length)
            if rest:
                starts.append(start)
                views.append(memoryview(rest))
            stream.finish()
        except BaseException:
            stream.abandon()
            raise
        finally:
            prefault.stop()
        self._starts = starts
        self._views = views

    @staticmethod
    def _gap(stream: _HashedStream, end: int) -> tuple[int, bytearray]:
        start = stream.position
        gap = bytearray(end - start)
        stream.read_into(memoryview(gap))
        return start, gap

    def placement(self) -> dict[str, tuple[int, int]]:
        """Record name -> (start, end) of the bytes each storage was read from."""
        return dict(self._placed)

    def reader(self) -> io.RawIOBase:
        """A seekable file object over the payload as read (for the zip reader)."""
        return PiecesReader(self._starts, self._views, self.size)

    def read(self, start: int, end: int) -> bytes:
        """The payload's bytes from ``start`` to ``end`` (clipped to its size)."""
        end = min(end, self.size)
        if start >= end:
            return b""
        if start >= 0:  # within one piece (a local header, a name): sliced, no reader
            view, inside = piece_at(self._starts, self._views, start)
            if inside + end - start <= len(view):
                return bytes(view[inside : inside + end - start])
        reader = self.reader()
        reader.seek(start)
        return reader.read(end - start) or b""

    def storage(self, name: str, nbytes: int) -> torch.Tensor | None:
        """The uint8 tensor read from record ``name``, if it holds exactly ``nbytes``."""
        found = self._storages.get(name)
        return found if found is not None and found.numel() == nbytes else None

    def close(self) -> None:
        """Drop this object's references; loaded tensors keep their storages."""
        self._storages.clear()
        self._views = []

    def __enter__(self) -> DirectCopy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _horizons(records: list[Record], length: int) -> list[int]:
    """For each record, how far a read block may reach: about to the data of the next
    record long enough to be read directly (its local header's name and padding
    included, estimated), so that a block is not read only to be copied into it."""
    horizons: list[int] = []
    reach = length
    for record in reversed(records):
        if record.length >= _DIRECT_MIN:
            reach = min(length, record.header_offset + LOCAL_HEADER.size + _HEADER_SLACK)
        horizons.append(reach)
    return horizons[::-1]


def _writable_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU uint8 tensor's memory."""
    count = tensor.numel()
    if count == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * count).from_address(tensor.data_ptr())).cast("B")


class _HashedStream:
    """Reads the payload front to back, each byte once, and hashes it in order."""

    def __init__(self, fd: Source, offset: int, length: int, hasher: Any, where: str) -> None:
        self._fd, self._offset, self._length, self._where = fd, offset, length, where
        self._hasher = hasher
        self.position = 0  # payload bytes handed out so far
        self.horizon = length  # a read block stops here (or where the request ends)
        self._read = 0  # payload bytes read from the file (and queued for hashing)
        self._block = memoryview(b"")
        self._helper = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-digest")
        self._pending: list[Future[Any]] = []

    def read_into(self, view: memoryview) -> None:
        """Fill ``view`` with the next ``len(view)`` bytes of the payload."""
        if self.position + len(view) > self._length:
            raise Unplannable("the directory places an entry past the end of the payload")
        done = 0
        while done < len(view):
            if self._block:
                take = min(len(self._block), len(view) - done)
                view[done : done + take] = self._block[:take]
                self._block = self._block[take:]
                done += take
            elif len(view) - done >= _DIRECT_MIN:
                left = self._length - self._read
                piece = view[done : done + min(_PIECE, max(_TAIL_PIECE, left >> 2))]
                self._fill(piece)
                done += len(piece)
            else:
                wanted = max(len(view) - done, self.horizon - self._read)
                block = bytearray(min(_BLOCK, self._length - self._read, wanted))
                self._fill(memoryview(block))
                self._block = memoryview(block)
        self.position += len(view)

    def _fill(self, view: memoryview) -> None:
        """Read exactly ``len(view)`` next bytes of the file into ``view``, queue its hash."""
        got = 0
        while got < len(view):
            count = pread(self._fd, view[got:], self._offset + self._read + got)
            if count == 0:
                raise CheckpointCorruptedError(f"{self._where} shrank while it was read")
            got += count
        self._read += got
        self._pending.append(self._helper.submit(self._hasher.update, view))

    def finish(self) -> None:
        """Wait for the hash of everything read; the hasher then holds the whole payload."""
        self._helper.shutdown(wait=True)
        for pending in self._pending:
            pending.result()
        self._pending.clear()

    def abandon(self) -> None:
        for pending in self._pending:
            pending.cancel()
        self._helper.shutdown(wait=True)
        self._pending.clear()
