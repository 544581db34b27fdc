"""What an optimizer's or LR scheduler's ``state_dict()`` leaves out: its class.

``Optimizer.load_state_dict`` loads Adam's moments into RAdam without a word (and into
SGD, which fails at its first step), and a scheduler's ``load_state_dict`` overwrites
another class's attributes. A pause saves the class; ``resume()`` refuses another one
before anything is loaded. (A module's modes, which its ``state_dict()`` leaves out too,
are :mod:`trainer_resume.module_modes`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..checks.pause_state import optional_entry
from ..errors import CheckpointFormatError, ResumeStateMismatchError

__all__ = ["OBJECT_CLASSES_KEY", "check_object_classes", "object_classes"]

OBJECT_CLASSES_KEY = "object_classes"
_CLASSED = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


def object_classes(objects: Mapping[str, Any]) -> dict[str, str]:
    """Per optimizer or LR scheduler resume object: its class (an optimizer unwrapped)."""
    return {
        name: _class_name(_unwrapped(obj))
        for name, obj in objects.items()
        if isinstance(_unwrapped(obj), _CLASSED)
    }


def check_object_classes(checkpoint: Any, objects: Mapping[str, Any], location: str) -> None:
    """Refuse an optimizer or scheduler of another class than the one that paused.

    Raises:
        CheckpointFormatError: the entry is malformed (321).
        ResumeStateMismatchError: a class differs (330).
    """
    saved = optional_entry(checkpoint, OBJECT_CLASSES_KEY, location)
    if not all(isinstance(v, str) for v in saved.values()):
        raise CheckpointFormatError(
            f"{location}: entry {OBJECT_CLASSES_KEY!r} is not a dict of names"
        )
    for name, obj in objects.items():
        kind = saved.get(name)
        inner = _unwrapped(obj)
        if kind is None or not isinstance(inner, _CLASSED) or _class_name(inner) == kind:
            continue
        raise ResumeStateMismatchError(
            f"object {name!r} is a {_class_name(inner)}, and the checkpoint holds the state of a "
            f"{kind}: it would load into another update rule; build the {kind.rpartition('.')[2]} "
            "the paused run had"
        )


def _unwrapped(obj: Any) -> Any:
    # Accelerate's AcceleratedOptimizer and Fabric's _FabricOptimizer hold the optimizer.
    inner = getattr(obj, "optimizer", None) if isinstance(obj, torch.optim.Optimizer) else None
    return inner if isinstance(inner, torch.optim.Optimizer) else obj


def _class_name(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"
