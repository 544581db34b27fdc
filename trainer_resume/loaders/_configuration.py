"""Which loader configurations resume exactly, and the source that reads each one.

A resumable loader accepts the samplers whose order it can recompute from recorded
seeds (torch's own samplers, exact types), the endless resumable samplers of this
package, and nothing else: every other configuration is refused here, before the
loader exists, with the error naming the fix.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..errors import ResumableModeRequiredError, UnsupportedResumeConfigurationError
from ._epochs import EPOCH_SAMPLERS, EpochSource
from ._sources import BatchSamplerSource, SamplerSource, Source
from .batch_samplers import BATCH_SAMPLER_TARGETS
from .sampler import InfiniteRandomSampler

__all__ = ["check_resumable_configuration", "source_of"]

_SUPPORTED = (
    "shuffle=True/False, torch's SequentialSampler, RandomSampler, SubsetRandomSampler, "
    "WeightedRandomSampler, DistributedSampler or a BatchSampler over one of them, "
    "InfiniteRandomSampler(resumable=True) or build_batch_sampler(..., resumable=True)"
)


def _is_epoch_sampler(sampler: Any) -> bool:
    return type(sampler) in EPOCH_SAMPLERS


def check_resumable_configuration(
    dataset: Any, sampler: Any, batch_sampler: Any, in_order: bool
) -> None:
    """Refuse, before anything is built, what a resumable loader cannot resume exactly.

    Raises:
        UnsupportedResumeConfigurationError: an IterableDataset, ``in_order=False``, or a
            sampler / batch sampler whose order cannot be recomputed.
        ResumableModeRequiredError: a sampler of this package built with ``resumable=False``.
    """
    if isinstance(dataset, IterableDataset):
        raise UnsupportedResumeConfigurationError(
            f"{type(dataset).__name__} is an IterableDataset, whose position the loader cannot "
            "record; use a map-style dataset (with __getitem__ and __len__) for resumable=True"
        )
    if in_order is not True:
        raise UnsupportedResumeConfigurationError(
            "in_order=False delivers batches in completion order, which a resume cannot repeat; "
            "leave in_order=True (the default) with resumable=True"
        )
    if batch_sampler is not None:
        if type(batch_sampler) in BATCH_SAMPLER_TARGETS.values():
            if not batch_sampler.resumable:
                raise ResumableModeRequiredError(
                    "the batch sampler was built with resumable=False; build it with resumable=True"
                )
            return
        if type(batch_sampler) is BatchSampler and _is_epoch_sampler(batch_sampler.sampler):
            return
        raise UnsupportedResumeConfigurationError(
            f"batch_sampler {type(batch_sampler).__name__} (over "
            f"{type(getattr(batch_sampler, 'sampler', None)).__name__}) cannot be repositioned; "
            f"use one of: {_SUPPORTED}"
        )
    if sampler is None or _is_epoch_sampler(sampler):
        return
    if type(sampler) is InfiniteRandomSampler:
        if not sampler.resumable:
            raise ResumableModeRequiredError(
                "the InfiniteRandomSampler was built with resumable=False; build it with resumable=True"
            )
        return
    raise UnsupportedResumeConfigurationError(
        f"sampler {type(sampler).__name__} cannot be repositioned (subclasses of the supported "
        f"samplers neither: their orders could not be recomputed); use one of: {_SUPPORTED}"
    )


def source_of(loader: DataLoader) -> tuple[Source, int | None]:
    """The source reading a checked loader's sampler, and the dataset size it was built for
    (``None`` where the loader's own ``len(dataset)`` was read)."""
    batch_sampler, sampler = loader.batch_sampler, loader.sampler
    if type(batch_sampler) in BATCH_SAMPLER_TARGETS.values():
        return BatchSamplerSource(batch_sampler), batch_sampler.dataset_size
    if type(sampler) is InfiniteRandomSampler:
        return SamplerSource(sampler, loader.batch_size), sampler.dataset_size
    if batch_sampler is not None:
        sampler = batch_sampler.sampler
    return EpochSource(sampler, batch_sampler, len(loader.dataset)), None  # type: ignore[arg-type]
