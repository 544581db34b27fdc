"""``ResumableDataLoader``: a ``torch.utils.data.DataLoader`` that resumes at the first undelivered batch."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from multiprocessing.context import BaseContext
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..errors import (
    LoaderFetchFailedError,
    LoaderStateError,
    ResumableModeRequiredError,
    UnsavedStateWarning,
    UnsupportedResumeConfigurationError,
)
from ..pause_signals import worker_start
from ..rng import derive_seed
from ..state import Deferred, LoaderState, built, cpu_state, now
from . import _state_keys as keys
from ._batching import ResumableBatchSampler
from ._configuration import check_resumable_configuration, source_of
from ._fetch import BatchFetcher, as_is
from ._hf_streaming import is_streaming_dataset, prepare_pass
from ._iterable import PassPlan, PassReader
from ._iterable_iterator import IterableIterator
from ._iterable_source import IterableSource
from ._iterator import ResumableIterator, Stream, shutdown
from ._sources import Tasks
from .sampler import InfiniteRandomSampler

__all__ = ["ResumableDataLoader"]

_WORKER_SEED_SALT = 0x776F_726B_6572  # b"worker": base seed of the internal loader's workers


def _is_resumable_sampler(sampler: Any) -> bool:
    return isinstance(sampler, (InfiniteRandomSampler, ResumableBatchSampler)) and sampler.resumable


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position can be saved and restored exactly.

    With ``resumable=False`` (the default) it is ``torch.utils.data.DataLoader``,
    argument for argument. With ``resumable=True`` it takes the same arguments with the
    same meaning, and resumes exactly from :meth:`state_dict` in a new loader built
    with the same arguments (also in a new process):

    * ``shuffle=True/False``, or ``sampler=`` torch's ``SequentialSampler``,
      ``RandomSampler`` (any ``generator``, ``replacement``, ``num_samples``),
      ``SubsetRandomSampler``, ``WeightedRandomSampler``, ``DistributedSampler``, or
      ``batch_sampler=BatchSampler(...)`` over one of them (exact classes): each
      ``iter(loader)`` is one epoch, as with ``DataLoader``. The epoch's indices are
      computed when it starts (indices only: no sample is read to reach a
      position), and the state records what ordered them (the sampler generator's
      state at the start of the epoch, or ``DistributedSampler``'s epoch; a random
      sampler without a generator gets its order from ``augmentation_seed``), so the
      rest of the epoch and every later one come out the same in any process. After
      the last batch of an epoch the state names the first batch of the next one;
      :attr:`epoch` is the epoch the next ``iter()`` reads. A new ``iter()`` replaces
      the previous iterator; one replaced before it delivered a batch does not count
      as an epoch (a loaded position stays pending).
    * Any other sampler or batch sampler with ``state_dict()`` / ``load_state_dict()``
      (torchdata's ``Stateful`` protocol): the state holds its ``state_dict()`` after
      the last delivered batch (taken when that batch's indices were drawn), and each
      ``iter(loader)`` loads it and starts a new ``iter(sampler)``. Its order must
      follow from its state alone.
    * An ``IterableDataset`` with ``state_dict()`` / ``load_state_dict()``, or whose
      ``__iter__`` returns an iterator that has them (torchdata's ``Stateful``
      protocol), with any ``num_workers``, ``persistent_workers``, ``prefetch_factor``,
      ``batch_size`` (or ``None``) and ``drop_last``: each worker reads its own copy,
      batched and delivered round-robin as by ``DataLoader`` (one ``iter(dataset)`` per
      pass, then ``next()`` only, as torch's fetcher reads it), and each
      ``iter(loader)`` is one pass. The state holds, per worker, the copy's and its
      iterator's ``state_dict()`` after the last batch *delivered* from it, the copy's
      generator states then, and whose turn is next; a resume loads them into the new
      workers' copies (with 0 workers into the dataset, in :meth:`load_state_dict`). Non-persistent workers copy the
      main-process dataset at every pass start (so a state saved between passes loads
      nothing into them); persistent workers and 0 workers carry their copies' states
      into the next pass. To know whether a pass has ended, :meth:`state_dict` (and
      :attr:`epoch`) read one batch ahead and keep it for the next ``next()``.
    * litdata's and MosaicML's ``StreamingDataset``, whose ``state_dict()`` takes the
      counts their own loaders pass: read as above, the loader records the samples each
      worker delivered and drives the library's state API as its own loader does (the
      epoch per pass, the state loaded when a pass starts); see docs/streaming.md.
    * ``sampler=`` a resumable :class:`InfiniteRandomSampler` (that exact class), or
      ``batch_sampler=`` a resumable sampler from :func:`build_batch_sampler`: one
      endless stream, described next.
    * Endless samplers have one shared stream: ``iter(loader)`` returns the active
      iterator while it can deliver, so every loop (and ``next(iter(loader))``)
      continues the same stream. A new iterator starts at the first undelivered batch.
      Without ``repeat`` an iteration ends right after the last batch of its cycle.
    * :meth:`state_dict` counts only batches *returned to the caller*, never
      prefetched ones; :meth:`load_state_dict` validates completely, then stops the
      workers and drops the prefetch, so the next batch is the first undelivered one.
    * Augmentation replays: ``augmentation_seed`` is drawn once at construction (from
      ``generator`` if given, else torch's default CPU generator) and saved in the
      state. With ``augmentation_seeding="batch"`` (the default over torch's and
      stateful samplers) Python ``random``, NumPy's global generator and torch CPU are
      seeded once per batch from its position, and its samples and ``collate_fn`` draw
      in order (a dataset's ``__getitems__`` is used when it has one). An
      ``IterableDataset`` (recorded as ``"batch"`` too) has them seeded once per pass
      and worker, before its ``iter()``; they carry on from batch to batch as in a
      ``DataLoader`` worker (with 0 workers they are the copy's own, swapped in for its
      reads), and the state saves them with the copy's position, so a dataset that keeps
      them in its own state too resumes exactly. With ``"sample"`` (the default for the
      endless samplers, required when they are sharded) ``dataset[index]`` runs seeded
      by ``derive_seed(augmentation_seed, stream_position)``, as under ``rng_scope``,
      and ``collate_fn`` by a per-batch seed: a sample's augmentation then depends on
      neither batch size nor world size.
      The state records the choice. The caller's generators are handed back exactly
      after every batch, also with ``num_workers=0`` and on errors (CUDA is never
      touched); worker base seeds derive from ``augmentation_seed`` (``generator`` is
      not drawn from per iterator).
    * A failing ``dataset[index]`` or ``collate_fn``, or a worker that dies (also while
      ``iter()`` starts the workers), raises LoaderFetchFailedError (original chained,
      index or stream position in the detail); that iterator is dead, and after
      :meth:`close` a new ``iter(loader)`` resumes at the last delivered batch. A
      failure while recording the delivered position raises LoaderCommitFailedError;
      ``state_dict()`` and ``iter()`` then stay blocked until :meth:`load_state_dict`.

    Args:
        resumable: Enable saving and restoring the position (keyword-only). Every
            other argument is ``torch.utils.data.DataLoader``'s.
        augmentation_seeding: ``"batch"`` or ``"sample"`` (keyword-only); ``None``
            chooses as described above.
        allow_inexact_shuffle_buffer: Accept a Hugging Face streaming dataset shuffled
            with a buffer (``.shuffle(buffer_size=...)``), refused otherwise: its state
            does not hold the buffer, so a resume refills it with other examples and
            differs from the uninterrupted run (keyword-only). With ``num_workers=0``
            only: a worker's copy fails to load such a state.

    Raises:
        ResumableModeRequiredError: a resumable sampler with ``resumable=False``, or
            ``resumable=True`` without one.
        UnsupportedResumeConfigurationError: with ``resumable=True``: an
            IterableDataset without a state (its ``__iter__`` a generator; one that
            returns an iterator without a state is refused by the first ``next()``), a
            sampler or batch sampler other than those above (subclasses included),
            ``in_order=False``, a Hugging Face streaming dataset shuffled with a buffer
            (unless ``allow_inexact_shuffle_buffer``), an IterableDataset whose
            ``state_dict()`` needs arguments (other than the streaming datasets above)
            or fails, or a MosaicML dataset with another ``batch_size``, ``replication``
            or several processes.
        ValueError: the sampler was built for a dataset of another size,
            ``augmentation_seeding`` is unknown, ``"batch"`` with a sharded endless
            sampler or ``"sample"`` with an IterableDataset (and every argument error
            ``DataLoader`` raises, e.g. a sampler or ``shuffle`` with an IterableDataset).
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: str | BaseContext | None = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        resumable: bool = False,
        augmentation_seeding: str | None = None,
        allow_inexact_shuffle_buffer: bool = False,
    ) -> None:
        if not isinstance(resumable, bool):
            raise TypeError(f"resumable must be a bool, got {type(resumable).__name__}")
        if augmentation_seeding not in (None, "batch", "sample"):
            raise ValueError(
                f"augmentation_seeding must be 'batch', 'sample' or None, got {augmentation_seeding!r}"
            )
        if not isinstance(allow_inexact_shuffle_buffer, bool):
            raise TypeError(
                "allow_inexact_shuffle_buffer must be a bool, got "
                f"{type(allow_inexact_shuffle_buffer).__name__}"
            )
        if resumable:
            check_resumable_configuration(
                dataset,
                sampler,
                batch_sampler,
                in_order,
                allow_inexact_shuffle_buffer=allow_inexact_shuffle_buffer,
                num_workers=num_workers,
            )
        else:
            for given in (sampler, batch_sampler):
                if _is_resumable_sampler(given):
                    raise ResumableModeRequiredError(
                        f"{type(given).__name__} was built with resumable=True; pass resumable=True "
                        "to the loader too (or build the sampler with resumable=False)"
                    )
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.resumable = resumable
        if not resumable:
            return
        source, expected = source_of(self)
        if expected is not None and len(dataset) != expected:  # type: ignore[arg-type]
            raise ValueError(
                f"the sampler was built for {expected} samples but the dataset has {len(dataset)}"  # type: ignore[arg-type]
            )
        if isinstance(source, IterableSource) and augmentation_seeding == "sample":
            raise ValueError(
                "augmentation_seeding='sample' seeds samples by their sampler position, which an "
                "IterableDataset does not have; leave it unset (per batch)"
            )
        if augmentation_seeding == "batch" and source.shards_stream:
            raise ValueError(
                "augmentation_seeding='batch' with a sampler sharded over several ranks: a sample's "
                "augmentation would change with the world size; leave it unset (per sample)"
            )
        if augmentation_seeding is None:
            # Endless samplers may be sharded, and a state of theirs resumes with any world
            # size, so they seed per sample (by global position) unless asked otherwise.
            augmentation_seeding = "batch" if source.epochs else "sample"
        self.augmentation_seeding = augmentation_seeding
        self._stream = Stream(source, keys.draw_seed(generator))
        if isinstance(source, IterableSource):
            if source.driver is not None:
                source.driver.configure(dataset, batch_size, num_workers)
            source.take_origin(self._stream.augmentation_seed)
        self._engine: DataLoader | None = (
            None  # internal loader whose persistent workers are reused
        )
        self._active: ResumableIterator | None = None
        self.__ready = True

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_ResumableDataLoader__ready", False):
            if name == "collate_fn":
                raise UnsupportedResumeConfigurationError(
                    "collate_fn cannot be replaced on a resumable loader (batches would no longer "
                    "replay); pass it to the constructor"
                )
            if name == "in_order" and value is not True:
                raise UnsupportedResumeConfigurationError("a resumable loader needs in_order=True")
        super().__setattr__(name, value)

    @property
    def epoch(self) -> int:
        """The epoch of the loader's position (resumable mode; 0 for endless samplers): the
        one being read, or after its last batch (and after :meth:`load_state_dict`) the one
        the next ``iter(loader)`` reads.

        Each ``iter(loader)`` over a torch sampler is one epoch, so after
        :meth:`load_state_dict` an epoch loop continues with
        ``for epoch in range(loader.epoch, epochs)``. A new ``iter(loader)`` that replaces a
        part-read iteration reads the next epoch: after a look at a batch
        (``next(iter(loader))``) the loop's first epoch is ``loader.epoch + 1``.
        """
        source = self._require_stream("epoch").source
        self._settle()
        return source.cursor[0] if source.epochs else 0

    @property
    def epoch_ended(self) -> bool:
        """True from the delivery of an iteration's last batch until the next ``iter(loader)``.

        The iteration's last batch is an epoch's (or, over an ``IterableDataset``, a
        pass's) last, so a training loop is about to run its epoch-end work; the
        trainer mixin lands a pause requested now after that work (see
        docs/data-loading.md#the-epoch-loop). False for endless samplers, before the
        first batch and after ``load_state_dict``.
        """
        self._require_stream("epoch_ended")
        self._settle()
        active = self._active
        return active is not None and active.ended

    def end_epoch(self) -> None:
        """End the epoch in progress now: the next ``iter(loader)`` reads the next epoch.

        What a new ``iter(loader)`` does when the previous iterator delivered batches
        and was replaced part-way, said where the loop leaves the epoch: a loop that
        stops its epochs early (a ``break``; Lightning with ``limit_train_batches``)
        calls it after its inner loop, so that a pause taken after it resumes at the
        next epoch (see docs/data-loading.md#the-epoch-loop); also for a loader whose
        position was loaded part-way into an epoch. The current iterator ends
        (``IteratorInvalidatedError`` on its next use). Nothing changes between epochs
        (no batch of the epoch was delivered) or for endless samplers, whose iterations
        never end.
        """
        stream = self._require_stream("end_epoch")
        stream.require_committable()
        source = stream.source
        if not source.epochs:
            return
        self._settle()
        number, offset = source.cursor
        active = self._active
        if active is not None and active.alive:
            active.retire("end_epoch() ended this iterator's epoch")
        self._active = None
        if offset:
            # The epoch's order is computed first: computing it moves the sampler's
            # generator as the uninterrupted run's did, and the next epoch follows from it.
            source.begin(stream.augmentation_seed)
            source.abandon(number)

    @property
    def augmentation_seed(self) -> int:
        """Base seed of every sample's and batch's augmentation (resumable mode)."""
        return self._require_stream("augmentation_seed").augmentation_seed

    # --- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if not self.__dict__.get("resumable", False):
            with worker_start(self):
                return super().__iter__()
        stream = self._require_stream("iter")
        stream.require_committable()
        if stream.fetch_failure is not None:
            raise LoaderFetchFailedError(stream.fetch_failure)
        source = stream.source
        # A consumer that stopped after a pass's last batch left its end unread: reading
        # on ends that pass here, instead of abandoning it and reading its end as the next.
        self._settle()
        active = self._active
        if active is not None and active.alive:
            if not source.epochs:
                return active
            # As with DataLoader, a new iter() starts a new epoch; an iterator that has
            # not delivered yet is only replaced (its position, maybe a loaded one, stays).
            active.retire("a new iter(loader) replaced this iterator")
            if active.delivered:
                if active.boundaries > 1 and not self.__dict__.get("_warned_left"):
                    self.__dict__["_warned_left"] = True
                    _warn_left_part_way(active)
                source.abandon(active.epoch)
        self._active = None
        source.begin(stream.augmentation_seed)
        if isinstance(source, IterableSource):
            self._active = self._iterate_passes(stream, source)
            return self._active
        engine = self._engine
        if engine is None or not self._reuses_workers():
            engine = self._engine = self._build_engine(stream)
        tasks = cast(Tasks, engine.sampler)
        with worker_start(engine):  # workers start with the pause signals blocked
            try:
                inner = iter(engine)  # calls iter(Tasks), which publishes this iteration's FIFO
            except RuntimeError as exc:
                if not _worker_died(exc):
                    raise
                raise self._start_failed(stream, exc, tasks.pending) from exc
        epoch = source.cursor[0] if source.epochs else 0
        self._active = ResumableIterator(stream, inner, tasks.pending, epoch)
        return self._active

    def _iterate_passes(self, stream: Stream, source: IterableSource) -> IterableIterator:
        # Kept persistent workers read the next pass as they are only after a pass read
        # to its end; anywhere else new workers load the delivered records.
        keep = self._engine is not None and self._reuses_workers() and source.copies_current
        plan = source.plan(kept=keep or self.num_workers == 0)
        engine = self._engine
        if engine is None or not keep:
            self._drop_engine()
            engine = self._engine = self._build_pass_engine(stream, source, plan)
        with worker_start(engine):  # workers start with the pause signals blocked
            try:
                inner = iter(engine)
            except RuntimeError as exc:
                if not _worker_died(exc):
                    raise
                raise self._start_failed(stream, exc, None) from exc
        return IterableIterator(stream, inner, source.cursor[0])

    def _start_failed(
        self, stream: Stream, error: RuntimeError, pending: Any
    ) -> LoaderFetchFailedError:
        # A worker that died while the iteration started (torch raises its "exited
        # unexpectedly" from the SIGCHLD handler, wherever the main thread is): the same
        # failure as one met by next(), recorded the same way.
        where = f" (batch starting at stream position {pending[0][0]})" if pending else ""
        stream.fetch_failure = (
            f"starting the iteration failed: {type(error).__name__}: {error}{where}; call "
            "close() on the loader, then iter() resumes at the last delivered batch"
        )
        self._drop_engine()
        return LoaderFetchFailedError(stream.fetch_failure)

    def _build_pass_engine(
        self, stream: Stream, source: IterableSource, plan: PassPlan
    ) -> DataLoader:
        # The internal loader takes whole tagged batches as single items (batch_size=None).
        seed_epoch = source.worker_seed_epoch()
        worker_seeds = torch.Generator()
        worker_seeds.manual_seed(
            derive_seed(stream.augmentation_seed, _WORKER_SEED_SALT)
            if seed_epoch is None  # persistent workers are seeded once, as with DataLoader
            else derive_seed(stream.augmentation_seed, _WORKER_SEED_SALT, seed_epoch)
        )
        return self._internal_loader(
            PassReader(
                self.dataset,
                self.collate_fn,
                self.batch_size,
                self.drop_last,
                stream.augmentation_seed,
                plan,
                prepare_pass if is_streaming_dataset(self.dataset) else None,
                source.driver,
            ),
            worker_seeds,
        )

    def _internal_loader(
        self, dataset: Any, worker_seeds: torch.Generator, sampler: Any = None
    ) -> DataLoader:
        """The internal loader over ``dataset``: one item per batch, this loader's worker
        settings, worker base seeds from ``worker_seeds``."""
        return DataLoader(
            dataset,
            batch_size=None,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=as_is,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context,
            generator=worker_seeds,
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers,
            pin_memory_device=self.pin_memory_device,
            in_order=True,
        )

    def _reuses_workers(self) -> bool:
        return bool(self.persistent_workers and self.num_workers > 0)

    def _build_engine(self, stream: Stream) -> DataLoader:
        # The internal loader fetches whole batches as single items (batch_size=None):
        # its sampler yields (first position, indices) tasks from the committed cursor.
        worker_seeds = torch.Generator()
        worker_seeds.manual_seed(derive_seed(stream.augmentation_seed, _WORKER_SEED_SALT))
        return self._internal_loader(
            BatchFetcher(
                self.dataset,
                self.collate_fn,
                self.batch_sampler is not None,
                stream.source.stride,
                per_sample=self.augmentation_seeding == "sample",
            ),
            worker_seeds,
            Tasks(stream.source, stream.augmentation_seed),
        )

    def close(self) -> None:
        """Stop the workers and invalidate the iterators (IteratorInvalidatedError on use).

        In resumable mode this also clears a fetch failure: the next ``iter(loader)``
        starts at the first undelivered batch. Not resumable: persistent workers stop.
        """
        if not self.__dict__.get("resumable", False):
            iterator, self._iterator = self._iterator, None
            if iterator is not None:
                shutdown(iterator)
            return
        stream = self._require_stream("close")
        self._stop("the loader was closed")
        stream.fetch_failure = None

    def _stop(self, reason: str) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.invalidate(reason)
        self._drop_engine()

    def _drop_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and engine._iterator is not None:
            shutdown(engine._iterator)
            engine._iterator = None

    # --- state (public guards; the hooks below do the work) -----------------------
    # state_dict/load_state_dict check the mode, the failure flags and the whole state
    # before any hook runs; a subclass overriding them instead of the hooks could let
    # a rejected state stop the workers or move the cursor, so override hooks only.

    def state_dict(self) -> LoaderState:
        """The delivered position: batches returned to the caller, never prefetched ones.

        Returns:
            A :class:`~trainer_resume.state.LoaderState` of ints, str and None (over an
            ``IterableDataset`` also its copies' ``state_dict()`` and generator states,
            uint8 and int64 tensors), readable by ``torch.load(weights_only=True)``.

        Raises:
            ResumableModeRequiredError: the loader was built with ``resumable=False``.
            LoaderCommitFailedError: recording a position failed; call load_state_dict().
        """
        stream = self._require_stream("state_dict")
        stream.require_committable()
        self._settle()
        return self._collect_state(stream)

    def deferred_state_dict(self) -> Callable[[], LoaderState]:
        """What :meth:`state_dict` returns now, built when the returned function is called.

        Only the delivered position is recorded now (integers and references to what
        the delivered batches left); the function builds the state from it, as an
        independent CPU copy (``cpu_state``), however far the loader has read by then,
        also from another thread, and as often as it is called; if the loop left the
        epoch part-way since (a new ``iter()``, :meth:`end_epoch`), what the state says
        then: the next epoch's start (leaving delivers nothing). A trainer records this
        at every step boundary and builds the state only when a pause or resume point
        is taken there.

        Raises:
            Same as :meth:`state_dict`, raised here.
        """
        if type(self).state_dict is not ResumableDataLoader.state_dict:
            state = cpu_state(self.state_dict())  # a subclass's own state: taken now
            return lambda: cpu_state(state)
        stream = self._require_stream("deferred_state_dict")
        stream.require_committable()
        self._settle()
        return partial(built, self._defer_state(stream))

    def boundary_record(self, report_end: bool = True) -> tuple[Deferred, bool]:
        """:meth:`deferred_state_dict` and :attr:`epoch_ended`, read together.

        What a trainer records at every step boundary, in one call (it runs once per
        step): the deferred state as a :data:`~trainer_resume.state.Deferred` (built by
        :func:`~trainer_resume.state.built`), and whether the epoch just ended (said once
        per iteration: at the first boundary after its last batch; ``report_end=False``
        reads the position alone, leaving that report to the boundary).

        Raises:
            Same as :meth:`state_dict`.
        """
        # deferred_state_dict()'s work written out where this class's own methods run: it
        # runs once per step, where each Python call costs several times its own work.
        cls = type(self)
        stream = self.__dict__.get("_stream")
        plain = _PLAIN_CLASSES.get(cls)
        if plain is None:
            plain = _PLAIN_CLASSES[cls] = _keeps_the_boundary_methods(cls)
        if stream is None or stream.commit_failure is not None or not plain:
            deferred: Deferred = (self.deferred_state_dict(),)  # settles: epoch_ended known
            if cls.epoch_ended is not ResumableDataLoader.epoch_ended:
                return deferred, self.epoch_ended is True  # a subclass's own
        else:
            active = self._active
            if isinstance(active, IterableIterator):  # _settle(), written out
                active.look_ahead()
            source = stream.source
            position = getattr(source, "position", None)
            if position is None:
                deferred = self._defer_state(stream)
            else:  # _defer_state(), written out
                deferred = (cls._built_state, self, stream, stream.augmentation_seed, position())
        active = self._active
        if active is None:
            return deferred, False
        ended = active.ended
        if not report_end:
            return deferred, ended
        active.boundaries += 1
        if ended:
            # Once per iteration: a later boundary at which this loader delivered nothing
            # (a validation loader read to its end between steps) is not its epoch's end.
            if self.__dict__.get("_reported_end") is active:
                return deferred, False
            self.__dict__["_reported_end"] = active
        return deferred, ended

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely against this loader; changes nothing.

        Raises:
            ResumableModeRequiredError: the loader was built with ``resumable=False``.
            LoaderStateError: wrong format, keys, types, batch size, sampler kind or
                settings, or counts that do not agree.
            ResumableSamplerGeneratorError: the sampler's seed is corrupted.
        """
        stream = self._require_stream("validate_state_dict")
        what = "loader state"
        keys.check_mapping(
            state,
            what,
            (
                keys.FORMAT,
                keys.AUGMENTATION_SEED,
                keys.BATCH_SIZE,
                keys.DELIVERED_BATCHES,
                keys.SAMPLER,
            ),
            (keys.AUGMENTATION_SEEDING,),
        )
        # States written before per-batch seeding existed seeded every sample.
        seeding = state.get(keys.AUGMENTATION_SEEDING, "sample")
        if seeding != self.augmentation_seeding:
            raise LoaderStateError(
                f"{what}[{keys.AUGMENTATION_SEEDING!r}] is {seeding!r} but this loader seeds per "
                f"{self.augmentation_seeding!r}; build it with augmentation_seeding={seeding!r}"
            )
        keys.check_format(state, what, keys.LOADER_FORMAT)
        keys.check_count(state, what, keys.AUGMENTATION_SEED)
        batch_size = state[keys.BATCH_SIZE]
        if batch_size is not None and not keys.is_int(batch_size):
            raise LoaderStateError(
                f"{what}[{keys.BATCH_SIZE!r}] must be an int or None, got {batch_size!r}"
            )
        if batch_size != self.batch_size:
            raise LoaderStateError(
                f"{what}[{keys.BATCH_SIZE!r}] is {batch_size!r} but this loader's batch_size is {self.batch_size!r}"
            )
        delivered = keys.check_count(state, what, keys.DELIVERED_BATCHES)
        sampler_state = state[keys.SAMPLER]
        expected_format = stream.source.format
        if isinstance(sampler_state, Mapping) and sampler_state.get(keys.FORMAT) != expected_format:
            found = sampler_state.get(keys.FORMAT)
            retired = keys.RETIRED_FORMATS.get(found) if isinstance(found, str) else None
            raise LoaderStateError(
                f"{what}[{keys.SAMPLER!r}] has format {found!r}, but this loader's "
                f"sampler saves {expected_format!r}" + (f": {retired}" if retired else "")
            )
        stream.source.validate(sampler_state)
        expected = stream.source.delivered_batches(sampler_state)
        if delivered != expected:
            raise LoaderStateError(
                f"{what}[{keys.DELIVERED_BATCHES!r}] = {delivered} but its sampler state implies {expected}"
            )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` completely, then stop the workers, drop the prefetch and
        move to the state's position; old iterators raise IteratorInvalidatedError.

        This is also the way out of LoaderCommitFailedError.

        Raises:
            Same as :meth:`validate_state_dict`; when it raises, the loader, its
            workers and its iterator are untouched.
        """
        self.validate_state_dict(state)
        self._apply_state(self._require_stream("load_state_dict"), state)

    def _collect_state(self, stream: Stream) -> LoaderState:
        """Hook: the delivered position as a :class:`LoaderState`."""
        return self._loader_state(stream, stream.augmentation_seed, stream.source.state())

    def _defer_state(self, stream: Stream) -> Deferred:
        """Hook: the delivered position now, as a :data:`~trainer_resume.state.Deferred`
        :class:`LoaderState` (a CPU copy when built)."""
        if type(self)._collect_state is not ResumableDataLoader._collect_state:
            # A subclass's own state: taken now, each build a copy of its own.
            return (cpu_state, cpu_state(self._collect_state(stream)))
        source = stream.source
        position = getattr(source, "position", None)
        # A sampler without a position: its own state copied now (a few integers).
        sampler = position() if position is not None else now(cpu_state(source.state()))
        return (type(self)._built_state, self, stream, stream.augmentation_seed, sampler)

    def _built_state(self, stream: Stream, seed: int, sampler: Deferred) -> LoaderState:
        """The state of a deferred position (see :meth:`_defer_state`): a CPU copy."""
        return cpu_state(self._loader_state(stream, seed, built(sampler)))

    def _loader_state(self, stream: Stream, seed: int, sampler_state: Any) -> LoaderState:
        return {
            keys.FORMAT: keys.LOADER_FORMAT,
            keys.AUGMENTATION_SEED: seed,
            keys.AUGMENTATION_SEEDING: self.augmentation_seeding,
            keys.BATCH_SIZE: self.batch_size,
            keys.DELIVERED_BATCHES: stream.source.delivered_batches(sampler_state),
            keys.SAMPLER: sampler_state,
        }  # type: ignore[return-value]

    def _apply_state(self, stream: Stream, state: Mapping[str, Any]) -> None:
        """Hook: adopt an already validated state."""
        self._stop("load_state_dict() moved the loader to another position")
        stream.source.apply(state[keys.SAMPLER])
        stream.augmentation_seed = state[keys.AUGMENTATION_SEED]
        stream.fetch_failure = None
        stream.commit_failure = None

    def _settle(self) -> None:
        # Over an IterableDataset a pass has ended only when the items after its last
        # batch say so: read on to the next batch (kept, not delivered) to know it.
        active = self._active
        if isinstance(active, IterableIterator):
            active.look_ahead()

    def _require_stream(self, method: str) -> Stream:
        stream = self.__dict__.get("_stream")
        if stream is None:
            if "resumable" not in self.__dict__:
                raise RuntimeError(f"ResumableDataLoader.__init__ was not called before {method}")
            raise ResumableModeRequiredError(
                f"ResumableDataLoader.{method} needs a loader built with resumable=True"
            )
        return stream


# Per class: whether it keeps the methods boundary_record's fast path writes out.
_PLAIN_CLASSES: dict[type, bool] = {}


def _keeps_the_boundary_methods(cls: type) -> bool:
    return all(
        getattr(cls, name) is getattr(ResumableDataLoader, name)
        for name in (
            "deferred_state_dict",
            "state_dict",
            "epoch_ended",
            "_settle",
            "_defer_state",
            "_collect_state",
        )
    )


def _warn_left_part_way(iterator: ResumableIterator) -> None:
    """A new ``iter(loader)`` left part-way an epoch read across step boundaries: the
    loop stops its epochs early without saying so, and a pause it took between its
    ``break`` and this ``iter()`` holds the middle of that epoch, where this run goes on
    with the next one."""
    warnings.warn(
        UnsavedStateWarning(
            f"iter(loader) left epoch {iterator.epoch} part-way, after {iterator.delivered} "
            "batch(es) read across step boundaries: a pause between the loop's break and this iter() "
            f"resumes inside epoch {iterator.epoch}, where this run goes on with epoch "
            f"{iterator.epoch + 1}; a loop that stops its epochs early calls "
            "loader.end_epoch() after its inner loop (see docs/data-loading.md#the-epoch-loop)"
        ),
        stacklevel=3,
    )


def _worker_died(error: RuntimeError) -> bool:
    """torch's report of a worker that exited (a retry may succeed); other start failures,
    such as a dataset that cannot be pickled for spawned workers, stay as they are."""
    return "exited unexpectedly" in str(error)
