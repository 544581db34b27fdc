"""Reuse prepared samples for a fixed number of epochs when input preparation is the bottleneck.

``policy`` decides in closed form which preparation serves index ``i`` in epoch
``e`` (shuffled with ``keyed_permutation``), ``store`` keeps one verified file per
index, and ``loader`` builds the dataset, sampler and DataLoader on top of them.
"""

from __future__ import annotations

from .loader import ReuseDataLoader, ReuseDataset, ReuseSampler
from .policy import ReuseKey, ReusePolicy

__all__ = ["ReuseDataLoader", "ReuseDataset", "ReuseKey", "ReusePolicy", "ReuseSampler"]
