"""``setup_dataloaders``: Fabric's ``setup_dataloaders`` with the data shared by a world-size-independent rule.

Under a distributed strategy ``fabric.setup_dataloaders`` rebuilds a loader around a
``DistributedSampler``, which orders every epoch by the number of processes: a pause then
resumes on the same number only. :func:`setup_dataloaders` shares a
``ResumableDataLoader`` the way ``accelerate.prepare`` does instead (whole global batches in
turn, positioned by a global cursor; see ``adapters._shared_loader``), so a pause resumes
on any number of processes, then hands it to ``fabric.setup_dataloaders`` with
``use_distributed_sampler=False``: the batches are moved to the device by Fabric's own
wrapper, which the trainer reads as any loader Fabric set up.
"""

from __future__ import annotations

from typing import Any

from ...errors import ResumableModeRequiredError
from ...loaders import ResumableDataLoader
from .._shared_loader import shared_loader

__all__ = ["setup_dataloaders"]


def setup_dataloaders(
    fabric: Any, loader: ResumableDataLoader, *, move_to_device: bool = True
) -> Any:
    """Set up a resumable loader for ``fabric``, shared so that a pause resumes on any number of processes.

    Use it instead of ``fabric.setup_dataloaders(loader)`` where a run may resume on
    another number of processes, and return what it returns from ``_resume_loaders()``.
    With ``shuffle=True/False`` (torch's ``BatchSampler`` over ``SequentialSampler``,
    ``RandomSampler``, ``SubsetRandomSampler`` or ``WeightedRandomSampler``) process ``r`` of
    ``W`` reads the epoch's global batches ``r, r + W, ...`` (every process the same count:
    the last batch completed and the count padded from the epoch's first samples, or with
    ``drop_last=True`` the last incomplete group dropped); with one process it reads what
    ``loader`` reads. A loader already sharded by rank (``InfiniteRandomSampler``,
    ``build_batch_sampler``, ``ShardedBatchSampler``, ``DistributedSampler``) and one over
    an ``IterableDataset`` (as ``fabric.setup_dataloaders`` leaves it) are kept as they
    are; any other loader is kept in one process and refused with several.

    With several processes, call it on every process: process 0's loader state (its
    augmentation seed and its sampler generator's state) is broadcast and loaded into
    every process's loader, so that all of them order the epochs alike.

    Args:
        fabric: The launched ``lightning_fabric.Fabric``.
        loader: A ``ResumableDataLoader(..., resumable=True)`` that has not delivered a
            batch yet; it is read through the returned loader only from now on.
        move_to_device: Passed on to ``fabric.setup_dataloaders``.

    Returns:
        Fabric's loader (``_FabricDataLoader``) around the shared ``ResumableDataLoader``.

    Raises:
        TypeError: ``loader`` is not a ``ResumableDataLoader``.
        ResumableModeRequiredError: it was built with ``resumable=False``.
        ValueError: it has delivered batches already (set it up before iterating it, and
            load states through the trainer).
        UnsupportedResumeConfigurationError: a loader that cannot be shared among the
            processes, or one sharded by itself for another process (332).
    """
    if not isinstance(loader, ResumableDataLoader):
        raise TypeError(
            f"setup_dataloaders takes a ResumableDataLoader(..., resumable=True), got "
            f"{type(loader).__name__}; a plain DataLoader goes through fabric.setup_dataloaders"
        )
    if not loader.resumable:
        raise ResumableModeRequiredError(
            "setup_dataloaders needs a ResumableDataLoader built with resumable=True"
        )
    delivered = loader.state_dict()["delivered_batches"]
    if delivered:
        raise ValueError(
            f"the loader has delivered {delivered} batch(es) already; set it up before iterating it"
        )
    # What Fabric itself shards data by (None for one device): the data-parallel processes.
    sharding = getattr(fabric.strategy, "distributed_sampler_kwargs", None) or {}
    replicas, rank = int(sharding.get("num_replicas", 1)), int(sharding.get("rank", 0))
    shared = shared_loader(
        loader,
        replicas,
        rank,
        function="setup_dataloaders",
        built_after="fabric.launch() (it then shards by Fabric's process group)",
        iterable_refusal=None,
    )
    if fabric.world_size > 1:
        shared.load_state_dict(fabric.broadcast(shared.state_dict(), src=0))
    return fabric.setup_dataloaders(
        shared, use_distributed_sampler=False, move_to_device=move_to_device
    )
