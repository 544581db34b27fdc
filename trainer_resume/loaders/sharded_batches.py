"""``ShardedBatchSampler``: torch's ``BatchSampler`` shared by ranks in whole batches.

The rule is the one ``accelerate.prepare`` applies to a data loader (Accelerate's
``BatchSamplerShard`` with ``split_batches=False``, ``even_batches=True``): the epoch's
*global* batches are the batch sampler's, and rank ``r`` of ``W`` takes global batches
``r, r + W, r + 2W, ...``. Every rank gets the same number of batches:

* ``drop_last=False``: the last partial batch is completed with the first samples of
  the epoch, and batches made of the following ones (continuing from the epoch's first
  ``W`` batches, repeated if the epoch is shorter) are added until the count is a
  multiple of ``W``;
* ``drop_last=True``: the global batches after the last whole group of ``W`` are dropped.

With one rank the batches are the batch sampler's, unchanged (``prepare`` leaves a
loader in one process alone).

Positions are global, as for this package's other sharded streams: in a resumable
loader the cursor counts global batches, so ranks at the same step hold the same
cursor and a state resumes with any world size (the rest of the epoch, from that
global batch, is shared among the new ranks by the same rule).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from ._sharding import resolve_replicas

__all__ = ["SHARDABLE_SAMPLERS", "EpochShards", "ShardedBatchSampler"]

# Exact types: the samplers whose epochs a resumable loader recomputes from recorded
# seeds. A DistributedSampler is sharded already (sharding it again drops samples).
SHARDABLE_SAMPLERS = (SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


class EpochShards:
    """One epoch's global batches as ``replicas`` ranks read them from global batch ``start``.

    Args:
        order: The epoch's indices in order (the sampler's whole pass; with
            ``drop_last`` a last partial batch's indices may be included, they are
            not read).
        batch_size: Samples per batch.
        drop_last: The batch sampler drops a last partial batch.
        replicas: Ranks sharing the epoch.
        start: The first global batch not delivered yet (0 at the epoch's start). The
            batches after the real ones are counted from here, so a resume with another
            number of ranks gives each the same count too.
    """

    __slots__ = ("batch_size", "end", "initial", "order", "real", "replicas", "start", "tail")

    def __init__(
        self, order: Sequence[Any], batch_size: int, drop_last: bool, replicas: int, start: int = 0
    ) -> None:
        self.order = order
        self.batch_size = batch_size
        self.replicas = replicas
        self.start = start
        count = len(order)
        self.real = count // batch_size if drop_last else _ceil_div(count, batch_size)
        left = max(self.real - start, 0)
        if replicas == 1:
            self.end = self.real
        elif drop_last:
            self.end = start + left // replicas * replicas
        else:
            self.end = start + _ceil_div(left, replicas) * replicas
        # Accelerate completes batches from the epoch's first `replicas` batches,
        # repeated while they hold fewer than one batch per rank.
        initial = list(order[: replicas * batch_size])
        while initial and len(initial) < replicas * batch_size:
            initial += initial
        self.initial = initial
        last = count - (self.real - 1) * batch_size if self.real else batch_size
        self.tail = batch_size - last if replicas > 1 and not drop_last else 0

    def batch(self, number: int) -> list[Any]:
        """Global batch ``number`` (one past the real batches: completed from the epoch's start)."""
        size = self.batch_size
        if number < self.real:
            batch = list(self.order[number * size : (number + 1) * size])
            if number == self.real - 1 and self.tail:
                batch += self.initial[: self.tail]
            return batch
        first = self.tail + (number - self.real) * size
        return self.initial[first : first + size]

    def of_rank(self, rank: int) -> range:
        """The global batch numbers rank ``rank`` reads, in order."""
        return range(self.start + rank, self.end, self.replicas)

    @property
    def count(self) -> int:
        """Batches each rank reads."""
        return (self.end - self.start) // self.replicas


class ShardedBatchSampler(Sampler[list[Any]]):
    """This rank's batches of a ``BatchSampler`` shared by ``num_replicas`` ranks (see the module).

    Iterated alone it yields rank ``rank``'s batches of one epoch of ``batch_sampler``.
    In a ``ResumableDataLoader(batch_sampler=ShardedBatchSampler(...), resumable=True)``
    each ``iter(loader)`` is one epoch, positioned by the global batch cursor: the
    sampler inside must be torch's ``SequentialSampler``, ``RandomSampler``,
    ``SubsetRandomSampler`` or ``WeightedRandomSampler`` (exact types), and every rank
    must order its epochs alike (the same generator state or ``augmentation_seed``).

    Args:
        batch_sampler: torch's ``BatchSampler`` (exact type) that cuts the epoch into
            global batches.
        num_replicas: Ranks sharing the epoch (default: the world size of an
            initialized ``torch.distributed`` process group, else 1).
        rank: This rank, in ``[0, num_replicas)`` (default: the process group's rank, else 0).

    Raises:
        TypeError: ``batch_sampler`` is not torch's ``BatchSampler``, or a count is not an int.
        ValueError: ``num_replicas < 1`` or ``rank`` outside ``[0, num_replicas)``.
    """

    def __init__(
        self,
        batch_sampler: BatchSampler,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        if type(batch_sampler) is not BatchSampler:
            raise TypeError(
                "ShardedBatchSampler shares torch's BatchSampler (exact type) among ranks, got "
                f"{type(batch_sampler).__name__}"
            )
        self.num_replicas, self.rank = resolve_replicas(num_replicas, rank)
        self.batch_sampler = batch_sampler
        self.sampler = batch_sampler.sampler
        self.batch_size: int = batch_sampler.batch_size
        self.drop_last: bool = batch_sampler.drop_last

    def __iter__(self) -> Iterator[list[Any]]:
        order = [index for batch in self.batch_sampler for index in batch]
        shards = EpochShards(order, self.batch_size, self.drop_last, self.num_replicas)
        for number in shards.of_rank(self.rank):
            yield shards.batch(number)

    def __len__(self) -> int:
        real, replicas = len(self.batch_sampler), self.num_replicas
        if replicas == 1:
            return real
        return real // replicas if self.drop_last else _ceil_div(real, replicas)
