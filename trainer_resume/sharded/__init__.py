"""Sharded pauses of FSDP2 (``fully_shard``) / DTensor models, through DCP.

Detected automatically: a resume object whose parameters are DTensors, and each
optimizer over them, is written by every rank for its own shards into a pause
*directory* (see :mod:`.manifest`), committed by a manifest of BLAKE3 digests
written last; everything else of the pause (loaders, RNG, extra state, other
objects) goes into one small file per rank.

``torch.distributed.checkpoint`` is imported only when a sharded pause is written
or read (:mod:`.write`, :mod:`.read`): importing it costs about half of importing
torch, which every process that never shards a model would pay.
"""

from __future__ import annotations

import importlib
from typing import Any

from .detect import SHARDED_STATE, ShardedObjects, first_dtensor, refuse_dtensors, sharded_objects
from .manifest import is_pause_directory

__all__ = [
    "SHARDED_STATE",
    "ShardedObjects",
    "ShardedPause",
    "WeightsOnlyLoadPlanner",
    "first_dtensor",
    "is_pause_directory",
    "open_pause",
    "refuse_dtensors",
    "sharded_objects",
    "write_pause",
]

_LAZY = {
    "ShardedPause": ".read",
    "WeightsOnlyLoadPlanner": ".read",
    "open_pause": ".read",
    "write_pause": ".write",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
