"""Read-only, seekable file objects over bytes that are not one whole file: a window
of an open file (a local descriptor, or an object read by range), or consecutive
pieces of memory (for ``zipfile`` and torch's zip reader, which seek and read)."""

from __future__ import annotations

import bisect
import io
import os
from typing import Any, Protocol

__all__ = ["FileWindow", "PiecesReader", "PositionalReader", "Source", "piece_at", "pread"]


class PositionalReader(Protocol):
    """Bytes read at a position, without a shared file position (an object by range)."""

    def pread_into(self, view: memoryview, position: int) -> int: ...


# A local file's descriptor, or a reader of an object's bytes by position.
Source = int | PositionalReader


def pread(source: Source, view: memoryview, position: int) -> int:
    """Read up to ``len(view)`` bytes of ``source`` from ``position`` into ``view``."""
    if isinstance(source, int):
        return os.preadv(source, [view], position)
    return source.pread_into(view, position)


class _Seekable(io.RawIOBase):
    """Position bookkeeping of a read-only file object of ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + pos < 0:
            raise ValueError(f"negative seek position {base + pos}")
        self._pos = base + pos
        return self._pos


class FileWindow(_Seekable):
    """``length`` bytes of the open file ``fd`` (or another :data:`Source`) from
    ``offset`` (read with ``preadv``, so the descriptor's own position is never moved)."""

    def __init__(self, fd: Source, offset: int, length: int) -> None:
        super().__init__(length)
        self._fd, self._offset = fd, offset

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        count = max(0, min(len(target), self._size - self._pos))
        got = pread(self._fd, target[:count], self._offset + self._pos) if count else 0
        self._pos += got
        return got


def piece_at(starts: list[int], views: list[memoryview], position: int) -> tuple[memoryview, int]:
    """The piece holding ``position`` (``views[i]`` starts at ``starts[i]``, ascending, no
    gaps) and where ``position`` lies in it."""
    index = bisect.bisect_right(starts, position) - 1
    return views[index], position - starts[index]


class PiecesReader(_Seekable):
    """``size`` bytes held as consecutive pieces: ``views[i]`` starts at ``starts[i]``
    (ascending, no gaps). Nothing is copied until it is read."""

    def __init__(self, starts: list[int], views: list[memoryview], size: int) -> None:
        super().__init__(size)
        self._starts, self._views = starts, views

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        done = 0
        while done < len(target) and self._pos < self._size:
            view, inside = piece_at(self._starts, self._views, self._pos)
            take = min(len(target) - done, len(view) - inside)
            target[done : done + take] = view[inside : inside + take]
            done += take
            self._pos += take
        return done
