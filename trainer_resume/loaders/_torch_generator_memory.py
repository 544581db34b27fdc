"""A torch CPU generator's state read and written in place: found and checked once per process.

``get_state`` / ``set_state`` copy a CPU generator's state through a 5 KB tensor, two
calls into torch that cost several times their own time in the training step that
follows. The state itself lies in the C++ generator as plain data: the Mersenne Twister
(``uint64 seed; int left; bool seeded; uint32 next; uint32 state[624]``) and the cached
normal samples after it (``optional<float>``, ``optional<double>``). Where this
process's torch has that layout, proven on private generators, the state is copied as
raw bytes through a memoryview:

* :func:`words_view`: the 624 words alone (read only), found by seeding a private
  generator and checked against NumPy's seeding of the same seeds;
* :func:`state_view`: the whole state, from the seed to the cached double's flag. Its
  edges are proven by reading only (the seed and position fields after
  ``manual_seed``; the cached double set by one normal draw and taken by the next),
  then whole copies between two private generators are checked to give the same
  ``get_state()`` and the same draws, with and without a cached sample;
* :func:`default_state_view`: the same place in ``torch.default_generator``, used only
  where its fields read what ``get_state()`` says (read only: it is never written while
  it is checked).

A raw copy takes no generator mutex, as ``get_state`` / ``set_state`` do: the callers
hold ``rng.hold_generators()``, and another thread drawing from the default generator
meanwhile would see its draws changed anyway. A copy holds the process's own layout
and is never saved or sent: saved states go through ``get_state``.
"""

from __future__ import annotations

import ctypes
import struct
import sys

import numpy as np
import torch

__all__ = ["default_state_view", "mapped", "raw_view", "state_view", "words_offset", "words_view"]

_MASK32 = (1 << 32) - 1
_WORDS = 624
_KEY_BYTES = _WORDS * 4
_OBJECT_HEADER = 16  # CPython's object header (reference count, type)
_SEARCH = 512  # bytes of a torch generator's C++ object searched for its words
# Before the words: uint64 seed; int left; bool seeded (and 3 bytes of padding); uint32 next.
_FIELDS = struct.Struct("=QiB3xI")
# After the words: 4 bytes of padding, optional<float> (value, flag, padding), then
# optional<double>'s value and its flag; the copy ends with that flag.
_DOUBLE_VALUE = 12
_DOUBLE_FLAG = 20
_PROBE_SEED = 0x5EED_0123_4567_89AB  # a 64-bit seed whose two halves differ


def raw_view(address: int, size: int) -> memoryview:
    """``size`` bytes at ``address`` as a writable byte memoryview."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


def mapped(address: int, size: int) -> bool:
    """Whether ``[address, address + size)`` lies in one readable mapping of this process
    (read from ``/proc/self/maps``; ``False`` where there is none)."""
    try:
        with open("/proc/self/maps", encoding="ascii") as maps:
            for line in maps:
                span, permissions = line.split(maxsplit=2)[:2]
                start, end = (int(bound, 16) for bound in span.split("-"))
                if start <= address and address + size <= end:
                    return permissions.startswith("r")
    except (OSError, ValueError):
        return False
    return False


def _impl(generator: torch.Generator) -> int | None:
    """The address of the C++ generator behind ``generator``, a plain torch CPU generator."""
    if (
        sys.implementation.name != "cpython"
        or type(generator) is not torch.Generator
        or generator.device.type != "cpu"
        or type(generator).__basicsize__ < _OBJECT_HEADER + ctypes.sizeof(ctypes.c_void_p)
    ):
        return None
    # After the object header: the at::Generator, a pointer to the C++ generator.
    impl = ctypes.c_void_p.from_address(id(generator) + _OBJECT_HEADER).value
    if not impl or impl % ctypes.sizeof(ctypes.c_void_p):
        return None
    if not mapped(impl, _SEARCH + _KEY_BYTES + _DOUBLE_FLAG + 1):
        return None
    return impl


def words_offset(generator: torch.Generator) -> int | None:
    """Where the Mersenne Twister words lie in ``generator``'s C++ object, found and checked.

    torch's ``manual_seed(s)`` of a 32-bit ``s`` leaves them ``init_genrand(s)``, what
    NumPy's legacy ``seed(s)`` leaves its key: the words are found in the object's first
    bytes by seeding ``generator`` (a private one: it is reseeded) and checked against
    NumPy's state for two seeds.
    """
    try:
        impl = _impl(generator)
        if impl is None:
            return None
        references = {
            seed: np.random.RandomState(seed).get_state()[1].astype(np.uint32).tobytes()
            for seed in (12345, _MASK32)
        }
        generator.manual_seed(12345)
        raw = ctypes.string_at(impl, _SEARCH + _KEY_BYTES)
        marker = references[12345][:64]
        # The first place the words may start; checked below by seeding (the bytes after
        # the object may hold a copy of them).
        offset = raw.find(marker, 0, _SEARCH + len(marker))
        if offset < _FIELDS.size or offset % 4:
            return None
        view = raw_view(impl + offset, _KEY_BYTES)
        for seed, reference in references.items():
            generator.manual_seed(seed)
            if bytes(view) != reference:
                return None
    except (ValueError, OverflowError, TypeError, RuntimeError):
        return None
    return offset


def words_view(generator: torch.Generator) -> memoryview | None:
    """The words (``uint32 state[624]``) inside a private torch CPU generator, if found and
    checked (:func:`words_offset`); read only, never written."""
    offset = words_offset(generator)
    impl = _impl(generator) if offset is not None else None
    if offset is None or impl is None:
        return None
    return raw_view(impl + offset, _KEY_BYTES)


def _state_at(generator: torch.Generator, offset: int) -> memoryview | None:
    impl = _impl(generator)
    if impl is None:
        return None
    start = offset - _FIELDS.size
    return raw_view(impl + start, _FIELDS.size + _KEY_BYTES + _DOUBLE_FLAG + 1)


def _fields(view: memoryview) -> tuple[int, int, int, int]:
    return _FIELDS.unpack(bytes(view[: _FIELDS.size]))  # type: ignore[return-value]


def _double_cache(view: memoryview) -> tuple[int, bytes]:
    """The cached double's flag and, where it is set, its value's bytes (else ``b""``)."""
    tail = _FIELDS.size + _KEY_BYTES
    flag = view[tail + _DOUBLE_FLAG]
    return flag, bytes(view[tail + _DOUBLE_VALUE : tail + _DOUBLE_FLAG]) if flag else b""


def _edges_hold(generator: torch.Generator, view: memoryview) -> bool:
    """The fields at both ends of ``view`` read as ``generator``'s seed, position and cached
    double (``generator`` is private: it is reseeded and drawn from)."""
    generator.manual_seed(_PROBE_SEED)
    if _fields(view) != (_PROBE_SEED, 1, 1, 0) or _double_cache(view)[0] != 0:
        return False
    torch.randn(1, dtype=torch.float64, generator=generator)  # a pair drawn, one kept
    flag, cached = _double_cache(view)
    if flag != 1:
        return False
    drawn = torch.randn(1, dtype=torch.float64, generator=generator).numpy().tobytes()
    if drawn != cached:
        return False
    return _double_cache(view)[0] == 0


def _copies_hold(source: torch.Generator, target: torch.Generator, offset: int) -> bool:
    """Copying the state bytes from ``source`` to ``target`` (both private) gives ``target``
    ``source``'s ``get_state()`` and draws, with and without a cached normal sample."""
    source_view, target_view = _state_at(source, offset), _state_at(target, offset)
    if source_view is None or target_view is None:
        return False
    for cached in (True, False, True):
        source.manual_seed(20240611 if cached else 7)
        torch.rand(5, generator=source)
        if cached:
            torch.randn(1, dtype=torch.float64, generator=source)
        target.manual_seed(99)
        if not cached:
            torch.randn(1, dtype=torch.float64, generator=target)
        target_view[:] = source_view
        if not torch.equal(source.get_state(), target.get_state()):
            return False
        for draw in (torch.rand, torch.randn):
            if not torch.equal(draw(7, generator=source), draw(7, generator=target)):
                return False
        if not torch.equal(
            torch.randn(3, dtype=torch.float64, generator=source),
            torch.randn(3, dtype=torch.float64, generator=target),
        ):
            return False
    return True


def state_view(generator: torch.Generator) -> memoryview | None:
    """The whole state inside a private torch CPU generator, if its layout is proven (see
    the module's docstring); ``generator`` is reseeded while it is checked."""
    try:
        offset = words_offset(generator)
        if offset is None:
            return None
        view = _state_at(generator, offset)
        if view is None or not _edges_hold(generator, view):
            return None
        other = torch.Generator(device="cpu")
        if words_offset(other) != offset or not _copies_hold(other, generator, offset):
            return None
        generator.manual_seed(0)
    except (ValueError, OverflowError, TypeError, RuntimeError):
        return None
    return view


def default_state_view(private: torch.Generator) -> memoryview | None:
    """The state of ``torch.default_generator`` in place, at the place :func:`state_view`
    proves on ``private``; only where its fields read what its ``get_state()`` says.

    ``private`` is set to the default generator's state to compare them; the default
    generator itself is only read.
    """
    default = torch.default_generator
    try:
        if state_view(private) is None:
            return None
        offset = words_offset(private)
        if offset is None:
            return None
        view = _state_at(default, offset)
        mine = _state_at(private, offset)
        if view is None or mine is None:
            return None
        private.set_state(default.get_state())
        words = slice(_FIELDS.size, _FIELDS.size + _KEY_BYTES)
        if (
            _fields(view) != _fields(mine)
            or bytes(view[words]) != bytes(mine[words])
            or _double_cache(view) != _double_cache(mine)
        ):
            return None
    except (ValueError, OverflowError, TypeError, RuntimeError):
        return None
    return view
