"""The balancing targets: ``"class_balance"`` (oversample every class) and ``"balance"`` (ratios per group)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sized
from typing import Any

import torch

from ..errors import ResumableBatchConfigurationError
from . import _groups
from ._batching import ResumableBatchSampler

__all__ = ["ClassBalanceBatchSampler", "BalanceBatchSampler"]

# A ratio times a group size is floored; this slack keeps e.g. 0.29 * 100 at 29.
_FLOOR_SLACK = 1e-9


class ClassBalanceBatchSampler(ResumableBatchSampler):
    """Each cycle oversamples every class to the size of the largest one.

    Labels come from the ``labels=`` option, else ``dataset.labels``, else
    ``dataset.targets``. Within a class the picks are whole shuffled passes over
    the class (``shuffle=True``) or the class's indices in order, continuing where
    the previous cycle stopped (``shuffle=False``). Classes are interleaved round
    robin in sorted label order, so any ``batch_size`` consecutive samples hold each
    class ``batch_size // classes`` or one more times.
    """

    target = "class_balance"

    def _configure(self, dataset: Sized, options: dict[str, Any]) -> None:
        labels = options.pop("labels", None)
        super()._configure(dataset, options)
        if labels is None:
            labels = getattr(dataset, "labels", None)
        if labels is None:
            labels = getattr(dataset, "targets", None)
        if labels is None:
            raise ValueError(
                "'class_balance' needs labels: pass labels=... or give the dataset a "
                "'labels' or 'targets' attribute"
            )
        keys = _groups.as_keys(labels, self._dataset_size, "labels")
        self.classes, self._members, group_of = _groups.group_indices(keys)
        self._largest = max(len(members) for members in self._members)
        self._digest_bytes = _groups.digest_parts(self.classes, group_of)

    def _raw_cycle_samples(self) -> int:
        return len(self._members) * self._largest

    def _order(self, cycle: int, generator: torch.Generator) -> torch.Tensor:
        largest = self._largest
        columns = []
        for members in self._members:
            size = len(members)
            if self.shuffle:
                passes = [
                    torch.randperm(size, generator=generator) for _ in range(-(-largest // size))
                ]
                picks = torch.cat(passes)[:largest]
            else:
                picks = (torch.arange(largest) + (cycle * largest) % size) % size
            columns.append(members[picks])
        return torch.stack(columns, dim=1).reshape(-1)

    def _digest_parts(self) -> list[bytes]:
        return self._digest_bytes


class BalanceBatchSampler(ResumableBatchSampler):
    """Each cycle repeats each group's indices by its ratio.

    Options ``groups`` (one key per index: a class or a domain) and ``ratios``
    (``{group: float}``; a group not listed keeps ratio 1.0). A group of ``n``
    indices contributes ``floor(ratio * n)`` samples per cycle: every index
    ``floor(ratio)`` times plus a subset for the fractional part, chosen afresh
    each cycle from the cycle's seed. With ``shuffle=True`` the cycle is shuffled as
    a whole; otherwise groups follow in sorted key order, indices ascending.

    Raises:
        ResumableBatchConfigurationError: a ratio names a group with no index, or no
            group contributes a sample.
        ValueError: a ratio is negative or not finite; ``groups`` has the wrong length.
        TypeError: ``ratios`` is not a mapping or a ratio is not a number.
    """

    target = "balance"

    def _configure(self, dataset: Sized, options: dict[str, Any]) -> None:
        missing = [name for name in ("groups", "ratios") if name not in options]
        if missing:
            raise TypeError(f"'balance' needs the option(s) {missing}")
        groups, ratios = options.pop("groups"), options.pop("ratios")
        super()._configure(dataset, options)
        if not isinstance(ratios, Mapping):
            raise TypeError(
                f"ratios must be a mapping {{group: float}}, got {type(ratios).__name__}"
            )
        keys = _groups.as_keys(groups, self._dataset_size, "groups")
        self.groups, self._members, group_of = _groups.group_indices(keys)
        known = set(self.groups)
        for group, ratio in ratios.items():
            if group not in known:
                raise ResumableBatchConfigurationError(
                    f"ratios[{group!r}] is set but group {group!r} has no index"
                )
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
                raise TypeError(
                    f"ratios[{group!r}] must be a number, got {type(ratio).__name__}: {ratio!r}"
                )
            if not math.isfinite(ratio) or ratio < 0:
                raise ValueError(f"ratios[{group!r}] must be finite and >= 0, got {ratio!r}")
        self.ratios = {group: float(ratios.get(group, 1.0)) for group in self.groups}
        self._counts = [
            math.floor(self.ratios[group] * len(members) + _FLOOR_SLACK)
            for group, members in zip(self.groups, self._members)
        ]
        self._digest_bytes = [
            *_groups.digest_parts(self.groups, group_of),
            repr(self._counts).encode(),
        ]

    def _raw_cycle_samples(self) -> int:
        return sum(self._counts)

    def _order(self, cycle: int, generator: torch.Generator) -> torch.Tensor:
        parts = []
        for members, count in zip(self._members, self._counts):
            whole, extra = divmod(count, len(members))
            if whole:
                parts.append(members.repeat(whole))
            if extra:
                picks = torch.randperm(len(members), generator=generator)[:extra]
                parts.append(members[picks if self.shuffle else picks.sort().values])
        order = torch.cat(parts)
        if self.shuffle:
            order = order[torch.randperm(len(order), generator=generator)]
        return order

    def _digest_parts(self) -> list[bytes]:
        return self._digest_bytes
