"""The delivered position of a loader over a stateful ``IterableDataset``: one record per worker.

Each worker (one with 0 workers) reads its own copy of the dataset; the main process
records, per worker, the copy's ``state_dict()`` and its iterator's after the last
batch *delivered* from it (prefetched batches never count), the copy's generator
states then, how many batches it delivered in the current pass and whether its part
of the pass has ended, plus the worker whose turn is next in torch's round-robin.
Each ``iter(loader)`` is one pass.

Where a pass starts from, as with ``DataLoader``:

* non-persistent workers: fresh copies of the main-process dataset every pass (the
  records are cleared when a pass ends);
* persistent workers and 0 workers: the copies carry their state into the next pass
  (each record keeps the dataset's state and forgets the finished iterator's).

A pass read to its end leaves the copies exactly as recorded, so the next pass reads
them as they are. Anywhere else (a resumed position, a pass left before its end,
new workers where the copies carried state) every copy first loads its record: the
copies then hold exactly what was delivered, never what was prefetched.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from operator import attrgetter
from typing import Any

from ..errors import LoaderStateError, UnsupportedResumeConfigurationError
from ..rng import validate_random_state
from ..state import Deferred, IterableDatasetSettings, IterableDatasetState, built
from . import _state_keys as keys
from ._driver import StreamingDriver
from ._global_generators import Snapshot, capture, snapshot_of, state_of
from ._iterable import PassPlan, WorkerStart, pass_seed, snapshot, state_failed
from ._seeding import caller_generators, seed_batch
from ._stateful import is_stateful

__all__ = ["IterableSource"]


class _Record:
    """What was delivered from one worker's copy."""

    __slots__ = ("batches", "dataset_state", "ended", "generators", "iterator_state")

    def __init__(self) -> None:
        self.dataset_state: Any = None  # None: the copy as its pass starts it
        self.iterator_state: Any = None  # None: no batch of this pass yet (or stateless)
        self.generators: Snapshot | None = None  # None: as the pass's seed starts them
        self.batches = 0
        self.ended = False


class IterableSource:
    """Positions of the workers reading a stateful ``IterableDataset``.

    Args:
        dataset: The user's dataset (with 0 workers, the copy that is read).
        num_workers: The loader's ``num_workers``.
        persistent_workers: The loader's ``persistent_workers``.
        drop_last: The loader's ``drop_last``.
        driver: The driver of a streaming dataset (see ``_streaming``): the records hold
            the samples each copy delivered, and each pass's start turns them into the
            library's states.
    """

    epochs = True  # each iter(loader) is one pass
    format = keys.ITERABLE_DATASET_FORMAT
    shards_stream = False
    stride = 1

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        persistent_workers: bool,
        drop_last: bool,
        driver: StreamingDriver | None = None,
    ) -> None:
        self._count = max(num_workers, 1)
        self._fresh_copies = num_workers > 0 and not persistent_workers
        self._settings: IterableDatasetSettings = {
            "num_workers": num_workers,
            "persistent_workers": bool(persistent_workers),
            "drop_last": bool(drop_last),
        }
        if driver is not None:
            self._settings["streaming"] = driver.library
        self._dataset = dataset
        self._driver = driver
        self._augmentation_seed = 0  # the loader's, given by begin() before each pass
        # With 0 workers the main-process dataset is the copy that is read (see take_origin).
        self._main = dataset if num_workers == 0 else None
        self._records = [_Record() for _ in range(self._count)]
        self._epoch = 0
        self._offset = 0
        self._delivered = 0
        self._next_worker = 0
        # The kept copies (persistent workers' or, with 0 workers, the main-process
        # dataset) hold the records' dataset states: after a pass read to its end, before
        # anything was read, or (0 workers) after a state was loaded into the dataset.
        self._current = True

    def take_origin(self, augmentation_seed: int) -> None:
        """With 0 workers, record the main-process dataset's state now: where a state saved
        before any batch starts, also in a loader that read on. It is taken with the
        generators seeded as the first pass starts them, as every later state is taken with
        the generators its next read starts from."""
        main = self._main
        if main is None or self._driver is not None or not is_stateful(main):
            return
        try:
            self._records[0].dataset_state = caller_generators().run(
                lambda: seed_batch(pass_seed(augmentation_seed, 0, 0)), lambda: snapshot(main)
            )
        except Exception as exc:
            raise UnsupportedResumeConfigurationError(state_failed(main, main, exc)) from exc

    @property
    def driver(self) -> StreamingDriver | None:
        """The driver of a streaming dataset, or ``None``."""
        return self._driver

    @property
    def cursor(self) -> tuple[int, int]:
        return self._epoch, self._offset

    @property
    def copies_current(self) -> bool:
        """Kept copies (persistent workers) may read the next pass as they are."""
        return self._current and not self._progressed()

    def _progressed(self) -> bool:
        return any(record.batches or record.ended for record in self._records)

    # --- passes ----------------------------------------------------------------------

    def begin(self, augmentation_seed: int) -> None:
        self._augmentation_seed = augmentation_seed

    def plan(self, kept: bool) -> PassPlan:
        """How the copies start the pass that begins now (``kept``: they are the copies
        the last pass read or a state was loaded into, not fresh ones from the main
        process)."""
        if self._driver is not None:
            return self._driven_plan()
        loaded = kept and self._current  # their dataset states are the records' already
        starts: list[WorkerStart] | None = None
        if not (loaded and not self._progressed()):
            progressed, turn = self._progressed(), self._next_worker
            starts = [
                (
                    None if loaded else record.dataset_state,
                    record.iterator_state,
                    record.generators,
                    record.batches,
                    record.ended,
                    progressed and worker < turn and not record.ended,
                )
                for worker, record in enumerate(self._records)
            ]
        self._current = False  # the pass reads the copies on from here
        return PassPlan(self._epoch, copy.deepcopy(starts))

    def _driven_plan(self) -> PassPlan:
        # Every pass opens each copy from the library state of its delivered samples (or
        # the pass's start), computed here, in the main process, where the library's
        # state_dict() runs.
        assert self._driver is not None
        records = self._records
        starts = self._driver.starts(
            self._dataset,
            self._epoch,
            [_samples(record.dataset_state) for record in records],
            [record.ended for record in records],
            self._next_worker,
        )
        if starts.rotation is not None and self._progressed():
            # The library deals the rest of the pass out from worker 0 again: each worker
            # carries on from the record of the worker whose batches it now reads.
            turn = starts.rotation
            self._records = records = [
                records[(turn + worker) % self._count] for worker in range(self._count)
            ]
            for worker, record in enumerate(records):
                record.ended = False
                if record.generators is None:  # as its own worker's pass seed left them
                    seed = pass_seed(
                        self._augmentation_seed, self._epoch, (turn + worker) % self._count
                    )
                    record.generators = caller_generators().run(
                        lambda seed=seed: seed_batch(seed), capture
                    )
            self._next_worker = 0
        progressed, turn = self._progressed(), self._next_worker
        plan: list[WorkerStart] = [
            (
                state,
                None,
                record.generators,
                record.batches,
                record.ended or done,
                progressed and worker < turn and not record.ended and not done,
            )
            for worker, (record, state, done) in enumerate(zip(records, starts.states, starts.done))
        ]
        self._current = False
        return PassPlan(self._epoch, copy.deepcopy(plan))

    def worker_seed_epoch(self) -> int | None:
        """The pass whose number seeds fresh workers (``None``: persistent ones, seeded once)."""
        return self._epoch if self._fresh_copies else None

    def commit_batch(self, worker: int, states: tuple[Any, Any, bool, Snapshot | None]) -> None:
        record = self._records[worker]
        record.dataset_state, record.iterator_state, record.ended, record.generators = states
        record.batches += 1
        self._next_worker = (worker + 1) % self._count
        self._offset += 1
        self._delivered += 1

    def end_worker(self, worker: int, dataset_state: Any) -> None:
        """``worker``'s part of the pass is over (its end was received, nothing delivered)."""
        record = self._records[worker]
        if record.ended:
            return  # its last batch said so already, as a resumed pass that skips the end
        record.dataset_state, record.iterator_state, record.ended = dataset_state, None, True
        record.generators = None
        self._next_worker = (worker + 1) % self._count

    def end_epoch(self, number: int) -> None:
        """The pass ``number`` was read to its end: the copies hold exactly the records."""
        if self._epoch == number:
            self._next_pass()
            self._current = True

    def abandon(self, number: int) -> None:
        """An iterator of pass ``number`` was replaced after delivering: the next pass starts
        from the delivered records (the copies read ahead of them)."""
        if self._epoch == number:
            self._next_pass()

    def _next_pass(self) -> None:
        self._epoch, self._offset, self._next_worker = self._epoch + 1, 0, 0
        for record in self._records:
            if self._fresh_copies or self._driver is not None:
                record.dataset_state = None
            record.iterator_state, record.generators = None, None
            record.batches, record.ended = 0, False

    # --- state -----------------------------------------------------------------------

    def state(self) -> IterableDatasetState:
        return built(self.position())

    def position(self) -> Deferred:
        """The delivered position now, its state built later (also from another thread).

        Only references are taken now: a record's fields are replaced, never changed in
        place (a delivered batch brings new states), so what they refer to stays as it
        was delivered; the state copies them when it is built.
        """
        # The settings never change after __init__ (_state copies them); the records'
        # fields are read by C calls: this runs after every step.
        return (
            _state,
            self._settings,
            (self._epoch, self._offset, self._delivered, self._next_worker),
            list(map(_RECORD_FIELDS, self._records)),
        )

    def validate(self, state: Mapping[str, Any]) -> None:
        what = "iterable dataset state"
        settings = state.get(keys.SETTINGS) if isinstance(state, Mapping) else None
        library = self._settings.get("streaming")
        saved_library = settings.get("streaming") if isinstance(settings, Mapping) else None
        if saved_library != library:
            raise LoaderStateError(
                f"{what} was saved by a loader over {_reading(saved_library)}, but this loader "
                f"reads {_reading(library)}; load it into a loader over the same dataset"
            )
        _, offset, delivered = keys.check_epoch_state(
            state,
            what,
            keys.ITERABLE_DATASET_FORMAT,
            self._settings,
            (keys.NEXT_WORKER, keys.WORKERS),
            fix="build the loader with {name}={saved!r} (each worker's copy of the dataset "
            "has its own state)",
        )
        turn = keys.check_count(state, what, keys.NEXT_WORKER)
        if turn >= self._count:
            raise LoaderStateError(
                f"{what}[{keys.NEXT_WORKER!r}] = {turn} but the loader reads with {self._count} "
                "worker(s)"
            )
        workers = state[keys.WORKERS]
        if not isinstance(workers, list) or len(workers) != self._count:
            raise LoaderStateError(
                f"{what}[{keys.WORKERS!r}] must be a list of {self._count} dict(s)"
            )
        batches = 0
        for worker, record in enumerate(workers):
            where = f"{what}[{keys.WORKERS!r}][{worker}]"
            keys.check_mapping(
                record,
                where,
                (
                    keys.DATASET_STATE,
                    keys.ITERATOR_STATE,
                    keys.GENERATORS,
                    keys.BATCHES,
                    keys.ENDED,
                ),
            )
            batches += keys.check_count(record, where, keys.BATCHES)
            if library is not None:
                _check_position(record, where)
            if type(record[keys.ENDED]) is not bool:
                raise LoaderStateError(f"{where}[{keys.ENDED!r}] must be a bool")
            generators = record[keys.GENERATORS]
            if generators is not None:
                try:
                    validate_random_state(generators)
                except (ValueError, RuntimeError) as exc:
                    raise LoaderStateError(f"{where}[{keys.GENERATORS!r}]: {exc}") from exc
                if generators["cuda"] is not None:
                    raise LoaderStateError(
                        f"{where}[{keys.GENERATORS!r}] holds a CUDA state; a copy's generators "
                        "are the CPU ones"
                    )
        if batches != offset or delivered < offset:
            raise LoaderStateError(
                f"{what}: the workers delivered {batches} batch(es) in the pass, but "
                f"{keys.OFFSET!r} = {offset} and {keys.DELIVERED!r} = {delivered}"
            )

    def apply(self, state: Mapping[str, Any]) -> None:
        saved = state[keys.WORKERS]
        main = self._main if self._driver is None else None
        if main is not None and saved[0][keys.DATASET_STATE] is not None:
            # The main-process dataset takes its state now, so what the caller changes in
            # it before the next pass (a set_epoch()) applies on top, as in the saved run.
            try:
                # The caller's generators come back: a dataset may set them as it loads.
                caller_generators().run(
                    _nothing,
                    lambda: main.load_state_dict(copy.deepcopy(saved[0][keys.DATASET_STATE])),
                )
            except Exception as exc:
                self._current = False  # the next pass loads the unchanged records again
                raise LoaderStateError(
                    f"{type(main).__name__}.load_state_dict() refused the saved dataset state: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        for record, entry in zip(self._records, saved):
            record.dataset_state = copy.deepcopy(entry[keys.DATASET_STATE])
            record.iterator_state = copy.deepcopy(entry[keys.ITERATOR_STATE])
            generators = entry[keys.GENERATORS]
            record.generators = snapshot_of(generators) if generators is not None else None
            record.batches, record.ended = entry[keys.BATCHES], entry[keys.ENDED]
        self._epoch, self._offset = state[keys.EPOCH], state[keys.OFFSET]
        self._delivered, self._next_worker = state[keys.DELIVERED], state[keys.NEXT_WORKER]
        self._current = main is not None  # workers load their records when they start

    def delivered_batches(self, state: Mapping[str, Any]) -> int:
        return state[keys.DELIVERED]


def _nothing() -> None:
    pass


# What a position takes of each worker's record, in _state's order.
_RECORD_FIELDS = attrgetter("dataset_state", "iterator_state", "generators", "batches", "ended")


def _state(
    settings: IterableDatasetSettings,
    counts: tuple[int, int, int, int],
    records: list[tuple[Any, Any, Snapshot | None, int, bool]],
) -> IterableDatasetState:
    epoch, offset, delivered, next_worker = counts
    return {
        keys.FORMAT: keys.ITERABLE_DATASET_FORMAT,
        keys.SETTINGS: dict(settings),
        keys.EPOCH: epoch,
        keys.OFFSET: offset,
        keys.DELIVERED: delivered,
        keys.NEXT_WORKER: next_worker,
        keys.WORKERS: [
            {
                keys.DATASET_STATE: copy.deepcopy(dataset_state),
                keys.ITERATOR_STATE: copy.deepcopy(iterator_state),
                keys.GENERATORS: state_of(generators) if generators is not None else None,
                keys.BATCHES: batches,
                keys.ENDED: ended,
            }
            for dataset_state, iterator_state, generators, batches, ended in records
        ],
    }  # type: ignore[return-value]


def _reading(library: Any) -> str:
    return "a dataset with its own state" if library is None else f"{library}'s StreamingDataset"


def _check_position(record: Mapping[str, Any], where: str) -> None:
    # A driven copy's record holds the samples it delivered and nothing else.
    position = record[keys.DATASET_STATE]
    if position is not None:
        keys.check_mapping(position, f"{where}[{keys.DATASET_STATE!r}]", ("samples",))
        keys.check_count(position, f"{where}[{keys.DATASET_STATE!r}]", "samples")
    if record[keys.ITERATOR_STATE] is not None:
        raise LoaderStateError(f"{where}[{keys.ITERATOR_STATE!r}] must be None")


def _samples(position: Any) -> int:
    # A driven copy's record: the samples it delivered in the pass (none before its first batch).
    return 0 if position is None else position["samples"]
