"""A private, immutable in-memory copy of a file's whole payload: the bytes verified
are the bytes loaded.

Verifying a file and then letting ``torch.load`` read it again would check one
version of the bytes and unpickle another if the file changes in between (a
concurrent writer, a swapped file). Most payloads are read record by record into
their tensors' own storages (:mod:`trainer_resume.durable._direct_copy`); one whose zip
directory does not allow that (or that changed while it was read) is copied here
once into memory that nothing else can change, hashed there and loaded from there.

On Linux the copy is a ``memfd`` (anonymous shared memory) filled in the kernel
(``sendfile``, no pass through Python) and then sealed against writes, growth and
shrinking, so not even another process that opens it through ``/proc`` can change
it; ``torch.load`` maps it by its ``/proc/self/fd`` path. Elsewhere (no
``memfd_create`` or no ``/proc``) the copy is an ordinary private buffer.

Memory: while loading, the copy (1x the payload) and the loaded tensors (1x) exist
together, so the peak is about 2x the payload; the copy is released before the
loaded object is returned, which then holds ordinary memory only.
"""

from __future__ import annotations

import io
import mmap
import os

from ..errors import CheckpointCorruptedError
from ._byte_readers import PiecesReader

__all__ = ["SealedCopy"]

_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")
_CHUNK = 1 << 24


class SealedCopy:
    """``length`` bytes of ``fd`` from ``offset``, copied into memory nothing else can change.

    Attributes:
        view: The copied bytes (read-only).
        size: Their length.
        path: A path ``torch.load`` can read the copy from, or None when
            the copy is a plain buffer (load from :meth:`reader` then).
    """

    def __init__(self, fd: int, offset: int, length: int, where: str) -> None:
        self.size = length
        self.path: str | None = None
        self._memfd: int | None = None
        self._map: mmap.mmap | None = None
        try:
            self._memfd = _sealed_memfd(fd, offset, length, where)
        except _NoMemfd:
            self.view = memoryview(_read_buffer(fd, offset, length, where)).toreadonly()
            return
        try:
            if length:
                self._map = mmap.mmap(self._memfd, length, prot=mmap.PROT_READ)
                self.view = memoryview(self._map).toreadonly()
            else:
                self.view = memoryview(b"")
            self.path = f"/proc/self/fd/{self._memfd}"
        except BaseException:
            self.close()
            raise

    def reader(self) -> io.RawIOBase:
        """A seekable file object over the copy (for ``torch.load`` without a path)."""
        return PiecesReader([0], [self.view], len(self.view))

    def read(self, start: int, end: int) -> bytes:
        """The copied bytes from ``start`` to ``end`` (clipped to the copy)."""
        return bytes(self.view[start:end])

    def unmap(self) -> None:
        """Drop this object's mapping of a ``memfd`` copy (``view`` goes); ``path`` stays
        readable. The copy's pages are then mapped once, by whoever reads ``path``."""
        if self._memfd is None:
            return  # a plain buffer: the view is the copy
        self._release_view()

    def close(self) -> None:
        """Release this object's hold on the copy; loaded tensors keep their own mapping."""
        self._release_view()
        if self._memfd is not None:
            os.close(self._memfd)
            self._memfd = None

    def _release_view(self) -> None:
        view = self.__dict__.pop("view", None)
        if view is not None:
            view.release()
        if self._map is not None:
            self._map.close()
            self._map = None

    def __enter__(self) -> SealedCopy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _NoMemfd(Exception):
    """This system cannot make a sealed memfd; the plain buffer is used instead."""


def _sealed_memfd(fd: int, offset: int, length: int, where: str) -> int:
    import fcntl  # POSIX only; imported here so the module loads everywhere

    create = getattr(os, "memfd_create", None)
    seals = [getattr(fcntl, name, None) for name in _SEALS]
    if create is None or None in seals or not os.path.isdir("/proc/self/fd"):
        raise _NoMemfd
    try:
        memfd = create("trainer-resume-payload", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:  # e.g. forbidden by a seccomp profile
        raise _NoMemfd from exc
    try:
        copied = 0
        while copied < length:
            sent = os.sendfile(memfd, fd, offset + copied, min(_CHUNK, length - copied))
            if sent == 0:
                raise CheckpointCorruptedError(f"{where} shrank while it was read")
            copied += sent
        mask = 0
        for seal in seals:
            mask |= seal  # type: ignore[operator]
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, mask)  # type: ignore[attr-defined]
        return memfd
    except BaseException:
        os.close(memfd)
        raise


def _read_buffer(fd: int, offset: int, length: int, where: str) -> bytearray:
    buffer = bytearray(length)
    view = memoryview(buffer)
    os.lseek(fd, offset, os.SEEK_SET)
    done = 0
    while done < length:
        got = os.readv(fd, [view[done : done + _CHUNK]])
        if got == 0:
            raise CheckpointCorruptedError(f"{where} shrank while it was read")
        done += got
    return buffer
