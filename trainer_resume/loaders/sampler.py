"""``InfiniteRandomSampler``: an endless stream of shuffled cycles with a closed-form cursor."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from ..errors import (
    LoaderStateError,
    ResumableBatchConfigurationError,
)
from ..state import SamplerState
from . import _state_keys as keys
from ._cursor import ResumableCursor
from ._cycles import CycleReader, permutation
from ._sharding import resolve_replicas

__all__ = ["InfiniteRandomSampler"]

_CHUNK = 1 << 16  # indices converted to Python ints at a time (bounds memory for big datasets)


class InfiniteRandomSampler(ResumableCursor[SamplerState], Sampler[int]):
    """An endless stream of dataset indices; cycle ``c`` is a permutation fixed by ``(seed, c)``.

    The seed is drawn once, at construction, from ``generator`` (torch's default CPU
    generator when ``None``); cycle ``c`` is ``torch.randperm(n)`` under a private
    generator seeded with ``derive_seed(seed, c)``. Any stream position ``p`` is
    therefore ``(cycle, offset) = divmod(p, n)`` and reaching it costs one
    permutation, never ``O(p)``. The dataset size is read once, at construction.

    With ``resumable=False`` the sampler is a plain sampler: every ``iter()``
    starts at position 0 of the same stream and there is no cursor. With
    ``resumable=True`` it keeps a cursor of *delivered* samples: ``iter()`` starts
    at the cursor, which moves only by :meth:`advance` (when used under a plain
    ``torch.utils.data.DataLoader``, call it for every batch you consume: the
    loader prefetches, so iteration itself says nothing about delivery) or by a
    :class:`~trainer_resume.loaders.ResumableDataLoader`, which records it for you.

    The stream has no end, so ``len()`` is not defined.

    Sharding: with ``num_replicas = W`` and ``rank = r`` the sampler reads rank
    ``r``'s slice of the one global stream: from the cursor ``C`` it yields the
    global positions ``C + r, C + r + W, C + r + 2W, ...``. The cursor is global:
    delivering ``k`` samples on a rank moves it by ``k * W``, so when every rank has
    delivered the same number of samples all ranks hold the same cursor and every
    global position below it was delivered exactly once. A state saved with one
    world size therefore continues with any other: rank ``r'`` of ``W'`` resumes at
    ``C + r'``. Every rank must draw the same seed (seed ``generator`` or torch's
    default generator identically on all ranks).

    Args:
        data_source: A sized dataset (only ``len()`` is used).
        generator: Draws the seed; torch's default CPU generator when ``None``.
        resumable: Keep a cursor and offer ``state_dict`` / ``load_state_dict``.
        num_replicas: Number of ranks sharing the stream (default: the world size of
            an initialized ``torch.distributed`` process group, else 1).
        rank: This rank (default: the process group's rank, else 0).

    Raises:
        ResumableBatchConfigurationError: ``data_source`` is empty.
        TypeError: ``resumable`` is not a bool, ``num_replicas`` / ``rank`` not ints.
        ValueError: ``num_replicas < 1`` or ``rank`` outside ``[0, num_replicas)``.
    """

    def __init__(
        self,
        data_source: Sized,
        *,
        generator: torch.Generator | None = None,
        resumable: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        if not isinstance(resumable, bool):
            raise TypeError(f"resumable must be a bool, got {type(resumable).__name__}")
        self.num_replicas, self.rank = resolve_replicas(num_replicas, rank)
        size = len(data_source)
        if size < 1:
            raise ResumableBatchConfigurationError("InfiniteRandomSampler got an empty dataset")
        self.data_source = data_source
        self.resumable = resumable
        self._size = size
        self._seed = keys.draw_seed(generator)
        self._consumed = 0

    @property
    def dataset_size(self) -> int:
        """Number of indices per cycle (the dataset size at construction)."""
        return self._size

    @property
    def seed(self) -> int:
        """The stream's seed (replaced by :meth:`load_state_dict`)."""
        return self._seed

    @property
    def consumed(self) -> int:
        """The global cursor: samples of the global stream delivered by all ranks together
        (0 when not resumable); with one replica, the delivered samples."""
        return self._consumed

    def __iter__(self) -> Iterator[int]:
        return self._indices_from(self._consumed if self.resumable else 0)

    def _indices_from(self, start: int) -> Iterator[int]:
        # This rank's slice from global cursor ``start``; the reader holds one cycle at a time.
        reader, stride, size = self.reader(), self.num_replicas, self._size
        position = start + self.rank
        while True:
            # Never past the current cycle: a cycle is built only when iteration reaches it.
            count = min(_CHUNK, -(-(size - position % size) // stride))
            yield from reader.take(position, count, stride)
            position += count * stride

    def reader(self) -> CycleReader:
        """A reader of this stream's positions (captures the current seed)."""
        size, seed = self._size, self._seed
        return CycleReader(size, lambda cycle: permutation(size, seed, cycle))

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely against this sampler; changes nothing.

        Raises:
            ResumableModeRequiredError: the sampler was built with ``resumable=False``.
            LoaderStateError: wrong format, dataset size, types, ranges, or
                ``consumed != cycle * dataset_size + offset``.
            ResumableSamplerGeneratorError: the seed is not an int in ``[0, 2**63)``.
        """
        self._require_resumable("validate_state_dict")
        what = "sampler state"
        keys.check_mapping(
            state,
            what,
            (keys.FORMAT, keys.DATASET_SIZE, keys.SEED, keys.CONSUMED, keys.CYCLE, keys.OFFSET),
            (keys.NUM_REPLICAS,),
        )
        keys.check_format(state, what, keys.SAMPLER_FORMAT)
        # Any world size may read a state back: the cursor is global (see the class docstring).
        keys.check_replicas(state, what)
        size = keys.check_count(state, what, keys.DATASET_SIZE)
        if size != self._size:
            raise LoaderStateError(
                f"{what}[{keys.DATASET_SIZE!r}] is {size} but this sampler's dataset has {self._size} samples"
            )
        keys.check_seed(state, what)
        consumed = keys.check_count(state, what, keys.CONSUMED)
        cycle = keys.check_count(state, what, keys.CYCLE)
        offset = keys.check_count(state, what, keys.OFFSET)
        if offset >= size:
            raise LoaderStateError(
                f"{what}[{keys.OFFSET!r}] = {offset} is not below the dataset size {size}"
            )
        if consumed != cycle * size + offset:
            raise LoaderStateError(
                f"{what}: consumed {consumed} != cycle*dataset_size+offset = {cycle}*{size}+{offset}"
            )

    def _state(self) -> SamplerState:
        """Hook: the current cursor as a :class:`SamplerState`."""
        cycle, offset = divmod(self._consumed, self._size)
        return {
            keys.FORMAT: keys.SAMPLER_FORMAT,
            keys.DATASET_SIZE: self._size,
            keys.SEED: self._seed,
            keys.CONSUMED: self._consumed,
            keys.CYCLE: cycle,
            keys.OFFSET: offset,
            keys.NUM_REPLICAS: self.num_replicas,
        }  # type: ignore[return-value]

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        """Hook: adopt an already validated state."""
        self._seed = state[keys.SEED]
        self._consumed = state[keys.CONSUMED]

    def _advance(self, count: int) -> None:
        """Hook: ``count`` more samples delivered by this rank."""
        self.commit(self._consumed + count * self.num_replicas)

    def _samples_at(self, consumed: int) -> int:  # type: ignore[override]
        """Hook: the cursor is the global sample count itself."""
        return consumed

    def _commit(self, consumed: int) -> None:  # type: ignore[override]
        """Hook: set the delivered-samples cursor."""
        self._consumed = consumed

    def __repr__(self) -> str:
        shard = (
            f", num_replicas={self.num_replicas}, rank={self.rank}" if self.num_replicas > 1 else ""
        )
        return (
            f"{type(self).__name__}(dataset_size={self._size}, resumable={self.resumable}{shard}"
            + (f", consumed={self._consumed})" if self.resumable else ")")
        )
