"""``resume_objects``: a Fabric loop's resume objects, with the precision plugin's GradScaler.

``fabric.setup`` returns a ``_FabricModule`` and ``_FabricOptimizer``s: both are resume
objects as they are (the module's state and gradients are saved under the model's own
names, the optimizer's through Fabric's strategy). A precision plugin that scales the
loss (``MixedPrecision("16-mixed")``; on CUDA what ``precision="16-mixed"`` makes) holds a
``GradScaler`` that is part of the run's state too: :func:`resume_objects` adds it, and a
trainer that returns objects set up by such a Fabric without it is refused when training
starts (a check registered with ``checks.hook_results``), where it would otherwise resume
with a fresh loss scale.

Fabric internals used (``lightning_fabric`` 2.5.3 to 2.6): ``_FabricModule._strategy``,
``_FabricOptimizer._strategy``, ``Strategy.precision`` and ``MixedPrecision.scaler``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning_fabric.wrappers import _FabricModule, _FabricOptimizer

from ...checks.hook_results import register_objects_check

__all__ = ["resume_objects", "scaler_left_out"]


def _scaler(strategy: Any) -> torch.amp.GradScaler | None:
    scaler = getattr(getattr(strategy, "precision", None), "scaler", None)
    return scaler if isinstance(scaler, torch.amp.GradScaler) else None


def resume_objects(fabric: Any, **objects: Any) -> dict[str, Any]:
    """``_resume_objects()`` for a loop whose objects went through ``fabric.setup``.

    Returns ``objects`` as they are (the ``_FabricModule`` and ``_FabricOptimizer`` that
    ``fabric.setup`` returned, a scheduler, anything with ``state_dict`` /
    ``load_state_dict``) and ``"scaler"``, the precision plugin's ``GradScaler``, when it
    has one (restored by the trainer's GradScaler handling)::

        def _resume_objects(self):
            return resume_objects(
                self.fabric, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
            )

    Args:
        fabric: The ``lightning_fabric.Fabric``.
        **objects: Name -> object.

    Raises:
        ValueError: a name is ``"scaler"`` while the plugin has a GradScaler (it is added here).
    """
    named = dict(objects)
    scaler = _scaler(fabric.strategy)
    if scaler is not None:
        if "scaler" in named and named["scaler"] is not scaler:
            raise ValueError("resume_objects adds 'scaler' itself; name your object otherwise")
        named["scaler"] = scaler
    return named


def scaler_left_out(objects: Mapping[str, Any]) -> str | None:
    """What is wrong when objects set up by Fabric come without their plugin's GradScaler (an objects check)."""
    returned = {id(obj) for obj in objects.values()}
    for name, obj in objects.items():
        if not isinstance(obj, (_FabricModule, _FabricOptimizer)):
            continue
        scaler = _scaler(obj._strategy)
        if scaler is not None and id(scaler) not in returned:
            return (
                f"returns {name!r}, set up by a Fabric whose precision plugin scales the loss with "
                "a GradScaler, but not that GradScaler, so a resumed run would start from a fresh "
                "loss scale; return it too: trainer_resume.adapters.fabric.resume_objects(fabric, "
                "...) adds it as 'scaler'"
            )
    return None


register_objects_check(scaler_left_out)
