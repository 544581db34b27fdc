"""Reuse prepared samples for a fixed number of epochs when input preparation is the bottleneck.

A sample prepared once serves ``lifetime`` consecutive epochs; which preparation
serves index ``i`` in epoch ``e`` is decided in closed form by
:class:`ReusePolicy`, so inputs do not depend on the number of workers or their
speed, and resuming needs nothing but the epoch number (``start_epoch=N``).

Prepared samples live in a directory, one file per index (``00000123.pt``). A
file is served only when it was built for the same index, generation, sample
seed, lifetime and fingerprint; anything else (missing, truncated, built under
other settings) is rebuilt and overwritten, so the file count never exceeds the
dataset size and nothing needs cleaning. One loader uses a directory at a time:
starting one removes the ``*.tmp`` files an interrupted run left behind.

Trust: the default load is ``torch.load(weights_only=True)``, so no pickled code
runs, but a file whose record matches is served as the sample; use directories
this library wrote and nobody else writes to.
"""

from __future__ import annotations

import operator
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ...errors import IteratorInvalidatedError, StorageURLError, UnsupportedResumeConfigurationError
from ...pause_signals import worker_start
from ...rng import derive_seed, rng_scope
from .keyed_permutation import KeyedPermutation
from .policy import ReuseKey, ReusePolicy, check_int
from .position import STATE_FORMAT, KeyedCollate, SequentialOrder, check_state, note_fetch
from .store import (
    UNREADABLE,
    LoadFn,
    SaveFn,
    check_storable,
    default_load,
    default_save,
    make_record,
    read_record,
    record_matches,
    remove_stale_temporaries,
    sample_path,
    write_record,
)

__all__ = ["ReusePolicy", "ReuseKey", "ReuseDataset", "ReuseSampler", "ReuseDataLoader"]

BuildFn = Callable[[ReuseKey], Any]

# A scheme of two letters or more and a colon-slash: a URL, or one with a slash missing.
_URL_LIKE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):/")
_WORKER_SEED_TAG = 0x776F_726B_6572  # b"worker": the workers' base seeds of an epoch


def _local_directory(directory: str | os.PathLike[str]) -> Path:
    """``directory`` as a local path (``file://`` removed); a URL is refused (353): the
    workers read the samples as local files, and it would become a local folder."""
    text = os.fspath(directory)
    if isinstance(text, str):
        if text[:7].lower() == "file://":
            text = text[7:]
        match = _URL_LIKE.match(text)
        if match is not None:
            raise StorageURLError(
                f"ReuseDataLoader keeps its prepared samples in a local directory, which its "
                f"workers read as files: {text!r} reads as a {match.group('scheme')}:// URL; "
                f"give a local path (or './{text}' for a local folder named "
                f"'{match.group('scheme')}:')"
            )
    return Path(text)


def _check_optional_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {type(value).__name__}: {value!r}")


class ReuseDataset(Dataset):
    """Map-style dataset serving prepared samples that are reused for ``policy.lifetime`` epochs.

    ``dataset[i]`` computes ``key = policy.key(i, epoch)``; when ``i``'s file holds
    that key's sample under the same lifetime and fingerprint, the sample is
    loaded, otherwise ``build(key)`` prepares it. ``build`` runs inside
    ``rng_scope(key.seed)`` (Python, NumPy global and torch CPU seeded with the
    sample seed, the caller's state restored afterwards), so a ``build`` drawing
    from the global generators is reproducible. A freshly built sample is stored
    only when a later epoch uses it again (``key.use < lifetime - 1``), so
    ``lifetime == 1`` writes nothing.

    The epoch lives in shared memory: :meth:`set_epoch` in the main process is seen
    by DataLoader workers, persistent ones included, under fork and spawn alike.

    Args:
        build: ``build(key) -> sample``; a deterministic function of ``key.index``
            and ``key.seed`` (or ``key.generation``) and of what ``fingerprint``
            identifies. Not of ``key.epoch``: one sample serves several epochs, and
            whether it is loaded or rebuilt must not show. Must be picklable for
            spawned workers.
        size: number of indices, at least 1.
        directory: where the sample files live (a local directory); created if missing.
        policy: the reuse schedule.
        fingerprint: identifies everything else ``build`` depends on (data
            version, augmentation settings); a file stored under another
            fingerprint is never served. ``str``, ``int`` or ``None``.
        save: ``save(record, path)`` writing exactly ``path``; default
            ``torch.save`` after checking that the sample is plain data (tensors,
            numbers, str, bytes, None, lists/tuples/sets/dicts of them).
        load: ``load(path) -> record``; default ``torch.load(weights_only=True)``
            to CPU. A custom load that unpickles arbitrary objects trusts the directory.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``size < 1``, or ``directory`` exists and is not a directory.
        StorageURLError: ``directory`` is a URL (353).
    """

    def __init__(
        self,
        build: BuildFn,
        size: int,
        directory: str | os.PathLike[str],
        policy: ReusePolicy,
        *,
        fingerprint: str | int | None = None,
        save: SaveFn | None = None,
        load: LoadFn | None = None,
    ) -> None:
        if not callable(build):
            raise TypeError(f"build must be callable, got {type(build).__name__}: {build!r}")
        check_int("size", size, 1)
        if not isinstance(policy, ReusePolicy):
            raise TypeError(
                f"policy must be a ReusePolicy, got {type(policy).__name__}: {policy!r}"
            )
        if fingerprint is not None and (
            isinstance(fingerprint, bool) or not isinstance(fingerprint, (str, int))
        ):
            raise TypeError(
                f"fingerprint must be a str, an int or None, got {type(fingerprint).__name__}: {fingerprint!r}"
            )
        _check_optional_callable("save", save)
        _check_optional_callable("load", load)
        path = _local_directory(directory)
        if path.exists() and not path.is_dir():
            raise ValueError(f"directory {os.fspath(path)!r} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)

        self.build = build
        self.size = size
        self.directory = path
        self.policy = policy
        self.fingerprint = fingerprint
        self._save = save
        self._load = load if load is not None else default_load
        # [epoch, first epoch set] in a shared tensor rather than ints: workers
        # (forked or spawned, persistent or not) hold the same memory, so set_epoch
        # reaches them without a restart.
        self._epochs = torch.tensor([0, -1], dtype=torch.int64).share_memory_()
        self._warned_unreadable = False

    def _require_init(self) -> None:
        if "_epochs" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call ReuseDataset.__init__")

    @property
    def epoch(self) -> int:
        """The epoch ``dataset[i]`` serves."""
        self._require_init()
        return int(self._epochs[0])

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` from now on, in this process and in every worker.

        Raises:
            TypeError: ``epoch`` is not an int.
            ValueError: ``epoch < 0``.
        """
        self._require_init()
        check_int("epoch", epoch, 0)
        if int(self._epochs[1]) < 0:
            self._epochs[1] = epoch
        self._epochs[0] = epoch

    def path(self, index: int) -> Path:
        """The file that holds ``index``'s prepared sample."""
        return sample_path(self.directory, index)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        self._require_init()
        position = operator.index(index)
        if not 0 <= position < self.size:
            raise IndexError(f"index {index!r} is outside range({self.size})")
        epoch, first_set = self._epochs.tolist()
        sample = self._fetch(self.policy.key(position, epoch), first_served=max(first_set, 0))
        note_fetch(epoch, position)  # the batch a collate_fn called next collates
        return sample

    def _fetch(self, key: ReuseKey, *, first_served: int) -> Any:
        lifetime = self.policy.lifetime
        path = self.path(key.index)
        # In its first epoch a generation can only have been stored by an earlier
        # pass over this same epoch, i.e. a restart: skip reading the previous
        # generation's file (a wasted load per rebuild) unless this epoch is the
        # first this dataset serves. Skipping is always safe, only slower.
        maybe_stored = key.epoch != key.first_epoch or key.epoch <= first_served
        if lifetime > 1 and maybe_stored:
            record = read_record(path, self._load)
            if record_matches(record, key, lifetime=lifetime, fingerprint=self.fingerprint):
                return record["sample"]
            if record is UNREADABLE and not self._warned_unreadable:
                self._warned_unreadable = True
                warnings.warn(
                    f"rebuilding unreadable sample file {os.fspath(path)!r} (further ones are rebuilt silently)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        with rng_scope(key.seed):
            sample = self.build(key)
        if key.use < lifetime - 1:
            self._store(path, key, sample)
        return sample

    def _store(self, path: Path, key: ReuseKey, sample: Any) -> None:
        save = self._save
        if save is None:
            check_storable(sample, index=key.index)
            save = default_save
        record = make_record(
            key, lifetime=self.policy.lifetime, fingerprint=self.fingerprint, sample=sample
        )
        try:
            write_record(path, record, save)
        except OSError:
            raise  # the disk, not the sample: keep the original error
        except Exception as error:
            raise TypeError(
                f"save could not store the sample built for index {key.index} "
                f"(a {type(sample).__module__}.{type(sample).__qualname__}): {error}"
            ) from error


class ReuseSampler(Sampler[int]):
    """Each epoch's shuffled order of ``range(size)``, computed in closed form by ``policy.order``.

    Iteration yields ``policy.order(p, epoch, size)`` for ``p`` in ``range(size)``
    (evaluated in vectorised chunks; memory does not grow with ``size``). The
    epoch is fixed when iteration starts.

    Args:
        size: number of indices, at least 1.
        policy: supplies the per-epoch keyed permutation.
        epoch: the epoch to iterate until :meth:`set_epoch` changes it.
    """

    def __init__(self, size: int, policy: ReusePolicy, *, epoch: int = 0) -> None:
        super().__init__()
        check_int("size", size, 1)
        if not isinstance(policy, ReusePolicy):
            raise TypeError(
                f"policy must be a ReusePolicy, got {type(policy).__name__}: {policy!r}"
            )
        self.size = size
        self.policy = policy
        self._epoch = check_int("epoch", epoch, 0)
        self._start = 0

    @property
    def epoch(self) -> int:
        """The epoch the next iteration shuffles."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Shuffle ``epoch``'s order from the next iteration on."""
        self._epoch = check_int("epoch", epoch, 0)

    def start_next_at(self, position: int) -> None:
        """Start the next iteration at ``position`` of its order (once); its length stays
        ``size``."""
        self._start = check_int("position", position, 0)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        # Built now, not on the first next(): the epoch is the one current at iter().
        return self._iterate(self.policy.permutation(self._epoch, self.size))

    def _iterate(self, permutation: KeyedPermutation) -> Iterator[int]:
        # The start at the first next(): a DataLoader iterator over workers calls
        # iter(sampler) twice and reads only the second (with batch_size=None).
        start, self._start = self._start, 0
        for chunk in permutation.iter_chunks(start=start):
            yield from chunk.tolist()


class ReuseDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`ReuseDataset` that advances the epoch by itself.

    Each ``iter(loader)`` starts the next epoch (``start_epoch`` first); an
    epoch abandoned part-way still counts (:meth:`end_epoch` ends one on purpose), while
    an iterator that delivered nothing is only replaced (the new one reads its epoch).
    Starting a new iteration makes the previous iterator raise ``RuntimeError`` on its
    next use, so no batch built for another epoch is ever delivered.

    Resuming: with its own order (``shuffle=True``, or neither ``sampler`` nor
    ``batch_sampler`` nor ``shuffle``), :meth:`state_dict` is the epoch and the batches of
    it delivered, and after :meth:`load_state_dict` the next ``iter(loader)`` serves that
    epoch from the next batch on, the batches of the uninterrupted run (return the loader
    from a trainer's ``_resume_loaders()``: it then pauses at any step). With a ``sampler``
    or ``batch_sampler`` of the caller's it resumes at an epoch's start only:
    ``ReuseDataLoader(..., start_epoch=N)`` after epoch ``N - 1``, or a state taken between
    epochs.

    Args:
        build: ``build(key) -> sample``, see :class:`ReuseDataset`.
        size: number of indices, at least 1.
        directory: where the sample files live.
        lifetime: number of consecutive epochs a prepared sample serves, at least 1.
        seed: base of the sample seeds, of the shuffle and of the batches' collation.
        start_epoch: the epoch the first iteration serves.
        fingerprint, save, load: see :class:`ReuseDataset`.
        **dataloader_kwargs: passed to ``torch.utils.data.DataLoader`` unchanged
            (``batch_size``, ``num_workers``, ``collate_fn``, ``persistent_workers``,
            ...), except that ``shuffle=True`` without a ``sampler`` or
            ``batch_sampler`` uses a :class:`ReuseSampler`. A user ``sampler`` /
            ``batch_sampler`` is used as given; reuse does not depend on the order,
            and such a sampler's ``set_epoch`` is left to the caller. A ``collate_fn``
            runs under a seed of its batch (its epoch and its last sample's index), the
            caller's generators kept, so its random draws are the same from any worker.
            Without a ``generator``, the workers' base seeds of each epoch come from
            ``(seed, epoch)``: nothing is drawn from the global generators.

    Raises:
        TypeError, ValueError: bad arguments, see :class:`ReusePolicy` and
            :class:`ReuseDataset`; ``DataLoader``'s own checks apply as well.
    """

    # Its samples are built under their own seeds (never from its workers' generators),
    # and the workers' seeds come from no global generator: persistent workers restarted
    # by a resume change nothing (read by the trainer's check of held loaders).
    keyed_samples = True
    # A trainer holding it refuses resume points, signal pauses and pauses inside an
    # epoch, unless it returns it from _resume_loaders() and ``resumes_mid_epoch``.
    resumes_at_epoch_start_only = True

    def __init__(
        self,
        build: BuildFn,
        size: int,
        directory: str | os.PathLike[str],
        *,
        lifetime: int,
        seed: int,
        start_epoch: int = 0,
        fingerprint: str | int | None = None,
        save: SaveFn | None = None,
        load: LoadFn | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if "dataset" in dataloader_kwargs:
            raise TypeError(
                "ReuseDataLoader builds its own dataset; pass build, size and directory instead"
            )
        policy = ReusePolicy(lifetime, seed)
        check_int("start_epoch", start_epoch, 0)
        dataset = ReuseDataset(
            build, size, directory, policy, fingerprint=fingerprint, save=save, load=load
        )
        kwargs = dict(dataloader_kwargs)
        sampler: ReuseSampler | None = None
        order: ReuseSampler | SequentialOrder | None = None
        if kwargs.get("sampler") is None and kwargs.get("batch_sampler") is None:
            if kwargs.pop("shuffle", None):
                order = sampler = ReuseSampler(size, policy, epoch=start_epoch)
            else:
                order = SequentialOrder(dataset)
            kwargs["sampler"] = order
        if kwargs.get("collate_fn") is not None:
            kwargs["collate_fn"] = KeyedCollate(kwargs["collate_fn"], seed)
        self._reuse_sampler = sampler
        self._reuse_order = order  # None: the caller's sampler, resumed at epoch starts only
        # Without a generator of the caller's, each epoch's workers take their base seed
        # from one of the epoch's own: not from the global generators, which a loader
        # started at a later epoch (a resume) would otherwise draw from once more with
        # persistent workers, and the same seeds at any start.
        self._reuse_own_generator = kwargs.get("generator") is None
        self._reuse_next_epoch = start_epoch  # where the next iteration starts, unless
        self._reuse_skip = 0  # (batches delivered before a resume) a live one holds it
        self._reuse_epoch: int | None = None
        self._reuse_live = False  # an iteration started and has not ended
        self._reuse_fresh = False  # ... and has delivered nothing since its iter()
        self._reuse_delivered = 0  # batches of the live iteration's epoch delivered
        self._reuse_epoch_ended = False
        self._reuse_iteration = 0  # iter(), end_epoch() and a loaded state end older iterators
        super().__init__(dataset, **kwargs)

    @property
    def policy(self) -> ReusePolicy:
        """The reuse schedule."""
        return self.dataset.policy

    @property
    def epoch(self) -> int | None:
        """The epoch of the iteration started last; ``None`` before the first."""
        return self._reuse_epoch

    @property
    def epoch_in_progress(self) -> bool:
        """An iteration is inside its epoch (it, or the run it resumes, delivered a batch of
        it) and has not ended: a pause now lies inside an epoch."""
        return self._reuse_live and self._reuse_delivered > 0

    @property
    def epoch_ended(self) -> bool:
        """The last batch delivered was its epoch's last, and no iteration started since."""
        return self._reuse_epoch_ended

    @property
    def resumes_mid_epoch(self) -> bool:
        """Its order is its own, so :meth:`state_dict` inside an epoch resumes exactly."""
        return self._reuse_order is not None

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``iter(loader)`` serves (save it to resume with ``start_epoch``)."""
        return self._next_start()[0]

    def _next_start(self) -> tuple[int, int]:
        """The epoch the next ``iter(loader)`` serves and the batches of it delivered before.

        An iterator that delivered nothing is only replaced: its epoch and start stay (a
        trainer's rebuilt iterator and its loop's own ``iter()`` read the same batches).
        One that delivered part of its epoch ends it: the next epoch starts.
        """
        if self._reuse_fresh:
            return self._position()
        return self._reuse_next_epoch, self._reuse_skip

    def _position(self) -> tuple[int, int]:
        """The epoch and the batches of it delivered: the live iteration's, else where the
        next one starts."""
        if self._reuse_live:
            return self._reuse_epoch, self._reuse_delivered  # type: ignore[return-value]
        return self._reuse_next_epoch, self._reuse_skip

    def end_epoch(self) -> None:
        """End the live iteration's epoch early (a loop that stops its epochs after a number
        of batches): the next ``iter(loader)`` serves the next epoch, and a state taken now
        says so. Iterators made before are ended."""
        if self._reuse_live:
            self._reuse_live = self._reuse_fresh = False
            self._reuse_iteration += 1

    def _reuse_settings(self) -> dict[str, Any]:
        """What a state holds besides its position: the settings its batches depend on."""
        policy = self.policy
        return {
            "size": self.dataset.size,
            "lifetime": policy.lifetime,
            "seed": policy.seed,
            # Its own order (shuffled or sequential) or the caller's sampler.
            "order": "shuffled"
            if self._reuse_sampler is not None
            else "sequential"
            if self._reuse_order is not None
            else "caller's",
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    def state_dict(self) -> dict[str, Any]:
        """The epoch and how many of its batches were delivered (between epochs: the next
        epoch, 0), with the settings the batches depend on. A state inside an epoch of a
        loader over the caller's ``sampler`` or ``batch_sampler`` cannot be loaded (332); a
        trainer refuses to pause there."""
        epoch, batches = self._position()
        return {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "batches": batches,
            **self._reuse_settings(),
        }

    def validate_state_dict(self, state: Any) -> None:
        """Check ``state`` completely against this loader; changes nothing.

        Raises:
            LoaderStateError: not a state of this loader, or one of other settings.
            UnsupportedResumeConfigurationError: a state inside an epoch for a loader
                over the caller's ``sampler`` or ``batch_sampler`` (332).
        """
        _, batches = check_state(state, self._reuse_settings(), len(self))
        if batches and self._reuse_order is None:
            raise UnsupportedResumeConfigurationError(
                f"the state lies {batches} batches into its epoch, but this ReuseDataLoader "
                "reads the caller's sampler or batch_sampler, whose order it cannot resume "
                "there: take its state between epochs, or give both loaders shuffle=True "
                "(their own order)"
            )

    def load_state_dict(self, state: Any) -> None:
        """Serve the state's epoch at the next ``iter(loader)``, from its next batch on.
        Iterators made before are ended. A state refused changes nothing.

        Raises:
            Same as :meth:`validate_state_dict`.
        """
        self.validate_state_dict(state)
        self._reuse_next_epoch, self._reuse_skip = state["epoch"], state["batches"]
        self._reuse_live = self._reuse_fresh = self._reuse_epoch_ended = False
        self._reuse_iteration += 1

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        epoch, skip = self._next_start()
        self._reuse_next_epoch, self._reuse_skip = epoch + 1, 0
        self._reuse_epoch, self._reuse_delivered = epoch, skip
        self._reuse_live = self._reuse_fresh = True
        self._reuse_epoch_ended = False
        self._reuse_iteration += 1
        # Before DataLoader.__iter__: persistent workers start fetching the new
        # epoch inside it, and they must already read the new epoch.
        self.dataset.set_epoch(epoch)
        if self._reuse_sampler is not None:
            self._reuse_sampler.set_epoch(epoch)
        if self._reuse_order is not None:
            self._reuse_order.start_next_at(skip * (self.batch_size or 1))
        if self._reuse_own_generator:
            self.generator = torch.Generator().manual_seed(
                derive_seed(_WORKER_SEED_TAG, self.policy.seed, epoch)
            )
        with worker_start(self):  # workers start with the pause signals blocked
            inner = super().__iter__()
        return _EpochIterator(self, inner, epoch, skip)


class _EpochIterator:
    """Delivers one epoch's batches; refuses to go on once a newer iteration started."""

    def __init__(
        self, loader: ReuseDataLoader, inner: Iterator[Any], epoch: int, skip: int
    ) -> None:
        self._loader = loader
        self._inner = inner
        self.epoch = epoch
        self._iteration = loader._reuse_iteration
        self._invalidated: str | None = None
        self._left: int | None  # batches still to deliver (None: no length)
        try:
            self._left = len(inner) - skip  # type: ignore[arg-type]
        except TypeError:
            self._left = None

    def __iter__(self) -> _EpochIterator:
        return self

    @property
    def alive(self) -> bool:
        """No newer iteration started, no state was loaded and the epoch was not ended since
        it was made."""
        return self._loader._reuse_iteration == self._iteration

    def invalidate(self, message: str) -> None:
        """Make every later ``next()`` raise ``IteratorInvalidatedError(message)``."""
        self._invalidated = message

    def __next__(self) -> Any:
        if self._invalidated is not None:
            raise IteratorInvalidatedError(self._invalidated)
        loader = self._loader
        if not self.alive:
            # Workers read the epoch from shared memory, so after a newer iter(loader)
            # they build that epoch's samples: this iterator's batches would mix epochs.
            current = loader.epoch
            if current != self.epoch:
                raise RuntimeError(
                    f"this iterator serves epoch {self.epoch}, but iteration over epoch "
                    f"{current} has started since; use the newer iterator"
                )
            raise RuntimeError(
                "this iterator was replaced since it was made (by a newer iter(loader), "
                "end_epoch() or a loaded state); make a new iterator (iter(loader))"
            )
        try:
            batch = next(self._inner)
        except StopIteration:
            loader._reuse_live = loader._reuse_fresh = False
            raise
        loader._reuse_delivered += 1
        loader._reuse_fresh = False
        if self._left is not None:
            self._left -= 1
        # The epoch's last batch delivered ends it, before its StopIteration.
        if self._left is not None and self._left <= 0:
            loader._reuse_live = False
            loader._reuse_epoch_ended = True
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]
