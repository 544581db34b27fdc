"""Epochs of torch's own samplers: each ``iter(loader)`` is one epoch, positioned by index only.

At the start of an epoch the whole epoch's order is computed from the sampler (or
batch sampler) in the main process: indices only, no data is read, O(epoch) work.
What the order depends on is recorded, so the same epoch can be computed again in
another process:

* a sampler with a ``generator`` of its own (``RandomSampler(ds, generator=g)``,
  ``shuffle=True`` with ``generator=g``): the generator's state at the start of the
  epoch; computing the epoch advances ``g`` as an uninterrupted run does, so the
  following epochs follow from it;
* a random sampler without one: it is given, for this computation only, a generator
  seeded ``derive_seed(augmentation_seed, salt, epoch)``, so no global generator is
  drawn and the state's ``augmentation_seed`` fixes every epoch's order;
* ``DistributedSampler``: its ``epoch`` (with its ``seed``, a constructor argument).

The cursor ``(epoch, offset)`` names the next undelivered batch; delivering the last
batch of an epoch moves it to ``(epoch + 1, 0)``, so a state taken there resumes at
the first batch of the next epoch. Under a ``ShardedBatchSampler`` the offset counts
*global* batches (delivering one moves it by the number of ranks), so every rank holds
the same cursor and the rest of an epoch can be shared among another number of ranks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from ..errors import LoaderStateError
from ..rng import derive_seed
from ..state import Deferred, EpochSamplerSettings, EpochSamplerState, now, revise_deferred
from . import _state_keys as keys
from ._sources import Pending, Task
from .sharded_batches import EpochShards, ShardedBatchSampler

__all__ = ["EPOCH_SAMPLERS", "EpochSource"]

# Exact types only: a subclass may order its epoch differently (or from global RNG),
# which a recorded generator state would not reproduce.
EPOCH_SAMPLERS = (
    SequentialSampler,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    DistributedSampler,
)
_GENERATOR_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)

_ORDER_SALT = 0x6F72_6465_72  # b"order": seeds of the orders of samplers without a generator
_EPOCH_SALT = 0x6570_6F63_68  # b"epoch": per-epoch base of the augmentation seeds

Cursor = tuple[int, int]


def _random_permutations(
    size: int, count: int, generator: torch.Generator, *, draw_empty_rest: bool
) -> list[int]:
    """``list(RandomSampler(..., num_samples=count, generator=generator))`` without replacement.

    The same draws as its ``__iter__`` (a permutation per whole pass and one more for the
    rest, which a whole pass draws also when the rest is empty: ``draw_empty_rest`` keeps
    a caller's generator in step with that), read as whole lists: iterating the sampler
    costs a generator step per index, twice the permutation itself.
    """
    order: list[int] = []
    for _ in range(count // size):
        order.extend(torch.randperm(size, generator=generator).tolist())
    if count % size or draw_empty_rest:
        order.extend(torch.randperm(size, generator=generator).tolist()[: count % size])
    return order


class _Epoch:
    """One computed epoch: the sampler's indices in order and what produced them.

    A ``BatchSampler`` cuts its sampler's indices into consecutive batches of
    ``batch_size`` (the last one partial unless ``drop_last``), so batch ``i`` is the
    slice ``[i * batch_size, (i + 1) * batch_size)``: only the indices are kept.
    """

    __slots__ = (
        "batch_size",
        "count",
        "drop_last",
        "generator_state",
        "indices",
        "left",
        "number",
        "sampler_epoch",
    )

    def __init__(
        self,
        number: int,
        indices: list[Any],
        batch_size: int | None,
        drop_last: bool,
        generator_state: Any,
        sampler_epoch: Any,
    ) -> None:
        self.number = number
        self.indices = indices
        self.batch_size = batch_size  # None: each item is one index
        self.drop_last = drop_last
        if batch_size is None:
            self.count = len(indices)
        elif drop_last:
            self.count = len(indices) // batch_size
        else:
            self.count = -(-len(indices) // batch_size)
        self.generator_state = generator_state
        self.sampler_epoch = sampler_epoch
        # Once the epoch is left part-way: the generator state and sampler epoch then,
        # what the next epoch's start is saved with.
        self.left: tuple[Any, Any] | None = None

    def shards(self, start: int, replicas: int) -> EpochShards:
        """The global batches ``replicas`` ranks read from global batch ``start``."""
        return EpochShards(self.indices, self.batch_size or 1, self.drop_last, replicas, start)


class EpochSource:
    """Batches of one epoch per iteration from a torch sampler or ``BatchSampler``.

    Args:
        sampler: The loader's sampler (one of :data:`EPOCH_SAMPLERS`).
        batch_sampler: The loader's ``BatchSampler`` over ``sampler``, or ``None``
            with ``batch_size=None`` (each item is then one index).
        dataset_size: ``len(dataset)``.
        shard: The loader's ``ShardedBatchSampler`` around ``batch_sampler``, if any:
            this rank reads its share of the global batches.
    """

    epochs = True  # each iter(loader) is one epoch
    format = keys.EPOCH_SAMPLER_FORMAT
    shards_stream = False  # DistributedSampler's order depends on the world size anyway

    def __init__(
        self,
        sampler: Any,
        batch_sampler: BatchSampler | None,
        dataset_size: int,
        shard: ShardedBatchSampler | None = None,
    ) -> None:
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        # (ranks, rank) sharing the global batches; no setting, so a state loads with any world size
        self._shard = (shard.num_replicas, shard.rank) if shard is not None else None
        self.generator: torch.Generator | None = (
            sampler.generator if isinstance(sampler, _GENERATOR_SAMPLERS) else None
        )
        distributed = isinstance(sampler, DistributedSampler)
        self._replicas, self._rank = (sampler.num_replicas, sampler.rank) if distributed else (1, 0)
        self._settings: EpochSamplerSettings = {
            "sampler": type(sampler).__name__,
            "batch_sampler": type(shard if shard is not None else batch_sampler).__name__
            if batch_sampler is not None
            else None,
            "batch_size": batch_sampler.batch_size if batch_sampler is not None else None,
            "drop_last": bool(batch_sampler.drop_last) if batch_sampler is not None else False,
            "dataset_size": dataset_size,
            "sampler_length": len(sampler),
            "replacement": bool(getattr(sampler, "replacement", False)),
            "num_replicas": self._replicas,
            "generator": self.generator is not None,
        }
        self._epoch = 0
        self._offset = 0
        self._delivered = 0
        self._computed: _Epoch | None = None
        self._expected_sampler_epoch: int | None = None  # a loaded mid-epoch position's
        # A loaded position inside a begun epoch: (epoch, the generator's state when it
        # began), its order recomputed on a copy (the generator was set to the position's).
        self._loaded_order: tuple[int, Any] | None = None

    @property
    def stride(self) -> int:
        """Global distance between the samples of one batch (``DistributedSampler``'s world size)."""
        return self._replicas

    @property
    def cursor(self) -> Cursor:
        return self._epoch, self._offset

    def _length(self) -> int:
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)

    # --- epochs ----------------------------------------------------------------------

    def begin(self, augmentation_seed: int) -> None:
        """Compute the cursor's epoch if it is not computed yet (an iterator is about to start)."""
        computed = self._computed
        if (
            computed is not None
            and computed.number == self._epoch
            and not self._reordered(computed)
        ):
            return
        self._computed = None
        sampler_epoch = None
        if isinstance(self.sampler, DistributedSampler):
            sampler_epoch = self.sampler.epoch
            expected = self._expected_sampler_epoch
            if self._offset and expected is not None and sampler_epoch != expected:
                raise LoaderStateError(
                    f"the loaded position is batch {self._offset} of an epoch the DistributedSampler "
                    f"ordered with set_epoch({expected}), but set_epoch({sampler_epoch}) was called since; "
                    f"call set_epoch({expected}) (the epoch the state was saved in) before iterating"
                )
        self._expected_sampler_epoch = None
        loaded, self._loaded_order = self._loaded_order, None
        copy = None
        if loaded is not None and loaded[0] == self._epoch and self.generator is not None:
            generator_state = loaded[1]
            copy = torch.Generator(device=self.generator.device)
            copy.set_state(generator_state)
        else:
            generator_state = self.generator.get_state() if self.generator is not None else None
        batch_sampler = self.batch_sampler
        computed = _Epoch(
            self._epoch,
            self._order(augmentation_seed, copy),
            batch_sampler.batch_size if batch_sampler is not None else None,
            bool(batch_sampler.drop_last) if batch_sampler is not None else False,
            generator_state,
            sampler_epoch,
        )
        if self._offset > computed.count:
            raise LoaderStateError(
                f"the loaded position is batch {self._offset} of epoch {self._epoch}, which has only "
                f"{computed.count} batch(es) here; load a state saved by a loader with the same sampler"
            )
        self._computed = computed

    def _reordered(self, computed: _Epoch) -> bool:
        """Whether ``set_epoch()`` changed a ``DistributedSampler``'s order since ``computed``
        was computed, none of its batches delivered: as with ``DataLoader``, an ``iter()``
        made before the loop set the epoch (a resumed Lightning fit makes one at the next
        epoch's start, then sets the epoch and iterates again) does not fix the next
        ``iter()``'s order, nor, without workers, its own before its first batch. Its
        order depends on the epoch alone, so computing it again draws from no generator."""
        sampler = self.sampler
        return (
            self._offset == 0
            and isinstance(sampler, DistributedSampler)
            and computed.sampler_epoch != sampler.epoch
        )

    def _order(self, augmentation_seed: int, copy: torch.Generator | None = None) -> list[Any]:
        """The sampler's indices for the cursor's epoch (its whole pass, in order), drawn
        from ``copy`` of the sampler's generator when given (a loaded epoch's)."""
        sampler = self.sampler
        generator = self.generator if copy is None else copy
        if generator is None and isinstance(sampler, _GENERATOR_SAMPLERS):
            generator = torch.Generator()
            generator.manual_seed(derive_seed(augmentation_seed, _ORDER_SALT, self._epoch))
        if type(sampler) is RandomSampler and not sampler.replacement:
            return _random_permutations(
                len(sampler.data_source),
                sampler.num_samples,
                generator,
                draw_empty_rest=generator is self.generator,  # a private one is not seen again
            )
        if generator is self.generator:
            return list(sampler)
        # Only for this computation: no global generator, nor the sampler's own, is drawn.
        sampler.generator = generator
        try:
            return list(sampler)
        finally:
            sampler.generator = self.generator

    def abandon(self, number: int) -> None:
        """Epoch ``number`` was left part-way (its iterator replaced after delivering, or
        ``end_epoch()``): as with ``DataLoader``, the next iterator starts the next epoch.
        A position recorded in it before now builds that start."""
        computed = self._computed
        if self._epoch != number:
            return
        if computed is not None and computed.number == number:
            sampler = self.sampler
            computed.left = (
                self.generator.get_state() if self.generator is not None else None,
                sampler.epoch if isinstance(sampler, DistributedSampler) else None,
            )
            revise_deferred()
        self.end_epoch(number)

    def end_epoch(self, number: int) -> None:
        """The iterator of epoch ``number`` ended or was replaced after delivering a batch:
        the next iterator starts the next epoch."""
        if self._epoch == number:
            self._epoch, self._offset = number + 1, 0

    def tasks(self, pending: deque[Pending], augmentation_seed: int) -> Iterator[Task]:
        computed = self._computed
        if computed is None or computed.number != self._epoch:
            raise RuntimeError("EpochSource.begin() was not called for the epoch being iterated")
        return self._tasks_when_taken(pending, augmentation_seed)

    def _tasks_when_taken(self, pending: deque[Pending], augmentation_seed: int) -> Iterator[Task]:
        # From the first task taken on, as DataLoader reads its sampler: with workers as the
        # iterator is made (its prefetch), without at the first batch. A set_epoch() called
        # in between orders the epoch.
        if self._reordered(self._computed):  # type: ignore[arg-type]
            self.begin(augmentation_seed)
        yield from self._tasks(self._computed, self._offset, pending, augmentation_seed)  # type: ignore[arg-type]

    def _tasks(
        self,
        computed: _Epoch,
        offset: int,
        pending: deque[Pending],
        augmentation_seed: int,
    ) -> Iterator[Task]:
        number = computed.number
        base = derive_seed(augmentation_seed, _EPOCH_SALT, number)
        if self._shard is not None:
            yield from self._shard_tasks(computed, offset, pending, base)
            return
        stride, rank, last = self._replicas, self._rank, computed.count - 1
        size, indices = computed.batch_size, computed.indices
        for index in range(offset, computed.count):
            after = (number + 1, 0) if index == last else (number, index + 1)
            # computed.start(index) and computed.item(index), written out (once per batch)
            if size is None:
                position, item = index * stride + rank, indices[index]
            else:
                start = index * size
                position, item = start * stride + rank, indices[start : start + size]
            pending.append((position, (number, index), after, index == last))
            yield base, position, item

    def _shard_tasks(
        self, computed: _Epoch, offset: int, pending: deque[Pending], base: int
    ) -> Iterator[Task]:
        # The offset is the global cursor: this rank reads global batch offset + rank,
        # and delivering it moves every rank's cursor by the number of ranks. Positions
        # are global sample offsets, so a global batch is seeded alike at any world size.
        replicas, rank = self._shard  # type: ignore[misc]
        shards = computed.shards(offset, replicas)
        number, size = computed.number, shards.batch_size
        for batch in shards.of_rank(rank):
            before = batch - rank
            last = before + replicas >= shards.end
            after = (number + 1, 0) if last else (number, before + replicas)
            pending.append((batch * size, (number, before), after, last))
            yield base, batch * size, shards.batch(batch)

    def commit(self, before: Cursor, after: Cursor) -> None:
        if before != (self._epoch, self._offset):
            raise RuntimeError(
                f"the delivered batch is (epoch, batch) {before} but the loader records {(self._epoch, self._offset)}"
            )
        self._epoch, self._offset = after
        # Global batches under a shard, as for the other sharded streams: ranks at the
        # same step record the same count.
        self._delivered += self._shard[0] if self._shard is not None else 1

    # --- state -----------------------------------------------------------------------

    def state(self) -> EpochSamplerState:
        computed = self._computed
        if computed is not None and computed.number == self._epoch:
            return self._state(
                self._epoch,
                self._offset,
                self._delivered,
                computed.generator_state,
                computed.sampler_epoch,
                self._generator_now(),
            )
        sampler_epoch = self.sampler.epoch if isinstance(self.sampler, DistributedSampler) else None
        loaded = self._loaded_order
        if loaded is not None and loaded[0] == self._epoch and self.generator is not None:
            # A loaded position not read on yet: its epoch began where the state said.
            return self._state(
                self._epoch,
                self._offset,
                self._delivered,
                loaded[1],
                sampler_epoch,
                self._generator_now(),
            )
        generator_state = self.generator.get_state() if self.generator is not None else None
        return self._state(
            self._epoch, self._offset, self._delivered, generator_state, sampler_epoch
        )

    def _generator_now(self) -> torch.Tensor | None:
        return self.generator.get_state() if self.generator is not None else None

    def _state(
        self,
        epoch: int,
        offset: int,
        delivered: int,
        generator_state: Any,
        sampler_epoch: Any,
        generator_now: torch.Tensor | None = None,
    ) -> EpochSamplerState:
        state = {
            keys.FORMAT: keys.EPOCH_SAMPLER_FORMAT,
            keys.SETTINGS: dict(self._settings),
            keys.EPOCH: epoch,
            keys.OFFSET: offset,
            keys.DELIVERED: delivered,
            keys.GENERATOR: generator_state,
            keys.SAMPLER_EPOCH: sampler_epoch,
        }
        if generator_now is not None:  # inside a begun epoch
            state[keys.GENERATOR_NOW] = generator_now
        return state  # type: ignore[return-value]

    def position(self) -> Deferred:
        """The delivered position now, its state built later: the state holds only
        integers, a copy of the settings (never changed) and generator states nothing
        changes in place. Within a computed epoch only the integers (and, with a
        generator of the sampler's, its state now) are taken now; if the epoch is left
        part-way before the state is built, it is the next epoch's start (what
        :meth:`state` says then: the leaving delivered nothing)."""
        computed = self._computed
        epoch = self._epoch
        if computed is None or computed.number != epoch:
            return now(self.state())
        return (
            type(self)._position_state,
            self,
            computed,
            self._offset,
            self._delivered,
            self._generator_now(),
        )

    def _position_state(
        self, computed: _Epoch, offset: int, delivered: int, generator_now: torch.Tensor | None
    ) -> EpochSamplerState:
        left = computed.left
        if left is not None:
            return self._state(computed.number + 1, 0, delivered, *left)
        return self._state(
            computed.number,
            offset,
            delivered,
            computed.generator_state,
            computed.sampler_epoch,
            generator_now,
        )

    def validate(self, state: Mapping[str, Any]) -> None:
        what = "epoch sampler state"
        _, offset, _ = keys.check_epoch_state(
            state,
            what,
            keys.EPOCH_SAMPLER_FORMAT,
            self._settings,
            (keys.GENERATOR, keys.SAMPLER_EPOCH),
            fix="build the loader with the arguments the state was saved with",
            optional_keys=(keys.GENERATOR_NOW,),
        )
        length = self._length()
        if offset >= max(length, 1):
            raise LoaderStateError(
                f"{what}[{keys.OFFSET!r}] = {offset} but an epoch has {length} batch(es)"
            )
        self._check_generator(state[keys.GENERATOR], what)
        if keys.GENERATOR_NOW in state:
            if self.generator is None:
                raise LoaderStateError(
                    f"{what} has {keys.GENERATOR_NOW!r}, but this sampler has no generator"
                )
            self._check_generator(state[keys.GENERATOR_NOW], what, keys.GENERATOR_NOW)
        sampler_epoch = state[keys.SAMPLER_EPOCH]
        if isinstance(self.sampler, DistributedSampler):
            if not keys.is_int(sampler_epoch):
                raise LoaderStateError(
                    f"{what}[{keys.SAMPLER_EPOCH!r}] must be an int, got {sampler_epoch!r}"
                )
        elif sampler_epoch is not None:
            raise LoaderStateError(
                f"{what}[{keys.SAMPLER_EPOCH!r}] must be None for a {self._settings['sampler']}"
            )

    def _check_generator(self, value: Any, what: str, key: str = keys.GENERATOR) -> None:
        generator = self.generator
        if generator is None:
            if value is not None:
                raise LoaderStateError(
                    f"{what}[{key!r}] must be None: this sampler has no generator"
                )
            return
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
            raise LoaderStateError(
                f"{what}[{key!r}] must be a 1-D uint8 tensor (a generator state)"
            )
        try:
            torch.Generator(device=generator.device).set_state(
                value
            )  # trial on a scratch generator
        except (RuntimeError, ValueError) as exc:
            raise LoaderStateError(
                f"{what}[{key!r}] is not a state of this generator: {exc}"
            ) from exc

    def apply(self, state: Mapping[str, Any]) -> None:
        self._epoch, self._offset = state[keys.EPOCH], state[keys.OFFSET]
        self._delivered = state[keys.DELIVERED]
        self._computed = None
        self._loaded_order = None
        if self.generator is not None:
            current = state.get(keys.GENERATOR_NOW)
            if current is not None:
                # Where the generator was at the position: another loader sharing it, or
                # the loop, drew from it since this epoch began. The epoch's order is
                # recomputed on a copy set to where it began.
                self.generator.set_state(current)
                self._loaded_order = (state[keys.EPOCH], state[keys.GENERATOR])
            else:
                self.generator.set_state(state[keys.GENERATOR])
        sampler_epoch = state[keys.SAMPLER_EPOCH]
        self._expected_sampler_epoch = sampler_epoch
        if sampler_epoch is not None:
            self.sampler.set_epoch(sampler_epoch)

    def delivered_batches(self, state: Mapping[str, Any]) -> int:
        return state[keys.DELIVERED]
