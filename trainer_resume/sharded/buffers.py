"""Each rank's own buffers of a sharded model.

FSDP2 shards parameters, not buffers: a BatchNorm's running statistics stay a plain
tensor on every rank, each following that rank's batches. DCP writes a plain tensor
once (as replicated) and loads that copy into every rank, so a resume gave every rank
one rank's statistics. Each rank's persistent plain buffers of its sharded models go
into its own state file instead (entry ``rank_buffers``, canonical names), and
``resume()`` copies them back after DCP's load; files of earlier releases leave the
buffers as DCP loaded them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .._module_names import ModuleNames, non_persistent_buffers
from ..checks.pause_state import optional_entry
from ..errors import CheckpointFormatError, ResumeStateMismatchError
from ..state import RANK_BUFFERS_KEY
from .detect import first_dtensor

__all__ = ["check_rank_buffers", "rank_buffers", "restore_rank_buffers"]


def rank_buffers(
    objects: Mapping[str, Any], models: Iterable[str], copy: Callable[[Any], Any]
) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's persistent plain buffers of the sharded ``models``: name -> canonical
    buffer name -> ``copy(buffer)``."""
    return {name: {key: copy(b) for key, b in _buffers(objects[name]).items()} for name in models}


def check_rank_buffers(checkpoint: Any, objects: Mapping[str, Any], location: str) -> None:
    """Refuse saved buffers that do not fit the live sharded models.

    Raises:
        CheckpointFormatError: the entry is malformed (321).
        ResumeStateMismatchError: a buffer is missing or of another shape or dtype (330).
    """
    for name, buffers in optional_entry(checkpoint, RANK_BUFFERS_KEY, location).items():
        module = objects.get(name)
        if not isinstance(module, torch.nn.Module) or not isinstance(buffers, Mapping):
            raise CheckpointFormatError(
                f"{location}: entry {RANK_BUFFERS_KEY!r}[{name!r}] is not a sharded model's buffers"
            )
        live = _buffers(module)
        for key, value in buffers.items():
            target = live.get(key)
            if target is None or not isinstance(value, torch.Tensor):
                raise ResumeStateMismatchError(
                    f"object {name!r}: this rank's buffer {key!r} is not a buffer of the model"
                )
            if value.shape != target.shape or value.dtype != target.dtype:
                raise ResumeStateMismatchError(
                    f"object {name!r}: this rank's buffer {key!r} has shape {list(value.shape)} "
                    f"and dtype {value.dtype} in the checkpoint, {list(target.shape)} and "
                    f"{target.dtype} here"
                )


def restore_rank_buffers(saved: Any, objects: Mapping[str, Any]) -> None:
    """Copy this rank's saved buffers into its sharded models (after DCP's load)."""
    if saved is None:
        return
    for name, buffers in saved.items():
        live = _buffers(objects[name])
        with torch.no_grad():
            for key, value in buffers.items():
                live[key].copy_(value)


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    names = ModuleNames(module)
    left_out = non_persistent_buffers(module)
    return {
        names.canonical(key): buffer
        for key, buffer in module.named_buffers()
        if key not in left_out and first_dtensor(buffer, key) is None
    }
