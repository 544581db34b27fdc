"""Endless index streams made of equal-length cycles, each regenerated from ``(seed, cycle)``.

Every stream in this package is a concatenation of cycles of one fixed length, so
a stream position maps to ``(position // length, position % length)`` in closed
form and reaching any position costs one cycle's order, never the positions before
it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..rng import derive_seed

CycleOrder = Callable[[int], torch.Tensor]


def cycle_generator(seed: int, cycle: int) -> torch.Generator:
    """A private CPU generator fixed by ``(seed, cycle)``; no global RNG is drawn."""
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, cycle))
    return generator


def permutation(size: int, seed: int, cycle: int) -> torch.Tensor:
    """The permutation of ``range(size)`` that cycle ``cycle`` of a stream seeded ``seed`` uses."""
    return torch.randperm(size, generator=cycle_generator(seed, cycle))


class CycleReader:
    """Reads stream positions, holding the order of one cycle at a time.

    The held cycle is replaced (and the old one freed) as soon as a read moves past
    it; nothing else is cached, so a reader's memory is one cycle's order.

    Args:
        length: Samples per cycle (at least 1).
        order: ``order(cycle)`` returns that cycle's indices as a 1-D int64 tensor
            of ``length`` elements.
    """

    __slots__ = ("_length", "_order", "_cycle", "_indices")

    def __init__(self, length: int, order: CycleOrder) -> None:
        self._length = length
        self._order = order
        self._cycle = -1
        self._indices: torch.Tensor | None = None

    def take(self, start: int, count: int, stride: int = 1) -> list[int]:
        """The indices at stream positions ``start, start + stride, ...`` (``count`` of them) as a new list."""
        result: list[int] = []
        while count > 0:
            cycle, offset = divmod(start, self._length)
            indices = self.cycle(cycle)
            piece = indices[offset : offset + count * stride : stride]
            result.extend(piece.tolist())
            taken = len(piece)  # at least 1: offset < length
            count -= taken
            start += taken * stride
        return result

    def cycle(self, cycle: int) -> torch.Tensor:
        """The order of ``cycle``; the previously held cycle is dropped first."""
        indices = self._indices
        if cycle != self._cycle or indices is None:
            self._indices = indices = None  # free the old cycle before building the next one
            indices = self._indices = self._order(cycle)
            self._cycle = cycle
        return indices
