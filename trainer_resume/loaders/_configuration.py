"""Which loader configurations resume exactly, and the source that reads each one.

A resumable loader accepts the samplers whose order it can recompute from recorded
seeds (torch's own samplers, exact types), samplers and ``IterableDataset``s that save
their own state, the endless resumable samplers of this package, and nothing else:
every other configuration is refused here, before the loader exists, with the error
naming the fix (an ``IterableDataset`` whose ``__iter__`` returns an object is checked
when its first pass opens that iterator, which only then exists).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..errors import ResumableModeRequiredError, UnsupportedResumeConfigurationError
from ._batching import ResumableBatchSampler
from ._epochs import EPOCH_SAMPLERS, EpochSource
from ._hf_streaming import check_streaming_dataset, is_streaming_dataset
from ._iterable_source import IterableSource
from ._sources import BatchSamplerSource, SamplerSource, Source
from ._stateful import StatefulSource, is_stateful
from ._streaming import check_state_arguments, driver_for
from .batch_samplers import BATCH_SAMPLER_TARGETS
from .sampler import InfiniteRandomSampler
from .sharded_batches import SHARDABLE_SAMPLERS, ShardedBatchSampler

__all__ = ["check_resumable_configuration", "source_of"]

_SUPPORTED = (
    "give it state_dict() and load_state_dict() (torchdata's Stateful protocol), or use "
    "shuffle=True/False, torch's SequentialSampler, RandomSampler, SubsetRandomSampler, "
    "WeightedRandomSampler, DistributedSampler or a BatchSampler over one of them, a "
    "ShardedBatchSampler over such a BatchSampler (not over a DistributedSampler), "
    "InfiniteRandomSampler(resumable=True) or build_batch_sampler(..., resumable=True)"
)


def _saves_its_iteration(value: Any) -> bool:
    # This package's samplers have state_dict() too, but theirs is a delivered cursor
    # that iterating does not move: read as a generic stateful sampler, every pass
    # would start at the same place.
    return is_stateful(value) and not isinstance(
        value, (InfiniteRandomSampler, ResumableBatchSampler)
    )


def _is_own_subclass(value: Any) -> bool:
    # Subclasses of this package's samplers have state_dict() too, but their streams
    # could not be checked on resume: they are refused, not taken as stateful samplers.
    own = (InfiniteRandomSampler, *BATCH_SAMPLER_TARGETS.values())
    return (
        isinstance(value, (InfiniteRandomSampler, ResumableBatchSampler)) and type(value) not in own
    )


def _is_epoch_sampler(sampler: Any) -> bool:
    return type(sampler) in EPOCH_SAMPLERS


def check_resumable_configuration(
    dataset: Any,
    sampler: Any,
    batch_sampler: Any,
    in_order: bool,
    *,
    allow_inexact_shuffle_buffer: bool = False,
    num_workers: int = 0,
) -> None:
    """Refuse, before anything is built, what a resumable loader cannot resume exactly.

    Raises:
        UnsupportedResumeConfigurationError: ``in_order=False`` with workers, an IterableDataset that
            has no state (its ``__iter__`` a generator), a Hugging Face streaming dataset
            shuffled with a buffer (unless ``allow_inexact_shuffle_buffer``, and then
            not with workers: they cannot load its state), or a sampler /
            batch sampler whose order cannot be recomputed.
        ResumableModeRequiredError: a sampler of this package built with ``resumable=False``.
    """
    if in_order is not True and num_workers > 0:  # without workers, batches come in order
        raise UnsupportedResumeConfigurationError(
            "in_order=False delivers batches in completion order, which a resume cannot repeat; "
            "leave in_order=True (the default) with resumable=True"
        )
    if isinstance(dataset, IterableDataset):
        # A sampler, batch sampler or shuffle is torch's to refuse (DataLoader does).
        if driver_for(dataset) is None:
            check_state_arguments(dataset)
        if not is_stateful(dataset) and inspect.isgeneratorfunction(type(dataset).__iter__):
            raise UnsupportedResumeConfigurationError(
                f"{type(dataset).__name__} is an IterableDataset without state_dict() and "
                "load_state_dict(), and its __iter__ is a generator (which has none either), so "
                "its position cannot be recorded; give the dataset (or the iterator its "
                "__iter__ returns) state_dict() and load_state_dict() (torchdata's Stateful "
                "protocol), or use a map-style dataset"
            )
        if is_streaming_dataset(dataset):
            check_streaming_dataset(
                dataset,
                allow_inexact_shuffle_buffer=allow_inexact_shuffle_buffer,
                num_workers=num_workers,
            )
        return
    for given in (sampler, batch_sampler, getattr(batch_sampler, "sampler", None)):
        if _is_own_subclass(given):
            raise UnsupportedResumeConfigurationError(
                f"{type(given).__name__} subclasses a sampler of this package, whose stream could "
                "not be checked on resume; use InfiniteRandomSampler or build_batch_sampler itself"
            )
    if type(batch_sampler) is ShardedBatchSampler:
        if type(batch_sampler.sampler) in SHARDABLE_SAMPLERS:
            return
        raise UnsupportedResumeConfigurationError(
            f"a ShardedBatchSampler over {type(batch_sampler.sampler).__name__} cannot be "
            "repositioned: use torch's SequentialSampler, RandomSampler, SubsetRandomSampler or "
            "WeightedRandomSampler inside it (a DistributedSampler is sharded already)"
        )
    if batch_sampler is not None:
        if type(batch_sampler) in BATCH_SAMPLER_TARGETS.values():
            if not batch_sampler.resumable:
                raise ResumableModeRequiredError(
                    "the batch sampler was built with resumable=False; build it with resumable=True"
                )
            return
        inner = getattr(batch_sampler, "sampler", None)
        if type(batch_sampler) is BatchSampler and (
            _is_epoch_sampler(inner) or _saves_its_iteration(inner)
        ):
            return
        if _saves_its_iteration(batch_sampler):
            return
        raise UnsupportedResumeConfigurationError(
            f"batch_sampler {type(batch_sampler).__name__} (over {type(inner).__name__}) cannot "
            f"be repositioned: {_SUPPORTED}"
        )
    if sampler is None or _is_epoch_sampler(sampler):
        return
    if type(sampler) is InfiniteRandomSampler:
        if not sampler.resumable:
            raise ResumableModeRequiredError(
                "the InfiniteRandomSampler was built with resumable=False; build it with resumable=True"
            )
        return
    if _saves_its_iteration(sampler):
        return
    raise UnsupportedResumeConfigurationError(
        f"sampler {type(sampler).__name__} cannot be repositioned (subclasses of the supported "
        f"samplers neither, unless stateful: their orders could not be recomputed): "
        f"{_lightning_fix(sampler)}{_SUPPORTED}"
    )


def _lightning_fix(sampler: Any) -> str:
    # Lightning (its Trainer, or Fabric's setup_dataloaders) rebuilds a loader around its
    # own wrapper of any sampler but RandomSampler and SequentialSampler to share it.
    kind = type(sampler)
    if kind.__name__ != "DistributedSamplerWrapper" or not kind.__module__.startswith(
        ("lightning_fabric.", "pytorch_lightning.")
    ):
        return ""
    return (
        "Lightning wrapped your sampler to share it among processes; pass "
        "use_distributed_sampler=False (to the Trainer, or to fabric.setup_dataloaders) with a "
        "sampler sharded by rank, or set the loader up with "
        "trainer_resume.adapters.fabric.setup_dataloaders(fabric, loader); or "
    )


def source_of(loader: DataLoader) -> tuple[Source, int | None]:
    """The source reading a checked loader's sampler, and the dataset size it was built for
    (``None`` where the loader's own ``len(dataset)`` was read)."""
    batch_sampler, sampler = loader.batch_sampler, loader.sampler
    if isinstance(loader.dataset, IterableDataset):
        return (
            IterableSource(
                loader.dataset,
                loader.num_workers,
                loader.persistent_workers,
                loader.drop_last,
                driver_for(loader.dataset),
            ),
            None,
        )
    if type(batch_sampler) in BATCH_SAMPLER_TARGETS.values():
        return BatchSamplerSource(batch_sampler), batch_sampler.dataset_size
    if type(sampler) is InfiniteRandomSampler:
        return SamplerSource(sampler, loader.batch_size), sampler.dataset_size
    if type(batch_sampler) is ShardedBatchSampler:
        return (
            EpochSource(
                batch_sampler.sampler,
                batch_sampler.batch_sampler,
                len(loader.dataset),  # type: ignore[arg-type]
                shard=batch_sampler,
            ),
            None,
        )
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        return StatefulSource(batch_sampler, None, False, batched=True), None
    if batch_sampler is not None:
        sampler = batch_sampler.sampler
    if type(sampler) not in EPOCH_SAMPLERS:
        if batch_sampler is None:
            return StatefulSource(sampler, None, False, batched=False), None
        return (
            StatefulSource(
                sampler, batch_sampler.batch_size, batch_sampler.drop_last, batched=True
            ),
            None,
        )
    return EpochSource(sampler, batch_sampler, len(loader.dataset)), None  # type: ignore[arg-type]
