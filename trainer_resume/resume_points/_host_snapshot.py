"""Copies of nested tensor state in host memory, for writing while training goes on.

A resume point is written by a background thread while the next steps change the
live tensors in place, so its state must be a copy: CPU tensors are copied, and
tensors on a GPU are copied into pinned host memory (where CUDA is available) with
one synchronisation at the end. The copy is the only time a point blocks the step,
and a fresh allocation per point would add a page fault per 4 KiB to it; so the
buffers of a point that was written serve the next point's copy of the same tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedResumeConfigurationError
from ..sharded.detect import first_dtensor
from ..state import map_tensors

__all__ = ["HostBuffers"]

Memo = dict[Any, tuple[torch.Tensor, torch.Tensor]]


class HostBuffers:
    """Host copies of nested state; ``recycle`` hands a written copy's buffers back for reuse.

    Only the thread that takes points calls ``copy`` and ``take_made``; ``recycle`` is
    called by the writer once the copy is written, before the point reports done, so a
    buffer is never reused while it is being written.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._made: list[torch.Tensor] = []

    def copy(self, value: Any, memo: Memo) -> Any:
        """Copy nested tensor state to host memory that training cannot change.

        Aliases stay aliases (``memo``, shared by the calls of one snapshot).

        Raises:
            UnsupportedResumeConfigurationError: the state holds sharded tensors (DTensor).
        """
        copied = map_tensors(value, self._copy_tensor, memo)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking copies land before the writer reads them
        return copied

    def take_made(self) -> list[torch.Tensor]:
        """The buffers the copies since the last call filled (to recycle once written)."""
        made, self._made = self._made, []
        return made

    def recycle(self, tensors: list[torch.Tensor]) -> None:
        """Offer the buffers of a copy that is no longer needed to the next copy."""
        free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        for tensor in tensors:
            free.setdefault(_key(tensor, tensor.is_pinned()), []).append(tensor)
        self._free = free  # the previous copy's buffers only: no growth across shape changes

    def _copy_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if first_dtensor(tensor, "") is not None:
            raise UnsupportedResumeConfigurationError(
                "these resume points cannot hold a sharded model (DTensor / fully_shard): take "
                "them with TrainingResumeMixin's resume_points (sharded points through "
                "torch.distributed.checkpoint), or pause on a signal to a sharded pause directory"
            )
        tensor = tensor.detach()
        if tensor.layout != torch.strided or not tensor.is_contiguous():
            return tensor.to("cpu", copy=True)  # rare layouts: a fresh copy, not pooled
        pinned = tensor.device.type == "cuda"
        free = self._free.get(_key(tensor, pinned))
        buffer = free.pop() if free else _allocate(tensor, pinned)
        buffer.copy_(tensor, non_blocking=buffer.is_pinned())
        self._made.append(buffer)
        return buffer


def _key(tensor: torch.Tensor, pinned: bool) -> tuple[Any, ...]:
    return (pinned, tensor.dtype, tuple(tensor.shape))


def _allocate(tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
    if pinned:
        try:
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        except RuntimeError:  # no pinnable memory (limits, drivers): pageable memory is as exact
            pass
    return torch.empty(tensor.shape, dtype=tensor.dtype)
