"""The public state guards shared by the resumable samplers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from ..errors import ResumableModeRequiredError
from . import _state_keys as keys

__all__ = ["ResumableCursor"]

StateT = TypeVar("StateT")


class ResumableCursor(Generic[StateT]):
    """``state_dict`` / ``load_state_dict`` / ``advance`` guards over a delivered cursor.

    The guards check the mode and the input, and ``load_state_dict`` validates
    completely (``validate_state_dict``) before any hook runs; the subclass
    implements the hooks ``_state``, ``_apply_state`` and ``_advance``. Overriding a
    guard would let a rejected state reach the cursor half-applied, so subclasses
    override hooks only.
    """

    resumable: bool

    def state_dict(self) -> StateT:
        """Return the delivered cursor as plain data.

        Raises:
            ResumableModeRequiredError: built with ``resumable=False``.
        """
        self._require_resumable("state_dict")
        return self._state()

    def validate_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` completely against this sampler; changes nothing."""
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Validate ``state`` completely, then adopt its seed and cursor.

        Raises:
            Same as :meth:`validate_state_dict`; nothing changes when it raises.
        """
        self.validate_state_dict(state)
        self._apply_state(state)

    def advance(self, count: int) -> None:
        """Record ``count`` more items as delivered by this rank (the global cursor
        moves ``count * num_replicas``).

        Raises:
            ResumableModeRequiredError: built with ``resumable=False``.
            TypeError: ``count`` is not an int.
            ValueError: ``count`` is negative, or the cursor would pass 2**63 samples.
        """
        self._require_resumable("advance")
        if not keys.is_int(count):
            raise TypeError(f"count must be an int, got {type(count).__name__}: {count!r}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._advance(count)

    def _state(self) -> StateT:
        """Hook: the current cursor as plain data."""
        raise NotImplementedError

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        """Hook: adopt an already validated state."""
        raise NotImplementedError

    def _advance(self, count: int) -> None:
        """Hook: move the cursor by ``count`` delivered items of this rank (``count >= 0``)."""
        raise NotImplementedError

    def _require_resumable(self, method: str) -> None:
        if "resumable" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ was not called")
        if not self.resumable:
            raise ResumableModeRequiredError(
                f"{type(self).__name__}.{method}() needs a sampler built with resumable=True"
            )
