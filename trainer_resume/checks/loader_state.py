"""The checks of a saved loader state's entries, shared by the package's loaders and the
adapters' loaders (DALI's iterator): a dict with the expected keys, its format marker,
a count.

A rejected state must name what is wrong and change nothing, so the checks only read;
each raises :class:`~trainer_resume.errors.LoaderStateError` with the offending key in
the detail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import LoaderStateError
from ..state import is_int as is_int

FORMAT = "format"  # the key of every loader state's format marker
SEED_LIMIT = 1 << 63  # seeds and positions stay below 2**63 (derive_seed's range)


def check_mapping(
    state: Any, what: str, required: Iterable[str], optional: Iterable[str] = ()
) -> None:
    """Require a dict with every ``required`` key and nothing outside ``required | optional``."""
    if not isinstance(state, Mapping):
        raise LoaderStateError(f"{what} must be a dict, got {type(state).__name__}")
    required = tuple(required)
    missing = [key for key in required if key not in state]
    if missing:
        raise LoaderStateError(f"{what} lacks key(s) {missing}")
    allowed = set(required) | set(optional)
    unexpected = sorted(str(key) for key in state if key not in allowed)
    if unexpected:
        raise LoaderStateError(f"{what} has unexpected key(s) {unexpected}")


def check_format(state: Mapping[str, Any], what: str, expected: str) -> None:
    if state[FORMAT] != expected:
        raise LoaderStateError(f"{what}[{FORMAT!r}] is {state[FORMAT]!r}, expected {expected!r}")


def check_count(state: Mapping[str, Any], what: str, key: str) -> int:
    """An int in ``[0, 2**63)`` (cursors, counts)."""
    value = state[key]
    if not is_int(value):
        raise LoaderStateError(
            f"{what}[{key!r}] must be an int, got {type(value).__name__}: {value!r}"
        )
    if not 0 <= value < SEED_LIMIT:
        raise LoaderStateError(f"{what}[{key!r}] = {value} is outside [0, 2**63)")
    return value
