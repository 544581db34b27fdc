"""Reading one pass of an ``IterableDataset`` in a worker (or the main process), batch by batch.

The internal loader of a resumable loader over an ``IterableDataset`` iterates a
:class:`PassReader`. Each process reads its own copy of the user's dataset (with 0
workers the main-process dataset itself), as with ``DataLoader``, and batches it as
torch's iterable fetcher does (``batch_size`` items per ``collate_fn`` call, a last
partial batch unless ``drop_last``; ``batch_size=None``: one item per call). Every
item the reader yields is a tagged tuple ``(tag, worker, payload, states)``:

* ``BATCH``: a batch and ``(dataset state, iterator state, last)`` right after it
  (``last``: the iterator stopped inside this partial batch, so the worker's part of
  the pass is over and its iterator is not asked again, as in torch's fetcher);
* ``END``: this worker's part of the pass is over, with the dataset's state then;
* ``SKIP``: nothing, sent once at the start of a resumed pass by the workers whose
  batch of the current round was delivered before the pause (see below);
* ``FAILED``: a :class:`~trainer_resume.loaders._fetch.FetchFailure`;
* ``REFUSED``: neither the dataset nor its iterator has a state.

torch delivers an iterable loader's items round-robin over the workers, starting at
worker 0, and skips a worker once its iteration has stopped. A resumed pass
continues after worker ``w``'s batch: workers ``0..w`` that still have items send
one ``SKIP`` first, so every worker keeps its own id (``get_worker_info().id``
splits the data as before) and the delivered order is the uninterrupted one.

The global generators are seeded before every batch from ``(augmentation_seed,
epoch, worker, batch number)``, so the dataset's augmentation replays from any
position; in the main process the caller's generators are handed back.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from ..rng import derive_seed
from ._fetch import FetchFailure, run_seeded
from ._seeding import seed_batch
from ._stateful import is_stateful

__all__ = ["BATCH", "END", "FAILED", "REFUSED", "SKIP", "PassPlan", "PassReader", "WorkerStart"]

BATCH, END, SKIP, FAILED, REFUSED = range(5)

_PASS_SALT = 0x6974_6572  # b"iter": per-pass base of the augmentation seeds
_OPEN_SALT = 0x6F70_656E  # b"open": seed of load_state_dict() and iter(dataset)
_ENDED = object()

# (dataset state to load or None, iterator state to load or None, batches this worker
# delivered in the pass, its part of the pass has ended, send a SKIP first)
WorkerStart = tuple[Any, Any, int, bool, bool]


class PassPlan:
    """How the copies start the pass a reader is built for.

    Args:
        epoch: The pass's number.
        starts: Per worker id (one entry with 0 workers); ``None`` when every copy
            starts the pass as it is (a kept copy that read the previous pass to its end,
            or one fresh from the main process at the start of a pass).
    """

    __slots__ = ("epoch", "starts")

    def __init__(self, epoch: int, starts: list[WorkerStart] | None) -> None:
        self.epoch = epoch
        self.starts = starts

    def __getstate__(self) -> tuple[int, list[WorkerStart] | None]:
        return self.epoch, self.starts

    def __setstate__(self, state: tuple[int, list[WorkerStart] | None]) -> None:
        self.epoch, self.starts = state


_SCALARS = (int, float, str, bool, type(None))


def _snapshot(value: Any) -> Any:
    # A copy: the object goes on changing after the batch is handed over, and a worker's
    # queue pickles what it sends later, on its own thread.
    if not is_stateful(value):
        return None
    state = value.state_dict()
    if type(state) is dict and all(type(item) in _SCALARS for item in state.values()):
        return dict(state)  # the common small state: a flat copy is a deep one (many µs less)
    return copy.deepcopy(state)


class PassReader(IterableDataset):
    """The internal loader's dataset: yields the tagged items of one pass per ``iter()``.

    A copy reads the pass its :class:`PassPlan` names on its first ``iter()``; later
    ``iter()`` calls (persistent workers) read the following passes from the copy as
    it is. Attribute reads and writes it does not own go to the user's dataset, so a
    ``worker_init_fn`` that configures ``get_worker_info().dataset`` (torch's sharding
    recipe) configures the user's dataset copy.

    Args:
        dataset: The user's ``IterableDataset``.
        collate_fn: The loader's collate function.
        batch_size: Items per batch, or ``None`` (each item is one batch).
        drop_last: Drop a last partial batch of a worker's pass.
        augmentation_seed: Base of the per-batch seeds.
        plan: The pass this reader starts with.
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        batch_size: int | None,
        drop_last: bool,
        augmentation_seed: int,
        plan: PassPlan,
    ) -> None:
        self.dataset = dataset
        self._collate_fn = collate_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._augmentation_seed = augmentation_seed
        self._plan = plan
        self._passes = 0  # iter() calls on this copy
        self._epoch = plan.epoch

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object lacks; private names are refused so that
        # unpickling (which probes for hooks before __dict__ is filled) cannot recurse.
        dataset = self.__dict__.get("dataset")
        if name.startswith("_") or dataset is None:
            raise AttributeError(name)
        return getattr(dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "dataset" or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)

    def __iter__(self) -> Iterator[tuple[int, int, Any, Any]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        start: WorkerStart | None = None
        if self._passes == 0:
            starts = self._plan.starts
            start = starts[worker] if starts is not None else None
        else:
            self._epoch += 1
        self._passes += 1
        return self._read(worker, self._epoch, start)

    def _read(
        self, worker: int, epoch: int, start: WorkerStart | None
    ) -> Iterator[tuple[int, int, Any, Any]]:
        dataset_state, iterator_state, batches, ended, skip = start or (None, None, 0, False, False)
        if skip:
            yield SKIP, worker, None, None
        in_worker = get_worker_info() is not None
        base = derive_seed(self._augmentation_seed, _PASS_SALT, epoch, worker)
        where = f"worker {worker}, batch {batches} of pass {epoch}"
        try:
            iterator = run_seeded(
                functools.partial(seed_batch, derive_seed(base, _OPEN_SALT, batches)),
                lambda: self._open(dataset_state, iterator_state, ended),
            )
        except Exception as exc:
            yield (
                FAILED,
                worker,
                FetchFailure(0, where, 0, "iteration", exc, in_worker=in_worker),
                None,
            )
            return
        if iterator is None:
            return  # its part of the pass had ended: the copy holds its state for the next pass
        if not is_stateful(self.dataset) and not is_stateful(iterator):
            yield REFUSED, worker, type(iterator).__name__, None
            return
        stopped = [False]  # the iterator stopped (inside a partial batch)
        while True:
            try:
                batch = run_seeded(
                    functools.partial(seed_batch, derive_seed(base, batches)),
                    lambda: self._batch(iterator, stopped),
                )
                states = (
                    (_snapshot(self.dataset), None, True)
                    if batch is _ENDED
                    else (_snapshot(self.dataset), _snapshot(iterator), stopped[0])
                )
            except Exception as exc:
                where = f"worker {worker}, batch {batches} of pass {epoch}"
                failure = FetchFailure(0, where, 0, "iteration", exc, in_worker=in_worker)
                yield FAILED, worker, failure, None
                return
            if batch is _ENDED:
                yield END, worker, None, states[0]
                return
            yield BATCH, worker, batch, states
            batches += 1

    def _open(self, dataset_state: Any, iterator_state: Any, ended: bool) -> Iterator[Any] | None:
        dataset = self.dataset
        if dataset_state is not None:
            dataset.load_state_dict(copy.deepcopy(dataset_state))
        if ended:
            return None
        iterator = iter(dataset)
        if iterator_state is not None:
            iterator.load_state_dict(copy.deepcopy(iterator_state))  # type: ignore[attr-defined]
        return iterator

    def _batch(self, iterator: Iterator[Any], stopped: list[bool]) -> Any:
        # As torch's _IterableDatasetFetcher: an iterator that stopped is not asked again.
        if stopped[0]:
            return _ENDED
        size = self._batch_size
        if size is None:
            try:
                item = next(iterator)
            except StopIteration:
                stopped[0] = True
                return _ENDED
            return self._collate_fn(item)
        items = list(islice(iterator, size))
        if len(items) < size:
            stopped[0] = True
            if not items or self._drop_last:
                return _ENDED
        return self._collate_fn(items)
