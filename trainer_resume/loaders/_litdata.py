"""litdata's ``StreamingDataset``, driven through its documented state API.

litdata's own ``StreamingDataLoader`` does three things a plain loader does not, and
a resumable loader over the dataset does them the same way (so the samples come in
the order litdata's loader gives them):

* at construction it tells the dataset the loader's ``batch_size`` and
  ``num_workers`` (``set_batch_size``, ``set_num_workers``), which split the chunks
  over the workers;
* before each pass it sets the epoch (``set_epoch``: 1 for the first pass, 2 for the
  next, ...), which seeds the pass's shuffle; a copy in a worker would otherwise
  start every pass in epoch 1 and repeat the first pass's order;
* to resume, it passes the samples it delivered to ``state_dict(num_samples_yielded,
  num_workers, batch_size)`` in the main process and loads the result into the
  dataset (``load_state_dict``), which each worker applies at its next ``iter()``:
  litdata splits the count over the workers as delivered round-robin, whole batches.

The loader records each worker's delivered samples exactly, so each copy is
positioned by its own count: a worker that delivered ``k`` whole batches loads the
state litdata's loader would have taken right after that batch (litdata deals the
batches out round-robin, so that is ``(k - 1) * num_workers + worker + 1`` batches
into the pass), which litdata replays as ``k`` batches of that worker; only that
worker reads it. A worker whose part of the pass ended is not opened again, nor one
that delivered its whole share (litdata 0.2.44 fails to resume a worker
there): the shares are litdata's own split, read from the attributes named below. So
the resumed pass delivers what the uninterrupted one did; a state at a pass's end
starts the next epoch (never an empty pass). ``reset_state_dict()`` is called before
each pass so a loaded state never carries into another one.

Tested with litdata 0.2.44 and 0.2.76: the public methods above, the state as
``state_dict`` produces it (never edited), and, for the shares, the dataset's
``get_len``, ``distributed_env`` (``global_rank``) and
``shuffler.get_chunks_and_intervals_per_workers``.
"""

from __future__ import annotations

from typing import Any

from ._driver import Starts

__all__ = ["LitdataDriver"]


class LitdataDriver:
    """Positions the copies of a litdata ``StreamingDataset`` (see the module docstring)."""

    library = "litdata"

    def __init__(self) -> None:
        self._batch_size = 1
        self._workers = 1
        self._num_workers = 0

    def configure(self, dataset: Any, batch_size: int | None, num_workers: int) -> None:
        """As litdata's loader does at construction: the split follows these two settings."""
        # Without batches each item is delivered alone, as batches of one.
        self._batch_size = batch_size or 1
        self._workers = max(num_workers, 1)
        self._num_workers = num_workers
        dataset.set_batch_size(self._batch_size)
        dataset.set_num_workers(num_workers)

    def starts(
        self, dataset: Any, epoch: int, samples: list[int], ended: list[bool], turn: int
    ) -> Starts:
        states: list[Any] = []
        done = [False] * len(samples)
        shares = self._shares(dataset, epoch) if any(samples) else None
        for worker, (count, stopped) in enumerate(zip(samples, ended)):
            if not count or stopped:  # the pass's start, or a part that ended (not opened again)
                states.append(None)
                continue
            if shares is not None and count >= shares[worker]:
                # Its whole share delivered: litdata 0.2.44 fails to resume a worker
                # there, and nothing is left for it to read.
                done[worker] = True
                states.append(None)
                continue
            # An open part delivered whole batches only. litdata deals a pass's batches out
            # round-robin from worker 0 (the last, partial one to the worker whose turn it
            # is), so this worker's k-th batch ends the first (k - 1) * workers + worker + 1
            # batches of the pass: the count litdata's loader would pass right then, which
            # litdata replays as k batches of this worker.
            batches = count // self._batch_size
            yielded = ((batches - 1) * self._workers + worker + 1) * self._batch_size
            dataset.reset_state_dict()
            dataset.set_epoch(epoch + 1)
            states.append(dataset.state_dict(yielded, self._workers, self._batch_size))
            dataset.reset_state_dict()
        return Starts(states, done=done)

    def _shares(self, dataset: Any, epoch: int) -> list[int]:
        """The samples each worker of this process reads in pass ``epoch``, as litdata's
        ``__iter__`` splits them (``shuffler.get_chunks_and_intervals_per_workers``)."""
        dataset.get_len(self._num_workers, self._batch_size)  # builds dataset.shuffler
        environment = dataset.distributed_env
        _, intervals = dataset.shuffler.get_chunks_and_intervals_per_workers(
            environment, self._workers, self._batch_size, epoch + 1
        )
        first = environment.global_rank * self._workers
        return [
            sum(interval[2] - interval[1] for interval in intervals[first + worker])
            for worker in range(self._workers)
        ]

    def open(self, copy: Any, epoch: int, state: Any) -> None:
        copy.reset_state_dict()
        copy.set_epoch(epoch + 1)  # ignored by litdata while a state is loaded: set it first
        if state is not None:
            copy.load_state_dict(state)
