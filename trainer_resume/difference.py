"""Where two nested training states differ: ``first_difference`` and ``max_abs_difference``.

One rule for every comparison in the package (the resume check, the demo's report,
the distributed resume's rank agreement): dicts by key, lists and tuples element by
element, tensors by dtype, shape and value, numbers by value, other values with
``==``; NaN equals NaN at the same place, so a state that holds NaN still compares
equal to its exact copy.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

__all__ = ["Difference", "first_difference", "max_abs_difference"]


class Difference(NamedTuple):
    """The first place where two nested states differ.

    Attributes:
        path: Keys and indices from the root, joined with ``/`` (``""`` for the root).
        detail: What differs (values, shapes, dtypes or keys).
        max_abs_difference: For numbers and tensors of one shape, the largest
            absolute difference; ``None`` when the structure differs.
    """

    path: str
    detail: str
    max_abs_difference: float | None

    def describe(self) -> str:
        where = self.path or "the value"
        return f"{where} differs: {self.detail}"


def first_difference(expected: Any, actual: Any) -> Difference | None:
    """Return where two nested states first differ, or ``None`` when they are bit-identical.

    Dicts are compared key by key in ``expected``'s order, lists and tuples element by
    element, tensors by shape, dtype and value (NaN equals NaN at the same place),
    other values with ``==``.
    """
    return _difference(expected, actual, "")


def max_abs_difference(expected: Any, actual: Any) -> float:
    """Largest absolute difference over all tensors and numbers of two nested states.

    Returns ``0.0`` for bit-identical states and ``inf`` when their structure
    (keys, lengths, shapes, dtypes, non-numeric values) differs.
    """
    return _max_difference(expected, actual)


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _tensor_difference(
    expected: torch.Tensor, actual: torch.Tensor, path: str
) -> Difference | None:
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return Difference(
            path,
            f"{expected.dtype}{list(expected.shape)} != {actual.dtype}{list(actual.shape)}",
            None,
        )
    if torch.equal(expected, actual):
        return None
    same = expected == actual
    if expected.is_floating_point() or expected.is_complex():
        same |= expected.isnan() & actual.isnan()
    if bool(same.all()):
        return None
    gap = _tensor_gap(expected, actual)
    count = int((~same).sum())
    return Difference(
        path, f"{count} of {expected.numel()} values, max abs difference {gap:.6g}", gap
    )


def _tensor_gap(expected: torch.Tensor, actual: torch.Tensor) -> float:
    if expected.numel() == 0:
        return 0.0
    if expected.dtype == torch.bool:
        return float((expected != actual).any())
    if not (expected.is_floating_point() or expected.is_complex()):
        # Integers exactly: through float64 two large different values could look equal.
        return float((expected.to(torch.int64) - actual.to(torch.int64)).abs().max())
    wide = torch.complex128 if expected.is_complex() else torch.float64
    gap = (expected.to(wide) - actual.to(wide)).abs()
    gap = gap.masked_fill(expected.isnan() & actual.isnan(), 0.0)
    return float(gap.nan_to_num(nan=math.inf).max())


def _difference(expected: Any, actual: Any, path: str) -> Difference | None:
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
            return Difference(path, f"{type(expected).__name__} != {type(actual).__name__}", None)
        return _tensor_difference(expected, actual, path)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        missing = [key for key in expected if key not in actual]
        extra = [key for key in actual if key not in expected]
        if missing or extra:
            return Difference(path, f"keys missing {missing}, unexpected {extra}", None)
        for key in expected:
            found = _difference(expected[key], actual[key], _join(path, key))
            if found is not None:
                return found
        return None
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return Difference(path, f"length {len(expected)} != {len(actual)}", None)
        for index, (left, right) in enumerate(zip(expected, actual)):
            found = _difference(left, right, _join(path, index))
            if found is not None:
                return found
        return None
    if _is_number(expected) and _is_number(actual):
        if expected == actual or (_is_nan(expected) and _is_nan(actual)):
            return None
        gap = abs(expected - actual)
        return Difference(
            path,
            f"{expected!r} != {actual!r}, max abs difference {gap:.6g}",
            float(gap),
        )
    if type(expected) is not type(actual) or expected != actual:
        return Difference(path, f"{expected!r} != {actual!r}", None)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


def _is_nan(value: Any) -> bool:
    return (
        cmath.isnan(value)
        if isinstance(value, complex)
        else isinstance(value, float) and math.isnan(value)
    )


def _max_difference(expected: Any, actual: Any) -> float:
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            return math.inf
        return _tensor_gap(expected, actual)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        if list(expected) != list(actual) and set(expected) != set(actual):
            return math.inf
        return max(
            (_max_difference(expected[key], actual[key]) for key in expected),
            default=0.0,
        )
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return math.inf
        return max(
            (_max_difference(left, right) for left, right in zip(expected, actual)),
            default=0.0,
        )
    if _is_number(expected) and _is_number(actual):
        if _is_nan(expected) and _is_nan(actual):
            return 0.0
        gap = float(abs(expected - actual))
        return math.inf if math.isnan(gap) else gap
    return 0.0 if type(expected) is type(actual) and expected == actual else math.inf
