"""Sharded pauses of FSDP2 (``fully_shard``) / DTensor models, through DCP.

Detected automatically: a resume object whose parameters are DTensors, and each
optimizer over them, is written by every rank for its own shards into a pause
*directory* (see :mod:`.manifest`), committed by a manifest of BLAKE3 digests
written last; everything else of the pause (loaders, RNG, extra state, other
objects) goes into one small file per rank.
"""

from __future__ import annotations

from .detect import SHARDED_STATE, ShardedObjects, first_dtensor, refuse_dtensors, sharded_objects
from .read import ShardedPause, WeightsOnlyLoadPlanner, is_pause_directory, open_pause
from .write import write_pause

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
