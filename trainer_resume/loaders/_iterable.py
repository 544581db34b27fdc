"""Reading one pass of an ``IterableDataset`` in a worker (or the main process), batch by batch.

The internal loader of a resumable loader over an ``IterableDataset`` iterates a
:class:`PassReader`. Each process reads its own copy of the user's dataset (with 0
workers the main-process dataset itself), as with ``DataLoader``, and reads it as
torch's ``_IterableDatasetFetcher`` does: one ``iter(dataset)`` per pass, then only
``next()`` on what it returned (a dataset that is its own iterator and restarts in
``__iter__`` is read through, not restarted per batch), ``batch_size`` items per
``collate_fn`` call, a last partial batch unless ``drop_last``; ``batch_size=None``:
one item per call. Every item the reader yields is a tagged tuple ``(tag, worker,
payload, states)``:

* ``BATCH``: a batch and ``(dataset state, iterator state, last, generators)`` right
  after it (``last``: the iterator stopped inside this partial batch, so the worker's
  part of the pass is over and its iterator is not asked again, as in torch's fetcher;
  ``generators``: the copy's generator states after the batch, None when ``last``,
  ``UNCHANGED`` from a worker when they are those of its previous batch that carried
  them in this pass);
* ``END``: this worker's part of the pass is over, with the dataset's state then;
* ``SKIP``: nothing, sent once at the start of a resumed pass by the workers whose
  batch of the current round was delivered before the pause (see below);
* ``FAILED``: a :class:`~trainer_resume.loaders._fetch.FetchFailure`;
* ``REFUSED``: the pass cannot be read exactly (the text says why).

torch delivers an iterable loader's items round-robin over the workers, starting at
worker 0, and skips a worker once its iteration has stopped. A resumed pass
continues after worker ``w``'s batch: workers ``0..w`` that still have items send
one ``SKIP`` first, so every worker keeps its own id (``get_worker_info().id``
splits the data as before) and the delivered order is the uninterrupted one.

Randomness. Each copy reads a pass with the global generators (Python ``random``,
NumPy's global generator, torch CPU) seeded from ``pass_seed(augmentation_seed,
pass, worker)`` before its ``iter(dataset)``; they carry on from batch to batch, as a
worker's do in ``DataLoader`` (in the main process they are the copy's own: put in
place for each read, the caller's handed back after it). The copy's
``state_dict()`` is taken right after each batch, with the generators as that batch
left them, and those generator states travel with it; after the copy's last read of
a pass they are seeded for its next pass first. A resumed pass therefore runs
``iter(dataset)`` under the seed the original pass ran it under, loads the copy's
states, and reads on with the generators as the last delivered batch left them. A
dataset that saves the global generators in its own state saves exactly those, so
restoring them, in ``load_state_dict`` or lazily in its next ``__iter__`` /
``__next__``, changes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from ..difference import first_difference
from ..rng import derive_seed
from ._driver import StreamingDriver
from ._fetch import FetchFailure
from ._global_generators import Snapshot, capture, fingerprint, install, layout, same
from ._seeding import NumPyGeneratorReplacedError, OwnGenerators, replaced_in_worker, seed_batch
from ._stateful import is_stateful

__all__ = [
    "BATCH",
    "END",
    "FAILED",
    "REFUSED",
    "SKIP",
    "UNCHANGED",
    "PassPlan",
    "PassReader",
    "WorkerStart",
    "pass_seed",
    "state_failed",
]

BATCH, END, SKIP, FAILED, REFUSED = range(5)
# A batch's generator states, when they are those of the worker's previous batch that carried them.
UNCHANGED = "unchanged"

_PASS_SALT = 0x6974_6572  # b"iter": per-pass, per-worker seed of a copy's generators
_ENDED = object()

# (dataset state to load or None, iterator state to load or None, generator states to
# put in place or None, batches this worker delivered in the pass, its part of the pass
# has ended, send a SKIP first)
WorkerStart = tuple[Any, Any, Any, int, bool, bool]
_AS_IT_IS: WorkerStart = (None, None, None, 0, False, False)  # the copy starts the pass as it is


def pass_seed(augmentation_seed: int, epoch: int, worker: int) -> int:
    """The seed of worker ``worker``'s generators as it starts reading pass ``epoch``."""
    return derive_seed(augmentation_seed, _PASS_SALT, epoch, worker)


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


_SCALARS = frozenset((int, float, str, bool, type(None)))


def snapshot(value: Any) -> Any:
    """``value.state_dict()``, copied: the object goes on changing after the batch is
    handed over, and a worker's queue pickles what it sends later, on its own thread."""
    state = value.state_dict()
    if type(state) is dict:
        for item in state.values():
            if type(item) not in _SCALARS:
                break
        else:
            return state.copy()  # the common small state: a flat copy is a deep one
    return _copied(state)


def _copied(value: Any) -> Any:
    # Plain containers of scalars (a position, Hugging Face's nested state) are copied
    # directly, several times faster than deepcopy; anything else goes to deepcopy.
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {key: _copied(item) for key, item in value.items()}
    if kind is list:
        return [_copied(item) for item in value]
    if kind is tuple:
        return tuple([_copied(item) for item in value])
    return copy.deepcopy(value)


class _WorkerGenerators:
    """In a worker the global generators are the copy's: nothing else draws from them.

    A batch carries them only when they changed since the last batch of the pass that
    carried them (``UNCHANGED`` otherwise): a dataset that draws no random numbers
    sends about 10 KB less per batch through the worker's queue. Where the layouts are
    proven, whether they changed is told from their raw bytes (:func:`fingerprint`),
    and they are captured only when they did.
    """

    __slots__ = ("_mark", "_sent")

    def __init__(self) -> None:
        self._sent: Snapshot | None = None
        self._mark: tuple[bytes, ...] | None = None

    def run(self, read: Callable[[], Any]) -> Any:
        result = read()
        kind = type(layout().numpy_state._bit_generator)
        if kind is not np.random.MT19937:  # installed by the read: its state cannot be carried
            raise NumPyGeneratorReplacedError(replaced_in_worker(kind.__name__))
        return result

    def after(self) -> Snapshot | str:
        mark = fingerprint()
        if mark is not None:
            if mark == self._mark:
                return UNCHANGED
            self._mark, self._sent = mark, capture()
            return self._sent
        states, sent = capture(), self._sent
        if sent is not None and same(states, sent):
            return UNCHANGED
        self._sent = states
        return states


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
        augmentation_seed: Base of the passes' seeds.
        plan: The pass this reader starts with.
        prepare_pass: Called with the copy before each pass's ``iter(dataset)`` and
            whether the pass resumes inside the copy's part; returns why the pass
            cannot be read exactly, or None.
        driver: The driver of a streaming dataset whose position its library's state
            API holds (see ``_streaming``): it opens each pass from the library state the
            plan carries, and a copy's recorded state is the samples it delivered in the
            pass (``{"samples": n}``), not a ``state_dict()`` of the dataset.
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        batch_size: int | None,
        drop_last: bool,
        augmentation_seed: int,
        plan: PassPlan,
        prepare_pass: Callable[[Any, bool], str | None] | None = None,
        driver: StreamingDriver | None = None,
    ) -> None:
        self.dataset = dataset
        self._collate_fn = collate_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._augmentation_seed = augmentation_seed
        self._plan = plan
        self._prepare_pass = prepare_pass
        self._driver = driver
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
        dataset_state, iterator_state, generators, batches, ended, skip = start or _AS_IT_IS
        if skip:
            yield SKIP, worker, None, None
        in_worker = get_worker_info() is not None
        streams = _WorkerGenerators() if in_worker else OwnGenerators()
        seed = pass_seed(self._augmentation_seed, epoch, worker)
        following = pass_seed(self._augmentation_seed, epoch + 1, worker)
        where = f"worker {worker}, batch {batches} of pass {epoch}"
        try:
            opened = streams.run(
                lambda: self._open(
                    seed, epoch, dataset_state, iterator_state, generators, ended, batches
                )
            )
        except Exception as exc:
            failure = FetchFailure(0, where, 0, "iteration", exc, in_worker=in_worker)
            yield FAILED, worker, failure, None
            return
        if opened is None:
            return  # its part of the pass had ended: the copy holds its state for the next pass
        if isinstance(opened, str):
            yield REFUSED, worker, opened, None
            return
        iterator = opened
        dataset = self.dataset
        driven = self._driver is not None
        dataset_stateful = not driven and is_stateful(dataset)
        same = iterator is dataset  # its own iterator: one state_dict() serves both records
        iterator_stateful = not driven and not same and is_stateful(iterator)
        if not driven and not dataset_stateful and not iterator_stateful:
            yield REFUSED, worker, _stateless(type(iterator).__name__), None
            return
        stopped = [False]  # the iterator stopped (inside a partial batch)
        # A driven copy's position is the samples it delivered; an opened copy delivered
        # only whole batches before (a partial one ends its part of the pass).
        samples = [batches * (self._batch_size or 1)]

        def taken() -> tuple[Any, Any]:
            if driven:
                return {"samples": samples[0]}, None
            try:
                state = snapshot(dataset) if dataset_stateful else None
                if same:
                    return state, state
                return state, snapshot(iterator) if iterator_stateful else None
            except Exception as exc:
                raise _StateFailed from exc

        def read() -> tuple[Any, Any]:
            batch = self._batch(iterator, stopped, samples)
            if batch is not _ENDED and not stopped[0]:
                return batch, (*taken(), False)
            # The copy's next read is the next pass: it starts with the generators
            # seeded for it, and so does the state the copy saves of them.
            seed_batch(following)
            if batch is _ENDED:
                return batch, taken()[0] if driven or dataset_stateful else None
            return batch, (*taken(), True)

        while True:
            try:
                batch, states = streams.run(read)
            except _StateFailed as failed:
                # Not a failed read: the position cannot be taken, and would not be on a retry.
                yield REFUSED, worker, state_failed(dataset, iterator, failed.__cause__), None
                return
            except Exception as exc:
                where = f"worker {worker}, batch {batches} of pass {epoch}"
                failure = FetchFailure(0, where, 0, "iteration", exc, in_worker=in_worker)
                yield FAILED, worker, failure, None
                return
            if batch is _ENDED:
                yield END, worker, None, states
                return
            yield BATCH, worker, batch, (*states, None if states[2] else streams.after())
            batches += 1

    def _open(
        self,
        seed: int,
        epoch: int,
        dataset_state: Any,
        iterator_state: Any,
        generators: Snapshot | None,
        ended: bool,
        batches: int,
    ) -> Iterator[Any] | str | None:
        dataset = self.dataset
        seed_batch(seed)
        if self._driver is not None:
            if ended:
                return None
            self._driver.open(dataset, epoch, dataset_state)
            seed_batch(seed)  # iter() runs under the pass's seed, whatever opening drew or set
            iterator = iter(dataset)
            if generators is not None:
                install(generators)
            return iterator
        if dataset_state is not None:
            dataset.load_state_dict(copy.deepcopy(dataset_state))
            seed_batch(seed)  # iter() runs under the pass's seed, whatever loading drew or set
        if ended:
            return None
        if self._prepare_pass is not None:
            refusal = self._prepare_pass(dataset, batches > 0)
            if refusal is not None:
                return refusal
        iterator = iter(dataset)
        if iterator_state is not None and not _kept_by_iter(dataset, iterator, iterator_state):
            iterator.load_state_dict(copy.deepcopy(iterator_state))  # type: ignore[attr-defined]
        if generators is not None:
            install(generators)  # as the copy's last delivered batch left them
        return iterator

    def _batch(self, iterator: Iterator[Any], stopped: list[bool], samples: list[int]) -> Any:
        # As torch's _IterableDatasetFetcher: next() only (islice would call iter() on
        # the iterator for every batch), and an iterator that stopped is not asked again.
        if stopped[0]:
            return _ENDED
        size = self._batch_size
        if size is None:
            try:
                item = next(iterator)
            except StopIteration:
                stopped[0] = True
                return _ENDED
            samples[0] += 1
            return self._collate_fn(item)
        # map() ends where next() raises StopIteration: the items before it, no iter() call.
        items = list(map(next, repeat(iterator, size)))
        if len(items) < size:
            stopped[0] = True
            if not items or self._drop_last:
                return _ENDED
        samples[0] += len(items)
        return self._collate_fn(items)


def _kept_by_iter(dataset: Any, iterator: Any, state: Any) -> bool:
    """Whether a dataset that is its own iterator still holds ``state`` after ``iter()``
    (it kept the position loaded before it): then it is not loaded again, a second load
    the uninterrupted run never made (a dataset may note a load, for example to make its
    next ``__iter__`` resume instead of starting over, and would carry that into its next
    pass). One whose ``iter()`` starts over is loaded again."""
    if iterator is not dataset:
        return False
    try:
        return first_difference(state, snapshot(dataset)) is None
    except Exception:  # noqa: BLE001 - its state_dict() is asked again after the batch
        return False


class _StateFailed(Exception):
    """Taking the copy's state after a batch failed (the cause is chained)."""


def state_failed(dataset: Any, iterator: Any, cause: BaseException | None) -> str:
    """Why a copy's position cannot be recorded: its ``state_dict()`` raised ``cause``."""
    owner = type(dataset).__name__
    if iterator is not dataset and is_stateful(iterator):
        owner = f"{owner} (or the {type(iterator).__name__} its __iter__ returns)"
    return (
        f"{owner}.state_dict() failed ({type(cause).__name__}: {cause}), so the "
        "delivered position cannot be recorded (a retry would fail the same way); give the "
        "dataset a state_dict() that takes no arguments and returns its position as plain data "
        "(torchdata's Stateful protocol)"
    )


def _stateless(iterator_type: str) -> str:
    return (
        f"neither the IterableDataset nor the {iterator_type} its __iter__ returns has "
        "state_dict() and load_state_dict(), so its position cannot be recorded; give the "
        "dataset (or its iterator) state_dict() and load_state_dict() (torchdata's Stateful "
        "protocol)"
    )
