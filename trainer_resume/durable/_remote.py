"""Checkpoint files at URLs: the payload held in memory while it is hashed, then
uploaded whole; an object read by range, its bytes verified before they are loaded.

Writing: the header carries the payload's digest and comes first, and an object
cannot be rewritten in place, so the payload (``torch.save``'s bytes, hashed as they
come) is held in memory, in the pieces torch wrote, until its digest is known; then
the header and the pieces go up as one upload (:func:`storage.objects.upload`), each
piece released once it is sent. Memory: the payload (1x the state) plus the part in
flight (or, for an object under two parts, a joined copy sent in one request).

Reading: :class:`~trainer_resume.storage.objects.ObjectReader` serves the object's bytes by position, so the local
reader's machinery (the zip directory planned, every record read once into its own
storage and hashed, verified before anything is unpickled) runs on it unchanged;
:class:`BufferCopy` is the whole-payload copy for an archive that cannot be read
record by record.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from ..errors import CheckpointCorruptedError, CheckpointWriteError
from ..storage import objects
from ._byte_readers import PiecesReader

__all__ = ["BufferCopy", "ChunkSink", "open_source", "upload_checkpoint"]

# Small writes of torch's zip writer are gathered into pieces of this size.
_GATHER = 1 << 20


class ChunkSink:
    """Keeps what ``torch.save`` writes, in order, as pieces of memory."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._small = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.size += view.nbytes
        if view.nbytes < _GATHER:
            self._small += view
            if len(self._small) >= _GATHER:
                self._gathered()
        else:
            self._gathered()
            self._pieces.append(view.tobytes())  # torch's view is valid only during the call
        return view.nbytes

    def flush(self) -> None:
        """Nothing to flush: the pieces are sent by :func:`upload_checkpoint`."""

    def _gathered(self) -> None:
        if self._small:
            self._pieces.append(bytes(self._small))
            self._small = bytearray()

    def drain(self) -> Iterator[bytes]:
        """The pieces in order, each dropped from here as it is handed out."""
        self._gathered()
        pieces, self._pieces = self._pieces, []
        pieces.reverse()
        while pieces:
            yield pieces.pop()


def upload_checkpoint(url: str, header: bytes, payload: ChunkSink) -> None:
    """Upload ``header`` then ``payload`` as the object at ``url``, whole or not at all.

    Raises:
        CheckpointWriteError: the upload failed and was abandoned; the previous object
            at ``url`` is intact (the cause is chained).
    """
    previous = _exists_quietly(url)

    def pieces() -> Iterator[bytes]:
        yield header
        yield from payload.drain()

    try:
        objects.upload(url, pieces(), size=len(header) + payload.size)
    except Exception as exc:
        kept = "; the previous object there is intact" if previous else ""
        raise CheckpointWriteError(f"could not write {url}: {exc!r}{kept}") from exc


def _exists_quietly(url: str) -> bool:
    try:
        return objects.exists(url)
    except Exception:  # noqa: BLE001 - only for the message
        return False


def open_source(url: str) -> objects.ObjectReader:
    """The object at ``url``, read by position (``FileNotFoundError`` when there is none)."""
    return objects.ObjectReader(url)


class BufferCopy:
    """``length`` bytes of ``source`` from ``offset``, copied whole into private memory
    (what :class:`~trainer_resume.durable._sealed_copy.SealedCopy` is for a local file)."""

    def __init__(self, source: objects.ObjectReader, offset: int, length: int, where: str) -> None:
        buffer = bytearray(length)
        view = memoryview(buffer)
        done = 0
        while done < length:
            got = source.pread_into(view[done : done + objects.READ_BLOCK_SIZE], offset + done)
            if got == 0:
                raise CheckpointCorruptedError(f"{where} shrank while it was read")
            done += got
        self.size = length
        self.path: str | None = None
        self.view = view.toreadonly()

    def reader(self) -> io.RawIOBase:
        return PiecesReader([0], [self.view], self.size)

    def read(self, start: int, end: int) -> bytes:
        return bytes(self.view[start:end])

    def unmap(self) -> None:
        """Nothing mapped: the buffer is the copy."""

    def close(self) -> None:
        self.__dict__.pop("view", None)

    def __enter__(self) -> BufferCopy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
