"""Samplers and batch samplers that save their own state (torchdata's ``Stateful`` protocol).

A sampler with ``state_dict()`` / ``load_state_dict()`` knows where it is; the loader
only has to know which of its states belongs to the last *delivered* batch. So the
main process draws each batch's indices from the sampler and takes
``sampler.state_dict()`` right after: that snapshot becomes the delivered state when
the batch is returned to the caller, never earlier, so prefetched batches do not
count. One batch is drawn ahead to learn whether the pass has ended; the snapshot of
the last batch is taken after the sampler's iterator stopped, so a state saved
there starts the next pass.

Every iteration begins with ``load_state_dict(delivered state)`` and a new
``iter(sampler)``, in an uninterrupted run as in a resumed one, so both ask the
sampler for the same thing in the same state. Its order must therefore follow from
its state alone (a generator it draws from belongs in its state).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import repeat
from typing import Any

from ..errors import LoaderStateError
from ..rng import derive_seed
from . import _state_keys as keys
from ._sources import Pending, Task

__all__ = ["StatefulSource", "is_stateful"]

_EPOCH_SALT = 0x7374_6174_65  # b"state": per-pass base of the augmentation seeds
_END = object()

Cursor = tuple[int, int, int]  # (pass, batch within it, samples before that batch in the pass)


def is_stateful(value: Any) -> bool:
    """Offers ``state_dict()`` and ``load_state_dict()`` (torchdata's ``Stateful`` protocol)."""
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


class StatefulSource:
    """Batches from a stateful sampler (cut by ``batch_size``) or a stateful batch sampler.

    Args:
        order: The object with the state: the sampler, or the batch sampler.
        batch_size: Cut the sampler's indices into batches of this size (``None``:
            ``order`` yields whole batches, or single indices when ``batched`` is false).
        drop_last: Drop a last partial batch of a pass (with ``batch_size``).
        batched: Items are batches (lists of indices), not single indices.
    """

    epochs = True
    format = keys.STATEFUL_SAMPLER_FORMAT
    shards_stream = False
    stride = 1

    def __init__(self, order: Any, batch_size: int | None, drop_last: bool, batched: bool) -> None:
        self.order = order
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._batched = batched
        self._cursor: Cursor = (0, 0, 0)
        self._delivered = 0
        self._committed: Any = copy.deepcopy(order.state_dict())  # the sampler at the cursor
        self._ended: Any = _END  # the sampler after a pass that yielded nothing

    @property
    def cursor(self) -> tuple[int, int]:
        return self._cursor[0], self._cursor[1]

    def begin(self, augmentation_seed: int) -> None:
        pass

    def abandon(self, number: int) -> None:
        # The sampler decides what a new iteration after a partly read pass is: it is
        # given the delivered state, as a resumed run would be.
        pass

    def end_epoch(self, number: int) -> None:
        if self._cursor[0] == number and self._ended is not _END:
            self._committed, self._ended = self._ended, _END
            self._cursor = (number + 1, 0, 0)

    def tasks(self, pending: deque[Pending], augmentation_seed: int) -> Iterator[Task]:
        return self._tasks(pending, augmentation_seed, self._cursor, self._committed)

    def _draw(self, iterator: Iterator[Any]) -> Any:
        size = self._batch_size
        if size is None:
            return next(iterator, _END)
        # next() only, as torch's fetcher: islice would call iter() on the iterator again.
        batch = list(map(next, repeat(iterator, size)))
        if not batch or (self._drop_last and len(batch) < size):
            return _END
        return batch

    def _tasks(
        self, pending: deque[Pending], augmentation_seed: int, cursor: Cursor, committed: Any
    ) -> Iterator[Task]:
        order = self.order
        order.load_state_dict(copy.deepcopy(committed))
        iterator = iter(order)
        number, index, samples = cursor
        base = derive_seed(augmentation_seed, _EPOCH_SALT, number)
        following = self._draw(iterator)
        if following is _END:
            self._ended = copy.deepcopy(order.state_dict())
            return
        while following is not _END:
            item = following
            snapshot = copy.deepcopy(order.state_dict())
            following = self._draw(iterator)
            last = following is _END
            size = len(item) if self._batched else 1
            if last:
                snapshot = copy.deepcopy(order.state_dict())  # the pass has ended
                after: Any = ((number + 1, 0, 0), snapshot)
            else:
                after = ((number, index + 1, samples + size), snapshot)
            pending.append((samples, (number, index, samples), after, last))
            yield base, samples, item
            index, samples = index + 1, samples + size

    def commit(self, before: Cursor, after: tuple[Cursor, Any]) -> None:
        if before != self._cursor:
            raise RuntimeError(
                f"the delivered batch is at {before} but the loader records {self._cursor}"
            )
        self._cursor, self._committed = after
        self._delivered += 1

    # --- state -------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        number, index, samples = self._cursor
        return {
            keys.FORMAT: keys.STATEFUL_SAMPLER_FORMAT,
            keys.EPOCH: number,
            keys.OFFSET: index,
            keys.SAMPLES: samples,
            keys.DELIVERED: self._delivered,
            keys.SAMPLER_STATE: copy.deepcopy(self._committed),
        }

    def validate(self, state: Mapping[str, Any]) -> None:
        what = "stateful sampler state"
        keys.check_mapping(
            state,
            what,
            (
                keys.FORMAT,
                keys.EPOCH,
                keys.OFFSET,
                keys.SAMPLES,
                keys.DELIVERED,
                keys.SAMPLER_STATE,
            ),
        )
        keys.check_format(state, what, keys.STATEFUL_SAMPLER_FORMAT)
        for key in (keys.EPOCH, keys.OFFSET, keys.SAMPLES, keys.DELIVERED):
            keys.check_count(state, what, key)

    def apply(self, state: Mapping[str, Any]) -> None:
        sampler_state = copy.deepcopy(state[keys.SAMPLER_STATE])
        try:
            # Its own load_state_dict is the sampler's only check of its state.
            self.order.load_state_dict(copy.deepcopy(sampler_state))
        except Exception as exc:
            raise LoaderStateError(
                f"{type(self.order).__name__}.load_state_dict() refused the saved sampler state: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._committed = sampler_state
        self._cursor = (state[keys.EPOCH], state[keys.OFFSET], state[keys.SAMPLES])
        self._delivered = state[keys.DELIVERED]
        self._ended = _END

    def delivered_batches(self, state: Mapping[str, Any]) -> int:
        return state[keys.DELIVERED]
