"""Bitwise comparison of nested training state, with the size of any difference."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Comparison", "compare"]


@dataclass(frozen=True)
class Comparison:
    """Whether two states are bit-identical, and by how much they differ if not.

    Attributes:
        identical: every tensor ``torch.equal`` (same dtype and shape), every other
            value equal, same keys in the same order.
        max_abs_diff: the largest absolute difference of any element (``inf`` when
            the structures differ, e.g. a missing key or another shape).
        first: the path of the first difference, or ``None``.
    """

    identical: bool
    max_abs_diff: float
    first: str | None


def _numbers(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64)
    return None


def _walk(a: Any, b: Any, path: str, found: list[tuple[str, float]]) -> None:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            found.append((f"{path}: keys {list(a)} vs {list(b)}", math.inf))
            return
        for key in a:
            _walk(a[key], b[key], f"{path}.{key}" if path else str(key), found)
        return
    if isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, (str, bytes)):
        if len(a) != len(b) or isinstance(b, (str, bytes)):
            found.append((f"{path}: length {len(a)} vs {len(b)}", math.inf))
            return
        for position, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{path}[{position}]", found)
        return
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            found.append((f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}", math.inf))
        elif not torch.equal(a, b):
            # NaN == NaN bitwise is still "identical" only if torch.equal says so; here it did not.
            difference = (_numbers(a) - _numbers(b)).abs()  # type: ignore[operator]
            worst = float(difference.nan_to_num(nan=math.inf).max()) if difference.numel() else 0.0
            found.append((path, worst))
        return
    left, right = _numbers(a), _numbers(b)
    if left is not None and right is not None and type(a) is type(b):
        if a != b:
            found.append((path, float((left - right).abs())))
        return
    if type(a) is not type(b) or a != b:
        found.append((f"{path}: {a!r} vs {b!r}", math.inf))


def compare(a: Any, b: Any) -> Comparison:
    """Compare nested state (mappings, sequences, tensors, numbers, other values)."""
    found: list[tuple[str, float]] = []
    _walk(a, b, "", found)
    if not found:
        return Comparison(True, 0.0, None)
    return Comparison(False, max(diff for _, diff in found), found[0][0] or "(value)")
