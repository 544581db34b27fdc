"""What a trainer's pauses carry of its setup: the module version, the signed config, the key.

Recorded once by ``_initialize_training_resume``; a pause writes the version and the
config's signature, ``resume()`` refuses a file of another version or config, and the
key signs and verifies every file the trainer writes or reads.
"""

from __future__ import annotations

from typing import Any

from ._step_guard import guard_of

__all__ = ["SETTINGS_ATTRIBUTE", "Settings", "settings_of"]

SETTINGS_ATTRIBUTE = "_training_resume_settings"


class Settings:
    """The module version, the config's signature and canonical form, the signing key."""

    __slots__ = ("canonical", "key", "signature", "version")

    def __init__(self, version: str, signature: str, canonical: Any, key: bytes | None) -> None:
        self.version = version
        self.signature = signature
        self.canonical = canonical
        self.key = key


def settings_of(trainer: Any, action: str) -> Settings:
    """The trainer's settings, or the error that names the missing initialisation call."""
    guard_of(trainer, action)
    return trainer.__dict__[SETTINGS_ATTRIBUTE]
