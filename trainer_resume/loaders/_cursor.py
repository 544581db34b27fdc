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
    implements the hooks ``_state``, ``_apply_state``, ``_advance``, ``_samples_at``
    and ``_commit``. Overriding a guard would let a rejected state reach the cursor
    half-applied, so subclasses override hooks only. Every move of the cursor
    (``advance``, a loader's commit) goes through :meth:`commit`, so no path can
    record a position that ``load_state_dict`` would later refuse.
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

    def commit(self, *position: int) -> None:
        """Set the delivered cursor to ``position`` (the loader calls this when it
        hands out a batch; ``_advance`` hooks call it too).

        Raises:
            ResumableModeRequiredError: built with ``resumable=False``.
            ValueError: ``position`` is at or past 2**63 samples, the limit every
                saved cursor must stay below; the cursor is unchanged.
        """
        self._require_resumable("commit")
        samples = self._samples_at(*position)
        if samples >= keys.SEED_LIMIT:
            raise ValueError(
                f"the cursor would move to sample {samples}, past the limit of 2**63 samples"
            )
        self._commit(*position)

    def _state(self) -> StateT:
        """Hook: the current cursor as plain data."""
        raise NotImplementedError

    def _apply_state(self, state: Mapping[str, Any]) -> None:
        """Hook: adopt an already validated state."""
        raise NotImplementedError

    def _advance(self, count: int) -> None:
        """Hook: move the cursor by ``count`` delivered items of this rank (``count >= 0``)
        through :meth:`commit`."""
        raise NotImplementedError

    def _samples_at(self, *position: int) -> int:
        """Hook: the global number of samples delivered at cursor ``position``."""
        raise NotImplementedError

    def _commit(self, *position: int) -> None:
        """Hook: set the cursor to an already checked ``position``."""
        raise NotImplementedError

    def _require_resumable(self, method: str) -> None:
        if "resumable" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ was not called")
        if not self.resumable:
            raise ResumableModeRequiredError(
                f"{type(self).__name__}.{method}() needs a sampler built with resumable=True"
            )
