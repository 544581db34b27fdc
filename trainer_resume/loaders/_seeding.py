"""Running a read under the generators it must see, and giving the caller's states back, in microseconds.

Two ways a loader's reads draw their randomness:

* :class:`CallerGenerators` (map-style batches): the global generators are seeded
  for the batch (:func:`seed_batch`), the batch is fetched, and the caller's states
  come back.
* :class:`OwnGenerators` (a copy of an ``IterableDataset`` read in the main
  process): the copy's generators carry on from read to read, as a worker's would; they
  are put in place for each read, taken back after it, and the caller's states come
  back.

Both hold ``rng.hold_generators()`` while the global generators hold anything but
the caller's states, so a pause taken on another thread never captures them. In a
worker process nothing but the loader's reads draws from the global generators, so
reads there run as they are (:func:`run_seeded`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from torch.utils.data import get_worker_info

from ..rng import hold_generators
from ._global_generators import (
    Snapshot,
    capture,
    global_seeder,
    install,
    layout,
    seed_global,
    torch_accessors,
    use_seeding_generator,
)
from ._torch_generator_memory import memory_of

__all__ = [
    "CallerGenerators",
    "NumPyGeneratorReplacedError",
    "OwnGenerators",
    "caller_generators",
    "replaced_in_worker",
    "run_seeded",
    "seed_batch",
]

T = TypeVar("T")

# What a read runs under: the batch seed for seed_batch, or a function that sets the states.
Seed = int | Callable[[], None]

seed_batch = seed_global  # seeds Python random, NumPy's global generator and torch CPU


class CallerGenerators:
    """Runs a fetch in the main process and hands the caller's generator states back, also on errors.

    ``run(seed, fetch)`` seeds the generators (``seed_batch(seed)`` for an ``int``, else
    ``seed()``) then calls ``fetch()`` and returns what it returned; the caller's Python,
    NumPy and torch CPU states come back after it. It is a function bound to this
    process's views of the generators (it runs once per batch).
    """

    __slots__ = ("run",)

    def __init__(self) -> None:
        self.run: Callable[[Seed, Callable[[], Any]], Any] = _hand_back(layout(), hold_generators())


def _hand_back(place: Any, lock: Any) -> Callable[[Seed, Callable[[], T]], T]:
    python, gauss, instance = place.python, place.gauss, place.python_instance
    numpy_state, (get_torch, _, put_taken) = place.numpy_state, torch_accessors()
    key = place.numpy_key()  # finds the bit generator first
    bit_generator = place.numpy_bit_generator
    seeder = global_seeder()
    # Written whole through the arrays they show (read through the views).
    python_memory, key_memory, gauss_memory = _memories(python, key, gauss)

    def run(seed: Seed, fetch: Callable[[], T]) -> T:
        # Another thread capturing the generators (a pause) waits until they are back.
        with lock:
            if python is None or key is None or numpy_state._bit_generator is not bit_generator:
                # The public accessors, or a NumPy generator the caller replaced.
                caller, caller_bit_generator = capture(), numpy_state._bit_generator
                try:
                    if type(seed) is int:
                        seeder(seed)
                    else:
                        seed()  # type: ignore[operator]
                    return fetch()
                finally:
                    # Replaced by the seeding's, or by the fetch.
                    if numpy_state._bit_generator is not caller_bit_generator:
                        np.random.set_bit_generator(caller_bit_generator)
                    install(caller)
            python_state, gauss_next = python.tobytes(), instance.gauss_next
            numpy_state_bytes, numpy_gauss = key.tobytes(), gauss.tobytes()
            torch_state = get_torch()
            try:
                if type(seed) is int:
                    seeder(seed)
                else:
                    seed()  # type: ignore[operator]
                return fetch()
            finally:
                if numpy_state._bit_generator is not bit_generator:  # the fetch replaced it
                    np.random.set_bit_generator(bit_generator)
                put_taken(torch_state)
                python_memory.raw = python_state
                instance.gauss_next = gauss_next
                key_memory.raw = numpy_state_bytes
                gauss_memory.raw = numpy_gauss

    return run


_CALLER: list[CallerGenerators] = []  # this process's, made on first use (never pickled)


def caller_generators() -> CallerGenerators:
    if not _CALLER:
        _CALLER.append(CallerGenerators())
    return _CALLER[0]


def run_seeded(seed: Seed, fetch: Callable[[], T]) -> T:
    """``fetch()`` seeded as :class:`CallerGenerators` seeds it; in the main process the
    caller's generators come back after."""
    if get_worker_info() is not None:
        # In a worker nothing but these fetches draws from the global generators,
        # and each fetch reseeds them, so there is no caller state to restore.
        if type(seed) is int:
            seed_batch(seed)
        else:
            seed()  # type: ignore[operator]
        return fetch()
    return (_CALLER[0] if _CALLER else caller_generators()).run(seed, fetch)


class OwnGenerators:
    """Generators of their own for reads in the main process, carried on from read to read.

    :meth:`run` puts the kept states in place (nothing before the first read, which
    seeds them itself), runs the read, keeps the states it left (:meth:`after`), and
    gives the caller's back, also on errors. It runs once per batch: over this
    process's raw views of the generators it swaps bytes in and out, and otherwise
    goes through :class:`CallerGenerators` and the public accessors.
    """

    __slots__ = ("_caller", "_states", "_swap")

    def __init__(self) -> None:
        self._caller = caller_generators()
        self._states: Snapshot | None = None
        self._swap = _own_swap(layout())

    def run(self, read: Callable[[], T]) -> T:
        swap = self._swap
        if swap is not None:
            done, result, states = swap(self._states, read)
            if done:
                self._states = states
                return result  # type: ignore[return-value]

        def own() -> T:
            place = layout()
            numpy_state, seeding = place.numpy_state, place.seeding
            numpy_before = numpy_state._bit_generator
            result = read()
            # Replaced by the read itself (a pass the read opens or ends is seeded on seeding).
            if numpy_state._bit_generator not in (numpy_before, seeding):
                raise NumPyGeneratorReplacedError(_REPLACED)
            self._states = capture()
            return result

        return self._caller.run(self._install, own)

    def _install(self) -> None:
        if self._states is not None:
            # Into the MT19937 the copy's reads draw from, whatever kind the caller's is.
            use_seeding_generator(layout())
            install(self._states)

    def after(self) -> Snapshot:
        """The states the last read left (its successor starts from them)."""
        if self._states is None:
            raise RuntimeError("OwnGenerators.after() before any read")
        return self._states


class NumPyGeneratorReplacedError(RuntimeError):
    """A read of an ``IterableDataset`` copy in the main process replaced NumPy's global bit
    generator (a fetch failure: the loader reports it, naming the fix)."""


_REPLACED = (
    "the dataset replaced NumPy's global bit generator (np.random.set_bit_generator) while "
    "a copy of it was read in the main process: a copy's generators carry on from read to read "
    "as a worker's do, and another bit generator cannot be carried; draw from a "
    "np.random.Generator of the dataset's own and save its state in the dataset's state_dict()"
)


def replaced_in_worker(kind: str) -> str:
    """Why a copy read in a worker that made a ``kind`` NumPy's global bit generator is refused."""
    return (
        f"the dataset made a {kind} NumPy's global bit generator (np.random.set_bit_generator) "
        "while a copy of it was read in a worker: a copy's generators are saved with each "
        "delivered batch and put back when it resumes, and only an MT19937's state can be; "
        "draw from a np.random.Generator of the dataset's own and save its state in the "
        "dataset's state_dict()"
    )


def _own_swap(
    place: Any,
) -> Callable[[Snapshot | None, Callable[[], Any]], tuple[bool, Any, Snapshot | None]] | None:
    """``swap(own, read)``: ``read()`` under ``own``'s states, returning ``(True, result, states after)``.

    ``(False, None, None)`` without reading where the raw views do not hold (a NumPy
    generator replaced, a state kept in the public form): the caller then swaps
    through the public accessors. ``None`` where this process has no raw views.
    """
    python, gauss, instance = place.python, place.gauss, place.python_instance
    numpy_state, (get_torch, put_torch, put_taken) = place.numpy_state, torch_accessors()
    key = place.numpy_key()
    bit_generator = place.numpy_bit_generator
    # Only over the MT19937 a read's seeding draws from (its states are read from its views).
    if python is None or key is None or gauss is None or bit_generator is not place.seeding:
        return None
    lock = hold_generators()
    # Written whole through the arrays they show (read through the views).
    python_memory, key_memory, gauss_memory = _memories(python, key, gauss)

    def swap(own: Snapshot | None, read: Callable[[], Any]) -> tuple[bool, Any, Snapshot | None]:
        with lock:
            if numpy_state._bit_generator is not bit_generator or (
                own is not None and not (type(own.python) is bytes and type(own.numpy) is bytes)
            ):
                return False, None, None
            python_state, gauss_next = python.tobytes(), instance.gauss_next
            numpy_state_bytes, numpy_gauss = key.tobytes(), gauss.tobytes()
            torch_state = get_torch()
            try:
                if own is not None:
                    # own.torch was taken by get_torch() after the last read (bytes), or loaded
                    (put_taken if type(own.torch) is bytes else put_torch)(own.torch)
                    python_memory.raw = own.python
                    instance.gauss_next = own.gauss_next
                    key_memory.raw = own.numpy
                    gauss_memory.raw = own.numpy_gauss
                result = read()
                after = Snapshot(
                    python.tobytes(),
                    instance.gauss_next,
                    key.tobytes(),
                    gauss.tobytes(),
                    get_torch(),
                )
            finally:
                replaced = numpy_state._bit_generator is not bit_generator
                if replaced:  # by the read: the caller's comes back, and the read is refused
                    np.random.set_bit_generator(bit_generator)
                put_taken(torch_state)
                python_memory.raw = python_state
                instance.gauss_next = gauss_next
                key_memory.raw = numpy_state_bytes
                gauss_memory.raw = numpy_gauss
            if replaced:
                raise NumPyGeneratorReplacedError(_REPLACED)
            return True, result, after

    return swap


def _memories(*views: memoryview | None) -> tuple[Any, ...]:
    return tuple(memory_of(view) if view is not None else None for view in views)
