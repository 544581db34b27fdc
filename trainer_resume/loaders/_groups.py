"""Grouping dataset indices by a per-index key (a class label or a domain)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def as_keys(values: Any, size: int, what: str) -> list[Any]:
    """Per-index keys as a list of plain Python values (tensors and arrays are unpacked).

    Raises:
        TypeError: ``values`` is not a sequence, tensor or array.
        ValueError: it does not hold exactly one key per index.
    """
    if isinstance(values, (torch.Tensor, np.ndarray)):
        if values.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, got shape {tuple(values.shape)}")
        keys = values.tolist()
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        keys = list(values)
    else:
        raise TypeError(f"{what} must be a sequence, tensor or array, got {type(values).__name__}")
    if len(keys) != size:
        raise ValueError(f"{what} has {len(keys)} entries but the dataset has {size} samples")
    return keys


def group_indices(keys: list[Any]) -> tuple[list[Any], list[torch.Tensor], torch.Tensor]:
    """Split ``range(len(keys))`` by key.

    Returns:
        ``(groups, members, group_of)``: the distinct keys in sorted order (by
        ``repr`` when they do not compare), each key's indices ascending as an int64
        tensor, and each index's position in ``groups``.

    Raises:
        TypeError: a key is not hashable.
    """
    members: dict[Any, list[int]] = {}
    for index, key in enumerate(keys):
        members.setdefault(key, []).append(index)
    try:
        groups = sorted(members)
    except TypeError:
        groups = sorted(members, key=lambda key: (type(key).__name__, repr(key)))
    group_of = torch.empty(len(keys), dtype=torch.int64)
    tensors = []
    for position, key in enumerate(groups):
        indices = torch.tensor(members[key], dtype=torch.int64)
        group_of[indices] = position
        tensors.append(indices)
    return groups, tensors, group_of


def digest_parts(groups: list[Any], group_of: torch.Tensor) -> list[bytes]:
    """Bytes that change whenever any index changes group or a key changes."""
    return [repr(groups).encode(), group_of.numpy().tobytes()]
