"""The training loader a ``ResumableTrainer`` owns, and where in its epoch it stands.

``Trainer`` builds its training loader in ``_get_dataloader`` and hands it to
``accelerator.prepare``, which rebuilds it as a ``DataLoaderShard``; on resume,
``skip_first_batches`` rebuilds it again over a ``SkipBatchSampler``. Neither keeps a
resumable position. So the trainer builds a ``ResumableDataLoader`` from the same
arguments (:func:`build_train_loader`) and keeps it out of both: on one process
``accelerator.prepare`` only moves batches to the device, which ``Trainer._prepare_inputs``
does again for every batch.

The Trainer's epoch loop sees a :class:`TrainLoader` around it, which counts the
batches delivered in the running epoch: ``state.epoch`` and the resumed epoch's step
numbers are computed from that count, and a pause written at an epoch's end must see
the loader's epoch as ended (or end it, see :meth:`TrainLoader.end_epoch`).

Transformers internals used (5.24): ``Trainer._train_batch_size``,
``Trainer._get_train_sampler``, ``Trainer._remove_unused_columns``,
``Trainer._get_collator_with_removed_columns`` and ``trainer_utils.seed_worker``, which
``Trainer._get_dataloader`` builds the training loader from.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from torch.utils.data import IterableDataset
from transformers.trainer_utils import seed_worker
from transformers.utils import is_datasets_available

from ...loaders import ResumableDataLoader

__all__ = ["TrainLoader", "build_train_loader"]


class TrainLoader:
    """A ``ResumableDataLoader`` as the Trainer's epoch loop iterates it.

    Each ``iter()`` reads one epoch of the loader; :attr:`batches_in_epoch` counts the
    batches of that epoch delivered so far, including those delivered before a pause
    when the epoch was resumed (:meth:`start_at`).

    Args:
        loader: A ``ResumableDataLoader`` built with ``resumable=True``.
    """

    def __init__(self, loader: ResumableDataLoader) -> None:
        if not isinstance(loader, ResumableDataLoader) or not loader.resumable:
            raise TypeError("TrainLoader needs a ResumableDataLoader built with resumable=True")
        self.loader = loader
        self.dataset = loader.dataset
        self.batch_size = loader.batch_size
        self._start = 0  # batches of the next iteration's epoch delivered before a pause
        self._delivered = 0
        self._epoch: int | None = None  # the loader epoch the running iteration reads

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        inner = iter(self.loader)
        # After iter(): a new iterator that replaces one which delivered part of an epoch
        # moves the loader on to the next epoch, the one this iteration reads.
        self._epoch = self.loader.epoch
        self._delivered = start
        return _Counted(self, inner)

    def start_at(self, batches: int) -> None:
        """The next iteration continues an epoch of which ``batches`` were delivered before."""
        self._start = batches

    @property
    def batches_in_epoch(self) -> int:
        """Batches of the running epoch delivered so far (its last one's step count)."""
        return self._delivered

    @property
    def epoch_ended(self) -> bool:
        """The running iteration delivered its epoch's last batch (the loader reads the next epoch)."""
        return self._epoch is not None and self.loader.epoch != self._epoch

    def end_epoch(self) -> None:
        """End the running epoch early, as the next ``iter()`` would (``should_epoch_stop``).

        A pause written now must hold the position the next epoch starts from: the
        loader moves there when a new iterator replaces one that delivered part of an
        epoch, so one is made here (the epoch loop's own ``iter()`` then replaces it
        before it has delivered anything, which moves nothing).
        """
        if not self.epoch_ended:
            iter(self.loader)


class _Counted:
    """The iterator of one epoch, counting what it delivers."""

    def __init__(self, owner: TrainLoader, inner: Iterator[Any]) -> None:
        self._owner = owner
        self._inner = inner

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        batch = next(self._inner)
        self._owner._delivered += 1
        return batch


def build_train_loader(trainer: Any) -> TrainLoader:
    """The training loader ``Trainer._get_dataloader`` would build, as a ``ResumableDataLoader``.

    The same dataset (unused columns removed), collator, batch size, sampler, workers,
    pinning, prefetch, ``drop_last`` and worker seeding; its order and every batch's
    random draws derive from ``args.data_seed`` (else ``args.seed``) and the batch's
    position, whatever the number of workers.

    Raises:
        ValueError: the trainer has no ``train_dataset``.
        UnsupportedResumeConfigurationError: what ``ResumableDataLoader`` refuses (a
            stateless ``IterableDataset``, a sampler it cannot reposition, ``in_order=False``).
    """
    args = trainer.args
    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    collator = trainer.data_collator
    if is_datasets_available() and _is_datasets_dataset(dataset):
        dataset = trainer._remove_unused_columns(dataset, description="Training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    seed = args.data_seed if args.data_seed is not None else args.seed
    options: dict[str, Any] = {
        "batch_size": trainer._train_batch_size,
        "collate_fn": collator,
        "num_workers": args.dataloader_num_workers,
        "pin_memory": args.dataloader_pin_memory,
        "persistent_workers": args.dataloader_persistent_workers,
        "multiprocessing_context": args.dataloader_multiprocessing_context,
        "prefetch_factor": args.dataloader_prefetch_factor,
        "in_order": args.dataloader_in_order,
        # The order and the augmentation seeds come from here, not from the global
        # generator's state when the loader happens to be built.
        "generator": torch.Generator().manual_seed(seed),
    }
    if not isinstance(dataset, IterableDataset):
        options["sampler"] = trainer._get_train_sampler(dataset)
        options["drop_last"] = args.dataloader_drop_last
        options["worker_init_fn"] = partial(
            seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index
        )
    return TrainLoader(ResumableDataLoader(dataset, resumable=True, **options))


def _is_datasets_dataset(dataset: Any) -> bool:
    import datasets

    return isinstance(dataset, datasets.Dataset)
