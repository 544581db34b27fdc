"""Sharded (DTensor / FSDP2 ``fully_shard``) state in a pause.

A DTensor holds only this rank's shard of a parameter. Written into an ordinary
pause file it would be resumed on every rank from rank 0's shards: silently wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .errors import UnsupportedResumeConfigurationError

__all__ = ["first_dtensor", "refuse_dtensors"]


def _is_dtensor(value: Any) -> bool:
    if not isinstance(value, torch.Tensor) or not torch.distributed.is_available():
        return False
    # Imported late: builds without torch.distributed have no DTensor.
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def first_dtensor(value: Any, where: str) -> str | None:
    """The path (``where`` then keys/indices) of the first DTensor in nested state, else ``None``."""
    if _is_dtensor(value):
        return where
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = first_dtensor(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def refuse_dtensors(state: Any, where: str) -> None:
    """Raise ``UnsupportedResumeConfigurationError`` when nested state holds a DTensor.

    Raises:
        UnsupportedResumeConfigurationError: names the first DTensor's path.
    """
    found = first_dtensor(state, where)
    if found is not None:
        raise UnsupportedResumeConfigurationError(
            f"{found} is a DTensor (a shard of a model sharded by fully_shard or DTensor): a pause "
            "file would hold only this rank's shard and resume every rank from it; train this model "
            "unsharded (e.g. DistributedDataParallel) to pause it"
        )
