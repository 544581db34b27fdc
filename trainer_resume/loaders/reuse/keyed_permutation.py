"""A keyed permutation of ``range(size)`` evaluated one position at a time.

A balanced Feistel network permutes the ``2**bits`` integers that fit in ``bits``
bits (``bits`` even, ``2**bits >= size``); cycle walking (apply the network again
until the value lands below ``size``) restricts it to ``range(size)`` and keeps it a
bijection. Each position costs a bounded number of integer mixes: no table, no
state that grows with the position or with the key, so the index at position ``p``
of a shuffled epoch is computed without generating the rest of the epoch.

Cost of cycle walking: the walks from all ``size`` positions visit every value of
the ``2**bits`` domain at most once in total, and ``2**bits < 4 * size``, so the
mean is below four network passes per position.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...rng import derive_seed

__all__ = ["KeyedPermutation"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
# Luby-Rackoff: four rounds already give a strong pseudo-random permutation for a
# random round function; two more cover the weaker, fixed mix used here.
ROUNDS = 6
_CHUNK = 1 << 16


def _mix(value: int) -> int:
    """SplitMix64 finaliser on Python ints (the round function)."""
    value = (value + _GOLDEN) & _MASK64
    value = ((value ^ (value >> 30)) * _MUL1) & _MASK64
    value = ((value ^ (value >> 27)) * _MUL2) & _MASK64
    return value ^ (value >> 31)


def _mix_array(value: np.ndarray) -> np.ndarray:
    """The same finaliser on uint64 arrays (NumPy wraps uint64 arithmetic modulo 2**64)."""
    value = value + np.uint64(_GOLDEN)
    value = (value ^ (value >> np.uint64(30))) * np.uint64(_MUL1)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(_MUL2)
    return value ^ (value >> np.uint64(31))


class KeyedPermutation:
    """A bijection of ``range(size)`` chosen by an integer ``key``.

    Args:
        size: number of elements, at least 1.
        key: any int; different keys give (with overwhelming probability) different
            permutations.

    Raises:
        TypeError: ``size`` or ``key`` is not an int.
        ValueError: ``size < 1``.
    """

    __slots__ = ("size", "_half", "_mask", "_round_keys")

    def __init__(self, size: int, key: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int, got {type(size).__name__}: {size!r}")
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        if isinstance(key, bool) or not isinstance(key, int):
            raise TypeError(f"key must be an int, got {type(key).__name__}: {key!r}")
        bits = max(2, (size - 1).bit_length())
        bits += bits & 1  # a balanced network needs two equal halves
        self.size = size
        self._half = bits // 2
        self._mask = (1 << self._half) - 1
        self._round_keys = tuple(derive_seed(key, round_index) for round_index in range(ROUNDS))

    @property
    def domain(self) -> int:
        """Size of the power-of-two domain the network permutes (``< 4 * size``)."""
        return 1 << (2 * self._half)

    def __len__(self) -> int:
        return self.size

    def __call__(self, position: int) -> int:
        """Return the element at ``position`` (``0 <= position < size``).

        Raises:
            IndexError: ``position`` is outside ``range(size)``.
        """
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} is outside range({self.size})")
        value = _network(position, self._half, self._mask, self._round_keys)
        while value >= self.size:
            value = _network(value, self._half, self._mask, self._round_keys)
        return value

    def take(self, positions: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`__call__`: the elements at ``positions`` as an int64 array.

        Raises:
            IndexError: a position is outside ``range(size)``.
        """
        positions = np.asarray(positions)
        if positions.size and (positions.min() < 0 or positions.max() >= self.size):
            raise IndexError(f"positions must lie in range({self.size})")
        values = _network_array(
            positions.astype(np.uint64), self._half, self._mask, self._round_keys
        )
        pending = np.flatnonzero(values >= np.uint64(self.size))
        while pending.size:
            walked = _network_array(values[pending], self._half, self._mask, self._round_keys)
            values[pending] = walked
            pending = pending[walked >= np.uint64(self.size)]
        return values.astype(np.int64)

    def iter_chunks(self, chunk: int = _CHUNK, *, start: int = 0) -> Iterator[np.ndarray]:
        """Yield the permutation in order from position ``start`` as int64 arrays of at most
        ``chunk`` elements."""
        for first in range(start, self.size, chunk):
            yield self.take(np.arange(first, min(first + chunk, self.size), dtype=np.int64))


def _network(value: int, half: int, mask: int, round_keys: tuple[int, ...]) -> int:
    left, right = value >> half, value & mask
    for round_key in round_keys:
        left, right = right, left ^ (_mix(round_key ^ right) & mask)
    return (left << half) | right


def _network_array(
    value: np.ndarray, half: int, mask: int, round_keys: tuple[int, ...]
) -> np.ndarray:
    shift, array_mask = np.uint64(half), np.uint64(mask)
    left, right = value >> shift, value & array_mask
    for round_key in round_keys:
        left, right = right, left ^ (_mix_array(right ^ np.uint64(round_key)) & array_mask)
    return (left << shift) | right
