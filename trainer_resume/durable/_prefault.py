"""Fresh memory faulted in on a helper thread, ahead of the reads that fill it.

A checkpoint read into fresh storages pays a page fault for every page the kernel
first copies into, on the reading thread, between its reads (about 25 ms per 120 MB
on a small VM: a quarter of a cold read). On Linux 5.14 and later
``madvise(MADV_POPULATE_WRITE)`` maps a range's pages writable without writing to
them, so a helper thread walks the storages in the order they will be read and maps
them there, and the reader finds its pages in place. Nothing is written: the memory
holds what it held, and only the moment of the faults moves. Where the call is
missing (another system, an older kernel) the reader faults the pages itself, as it
would anyway.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["Prefaulter", "prefault_supported"]

_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_CHUNK = 4 << 20  # mapped this many bytes per call, so that stop() takes effect soon
_MIN_BYTES = 64 << 10  # smaller storages come from memory the heap has mapped already
_PAGE = mmap.PAGESIZE

# madvise(address, length, MADV_POPULATE_WRITE) of this process, found and tried on first
# use; [None] where it cannot populate (not Linux, no libc symbol, an older kernel).
_POPULATE: list[Callable[[int, int], int] | None] = []


def _populate() -> Callable[[int, int], int] | None:
    if not _POPULATE:
        _POPULATE.append(_find_populate())
    return _POPULATE[0]


def _find_populate() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise: Any = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int

    def populate(address: int, length: int) -> int:
        return madvise(address, length, _MADV_POPULATE_WRITE)  # type: ignore[no-any-return]

    probe = torch.empty(2 * _PAGE, dtype=torch.uint8)  # at least one whole page inside
    start, _ = _pages(probe)
    return populate if populate(start, _PAGE) == 0 else None


def prefault_supported() -> bool:
    """Whether this process can map memory ahead of a reader (tried once, by a call)."""
    return _populate() is not None


class Prefaulter:
    """Maps the pages of ``storages`` (contiguous CPU tensors), in order, on a helper thread.

    Only whole pages inside each storage are mapped, and nothing is written. The thread
    holds the storages until :meth:`stop`, which ends the walk where it is and waits
    for the thread; the reader calls it once it is done, or gives up.
    """

    def __init__(self, storages: Sequence[torch.Tensor]) -> None:
        self._stopped = False
        self._thread: threading.Thread | None = None
        ranges = [_pages(storage) for storage in storages if storage.nbytes >= _MIN_BYTES]
        ranges = [(start, end) for start, end in ranges if end > start]
        populate = _populate() if ranges else None
        if populate is not None:
            self._storages = list(storages)  # held: the ranges point into them
            self._thread = threading.Thread(
                target=self._run,
                args=(populate, ranges),
                name="checkpoint-prefault",
                daemon=True,
            )
            self._thread.start()

    def _run(self, populate: Callable[[int, int], int], ranges: list[tuple[int, int]]) -> None:
        for start, end in ranges:
            for chunk in range(start, end, _CHUNK):
                if self._stopped or populate(chunk, min(_CHUNK, end - chunk)):
                    return  # stopped, or refused (out of memory): the reader faults the rest

    def stop(self) -> None:
        """End the walk where it is and wait for the helper thread."""
        self._stopped = True
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._storages = []


def _pages(storage: torch.Tensor) -> tuple[int, int]:
    """The whole pages inside ``storage``'s memory: (first page's address, end)."""
    address = storage.data_ptr()
    start = -(-address // _PAGE) * _PAGE
    end = (address + storage.nbytes) // _PAGE * _PAGE
    return start, end
