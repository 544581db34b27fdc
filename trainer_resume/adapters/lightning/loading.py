"""``load_from_checkpoint`` for our Lightning files.

Pause files and files written through :class:`DurableCheckpointIO` carry a verified
header in front of the ``torch.save`` archive, so Lightning's own
``LightningModule.load_from_checkpoint`` cannot read them (torch reports
``Weights only load failed ... Unsupported operand`` and suggests
``weights_only=False``, which would not help). :func:`load_from_checkpoint` reads
one verified and weights-only, then builds the module the way Lightning's does.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import pytorch_lightning as pl
from pytorch_lightning.core.saving import _default_map_location, _load_state
from pytorch_lightning.utilities.migration.utils import _pl_migrate_checkpoint

from ...checkpoint_files.lightning import plain_lightning_checkpoint

__all__ = ["load_from_checkpoint"]

ModuleT = TypeVar("ModuleT", bound=pl.LightningModule)


def load_from_checkpoint(
    cls: type[ModuleT],
    path: str | os.PathLike[str],
    *,
    map_location: Any = None,
    strict: bool | None = None,
    key: bytes | None = None,
    **kwargs: Any,
) -> ModuleT:
    """``cls.load_from_checkpoint(path, ...)`` for a pause file or ``DurableCheckpointIO`` file.

    The file is verified and loaded weights-only (:func:`plain_lightning_checkpoint`),
    then the module is built exactly as Lightning's ``load_from_checkpoint`` builds
    it: ``cls(**hyper_parameters, **kwargs)``, ``load_state_dict(..., strict)``,
    ``on_load_checkpoint``, moved to the device of the stored weights.

    Args:
        cls: The ``LightningModule`` subclass.
        path: The file.
        map_location: As for ``torch.load``; ``None`` behaves as Lightning's default
            (CUDA tensors load onto the CPU when CUDA is not available).
        strict: As for ``LightningModule.load_from_checkpoint``.
        key: The signing key the file was written with, if any.
        **kwargs: Override saved hyper-parameters, as in Lightning's.

    Returns:
        The module.

    Raises:
        The errors of :func:`plain_lightning_checkpoint`.
    """
    if not (isinstance(cls, type) and issubclass(cls, pl.LightningModule)):
        raise TypeError(f"cls must be a LightningModule subclass, got {cls!r}")
    checkpoint = plain_lightning_checkpoint(
        path,
        key=key,
        map_location=map_location if map_location is not None else _default_map_location,
    )
    # The same steps as pytorch_lightning.core.saving._load_from_checkpoint after its torch.load.
    checkpoint = _pl_migrate_checkpoint(checkpoint, checkpoint_path=os.fspath(path))
    checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
    checkpoint[cls.CHECKPOINT_HYPER_PARAMS_KEY].update(kwargs)
    model = _load_state(cls, checkpoint, strict=strict, **kwargs)
    state_dict = checkpoint["state_dict"]
    tensors = [value for value in state_dict.values() if hasattr(value, "device")]
    return model.to(tensors[0].device) if tensors else model
