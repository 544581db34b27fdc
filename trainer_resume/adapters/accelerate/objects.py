"""``resume_objects``: the resume objects of an Accelerate training loop, in one call."""

from __future__ import annotations

from typing import Any

import torch

from .accelerator_state import accelerator_state

__all__ = ["resume_objects"]

_RESERVED = ("accelerator", "scaler")


def resume_objects(accelerator: Any, **objects: Any) -> dict[str, Any]:
    """``_resume_objects()`` for a loop whose objects went through ``accelerator.prepare``.

    Models are saved unwrapped (``accelerator.unwrap_model``: without the
    ``DistributedDataParallel`` wrapper, so a pause resumes on another number of
    processes); the prepared optimizer and scheduler are saved through their own
    ``state_dict`` (that of the object they wrap). Added: ``"accelerator"``, the
    Accelerator's step state (:func:`accelerator_state`), and ``"scaler"``,
    ``accelerator.scaler``, when mixed precision uses a ``GradScaler`` (restored by the
    trainer's GradScaler handling)::

        def _resume_objects(self):
            return resume_objects(
                self.accelerator, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
            )

    Args:
        accelerator: The ``accelerate.Accelerator``.
        **objects: Name -> prepared model, optimizer, scheduler or any other object
            with ``state_dict`` / ``load_state_dict``.

    Raises:
        ValueError: a name is ``"accelerator"`` or ``"scaler"`` (these are added here).
    """
    taken = [name for name in _RESERVED if name in objects]
    if taken:
        raise ValueError(f"resume_objects adds {taken[0]!r} itself; name your object otherwise")
    named = {
        name: accelerator.unwrap_model(obj) if isinstance(obj, torch.nn.Module) else obj
        for name, obj in objects.items()
    }
    named["accelerator"] = accelerator_state(accelerator)
    if accelerator.scaler is not None:
        named["scaler"] = accelerator.scaler
    return named
