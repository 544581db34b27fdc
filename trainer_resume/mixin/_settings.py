"""What a trainer's pauses carry of its setup: the module version, the signed config, the key.

Recorded once by ``_initialize_training_resume``; a pause writes the version, the
config's signature, its canonical form and its ``config_ignore`` paths, ``resume()``
refuses a file of another version or config, and the key signs and verifies every
file the trainer writes or reads.
"""

from __future__ import annotations

from typing import Any

from ..signature import SignedConfig
from ._step_guard import guard_of

__all__ = ["SETTINGS_ATTRIBUTE", "Settings", "settings_of"]

SETTINGS_ATTRIBUTE = "_training_resume_settings"


class Settings:
    """The module version, the signed config, the signing key, the scheduler-step rule and
    whether spent gradients are left out."""

    __slots__ = ("config", "key", "scheduler_steps", "spent_gradients", "version")

    def __init__(
        self,
        version: str,
        config: SignedConfig,
        key: bytes | None,
        scheduler_steps: str = "convert",
        spent_gradients: str = "save",
    ) -> None:
        self.version = version
        self.config = config
        self.key = key
        self.scheduler_steps = scheduler_steps  # per-step schedulers on another world size
        self.spent_gradients = spent_gradients  # "drop": declared never read once spent

    @property
    def signature(self) -> str:
        return self.config.signature

    @property
    def canonical(self) -> Any:
        return self.config.canonical


def settings_of(trainer: Any, action: str) -> Settings:
    """The trainer's settings, or the error that names the missing initialisation call."""
    guard_of(trainer, action)
    return trainer.__dict__[SETTINGS_ATTRIBUTE]
