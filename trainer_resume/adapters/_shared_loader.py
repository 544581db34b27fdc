"""A ``ResumableDataLoader`` shared among data-parallel processes, for the adapters that share one.

``accelerate.prepare`` and Lightning Fabric's ``setup_dataloaders`` give each process its
part of a data loader. The adapters do it the resumable way, by one rule
(:func:`shared_loader`):

* torch's ``BatchSampler`` over ``SequentialSampler``, ``RandomSampler``,
  ``SubsetRandomSampler`` or ``WeightedRandomSampler`` (``shuffle=True/False`` with a
  ``batch_size``) is rebuilt around a :class:`~trainer_resume.loaders.ShardedBatchSampler`:
  process ``r`` of ``W`` reads the epoch's global batches ``r, r + W, ...``, positioned by a
  global cursor, so a pause resumes on any number of processes; every other argument,
  the augmentation seed included, is kept;
* a loader already sharded by rank (``InfiniteRandomSampler``, ``build_batch_sampler``,
  ``ShardedBatchSampler``, ``DistributedSampler``) is kept as it is, where sharding it
  again would drop samples; one sharded for another process is refused;
* anything else is kept as it is in one process; with several, an ``IterableDataset`` is
  kept or refused as the framework's own sharing treats it, and any other loader is
  refused.

Every refusal is ``UnsupportedResumeConfigurationError`` (332) naming the adapter's
function and the fix.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler

from ..errors import UnsupportedResumeConfigurationError
from ..loaders import ResumableDataLoader, ShardedBatchSampler
from ..loaders.sharded_batches import SHARDABLE_SAMPLERS

__all__ = ["shared_loader"]


def _shares_by_itself(loader: ResumableDataLoader) -> Any:
    """The part of ``loader`` that already shards it over ranks (it has ``num_replicas``), if any."""
    batch_sampler = loader.batch_sampler
    for part in (batch_sampler, loader.sampler, getattr(batch_sampler, "sampler", None)):
        if part is not None and hasattr(part, "num_replicas") and hasattr(part, "rank"):
            return part
    return None


def _sharable(loader: ResumableDataLoader) -> bool:
    batch_sampler = loader.batch_sampler
    return type(batch_sampler) is BatchSampler and type(batch_sampler.sampler) in SHARDABLE_SAMPLERS


def _rebuilt(loader: ResumableDataLoader, replicas: int, rank: int) -> ResumableDataLoader:
    """``loader`` with its batch sampler shared among ``replicas`` ranks, every other argument kept."""
    sharded = ResumableDataLoader(
        loader.dataset,
        batch_sampler=ShardedBatchSampler(loader.batch_sampler, num_replicas=replicas, rank=rank),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        # Draws the new loader's augmentation seed, replaced below by the original's:
        # neither the caller's generator nor torch's default one is drawn from.
        generator=torch.Generator().manual_seed(loader.augmentation_seed),
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=loader.in_order,
        resumable=True,
        augmentation_seeding=loader.augmentation_seeding,
    )
    state = sharded.state_dict()
    state["augmentation_seed"] = loader.augmentation_seed
    sharded.load_state_dict(state)
    return sharded


def shared_loader(
    loader: ResumableDataLoader,
    replicas: int,
    rank: int,
    *,
    function: str,
    built_after: str,
    iterable_refusal: str | None,
) -> ResumableDataLoader:
    """``loader`` as process ``rank`` of ``replicas`` reads it (see the module).

    Args:
        loader: A ``ResumableDataLoader(..., resumable=True)``.
        replicas: The number of data-parallel processes.
        rank: This process's place among them.
        function: The adapter's function, named in a refusal (``"prepare_loader"``).
        built_after: What a sampler sharded by itself must be built after to shard by the
            right process group, and why, named in a refusal (``"the Accelerator (it then
            shards by the Accelerator's process group)"``).
        iterable_refusal: Why an ``IterableDataset`` is refused with several processes;
            ``None``: it is kept as it is (each process reads its own copy).

    Raises:
        UnsupportedResumeConfigurationError: a sampler sharded for another process, or a
            loader that cannot be shared among several (332).
    """
    if _sharable(loader):
        return _rebuilt(loader, replicas, rank)
    part = _shares_by_itself(loader)
    if part is not None:
        if (part.num_replicas, part.rank) != (replicas, rank):
            raise UnsupportedResumeConfigurationError(
                f"the loader's {type(part).__name__} is sharded for rank {part.rank} of "
                f"{part.num_replicas}, but this is process {rank} of {replicas}; build it after "
                f"{built_after} or pass num_replicas={replicas}, rank={rank}"
            )
        return loader
    if replicas == 1:
        return loader  # nothing to share: a loader in one process is left alone
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        if iterable_refusal is None:
            return loader
        what = f"an IterableDataset, {iterable_refusal}"
    else:
        what = f"a {type(loader.batch_sampler or loader.sampler).__name__}"
        if loader.batch_sampler is not None and hasattr(loader.batch_sampler, "sampler"):
            what += f" over a {type(loader.batch_sampler.sampler).__name__}"
    raise UnsupportedResumeConfigurationError(
        f"{function} shares a loader among {replicas} processes when it reads torch's "
        "BatchSampler over SequentialSampler, RandomSampler, SubsetRandomSampler or "
        f"WeightedRandomSampler (shuffle=True/False with a batch_size), but it reads {what}; "
        "use one of those, or a sampler already sharded by rank (InfiniteRandomSampler, "
        "build_batch_sampler, ShardedBatchSampler or DistributedSampler)"
    )
