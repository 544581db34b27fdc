"""``build_batch_sampler``: resumable batch samplers chosen by a ``_target_`` name."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import torch

from ._batching import ResumableBatchSampler
from .balanced import BalanceBatchSampler, ClassBalanceBatchSampler

__all__ = [
    "build_batch_sampler",
    "ResumableBatchSampler",
    "NaiveBatchSampler",
    "ClassBalanceBatchSampler",
    "BalanceBatchSampler",
    "BATCH_SAMPLER_TARGETS",
]


class NaiveBatchSampler(ResumableBatchSampler):
    """Each cycle is a permutation of the dataset (``range`` without ``shuffle``) cut into batches."""

    target = "naive"

    def _raw_cycle_samples(self) -> int:
        return self._dataset_size

    def _order(self, cycle: int, generator: torch.Generator) -> torch.Tensor:
        if self.shuffle:
            return torch.randperm(self._dataset_size, generator=generator)
        return torch.arange(self._dataset_size)


BATCH_SAMPLER_TARGETS: dict[str, type[ResumableBatchSampler]] = {
    cls.target: cls for cls in (NaiveBatchSampler, ClassBalanceBatchSampler, BalanceBatchSampler)
}


def build_batch_sampler(
    _target_: str,
    dataset: Sized,
    batch_size: int,
    *,
    repeat: bool,
    shuffle: bool,
    drop_last: bool,
    resumable: bool = False,
    generator: torch.Generator | None = None,
    num_replicas: int | None = None,
    rank: int | None = None,
    **options: Any,
) -> ResumableBatchSampler:
    """Build the batch sampler named by ``_target_``.

    Targets:
        ``"naive"``: each cycle a permutation of the dataset (or ``range`` without
        ``shuffle``) cut into batches. No options.

        ``"class_balance"``: each cycle oversamples every class to the size of the
        largest, shuffled within class and interleaved so batches are as
        class-uniform as possible. Option ``labels`` (default ``dataset.labels`` or
        ``dataset.targets``).

        ``"balance"``: options ``groups`` (each index's class or domain key) and
        ``ratios`` (``{group: float}``, unlisted groups keep 1.0); each cycle repeats
        each group's indices by its ratio, the fractional part a subset chosen from
        the cycle's seed.

    Every cycle has the same number of samples; its last batch is partial unless
    ``drop_last``. See :class:`ResumableBatchSampler` for iteration and state.

    Args:
        _target_: ``"naive"``, ``"class_balance"`` or ``"balance"``.
        dataset: The sized dataset the indices refer to.
        batch_size: Samples per batch (at least 1).
        repeat: Continue with the next cycle instead of ending each iteration after one.
        shuffle: Randomise the order within each cycle.
        drop_last: Drop each cycle's last partial batch.
        resumable: Keep a delivered cursor with ``state_dict`` / ``load_state_dict``.
        generator: Draws the sampler's seed (torch's default CPU generator if None).
            Every rank must draw the same seed.
        num_replicas: Ranks sharing the global batch stream (default: the world
            size of an initialized ``torch.distributed`` process group, else 1).
        rank: This rank, in ``[0, num_replicas)`` (default: the process group's
            rank, else 0). Rank ``r`` takes global batches ``r, r + W, ...``.
        **options: The target's options.

    Raises:
        ValueError: unknown ``_target_``, labels/groups of the wrong length, bad ratios.
        TypeError: an option the target does not take, or a wrongly typed argument.
        ResumableBatchConfigurationError: empty dataset, ``batch_size < 1``, settings
            that yield no batch, a ratio for a group with no index, or
            ``repeat=False`` with batches per cycle not divisible by ``num_replicas``.
    """
    try:
        cls = BATCH_SAMPLER_TARGETS[_target_]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown batch sampler target {_target_!r}; choose one of {sorted(BATCH_SAMPLER_TARGETS)}"
        ) from None
    return cls(
        dataset,
        batch_size,
        repeat=repeat,
        shuffle=shuffle,
        drop_last=drop_last,
        resumable=resumable,
        generator=generator,
        num_replicas=num_replicas,
        rank=rank,
        **options,
    )
