"""Where a ``ReuseDataLoader`` stands inside an epoch, and what makes resuming there exact.

A ``ReuseDataLoader`` whose order is its own (``shuffle=True``: the keyed shuffle of
each epoch; no sampler and no shuffle: ``0, 1, ...``) resumes at any batch: its
state is the epoch and the number of batches of it delivered, and the resumed epoch
starts its order that many batches on (:class:`SequentialOrder`, and ``ReuseSampler``'s
offset). The samples are built under their own seeds, so only a ``collate_fn`` could
draw from a worker's generators, which depend on which worker serves a batch: with
:class:`KeyedCollate` each batch is collated under a seed of its epoch and its last
sample's index, so its draws are the same from whichever worker, at any resume.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any

from torch.utils.data import SequentialSampler

from ...errors import LoaderStateError
from ...rng import derive_seed, rng_scope

__all__ = ["STATE_FORMAT", "KeyedCollate", "SequentialOrder", "check_state", "note_fetch"]

STATE_FORMAT = "trainer_resume.reuse_loader/1"
_COLLATE_TAG = 0x636F_6C6C_6174_65  # b"collate": the seeds of the batches' collation

# The (epoch, index) of the sample fetched last by this thread of this process (a
# worker, or the main process without workers): the batch the collation that follows is of.
_FETCHED = threading.local()


def note_fetch(epoch: int, index: int) -> None:
    """Record the sample a fetch served, for the :class:`KeyedCollate` call after it."""
    _FETCHED.key = (epoch, index)


class KeyedCollate:
    """The caller's ``collate_fn`` run under a seed of its batch, the caller's generators kept.

    A fetch calls ``dataset[i]`` for each index of the batch and then the collate
    function, in the same thread: the batch is named by its epoch and its last sample's
    index (one batch of an epoch's order only), so its random draws do not depend on
    which worker collates it, nor on what that worker collated before.
    """

    def __init__(self, collate: Callable[[Any], Any], seed: int) -> None:
        self.collate = collate
        self.seed = seed

    def __call__(self, batch: Any) -> Any:
        key = getattr(_FETCHED, "key", None)
        if key is None:  # called outside a fetch of the loader's dataset
            return self.collate(batch)
        _FETCHED.key = None
        with rng_scope(derive_seed(_COLLATE_TAG, self.seed, *key)):
            return self.collate(batch)


class SequentialOrder(SequentialSampler):
    """``0, 1, ..., len - 1``, as torch's ``SequentialSampler``; the next iteration may start
    further on (:meth:`start_next_at`), its length left as it is."""

    def __init__(self, data_source: Sized) -> None:
        super().__init__(data_source)
        self._start = 0

    def start_next_at(self, position: int) -> None:
        """Start the next iteration at ``position`` (once)."""
        self._start = position

    def __iter__(self) -> Iterator[int]:
        # The start at the first next(): a DataLoader iterator over workers calls
        # iter(sampler) twice and reads only the second (with batch_size=None).
        start, self._start = self._start, 0
        yield from range(start, len(self.data_source))


def check_state(state: Any, expected: Mapping[str, Any], batches_per_epoch: int) -> tuple[int, int]:
    """``(epoch, batches)`` of a ``ReuseDataLoader`` state, checked against the loader's
    ``expected`` settings; changes nothing.

    Raises:
        LoaderStateError: not such a state, or one of other settings (named), or a
            batch count outside the epoch.
    """
    what = "ReuseDataLoader state"
    if not isinstance(state, Mapping):
        raise LoaderStateError(f"{what} must be a mapping, got {type(state).__name__}")
    keys = {"format", "epoch", "batches", *expected}
    if set(state) != keys:
        missing, unknown = sorted(keys - set(state)), sorted(set(state) - keys, key=str)
        raise LoaderStateError(f"{what}: missing keys {missing}, unknown keys {unknown}")
    if state["format"] != STATE_FORMAT:
        raise LoaderStateError(f"{what}: format {state['format']!r}, expected {STATE_FORMAT!r}")
    for name in ("epoch", "batches"):
        value = state[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LoaderStateError(f"{what}: {name} must be an int >= 0, got {value!r}")
    differ = [
        f"{name}: {state[name]!r} in the state, {value!r} in this loader"
        for name, value in expected.items()
        if state[name] != value or type(state[name]) is not type(value)
    ]
    if differ:
        raise LoaderStateError(
            f"{what} was saved by a loader of other settings, whose batches are other "
            f"samples: {'; '.join(differ)}"
        )
    if state["batches"] >= batches_per_epoch:
        raise LoaderStateError(
            f"{what}: {state['batches']} batches delivered, but an epoch has "
            f"{batches_per_epoch}; a finished epoch is saved as the next one's start"
        )
    return state["epoch"], state["batches"]
