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
* :func:`private_states`: private generators with their whole state, from the seed to
  the cached double's flag. Its edges are proven by reading only (the seed and position
  fields after ``manual_seed``; the cached double set by one normal draw and taken by
  the next), then whole copies between the generators are checked to give the same
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
import functools
import struct
import sys
from typing import Any

import numpy as np
import torch

__all__ = [
    "STATE_WORDS",
    "default_state_view",
    "memory_of",
    "private_states",
    "raw_view",
    "words_view",
]

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
# The bytes of a C++ generator searched or read: its words lie in the first _SEARCH.
_EXTENT = _SEARCH + _KEY_BYTES + _DOUBLE_FLAG + 1
# The words within a state's view.
STATE_WORDS = slice(_FIELDS.size, _FIELDS.size + _KEY_BYTES)


def raw_view(address: int, size: int) -> memoryview:
    """``size`` bytes at ``address`` as a writable byte memoryview (:func:`memory_of` gives
    the ctypes array it shows)."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


def memory_of(view: memoryview) -> Any:
    """The ctypes array a :func:`raw_view` shows whole: its ``raw`` attribute reads and
    writes all the bytes in one call, in about half the time of the view's slice
    assignment (it runs several times per batch)."""
    memory = view.obj
    if not isinstance(memory, ctypes.Array) or ctypes.sizeof(memory) != view.nbytes:
        raise ValueError("not a whole raw view")
    return memory


def _mapped(addresses: list[int]) -> bool:
    """Whether, for each of ``addresses`` (a C++ generator), the bytes its state may occupy
    lie in one readable mapping of this process (``/proc/self/maps``; ``False`` where there
    is none). One pass, which ends once every address is found."""
    wanted = {(address, address + _EXTENT) for address in addresses}
    try:
        with open("/proc/self/maps", encoding="ascii") as maps:
            for line in maps:
                span, permissions = line.split(" ", 2)[:2]
                start, stop = (int(bound, 16) for bound in span.split("-"))
                found = {(low, high) for low, high in wanted if start <= low and high <= stop}
                if found:
                    if not permissions.startswith("r"):
                        return False
                    wanted -= found
                    if not wanted:
                        return True
    except (OSError, ValueError):
        return False
    return False


def _impl(generator: Any) -> int | None:
    """The address of the C++ generator behind ``generator``, a plain torch CPU generator
    (see :func:`_mapped` before reading there)."""
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
    return impl


@functools.cache
def _numpy_words(seed: int) -> bytes:
    """The words NumPy's legacy ``seed(seed)`` leaves: ``init_genrand(seed)``."""
    return np.random.RandomState(seed).get_state()[1].astype(np.uint32).tobytes()


def _words_offset(generator: torch.Generator, impl: int) -> int | None:
    """Where the words lie in ``generator``'s C++ object at ``impl``, found and checked.

    torch's ``manual_seed(s)`` of a 32-bit ``s`` leaves them ``init_genrand(s)``, what
    NumPy's legacy ``seed(s)`` leaves its key: the words are found in the object's first
    bytes by seeding ``generator`` (a private one: it is reseeded) and checked against
    NumPy's state for two seeds.
    """
    generator.manual_seed(12345)
    raw = ctypes.string_at(impl, _SEARCH + _KEY_BYTES)
    marker = _numpy_words(12345)[:64]
    # The first place the words may start; checked below by seeding (the bytes after the
    # object may hold a copy of them).
    offset = raw.find(marker, 0, _SEARCH + len(marker))
    if offset < _FIELDS.size or offset % 4:
        return None
    view = raw_view(impl + offset, _KEY_BYTES)
    for seed in (12345, _MASK32):
        generator.manual_seed(seed)
        if bytes(view) != _numpy_words(seed):
            return None
    return offset


def words_view(generator: torch.Generator) -> memoryview | None:
    """The words (``uint32 state[624]``) inside a private torch CPU generator, if found and
    checked; read only, never written (``generator`` is reseeded)."""
    try:
        impl = _impl(generator)
        if impl is None or not _mapped([impl]):
            return None
        offset = _words_offset(generator, impl)
    except (ValueError, OverflowError, TypeError, RuntimeError):
        return None
    return raw_view(impl + offset, _KEY_BYTES) if offset is not None else None


def _state_at(impl: int, offset: int) -> memoryview:
    return raw_view(impl + offset - _FIELDS.size, _FIELDS.size + _KEY_BYTES + _DOUBLE_FLAG + 1)


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


def _copy_holds(
    source: torch.Generator,
    source_view: memoryview,
    target: torch.Generator,
    target_view: memoryview,
    cached: bool,
) -> bool:
    """Copying the state bytes from ``source`` to ``target`` (both private) gives ``target``
    ``source``'s ``get_state()`` and draws; ``cached``: the source holds a cached normal
    sample and the target none, else the other way round."""
    source.manual_seed(20240611 if cached else 7)
    torch.rand(5, generator=source)
    target.manual_seed(99)
    torch.randn(1, dtype=torch.float64, generator=source if cached else target)
    target_view[:] = source_view
    if not torch.equal(source.get_state(), target.get_state()):
        return False
    for draw in (torch.rand, torch.randn):
        if not torch.equal(draw(7, generator=source), draw(7, generator=target)):
            return False
    return torch.equal(
        torch.randn(3, dtype=torch.float64, generator=source),
        torch.randn(3, dtype=torch.float64, generator=target),
    )


def private_states(count: int) -> list[tuple[torch.Generator, memoryview]] | None:
    """``count`` private torch CPU generators, each with its whole state in place, where the
    layout is proven on them (see the module's docstring); ``None`` where it is not.

    The edges are proven on the first generator by reading; the copies, from each
    generator to the next and from the last to the first, with and without a cached
    normal sample.
    """
    generators = [torch.Generator(device="cpu") for _ in range(max(count, 2))]
    try:
        found = [_impl(generator) for generator in generators]
        impls = [impl for impl in found if impl is not None]
        if len(impls) < len(generators) or not _mapped(impls):
            return None
        offsets = [_words_offset(generator, impl) for generator, impl in zip(generators, impls)]
        offset = offsets[0]
        if offset is None or any(other != offset for other in offsets):
            return None
        views = [_state_at(impl, offset) for impl in impls]
        if not _edges_hold(generators[0], views[0]):
            return None
        for index, (generator, view) in enumerate(zip(generators, views)):
            following = (index + 1) % len(generators)
            for cached in (True, False):
                if not _copy_holds(
                    generator, view, generators[following], views[following], cached
                ):
                    return None
        for generator in generators:
            generator.manual_seed(0)
    except (ValueError, OverflowError, TypeError, RuntimeError):
        return None
    return list(zip(generators, views))[:count]


def default_state_view(private: torch.Generator, view: memoryview) -> memoryview | None:
    """The state of ``torch.default_generator`` in place, at the place ``view`` has in
    ``private`` (from :func:`private_states`); only where its fields read what its
    ``get_state()`` says.

    ``private`` is set to the default generator's state to compare them; the default
    generator itself is only read.
    """
    default = torch.default_generator
    try:
        # private's memory was proven with its layout; the default generator's is read.
        private_impl, impl = _impl(private), _impl(default)
        if private_impl is None or impl is None or not _mapped([impl]):
            return None
        offset = ctypes.addressof(ctypes.c_char.from_buffer(view)) - private_impl + _FIELDS.size
        state = _state_at(impl, offset)
        private.set_state(default.get_state())
        if (
            _fields(state) != _fields(view)
            or bytes(state[STATE_WORDS]) != bytes(view[STATE_WORDS])
            or _double_cache(state) != _double_cache(view)
        ):
            return None
    except (ValueError, OverflowError, TypeError, RuntimeError):
        return None
    return state
