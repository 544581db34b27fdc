"""Seeding the global generators once per batch, and giving the caller's states back,
in microseconds.

``rng_scope`` costs tens of microseconds: ``random.seed`` runs CPython's
``init_by_array``, ``random.getstate`` builds 625 Python ints, and
``np.random.get_state`` / ``set_state`` copy NumPy's state through Python objects.
That is more than a cheap batch costs to fetch. Both Mersenne Twister states (Python
``random`` and NumPy's legacy global generator) are 2500 bytes (624 words and a
position), so here they are copied as raw bytes:

* NumPy's global generator through ``bit_generator.ctypes.state_address`` (public
  NumPy API). The bytes miss a cached second Gaussian (``has_gauss``), so they are
  used only when the caller cannot hold one: when its bytes are unchanged since the
  previous batch handed them back (a hand-back leaves no cached Gaussian); otherwise
  ``get_state`` / ``set_state`` are used.
* Python ``random`` through the state inside CPython's ``random.Random`` object (and
  its ``gauss_next`` attribute). The layout is checked once per process against
  ``getstate`` / ``setstate`` on scratch generators; where it does not match (another
  implementation or build), ``random.getstate`` / ``setstate`` / ``seed`` are used.

:func:`seed_batch` seeds all three from one batch seed. With the checked layout,
Python ``random`` gets the Mersenne Twister state of ``init_genrand(low 32 bits)``
(computed by a private NumPy ``RandomState``: a third of ``random.seed``'s cost)
and NumPy's global generator ``seed(high 32 bits)``; torch CPU gets the whole seed.
Worker processes and the main process seed the same way, so batches do not depend
on ``num_workers``. CUDA generators are never touched.
"""

from __future__ import annotations

import ctypes
import random
import sys
from array import array
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from ..rng import hold_generators, seed_cpu_generators

__all__ = ["CallerGenerators", "seed_batch"]

T = TypeVar("T")

_MASK32 = (1 << 32) - 1
_MT_BYTES = 624 * 4 + 4  # NumPy's mt19937_state: uint32 key[624]; int pos
_KEY_BYTES = 624 * 4
_PY_OFFSET = (
    16  # CPython's object header (reference count, type); then int index; uint32 state[624]
)


def _python_state_address(instance: random.Random) -> int | None:
    """Where ``instance``'s Mersenne Twister state lies, if this interpreter's layout is the known one."""
    if sys.implementation.name != "cpython":
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
        ctypes.memmove(id(other) + _PY_OFFSET, raw, _MT_BYTES)
        if other.getstate() != probe.getstate() or other.random() != probe.random():
            return None
    except (ValueError, OverflowError, TypeError):
        return None
    return id(instance) + _PY_OFFSET


def _numpy_state_address(bit_generator: Any) -> int | None:
    if type(bit_generator) is not np.random.MT19937:
        return None
    return bit_generator.ctypes.state_address


class _Process:
    """This process's addresses and scratch generator (found once, never pickled)."""

    def __init__(self) -> None:
        instance = random._inst
        self.python = _python_state_address(instance) if type(instance) is random.Random else None
        getter = getattr(np.random, "get_bit_generator", None)
        self.numpy = _numpy_state_address(getter()) if getter is not None else None
        self.scratch = np.random.RandomState()
        self.scratch_address = _numpy_state_address(getattr(self.scratch, "_bit_generator", None))
        if self.scratch_address is not None:
            self.scratch.seed(12345)  # check the scratch bytes against its public state once
            raw = ctypes.string_at(self.scratch_address, _MT_BYTES)
            state = self.scratch.get_state()
            if (
                raw[:_KEY_BYTES] != state[1].astype("<u4").tobytes()
                or int.from_bytes(raw[_KEY_BYTES:], sys.byteorder, signed=True) != state[2]
            ):
                self.scratch_address = None
        self.fast_seed = self.python is not None and self.scratch_address is not None


_PROCESS: list[_Process] = []


def _process() -> _Process:
    if not _PROCESS:
        _PROCESS.append(_Process())
    return _PROCESS[0]


def seed_batch(seed: int) -> None:
    """Seed Python ``random``, NumPy's global generator and torch CPU for one batch."""
    process = _process()
    if not process.fast_seed:
        seed_cpu_generators(seed)
        return
    process.scratch.seed(seed & _MASK32)
    raw = ctypes.string_at(process.scratch_address, _MT_BYTES)  # type: ignore[arg-type]
    ctypes.memmove(process.python, raw[_KEY_BYTES:] + raw[:_KEY_BYTES], _MT_BYTES)  # index first
    random._inst.gauss_next = None
    np.random.seed((seed >> 32) & _MASK32)
    torch.default_generator.manual_seed(seed)


class CallerGenerators:
    """Runs a fetch in the main process and hands the caller's generator states back, also on errors."""

    __slots__ = ("_numpy_clean", "_process")

    def __init__(self) -> None:
        self._process = _process()
        self._numpy_clean: bytes | None = None  # NumPy's bytes as the last hand-back left them

    def run(self, seed: Callable[[], None], fetch: Callable[[], T]) -> T:
        """``seed()`` then ``fetch()``; the caller's Python, NumPy and torch CPU states come back."""
        # Another thread capturing the generators (a pause) waits until they are back.
        with hold_generators():
            return self._run(seed, fetch)

    def _run(self, seed: Callable[[], None], fetch: Callable[[], T]) -> T:
        python_address, numpy_address = self._process.python, self._process.numpy
        if python_address is not None:
            python: Any = ctypes.string_at(python_address, _MT_BYTES)
            gauss_next = random._inst.gauss_next
        else:
            python = random.getstate()
        numpy_bytes: bytes | None = None
        numpy_full: Any = None
        if numpy_address is not None:
            numpy_bytes = ctypes.string_at(numpy_address, _MT_BYTES)
            if numpy_bytes != self._numpy_clean:
                numpy_full, numpy_bytes = np.random.get_state(), None
        else:
            numpy_full = np.random.get_state()
        torch_state = torch.default_generator.get_state()
        try:
            seed()
            return fetch()
        finally:
            torch.default_generator.set_state(torch_state)
            if python_address is not None:
                ctypes.memmove(python_address, python, _MT_BYTES)
                random._inst.gauss_next = gauss_next
            else:
                random.setstate(python)
            if numpy_bytes is not None:
                np.random.seed(0)  # drops a Gaussian the fetch may have cached (the bytes do not)
                ctypes.memmove(numpy_address, numpy_bytes, _MT_BYTES)
                self._numpy_clean = numpy_bytes
            else:
                np.random.set_state(numpy_full)
                has_gauss = numpy_full[3] if isinstance(numpy_full, tuple) else 1
                clean = numpy_address is not None and not has_gauss
                self._numpy_clean = ctypes.string_at(numpy_address, _MT_BYTES) if clean else None
