"""What ``torch.load(weights_only=True)`` reads back: the one check used before any save.

A pause file and a reuse sample file are both read weights-only, so both are checked
with this rule before they are written: a value the loader would refuse is caught
while the state is still at hand, not when a later run fails to load the file.
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict
from functools import cache
from typing import Any

import torch

__all__ = ["refusal_reason", "refused_entry"]

# Exact types: a NumPy float64 is a float subclass but is pickled as a NumPy object.
_ALWAYS: frozenset[type] = frozenset(
    {bool, int, float, complex, str, type(None), torch.dtype, torch.device}
)
_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_SEQUENCES = frozenset({list, tuple, torch.Size})
_MAPPINGS = frozenset({dict, OrderedDict})
# Accepted by newer torch releases only (bytes and bytearray since 2.5, set since 2.6),
# and empty bytes (pickled as a call of ``bytes()``) not even by those: probed once in
# the installed torch, so the check says what this torch will load.
_PROBES: dict[str, Any] = {
    "bytes": b"x",
    "empty bytes": b"",
    "bytearray": bytearray(b"x"),
    "set": {0},
}


@cache
def _accepted_by_this_torch() -> frozenset[str]:
    accepted = set()
    for name, sample in _PROBES.items():
        buffer = io.BytesIO()
        torch.save(sample, buffer)
        buffer.seek(0)
        try:
            torch.load(buffer, weights_only=True)
        except Exception:  # the unpickler's refusal: not loadable with this torch
            continue
        accepted.add(name)
    return frozenset(accepted)


def _allowed_by_user(kind: type) -> bool:
    # Classes allowed with torch.serialization.add_safe_globals (torch 2.4 and later).
    get_safe_globals = getattr(torch.serialization, "get_safe_globals", None)
    if get_safe_globals is None:
        return False
    return any(
        (entry[0] if isinstance(entry, tuple) else entry) is kind for entry in get_safe_globals()
    )


def _loadable_scalar(value: Any, accepted: frozenset[str]) -> bool:
    kind = type(value)
    if kind in _ALWAYS or kind in _TENSORS:
        return True
    if kind is bytes:
        return "bytes" in accepted and (bool(value) or "empty bytes" in accepted)
    return kind is bytearray and "bytearray" in accepted


def refused_entry(value: Any, where: str) -> str | None:
    """Describe the first entry of ``value`` that a weights-only load would refuse.

    Accepted: tensors and parameters (exact types), numbers, str, None, dtypes,
    devices, and lists, tuples, ``torch.Size``, dicts and OrderedDicts of them (keys
    too); bytes (not empty), bytearray and sets where the installed torch loads them;
    classes allowed with ``torch.serialization.add_safe_globals``.

    Args:
        value: The nested state about to be saved.
        where: The name of ``value`` in the description (e.g. ``"checkpoint"``).

    Returns:
        ``None`` when everything loads, else ``"<path> is a <module>.<type>"`` (with
        a hint for NumPy values), e.g. ``"checkpoint['extra']['pool'] is a numpy.ndarray
        (convert with torch.from_numpy)"``.
    """
    accepted = _accepted_by_this_torch()
    sequences = _SEQUENCES | {set} if "set" in accepted else _SEQUENCES
    return _refused(value, where, accepted, sequences, set())


def _refused(
    value: Any,
    where: str,
    accepted: frozenset[str],
    sequences: frozenset[type],
    seen: set[int],
) -> str | None:
    if _loadable_scalar(value, accepted):
        return None
    kind = type(value)
    if kind not in sequences and kind not in _MAPPINGS:
        if _allowed_by_user(kind):
            return None
        hint = " (convert with torch.from_numpy)" if kind.__module__.startswith("numpy") else ""
        empty = " (empty bytes)" if kind is bytes else ""
        return f"{where} is a {kind.__module__}.{kind.__qualname__}{hint}{empty}"
    if id(value) in seen:  # shared or self-referencing containers are checked once
        return None
    seen.add(id(value))
    if kind in _MAPPINGS:
        for key, item in value.items():
            found = _refused(key, f"a key of {where}", accepted, sequences, seen)
            found = found or _refused(item, f"{where}[{key!r}]", accepted, sequences, seen)
            if found:
                return found
        return None
    for index, item in enumerate(value):
        found = _refused(item, f"{where}[{index}]", accepted, sequences, seen)
        if found:
            return found
    return None


def refusal_reason(error: pickle.UnpicklingError) -> str:
    """What a weights-only load refused, in one line (the global it would not unpickle)."""
    # torch's message is a page of advice (retry with weights_only=False); the line
    # naming the refused global is the news.
    text = str(error)
    marker = "WeightsUnpickler error:"
    if marker in text:
        return text.split(marker, 1)[1].strip().split(". ", 1)[0]
    # Other torch releases and paths put the news in a paragraph of its own
    # ("Trying to load unsupported GLOBAL ...") between the advice and a docs link.
    paragraphs = [part.strip() for part in text.split("\n\n") if part.strip()]
    for paragraph in paragraphs[1:]:
        if "GLOBAL" in paragraph:
            return paragraph.splitlines()[0]
    return paragraphs[0].splitlines()[0] if paragraphs else type(error).__name__
