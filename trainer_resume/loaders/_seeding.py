"""Seeding the global generators for one batch in the main process, and giving the
caller's states back, in microseconds.

``rng_scope`` saves and restores through ``random.getstate`` (625 Python ints) and
``np.random.get_state`` / ``set_state``: tens of microseconds each, more than a cheap
batch costs to fetch. Here both Mersenne Twister states are copied as raw bytes
instead (2500 bytes each: 624 words and a position):

* NumPy's legacy global generator: through ``bit_generator.ctypes.state_address``
  (public NumPy API). The bytes miss one thing ``get_state`` holds, a cached second
  Gaussian (``has_gauss``), so they are used only when the caller cannot hold one:
  when its bytes are unchanged since the previous batch handed them back (a restore
  leaves no cached Gaussian). Otherwise ``get_state`` / ``set_state`` are used.
* Python ``random``: the state inside CPython's ``random.Random`` object, plus its
  ``gauss_next`` attribute. The layout is checked once per process against
  ``getstate()`` / ``setstate()`` on a scratch generator; where it does not match
  (another Python implementation or build), ``getstate`` / ``setstate`` are used.

torch CPU is saved and restored through its own state calls; CUDA is not touched.
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

from ..rng import seed_cpu_generators

__all__ = ["CallerGenerators"]

T = TypeVar("T")

_MT_BYTES = 624 * 4 + 4  # NumPy's mt19937_state: uint32 key[624]; int pos
_PY_BYTES = (
    4 + 624 * 4
)  # CPython's RandomObject after its header: int index; uint32 state[624]
_PY_OFFSET = 16  # the object header: reference count and type pointer


def _python_state_address() -> int | None:
    """Where ``random``'s Mersenne Twister state lies, if this interpreter's layout is the known one."""
    if sys.implementation.name != "cpython" or type(random._inst) is not random.Random:
        return None
    probe, other = random.Random(20240611), random.Random(7)
    probe.random()
    try:
        raw = ctypes.string_at(id(probe) + _PY_OFFSET, _PY_BYTES)
        words = array("I")
        words.frombytes(raw[4:])
        index = int.from_bytes(raw[:4], sys.byteorder, signed=True)
        if words.itemsize != 4 or (*words, index) != probe.getstate()[1]:
            return None
        ctypes.memmove(id(other) + _PY_OFFSET, raw, _PY_BYTES)
        if other.getstate() != probe.getstate() or other.random() != probe.random():
            return None
    except (ValueError, OverflowError, TypeError):
        return None
    return id(random._inst) + _PY_OFFSET


class CallerGenerators:
    """Runs a fetch under a seed and hands the caller's generator states back, also on errors."""

    __slots__ = ("_numpy", "_numpy_clean", "_python")

    def __init__(self) -> None:
        getter = getattr(np.random, "get_bit_generator", None)
        bit_generator = getter() if getter is not None else None
        self._numpy: int | None = None
        if type(bit_generator) is np.random.MT19937:
            self._numpy = bit_generator.ctypes.state_address
        self._numpy_clean: bytes | None = (
            None  # NumPy's bytes as the last restore left them
        )
        self._python = _python_state_address()

    def run(self, seed: int, fetch: Callable[[], T]) -> T:
        """``fetch()`` with Python ``random``, NumPy's global generator and torch CPU seeded by ``seed``."""
        python_address, numpy_address = self._python, self._numpy
        if python_address is not None:
            python: Any = ctypes.string_at(python_address, _PY_BYTES)
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
            seed_cpu_generators(seed)
            return fetch()
        finally:
            torch.default_generator.set_state(torch_state)
            if python_address is not None:
                ctypes.memmove(python_address, python, _PY_BYTES)
                random._inst.gauss_next = gauss_next
            else:
                random.setstate(python)
            if numpy_bytes is not None:
                np.random.seed(
                    0
                )  # drops a Gaussian the fetch may have cached (the bytes do not)
                ctypes.memmove(numpy_address, numpy_bytes, _MT_BYTES)
                self._numpy_clean = numpy_bytes
            else:
                np.random.set_state(numpy_full)
                has_gauss = numpy_full[3] if isinstance(numpy_full, tuple) else 1
                clean = numpy_address is not None and not has_gauss
                self._numpy_clean = (
                    ctypes.string_at(numpy_address, _MT_BYTES) if clean else None
                )
