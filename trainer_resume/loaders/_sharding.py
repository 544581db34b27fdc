"""Which slice of a global stream one rank reads: ``num_replicas`` / ``rank`` and their defaults.

Rank ``r`` of ``W`` takes global positions ``r, r + W, r + 2W, ...`` counted from
the shared cursor. A sampler's cursor is *global*: after every rank delivered
``k`` items from cursor ``C``, each rank's cursor is ``C + k * W``, the same on
every rank, and every global position below it was delivered by exactly one rank.
A state therefore says where the global stream stands, whatever the world size that
reads it back.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ._state_keys import is_int

__all__ = ["process_group_world", "resolve_replicas"]


def process_group_world() -> tuple[int, int] | None:
    """``(world_size, rank)`` of the default process group, or ``None`` when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return None


def resolve_replicas(num_replicas: Any, rank: Any) -> tuple[int, int]:
    """Fill ``num_replicas`` / ``rank`` from the process group (else 1 / 0) and check them.

    Raises:
        TypeError: a value is not an int.
        ValueError: ``num_replicas < 1`` or ``rank`` outside ``[0, num_replicas)``.
    """
    world = process_group_world()
    if num_replicas is None:
        num_replicas = world[0] if world is not None else 1
    if rank is None:
        rank = world[1] if world is not None else 0
    for name, value in (("num_replicas", num_replicas), ("rank", rank)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, num_replicas) = [0, {num_replicas}), got {rank}")
    return num_replicas, rank
