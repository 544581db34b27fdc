"""``prepare_loader``: what ``accelerator.prepare`` does for a data loader, resumable.

``accelerator.prepare`` rebuilds a ``DataLoader`` as an Accelerate ``DataLoaderShard``
from its dataset, batch sampler and collate function: a ``ResumableDataLoader``'s
position, augmentation seeding and signal-blocked workers do not survive it.
:func:`prepare_loader` makes the same loader the resumable way:

* the data is shared among ``accelerator.num_processes`` by the rule of ``prepare``
  (whole batches in turn, every process the same count; see
  :class:`~trainer_resume.loaders.ShardedBatchSampler`), positioned by a global cursor,
  so a pause resumes on any number of processes;
* batches are moved to ``accelerator.device`` (``non_blocking`` as configured);
* the loader registers with the Accelerator's ``GradientState`` while it is iterated,
  as ``DataLoaderShard`` does, with ``end_of_dataloader`` set on an epoch's last batch and
  ``remainder`` (``len(dataset) % total_batch_size``), so ``accumulate`` closes a window
  at an epoch's end and ``gather_for_metrics`` drops the padding.

Accelerate internals used (accelerate 1.15): ``GradientState._add_dataloader`` /
``_remove_dataloader`` and the ``end_of_dataloader`` / ``remainder`` attributes
``GradientState`` reads from the registered loader.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, send_to_device

from ...errors import ResumableModeRequiredError
from ...loaders import ResumableDataLoader
from ...state import LoaderState
from .._shared_loader import shared_loader
from .settings import check_accelerator

__all__ = ["PreparedLoader", "prepare_loader"]


# torch DataLoader settings a prepared loader offers as its loader's (batch_size,
# sampler and batch_sampler are its own properties above).
_LOADER_SETTINGS = frozenset(
    (
        "collate_fn",
        "drop_last",
        "generator",
        "in_order",
        "multiprocessing_context",
        "num_workers",
        "persistent_workers",
        "pin_memory",
        "pin_memory_device",
        "prefetch_factor",
        "timeout",
        "worker_init_fn",
    )
)


class PreparedLoader:
    """A resumable loader as ``accelerator.prepare`` would have made it; built by :func:`prepare_loader`.

    Iterate it as the prepared loader (each ``iter()`` one epoch, ``len()`` this
    process's batches), and return it from ``_resume_loaders()``: its ``state_dict()``
    is the delivered position of :attr:`loader`, the resumable loader it reads.
    """

    def __init__(
        self,
        loader: ResumableDataLoader,
        *,
        device: torch.device | None,
        non_blocking: bool,
        total_batch_size: int | None,
        gradient_state: Any,
        drop_last: bool,
    ) -> None:
        self.loader = loader
        self.device = device  # None: batches stay where the loader makes them
        self.non_blocking = non_blocking
        self.total_batch_size = total_batch_size  # batch size times the number of processes
        self.gradient_state = gradient_state
        self._drop_last = drop_last
        # Read by GradientState from the loader it registered last.
        self.end_of_dataloader = False
        self.remainder = -1

    # --- what a prepared loader offers -----------------------------------------------

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def batch_sampler(self) -> Any:
        return self.loader.batch_sampler

    @property
    def sampler(self) -> Any:
        return self.loader.sampler

    @property
    def batch_size(self) -> int | None:
        return getattr(self.loader.batch_sampler, "batch_size", self.loader.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` reads (see ``ResumableDataLoader.epoch``)."""
        return self.loader.epoch

    @property
    def epoch_ended(self) -> bool:
        """An epoch's last batch was just delivered (see ``ResumableDataLoader.epoch_ended``):
        a pause requested now lands after the loop's epoch-end work."""
        return self.loader.epoch_ended

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object lacks: the DataLoader settings a prepared
        # loader offers (Accelerate's skip_first_batches reads them) are the loader's.
        if name in _LOADER_SETTINGS:
            return getattr(self.__dict__["loader"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader
        self._begin()
        try:
            iterator = iter(loader)
            while True:
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                # Known as the last batch is delivered, without reading a batch ahead (a
                # pass over an IterableDataset reads on to its end): the delivered
                # position stays exact.
                self.end_of_dataloader = loader.epoch_ended
                if self.device is not None:
                    batch = send_to_device(batch, self.device, non_blocking=self.non_blocking)
                yield batch
                if self.end_of_dataloader:
                    return
        finally:
            self.gradient_state._remove_dataloader(self)

    def _begin(self) -> None:
        # DataLoaderStateMixin.begin (accelerate 1.15): reset, remainder, register.
        self.end_of_dataloader = False
        self.remainder = -1
        if not self._drop_last and self.total_batch_size:
            try:
                self.remainder = len(self.loader.dataset) % self.total_batch_size
            except TypeError:  # a dataset without len(): as Accelerate, no remainder
                pass
        self.gradient_state._add_dataloader(self)

    def close(self) -> None:
        """Stop the workers (see ``ResumableDataLoader.close``)."""
        self.loader.close()

    # --- the loader protocol of _resume_loaders() ----------------------------------------

    def state_dict(self) -> LoaderState:
        """The delivered position (``ResumableDataLoader.state_dict``)."""
        return self.loader.state_dict()

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely; changes nothing (``ResumableDataLoader.validate_state_dict``)."""
        self.loader.validate_state_dict(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Move to ``state``'s position (``ResumableDataLoader.load_state_dict``)."""
        self.loader.load_state_dict(state)


def prepare_loader(accelerator: Any, loader: ResumableDataLoader) -> PreparedLoader:
    """Prepare a resumable loader for ``accelerator`` as ``accelerator.prepare`` prepares a ``DataLoader``.

    Use it instead of passing the loader to ``accelerator.prepare`` (which rebuilds it
    as a plain ``DataLoaderShard``, and is refused when training starts), and return
    the result from ``_resume_loaders()``.

    With ``shuffle=True/False`` (torch's ``BatchSampler`` over ``SequentialSampler``,
    ``RandomSampler``, ``SubsetRandomSampler`` or ``WeightedRandomSampler``) process ``r``
    of ``W`` reads the epoch's global batches ``r, r + W, ...``, as from ``prepare``
    (``even_batches``: the last batch completed and the count padded from the epoch's
    first samples); with one process the loader reads exactly what ``loader`` would. A
    loader already sharded by rank (``InfiniteRandomSampler``, ``build_batch_sampler``,
    ``ShardedBatchSampler``, ``DistributedSampler``) is kept as it is, where ``prepare``
    would shard it a second time. Other loaders (stateful samplers, ``IterableDataset``)
    are kept as they are in one process and refused with several.

    With several processes, call it on every process, in the same order as
    ``accelerator.prepare``: process 0's loader state (its augmentation seed and its
    sampler generator's state) is broadcast and loaded into every process's loader,
    once. Accelerate copies process 0's sampler generator at every epoch's start;
    here every later epoch follows from the copied state alike on every process.

    Args:
        accelerator: The ``accelerate.Accelerator``.
        loader: A ``ResumableDataLoader(..., resumable=True)`` that has not delivered a
            batch yet; it is read through the returned loader only from now on.

    Returns:
        The :class:`PreparedLoader`.

    Raises:
        TypeError: ``loader`` is not a ``ResumableDataLoader``.
        ResumableModeRequiredError: it was built with ``resumable=False``.
        ValueError: it has delivered batches already (prepare it before iterating it,
            and load states into the prepared loader).
        UnsupportedResumeConfigurationError: a setting of ``accelerator`` that is not
            reproduced (see :mod:`~trainer_resume.adapters.accelerate.settings`), or a
            loader that cannot be shared among its processes (see above).
    """
    if not isinstance(loader, ResumableDataLoader):
        raise TypeError(
            f"prepare_loader takes a ResumableDataLoader(..., resumable=True), got "
            f"{type(loader).__name__}; a plain DataLoader goes through accelerator.prepare"
        )
    if not loader.resumable:
        raise ResumableModeRequiredError(
            "prepare_loader needs a ResumableDataLoader built with resumable=True"
        )
    check_accelerator(accelerator)
    delivered = loader.state_dict()["delivered_batches"]
    if delivered:
        raise ValueError(
            f"the loader has delivered {delivered} batch(es) already; prepare it before iterating "
            "it, and load saved states into the prepared loader"
        )
    replicas, rank = accelerator.num_processes, accelerator.process_index
    shared = shared_loader(
        loader,
        replicas,
        rank,
        function="prepare_loader",
        built_after="the Accelerator (it then shards by the Accelerator's process group)",
        iterable_refusal="whose batches Accelerate dispatches from the main process (not reproduced)",
    )
    if replicas > 1:
        state: list[Any] = [shared.state_dict() if rank == 0 else None]
        broadcast_object_list(state, from_process=0)
        shared.load_state_dict(state[0])
    batch_size = getattr(shared.batch_sampler, "batch_size", None)
    return PreparedLoader(
        shared,
        device=accelerator.device if accelerator.device_placement else None,
        non_blocking=bool(accelerator.non_blocking),
        total_batch_size=batch_size * replicas if batch_size else None,
        gradient_state=accelerator.gradient_state,
        drop_last=bool(loader.drop_last),
    )
