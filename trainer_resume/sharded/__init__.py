"""Sharded pauses of FSDP2 (``fully_shard``) / DTensor models, through DCP.

Detected automatically: a resume object whose parameters are DTensors, and each
optimizer over them, is written by every rank for its own shards into a pause
*directory* (see :mod:`.manifest`), committed by a manifest of BLAKE3 digests
written last; everything else of the pause (loaders, RNG, extra state, other
objects) goes into one small file per rank.

``torch.distributed.checkpoint`` is imported only when a sharded pause is written
or read (:mod:`.write`, :mod:`.read`): importing it costs about half of importing
torch, which every process that never shards a model would pay. So importing this
package imports none of its modules; ``WeightsOnlyLoadPlanner`` loads :mod:`.read`
when first asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

# The one public name (docs/distributed.md). The package's own modules import the
# submodules they use: detect, manifest, and write / read lazily.
__all__ = ["WeightsOnlyLoadPlanner"]


def __getattr__(name: str) -> Any:
    if name != "WeightsOnlyLoadPlanner":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(".read", __name__).WeightsOnlyLoadPlanner
