"""``resume_objects``: the resume objects of an Accelerate training loop, in one call."""

from __future__ import annotations

from typing import Any

import torch

from .accelerator_state import accelerator_state

__all__ = ["resume_objects"]

_RESERVED = ("accelerator", "scaler")
_REGISTERED = "custom_object_"  # + the place in accelerator.register_for_checkpointing's order


def resume_objects(accelerator: Any, **objects: Any) -> dict[str, Any]:
    """``_resume_objects()`` for a loop whose objects went through ``accelerator.prepare``.

    Models are saved unwrapped (``accelerator.unwrap_model``: without the
    ``DistributedDataParallel`` wrapper, so a pause resumes on another number of
    processes); the prepared optimizer and scheduler are saved through their own
    ``state_dict`` (that of the object they wrap). Added: ``"accelerator"``, the
    Accelerator's step state (:func:`accelerator_state`); ``"scaler"``,
    ``accelerator.scaler``, when mixed precision uses a ``GradScaler`` (restored by the
    trainer's GradScaler handling); and each object registered with
    ``accelerator.register_for_checkpointing`` and not passed here, as
    ``"custom_object_<i>"`` (``i`` its place in the registration order, as
    ``save_state`` numbers them)::

        def _resume_objects(self):
            return resume_objects(
                self.accelerator, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
            )

    Args:
        accelerator: The ``accelerate.Accelerator``.
        **objects: Name -> prepared model, optimizer, scheduler or any other object
            with ``state_dict`` / ``load_state_dict``.

    Raises:
        ValueError: a name is ``"accelerator"``, ``"scaler"`` or ``"custom_object_<i>"``
            (these are added here).
    """
    taken = [name for name in objects if name in _RESERVED or name.startswith(_REGISTERED)]
    if taken:
        raise ValueError(f"resume_objects adds {taken[0]!r} itself; name your object otherwise")
    named = {
        name: accelerator.unwrap_model(obj) if isinstance(obj, torch.nn.Module) else obj
        for name, obj in objects.items()
    }
    named["accelerator"] = accelerator_state(accelerator)
    if accelerator.scaler is not None:
        named["scaler"] = accelerator.scaler
    # What save_state would save besides: an object the loop holds nowhere else is lost
    # unless it is here (the trainer's check of its own attributes cannot see it).
    given = {id(obj) for obj in objects.values()}
    for index, obj in enumerate(accelerator._custom_objects):
        if id(obj) not in given:
            named[f"{_REGISTERED}{index}"] = obj
    return named
