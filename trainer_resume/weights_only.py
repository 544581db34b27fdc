"""Whether a state can be read back by ``torch.load(weights_only=True)``, checked before writing.

A file holding an object outside torch's weights-only set is written without
complaint and refused only when it is loaded, typically after a preemption, when
nothing can be done. :func:`check_weights_only` walks the state first and names
the first such object, so the refusal comes while the run can still be fixed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from .errors import UnsafeCheckpointError

__all__ = ["check_weights_only", "unsafe_entry"]

# Exact types: a subclass (IntEnum, a NumPy scalar, a namedtuple) pickles as its own class.
_LEAVES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    torch.dtype,
    torch.device,
    torch.Size,
)
_CONTAINERS = (dict, OrderedDict, list, tuple, set)


def _allowed_by_user(value: Any) -> bool:
    # Classes the user allowed with torch.serialization.add_safe_globals.
    allowed = [
        entry[0] if isinstance(entry, tuple) else entry
        for entry in torch.serialization.get_safe_globals()
    ]
    return any(isinstance(entry, type) and type(value) is entry for entry in allowed)


def unsafe_entry(value: Any, path: str = "") -> str | None:
    """Return the path and type of the first value ``torch.load(weights_only=True)`` refuses.

    Args:
        value: Nested state (dicts, lists, tuples, sets, tensors, scalars...).
        path: Prefix of the reported path.

    Returns:
        ``"<path> (<module>.<class>)"`` of the first refused value, or ``None``.
    """
    kind = type(value)
    if kind in _LEAVES or isinstance(value, torch.Tensor):
        return None
    if kind in _CONTAINERS:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and type(key) not in _LEAVES:
                kind_of_key = f"{type(key).__module__}.{type(key).__qualname__}"
                return f"{path or '<root>'} key {key!r} ({kind_of_key})"
            found = unsafe_entry(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    if _allowed_by_user(value):
        return None
    return f"{path or '<root>'} ({kind.__module__}.{kind.__qualname__})"


def check_weights_only(value: Any, *, where: str) -> None:
    """Raise ``UnsafeCheckpointError`` (328) if ``value`` could not be loaded weights-only.

    Args:
        value: The state about to be written.
        where: What is being written (a file path), for the message.

    Raises:
        UnsafeCheckpointError: naming the first refused value's path and class.
    """
    found = unsafe_entry(value)
    if found is not None:
        raise UnsafeCheckpointError(
            f"{where}: {found} would be refused when loading; store plain values "
            "(tensors, numbers, str, "
            "lists, dicts) or allow the class with torch.serialization.add_safe_globals"
        )
