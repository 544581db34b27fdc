"""Resumable data loading: samplers, batch samplers and a DataLoader whose position
is saved and restored exactly (see ``ResumableDataLoader``), and sample reuse."""

from __future__ import annotations

from .batch_samplers import build_batch_sampler
from .dataloader import ResumableDataLoader
from .reuse import ReuseDataLoader, ReuseDataset, ReuseKey, ReusePolicy, ReuseSampler
from .sampler import InfiniteRandomSampler
from .sharded_batches import ShardedBatchSampler

# The groups are marked here, not among the imports, which the import sorter orders.
__all__ = [
    # resumable loading
    "InfiniteRandomSampler",
    "ResumableDataLoader",
    "build_batch_sampler",
    "ShardedBatchSampler",
    # sample reuse
    "ReusePolicy",
    "ReuseKey",
    "ReuseDataset",
    "ReuseSampler",
    "ReuseDataLoader",
]
