"""Resumable data loading: samplers, batch samplers and a DataLoader whose position
is saved and restored exactly (see ``ResumableDataLoader``), and sample reuse."""

from __future__ import annotations

from .batch_samplers import build_batch_sampler
from .dataloader import ResumableDataLoader

# --- sample reuse ---------------------------------------------------------------
from .reuse import ReuseDataLoader, ReuseDataset, ReuseKey, ReusePolicy, ReuseSampler
from .sampler import InfiniteRandomSampler

__all__ = [
    "InfiniteRandomSampler",
    "ResumableDataLoader",
    "build_batch_sampler",
    "ReusePolicy",
    "ReuseKey",
    "ReuseDataset",
    "ReuseSampler",
    "ReuseDataLoader",
]
