"""Whether a sharded model's gradients at a pause are an open window's partial sums.

FSDP2 reduce-scatters every micro-batch's gradients (with gradient sync on, the only
way a pause can save them, see sharded/detect.py): each rank's ``.grad`` is its shard of
the window's sum so far, averaged over the ranks. With as many ranks a resume puts them
back exactly. With another number the window's remaining micro-steps would add
gradients averaged over another number of ranks, and its steps count other samples, so
such a pause is refused on another world size (330), as a DDP window is (distributed.py).
Gradients an optimizer has stepped on since (a loop that zeroes them at the start of its
step, as torchtitan's does) hold no window and resume on any number of ranks.

Which it is: when training starts, each optimizer of a trainer with a sharded model gets
a step post hook recording the step it ran in; a pause whose sharded models hold
gradients and whose last completed step ran no optimizer step is inside a window
(``SHARDED_WINDOW_KEY`` in its file), and a resume carries the answer on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..sharded.detect import ShardedObjects
from ._gradient_liveness import run_uncompiled, stepping_optimizer
from ._step_guard import StepGuard

__all__ = ["restore_window", "watch_optimizer_steps", "window_open"]

_ATTRIBUTE = "_training_resume_optimizer_steps"


class _OptimizerSteps:
    """The step the trainer's optimizers last stepped in (``None``: not since a window opened)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.watched: set[int] = set()
        self.handles: list[Any] = []


def _steps(trainer: Any) -> _OptimizerSteps:
    record = trainer.__dict__.get(_ATTRIBUTE)
    if record is None:
        record = trainer.__dict__[_ATTRIBUTE] = _OptimizerSteps()
    return record


def watch_optimizer_steps(
    trainer: Any, guard: StepGuard, objects: Mapping[str, Any], sharded: ShardedObjects
) -> None:
    """Hook the step of every optimizer among ``objects`` when a model is sharded."""
    if not sharded.models:
        return
    record = _steps(trainer)
    for obj in objects.values():
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        optimizer = stepping_optimizer(obj)
        if id(optimizer) in record.watched:
            continue

        def stepped(*_: Any) -> None:
            record.last = guard.completed_steps + 1  # the step running now

        # Not traced into a compiled optimizer step (its graph would guard on the count).
        hook = run_uncompiled(stepped)
        record.handles.append(optimizer.register_step_post_hook(hook))
        record.watched.add(id(optimizer))


def window_open(
    trainer: Any, guard: StepGuard, objects: Mapping[str, Any], sharded: ShardedObjects
) -> bool:
    """Whether the sharded models' gradients are a window's partial sums at this boundary."""
    held = any(
        param.grad is not None for name in sharded.models for param in objects[name].parameters()
    )
    return held and _steps(trainer).last != guard.completed_steps


def restore_window(trainer: Any, completed_steps: int, inside: bool) -> None:
    """After a resume: the resumed boundary is inside a window exactly when the pause was."""
    _steps(trainer).last = None if inside else completed_steps
