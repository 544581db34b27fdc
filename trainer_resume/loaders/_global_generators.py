"""The global generators' states taken whole and put back, and seeded from one integer, in microseconds.

Python ``random``, NumPy's legacy global generator and torch's CPU generator hold what
augmentation code draws from. Their public accessors are slow (``random.getstate``
builds 625 ints, ``np.random.get_state`` a tuple around an array: tens of
microseconds), so where this interpreter's layout is the known one the states are
copied as raw bytes through memoryviews:

* Python ``random``: the Mersenne Twister inside CPython's ``random.Random`` object
  (an int index, then ``uint32 state[624]``) and its ``gauss_next`` attribute. The
  layout is checked once per process against ``getstate`` / ``setstate`` on scratch
  generators.
* NumPy: the ``MT19937`` bit generator's state through
  ``bit_generator.ctypes.state_address`` (public NumPy API: ``uint32 key[624]; int
  pos``), and the cached second Gaussian that the legacy ``RandomState`` keeps in its
  own object (``int has_gauss; double gauss``). Its place is found once per process, on
  a private ``RandomState``, by writing a marker through ``set_state`` and checked by
  writing through the view and reading back with ``get_state``. If
  ``np.random.set_bit_generator`` replaces the bit generator, the next access finds the
  new one; :func:`seed_global` makes ``_Layout.seeding`` (the MT19937 found first, or
  one of its own) global again before it seeds, so every batch draws from an MT19937
  whatever was global.
* torch: ``get_state`` / ``set_state`` (a 5 KB tensor; no faster public route) for the
  states a :class:`Snapshot` holds; the per-batch hand-back of the caller's state
  (:func:`torch_accessors`) and the seeding copy the state in place where its layout is
  proven (``_torch_generator_memory``).

Where a check fails, the public accessors are used: slower, never different. A
:class:`Snapshot` holds either form and converts to the saved
:class:`~trainer_resume.state.RandomState` schema and back. CUDA generators are never
touched.

:func:`seed_global` gives Python ``random`` the Mersenne Twister state of
``init_genrand(low 32 bits)``, NumPy's global generator ``seed(high 32 bits)`` and torch
CPU the whole seed, in every process and with either form. Where torch CPU's state lies
in place (the layout proven), ``manual_seed`` seeds it and its words, ``init_genrand(low
32 bits)``, are copied to Python; NumPy's words are computed by a private torch generator
whose words are read in place (found and checked once per process). Elsewhere that
generator, else a private NumPy ``RandomState`` (a third of ``random.seed``'s cost),
computes Python's words too.
"""

from __future__ import annotations

import ctypes
import functools
import random
import struct
import sys
import threading
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..rng import RNG_FORMAT, numpy_global_state
from ..state import RandomState
from ._torch_generator_memory import (
    STATE_WORDS,
    default_state_view,
    memory_of,
    private_states,
    raw_view,
    words_view,
)

__all__ = [
    "Snapshot",
    "capture",
    "fingerprint",
    "global_seeder",
    "install",
    "seed_global",
    "snapshot_of",
    "state_of",
]

_MASK32 = (1 << 32) - 1
_WORDS = 624
_KEY_BYTES = _WORDS * 4
_MT_BYTES = _KEY_BYTES + 4  # NumPy's mt19937_state: uint32 key[624]; int pos
_PY_OFFSET = (
    16  # CPython's object header (reference count, type); then int index; uint32 state[624]
)
_FRESH_INDEX = (_WORDS).to_bytes(4, sys.byteorder)  # init_genrand leaves the index at 624
_GAUSS_BYTES = 16  # int has_gauss; 4 bytes of padding; double gauss
_NO_GAUSS = bytes(_GAUSS_BYTES)  # has_gauss 0, gauss 0.0
_MARKER = 0.8147236863931789  # a cached Gaussian no state holds by chance


def _python_view(instance: random.Random) -> memoryview | None:
    """``instance``'s index and state as raw memory, if this interpreter's layout is the known one."""
    if sys.implementation.name != "cpython" or type(instance) is not random.Random:
        return None
    probe, other = random.Random(20240611), random.Random(7)
    probe.random()
    try:
        raw = ctypes.string_at(id(probe) + _PY_OFFSET, _MT_BYTES)
        words = array("I")
        words.frombytes(raw[4:])
        index = int.from_bytes(raw[:4], sys.byteorder, signed=True)
        if words.itemsize != 4 or (*words, index) != probe.getstate()[1]:
            return None
        raw_view(id(other) + _PY_OFFSET, _MT_BYTES)[:] = raw
        if other.getstate() != probe.getstate() or other.random() != probe.random():
            return None
    except (ValueError, OverflowError, TypeError):
        return None
    return raw_view(id(instance) + _PY_OFFSET, _MT_BYTES)


def _key_view(bit_generator: Any) -> memoryview | None:
    if type(bit_generator) is not np.random.MT19937:
        return None
    return raw_view(bit_generator.ctypes.state_address, _MT_BYTES)


def _gauss_view(state: np.random.RandomState) -> memoryview | None:
    """Where ``state`` keeps its cached Gaussian (``has_gauss``, ``gauss``): the place is
    found and checked on a private ``RandomState`` over an MT19937 (``state`` itself is
    never written, and its bit generator may be of any kind)."""
    if type(state) is not np.random.RandomState:
        return None
    offset = _gauss_offset()
    return raw_view(id(state) + offset, _GAUSS_BYTES) if offset is not None else None


def _gauss_offset() -> int | None:
    """The offset of the cached Gaussian in a ``RandomState`` object, or ``None``."""
    probe = np.random.RandomState(np.random.MT19937(20240611))
    saved = probe.get_state()
    try:
        probe.set_state(("MT19937", saved[1], saved[2], 1, _MARKER))
        raw = ctypes.string_at(id(probe), type(probe).__basicsize__)
        found = raw.find(struct.pack("d", _MARKER))
        offset = found - 8
        if found < 0 or offset < 0 or raw.find(struct.pack("d", _MARKER), found + 1) >= 0:
            return None
        if int.from_bytes(raw[offset : offset + 4], sys.byteorder) != 1:
            return None
        view = raw_view(id(probe) + offset, _GAUSS_BYTES)
        probe.set_state(("MT19937", saved[1], saved[2], 0, 0.0))
        if bytes(view[:4]) != bytes(4):
            return None
        view[:] = (1).to_bytes(4, sys.byteorder) + bytes(4) + struct.pack("d", 0.25)
        if probe.get_state()[3:] != (1, 0.25):
            return None
        return offset
    except (ValueError, TypeError):
        return None


class _Layout:
    """This process's views of the generators (found once, never pickled)."""

    def __init__(self) -> None:
        self.python_instance = random._inst  # held: the view points into it
        self.python = _python_view(self.python_instance)
        self.numpy_state = np.random.mtrand._rand
        self.gauss = _gauss_view(self.numpy_state)
        # What NumPy's global generator draws from while a batch is fetched (seed_global):
        # the global MT19937 found here, or one of its own where the global is another kind.
        found = self.numpy_state._bit_generator
        self.seeding = found if type(found) is np.random.MT19937 else np.random.MT19937()
        self.numpy_bit_generator: Any = None
        self.numpy: memoryview | None = None
        self.numpy_seed: Any = None
        self.scratch = np.random.RandomState()
        self.scratch_key = _key_view(self.scratch._bit_generator)
        reference = np.random.RandomState(12345).get_state()
        if not _holds(self.scratch_key, self.scratch.seed, reference):
            self.scratch_key = None
        # MT19937._legacy_seeding (RandomState.seed without its checks and Gaussian reset,
        # in NumPy since 1.17) is used where it gives RandomState.seed's state.
        legacy = getattr(self.scratch._bit_generator, "_legacy_seeding", None)
        fast = legacy is not None and _holds(self.scratch_key, legacy, reference)
        self.scratch_seed = legacy if fast else self.scratch.seed
        # A private torch generator whose state gives the seeded states (see _fast_seeder):
        # its words those of Python and NumPy, its whole state torch CPU's; with a second
        # one that converts a state copied in place to get_state()'s tensor, and torch
        # CPU's state in place (None: get_state / set_state).
        self.torch_state: memoryview | None = None
        self.torch_default: memoryview | None = None
        self.converter: _Converter | None = None
        states = private_states(2)
        if states is not None:
            (self.torch_scratch, self.torch_state), (private, private_state) = states
            self.torch_words = self.torch_state[STATE_WORDS]
            self.torch_default = default_state_view(private, private_state)
            if self.torch_default is not None:
                self.converter = _Converter(private, private_state)
        else:
            self.torch_scratch = torch.Generator(device="cpu")
            self.torch_words = words_view(self.torch_scratch)

    def numpy_key(self) -> memoryview | None:
        """The global bit generator's state, or None (public accessors only)."""
        bit_generator = self.numpy_state._bit_generator
        if bit_generator is not self.numpy_bit_generator:  # replaced by set_bit_generator
            self.numpy_bit_generator = bit_generator  # held: the view points into it
            self.numpy = _key_view(bit_generator) if self.gauss is not None else None
            self.numpy_seed = (
                getattr(bit_generator, "_legacy_seeding", None) if self.numpy is not None else None
            )
        return self.numpy


def _holds(key: memoryview | None, seed: Any, reference: tuple[Any, ...]) -> bool:
    """``seed(12345)`` leaves ``key`` holding ``reference`` (RandomState(12345)'s public state)."""
    if key is None:
        return False
    try:
        seed(12345)
    except (TypeError, ValueError):
        return False
    position = int.from_bytes(key[_KEY_BYTES:], sys.byteorder, signed=True)
    return (
        bytes(key[:_KEY_BYTES]) == reference[1].astype("<u4").tobytes() and position == reference[2]
    )


_LAYOUT: list[_Layout] = []


def layout() -> _Layout:
    if not _LAYOUT:
        _LAYOUT.append(_Layout())
    return _LAYOUT[0]


class Snapshot:
    """The three global generators' states at one moment.

    ``python`` is the raw index and state (``bytes``) with ``gauss_next`` beside it, or
    ``random.getstate()``; ``numpy`` the raw key and position with ``numpy_gauss`` beside
    it, or ``np.random.get_state()``; ``torch`` the CPU generator's state tensor, the
    tensor's bytes as a ``bytearray``, or ``bytes``: the generator's memory, copied in
    place (``torch_accessors``; this process only). It pickles the state as the tensor's
    bytes (a tensor crossing a worker queue would go through shared memory) and keeps
    them as a ``bytearray`` until they are used.
    """

    __slots__ = ("gauss_next", "numpy", "numpy_gauss", "python", "torch")

    def __init__(
        self, python: Any, gauss_next: Any, numpy: Any, numpy_gauss: Any, torch_state: Any
    ) -> None:
        self.python = python
        self.gauss_next = gauss_next
        self.numpy = numpy
        self.numpy_gauss = numpy_gauss
        self.torch = torch_state

    def __getstate__(self) -> tuple[Any, ...]:
        state = self.torch
        raw = state if type(state) is bytearray else bytearray(_tensor(state).numpy())
        return self.python, self.gauss_next, self.numpy, self.numpy_gauss, raw

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        # The torch state stays a bytearray until it is used: most never are (a worker sends
        # one with every batch; only the delivered one's is saved, and only at a pause).
        self.python, self.gauss_next, self.numpy, self.numpy_gauss, self.torch = state


def _tensor(torch_state: Any) -> torch.Tensor:
    kind = type(torch_state)
    if kind is bytearray:  # get_state()'s tensor, unpickled
        return torch.frombuffer(bytearray(torch_state), dtype=torch.uint8)
    if kind is bytes:  # the generator's memory, copied in place
        converter = layout().converter
        if converter is None:  # made only where the layout is proven
            raise RuntimeError("an in-place torch state in a process without the layout")
        return converter.tensor(torch_state)
    return torch_state  # type: ignore[no-any-return]


class _Converter:
    """A private generator that turns a torch state copied in place into ``get_state()``'s
    tensor (at a pause, or when a snapshot is pickled: off the per-batch path)."""

    def __init__(self, generator: torch.Generator, view: memoryview) -> None:
        self._lock = threading.Lock()
        self._generator = generator  # held: the view points into it
        self._view = view

    def tensor(self, state: bytes) -> torch.Tensor:
        with self._lock:
            self._view[:] = state
            return self._generator.get_state()


def same(first: Snapshot, second: Snapshot) -> bool:
    """Whether two snapshots hold exactly the same states (False for the public form)."""
    if not (
        type(first.python) is bytes
        and type(second.python) is bytes
        and type(first.numpy) is bytes
        and type(second.numpy) is bytes
    ):
        return False
    return (
        first.python == second.python
        and first.numpy == second.numpy
        and first.numpy_gauss == second.numpy_gauss
        and _float_bytes(first.gauss_next) == _float_bytes(second.gauss_next)
        and torch.equal(_tensor(first.torch), _tensor(second.torch))
    )


def _float_bytes(value: float | None) -> bytes | None:
    # Bit for bit: 0.0 == -0.0, yet the generators would go on differently.
    return None if value is None else struct.pack("d", value)


def fingerprint() -> tuple[bytes, ...] | None:
    """The three global generators' states as raw bytes, copied in place (this process
    only; never saved or sent), or ``None`` where a layout is not proven: equal
    fingerprints are equal states, for a check cheaper than :func:`capture` and
    :func:`same` (about a microsecond)."""
    place = _LAYOUT[0] if _LAYOUT else layout()
    python, key, generator = place.python, place.numpy_key(), place.torch_default
    if python is None or key is None or generator is None:
        return None
    return (
        python.tobytes(),
        _float_bytes(place.python_instance.gauss_next) or b"",
        key.tobytes(),
        place.gauss.tobytes(),  # type: ignore[union-attr]  # found where key is
        generator.tobytes(),
    )


def capture() -> Snapshot:
    """The global generators' states now (the caller holds ``rng.hold_generators()``)."""
    place = _LAYOUT[0] if _LAYOUT else layout()
    python = place.python
    key = place.numpy_key()
    return Snapshot(
        python.tobytes() if python is not None else random.getstate(),
        place.python_instance.gauss_next,
        key.tobytes() if key is not None else numpy_global_state(),
        place.gauss.tobytes() if key is not None else None,  # type: ignore[union-attr]
        torch.default_generator.get_state(),
    )


def install(snapshot: Snapshot) -> None:
    """Put ``snapshot``'s states into the global generators."""
    place = _LAYOUT[0] if _LAYOUT else layout()
    torch_accessors()[1](snapshot.torch)
    python = place.python
    if type(snapshot.python) is bytes and python is not None:
        python[:] = snapshot.python
        place.python_instance.gauss_next = snapshot.gauss_next
    else:
        random.setstate(_python_public(snapshot))
    key = place.numpy_key()
    if type(snapshot.numpy) is bytes and key is not None:
        key[:] = snapshot.numpy
        place.gauss[:] = snapshot.numpy_gauss  # type: ignore[index]
    else:
        np.random.set_state(_numpy_public(snapshot))


def torch_accessors() -> tuple[Callable[[], Any], Callable[[Any], None], Callable[[Any], None]]:
    """``(get, put, put_taken)`` of torch CPU's state in this process: its memory copied
    in place as ``bytes`` where the layout is proven, else ``get_state`` / ``set_state``.
    ``put`` takes any form a :class:`Snapshot` holds; ``put_taken`` only a state ``get``
    took (C calls, no Python frame: they run once per batch)."""
    view = layout().torch_default
    set_state = torch.default_generator.set_state
    if view is None:
        return torch.default_generator.get_state, lambda state: set_state(_tensor(state)), set_state
    memory = memory_of(view)

    def put(state: Any) -> None:
        if type(state) is bytes:
            memory.raw = state
        else:
            set_state(_tensor(state))

    return view.tobytes, put, functools.partial(setattr, memory, "raw")


def seed_global(seed: int) -> None:
    """Seed Python ``random``, NumPy's global generator and torch CPU from one integer."""
    (_SEEDERS[0] if _SEEDERS else global_seeder())(seed)


def global_seeder() -> Callable[[int], None]:
    """This process's fastest :func:`seed_global`, made on first use (it runs once per batch)."""
    if not _SEEDERS:
        _SEEDERS.append(_fast_seeder(layout()) or _seed_any)
    return _SEEDERS[0]


_SEEDERS: list[Callable[[int], None]] = []  # this process's fastest seeder, made on first use


def use_seeding_generator(place: _Layout) -> None:
    """Make ``place.seeding`` NumPy's global bit generator, if something (a dataset's
    ``np.random.set_bit_generator``) put another there: every batch is seeded and drawn
    from the same MT19937 whatever the process left global, in a worker as in the main
    process (where the caller's comes back after the fetch)."""
    if place.numpy_state._bit_generator is not place.seeding and _SET_BIT_GENERATOR is not None:
        _SET_BIT_GENERATOR(place.seeding)


_SET_BIT_GENERATOR = getattr(np.random, "set_bit_generator", None)  # NumPy 1.25 and later


def _seed_any(seed: int) -> None:
    place = layout()
    use_seeding_generator(place)
    place.scratch_seed(seed & _MASK32)
    python = place.python
    scratch = place.scratch_key
    if python is not None and scratch is not None:
        python[:4] = _FRESH_INDEX
        python[4:] = scratch[:_KEY_BYTES]
        place.python_instance.gauss_next = None
    else:
        key = place.scratch.get_state()[1]
        random.setstate((random.Random.VERSION, (*key.tolist(), _WORDS), None))
    high = (seed >> 32) & _MASK32
    if place.numpy_key() is not None and place.numpy_seed is not None:
        place.numpy_seed(high)
        place.gauss[:] = _NO_GAUSS  # type: ignore[index]  # no cached Gaussian, as seed() leaves it
    else:
        np.random.seed(high)
    torch.default_generator.manual_seed(seed)


def _fast_seeder(place: _Layout) -> Callable[[int], None] | None:
    """``_seed_any`` over this process's views, bound once: it runs once per batch."""
    python, scratch, gauss = place.python, place.scratch_key, place.gauss
    bit_generator = place.seeding  # the views of the MT19937 every batch draws from
    key = _key_view(bit_generator) if gauss is not None else None
    numpy_seed, scratch_seed = getattr(bit_generator, "_legacy_seeding", None), place.scratch_seed
    if python is None or scratch is None or key is None or gauss is None or numpy_seed is None:
        return None
    seeded, scratch_state, default_state = place.torch_words, place.torch_state, place.torch_default
    if seeded is not None and scratch_state is not None and default_state is not None:
        return _in_place_seeder(place, python, key, gauss, (seeded, default_state))
    index, words = python[:4], python[4:]
    instance, numpy_state = place.python_instance, place.numpy_state
    manual_seed = torch.default_generator.manual_seed
    # seed_torch(seed) seeds torch CPU and returns the words of init_genrand(low 32 bits),
    # Python's; seed_numpy(high) seeds NumPy.
    if seeded is not None:
        # The words computed by the private torch generator: no call into NumPy per batch.
        torch_seed = place.torch_scratch.manual_seed
        numpy_words, numpy_position = key[:_KEY_BYTES], key[_KEY_BYTES:]

        def seed_torch(seed: int) -> memoryview:
            torch_seed(seed)
            manual_seed(seed)
            return seeded

        def seed_numpy(high: int) -> None:
            torch_seed(high)
            numpy_words[:] = seeded
            numpy_position[:] = _FRESH_INDEX  # NumPy's pos after seed(): 624, as Python's index

    else:
        fresh = scratch[:_KEY_BYTES]

        def seed_torch(seed: int) -> memoryview:
            scratch_seed(seed & _MASK32)
            manual_seed(seed)
            return fresh

        def seed_numpy(high: int) -> None:
            numpy_seed(high)

    def seed_fast(seed: int) -> None:
        if numpy_state._bit_generator is not bit_generator:  # replaced by set_bit_generator
            use_seeding_generator(place)
        low_words = seed_torch(seed)
        index[:] = _FRESH_INDEX
        words[:] = low_words  # before seed_numpy: the torch words are those of the last seed
        instance.gauss_next = None
        seed_numpy((seed >> 32) & _MASK32)
        gauss[:] = _NO_GAUSS  # no cached Gaussian, as seed() leaves it

    return seed_fast


def _in_place_seeder(
    place: _Layout,
    python: memoryview,
    key: memoryview,
    gauss: memoryview,
    torch_views: tuple[memoryview, memoryview],
) -> Callable[[int], None]:
    """``_fast_seeder`` where torch's state lies in place: torch CPU is seeded and its words
    copied to Python, and the private torch generator computes NumPy's words (one frame: it
    runs once per batch). ``torch_views``: the private generator's words, and torch CPU's
    state."""
    seeded, default_state = torch_views
    default_words = default_state[STATE_WORDS]
    index, words = python[:4], python[4:]
    numpy_words, numpy_position = key[:_KEY_BYTES], key[_KEY_BYTES:]
    instance, numpy_state = place.python_instance, place.numpy_state
    bit_generator, torch_seed = place.seeding, place.torch_scratch.manual_seed
    manual_seed = torch.default_generator.manual_seed
    gauss_memory = memory_of(gauss)

    def seed_in_place(seed: int) -> None:
        if numpy_state._bit_generator is not bit_generator:  # replaced by set_bit_generator
            use_seeding_generator(place)
        manual_seed(seed)  # its words: init_genrand(low 32 bits), Python's
        index[:] = _FRESH_INDEX
        words[:] = default_words
        instance.gauss_next = None
        torch_seed((seed >> 32) & _MASK32)  # init_genrand(high 32 bits): NumPy's seed()
        numpy_words[:] = seeded
        numpy_position[:] = _FRESH_INDEX  # NumPy's pos after seed(): 624, as Python's index
        gauss_memory.raw = _NO_GAUSS  # no cached Gaussian, as seed() leaves it

    return seed_in_place


# --- the saved schema ----------------------------------------------------------------


def _python_public(snapshot: Snapshot) -> tuple[int, tuple[int, ...], float | None]:
    if type(snapshot.python) is not bytes:
        return snapshot.python  # type: ignore[no-any-return]
    words = array("I")
    words.frombytes(snapshot.python[4:])
    index = int.from_bytes(snapshot.python[:4], sys.byteorder, signed=True)
    return random.Random.VERSION, (*words, index), snapshot.gauss_next


def _numpy_public(snapshot: Snapshot) -> tuple[str, np.ndarray, int, int, float]:
    if type(snapshot.numpy) is not bytes:
        return snapshot.numpy  # type: ignore[no-any-return]
    key = np.frombuffer(snapshot.numpy, dtype=np.uint32, count=_WORDS).copy()
    pos = int.from_bytes(snapshot.numpy[_KEY_BYTES:], sys.byteorder, signed=True)
    has_gauss = int.from_bytes(snapshot.numpy_gauss[:4], sys.byteorder, signed=True)
    (gauss,) = struct.unpack("d", snapshot.numpy_gauss[8:])
    return "MT19937", key, pos, has_gauss, gauss


def state_of(snapshot: Snapshot) -> RandomState:
    """``snapshot`` as a :class:`~trainer_resume.state.RandomState` (plain data, no CUDA)."""
    if type(snapshot.python) is bytes:
        internal = np.empty(_WORDS + 1, dtype=np.int64)
        internal[:_WORDS] = np.frombuffer(snapshot.python, dtype=np.uint32, offset=4)
        internal[_WORDS] = int.from_bytes(snapshot.python[:4], sys.byteorder, signed=True)
        version, gauss_next = random.Random.VERSION, snapshot.gauss_next
    else:
        version, words, gauss_next = snapshot.python
        internal = np.asarray(words, dtype=np.int64)
    kind, key, pos, has_gauss, gauss = _numpy_public(snapshot)
    return {
        "format": RNG_FORMAT,
        "python": {
            "version": int(version),
            "internal": torch.from_numpy(internal),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "torch": _tensor(snapshot.torch).clone(),
        "cuda": None,
        "cuda_device": None,
    }


def snapshot_of(state: RandomState) -> Snapshot:
    """A :class:`Snapshot` of a validated ``state`` (public form: the first ``install`` is slower)."""
    python, numpy_state = state["python"], state["numpy"]
    return Snapshot(
        (python["version"], tuple(python["internal"].tolist()), python["gauss_next"]),
        None,
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        ),
        None,
        state["torch"].clone(),
    )
