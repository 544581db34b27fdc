"""Where a resumable loader's batches come from, and how delivery moves the cursor.

The loader iterates its sampler in the main process, one *task* per batch:
``(seed base, first stream position, indices)``. For every task handed to the fetch
machinery, the cursor it starts from, the cursor after it and whether it is the last
batch of the iteration go into a FIFO; the cursor is committed only when that batch
is returned to the caller. Prefetched batches therefore never count as consumed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from ..state import BatchSamplerState, SamplerState
from . import _state_keys as keys
from ._batching import ResumableBatchSampler
from .sampler import InfiniteRandomSampler

__all__ = ["Pending", "Source", "SamplerSource", "BatchSamplerSource", "Tasks"]

Task = tuple[int, int, Any]  # (seed base, first stream position, indices or a single index)
# (first stream position, cursor before, cursor after, last batch of the iteration)
Pending = tuple[int, Any, Any, bool]


class Source(Protocol):
    """What the loader needs from a resumable sampler (every kind).

    ``epochs``: each ``iter(loader)`` is one epoch (``begin`` prepares it, ``end_epoch``
    closes one whose iterator stopped, ``abandon`` one replaced after it delivered);
    otherwise every ``iter`` continues one shared stream.
    """

    epochs: bool
    format: str  # the format marker of its states
    shards_stream: bool  # ranks read slices of one global stream (num_replicas > 1)

    def begin(self, augmentation_seed: int) -> None: ...
    def abandon(self, number: int) -> None: ...
    def end_epoch(self, number: int) -> None: ...
    def tasks(self, pending: deque[Pending], augmentation_seed: int) -> Iterator[Task]: ...
    def commit(self, before: Any, after: Any) -> None: ...
    def state(self) -> SamplerState | BatchSamplerState: ...
    def validate(self, state: Mapping[str, Any]) -> None: ...
    def apply(self, state: Mapping[str, Any]) -> None: ...
    def delivered_batches(self, state: Mapping[str, Any]) -> int: ...
    @property
    def stride(self) -> int: ...


def _check_contiguous(expected: Any, recorded: Any, what: str) -> None:
    # The sampler's cursor moved under the loader (advance/load_state_dict called on
    # the sampler directly): committing would record a position nobody delivered.
    if expected != recorded:
        raise RuntimeError(
            f"the delivered batch starts at {what} {expected} but the sampler records {recorded}"
        )


class _StreamSource:
    """A source whose iterations all continue one stream (nothing happens per epoch)."""

    epochs = False

    def begin(self, augmentation_seed: int) -> None:
        pass

    def abandon(self, number: int) -> None:
        pass

    def end_epoch(self, number: int) -> None:
        pass


class SamplerSource(_StreamSource):
    """Batches of ``batch_size`` consecutive stream positions of an ``InfiniteRandomSampler``."""

    format = keys.SAMPLER_FORMAT

    @property
    def shards_stream(self) -> bool:
        return self.sampler.num_replicas > 1

    def __init__(self, sampler: InfiniteRandomSampler, batch_size: int | None) -> None:
        self.sampler = sampler
        self.batch_size = batch_size

    @property
    def stride(self) -> int:
        """Distance in the global stream between two samples of one batch (the world size)."""
        return self.sampler.num_replicas

    def tasks(self, pending: deque[Pending], augmentation_seed: int) -> Iterator[Task]:
        return self._tasks(self.sampler.consumed, self.sampler.reader(), pending, augmentation_seed)

    def _tasks(
        self, cursor: int, reader: Any, pending: deque[Pending], base: int
    ) -> Iterator[Task]:
        # Cursors are global; this rank's samples sit at cursor + rank + i * stride.
        size, stride, rank = self.batch_size, self.sampler.num_replicas, self.sampler.rank
        if size is None:
            while True:
                pending.append((cursor + rank, cursor, cursor + stride, False))
                yield base, cursor + rank, reader.take(cursor + rank, 1, stride)[0]
                cursor += stride
        while True:
            indices = reader.take(cursor + rank, size, stride)
            pending.append((cursor + rank, cursor, cursor + size * stride, False))
            yield base, cursor + rank, indices
            cursor += size * stride

    def commit(self, before: int, after: int) -> None:
        _check_contiguous(before, self.sampler.consumed, "stream position")
        self.sampler.commit(after)

    def state(self) -> SamplerState:
        return self.sampler._state()

    def validate(self, state: Mapping[str, Any]) -> None:
        self.sampler.validate_state_dict(state)

    def apply(self, state: Mapping[str, Any]) -> None:
        self.sampler._apply_state(state)

    def delivered_batches(self, state: Mapping[str, Any]) -> int:
        # Global batches: all ranks together at the same step k deliver k * num_replicas.
        return state["consumed"] // (self.batch_size or 1)


class BatchSamplerSource(_StreamSource):
    """The batches of a resumable batch sampler, from its delivered cursor."""

    format = keys.BATCH_SAMPLER_FORMAT
    stride = 1  # a batch is contiguous in the global stream (ranks take whole batches)

    def __init__(self, batch_sampler: ResumableBatchSampler) -> None:
        self.batch_sampler = batch_sampler

    @property
    def shards_stream(self) -> bool:
        return self.batch_sampler.num_replicas > 1

    def tasks(self, pending: deque[Pending], augmentation_seed: int) -> Iterator[Task]:
        return self._tasks(self.batch_sampler.cursor, pending, augmentation_seed)

    def _tasks(self, cursor: tuple[int, int], pending: deque[Pending], base: int) -> Iterator[Task]:
        batch_sampler = self.batch_sampler
        # Without repeat an iteration is one cycle: its last batch is marked, so the
        # iterator ends right after delivering it and a consumer that stops after
        # len(loader) batches finds the next cycle, not a leftover end, at the next iter().
        ends, first_cycle = not batch_sampler.repeat, cursor[0]
        count, rank = batch_sampler.batches_per_cycle, batch_sampler.rank
        for cycle, offset, position, indices in batch_sampler.batches_from(*cursor):
            after = batch_sampler.next_cursor(cycle, offset)
            last = ends and (after[0] * count + after[1] + rank) // count != first_cycle
            pending.append((position, (cycle, offset), after, last))
            yield base, position, indices

    def commit(self, before: tuple[int, int], after: tuple[int, int]) -> None:
        _check_contiguous(before, self.batch_sampler.cursor, "(cycle, batch)")
        self.batch_sampler.commit(*after)

    def state(self) -> BatchSamplerState:
        return self.batch_sampler._state()

    def validate(self, state: Mapping[str, Any]) -> None:
        self.batch_sampler.validate_state_dict(state)

    def apply(self, state: Mapping[str, Any]) -> None:
        self.batch_sampler._apply_state(state)

    def delivered_batches(self, state: Mapping[str, Any]) -> int:
        return state["cycle"] * self.batch_sampler.batches_per_cycle + state["offset"]


class Tasks:
    """The internal loader's sampler: each ``iter()`` starts at the committed cursor.

    Every ``iter()`` (a new internal iterator, or a persistent-worker reset) gets a
    fresh FIFO of pending cursors, published as :attr:`pending` for the loader's
    iterator to pop on delivery.
    """

    def __init__(self, source: Source, augmentation_seed: int) -> None:
        self.source = source
        self.augmentation_seed = augmentation_seed
        self.pending: deque[Pending] = deque()

    def __iter__(self) -> Iterator[Task]:
        self.pending = deque()
        return self.source.tasks(self.pending, self.augmentation_seed)
