"""The output contract of a dataset, checked sample by sample before collation.

A sample may be anything ``dataset[i]`` returns: a tensor, a tuple such as
``(image, label)``, a dict, nested mappings and sequences. It is identified by its
index. Each field (``[0]`` of a tuple, ``image`` of a dict, ``meta.size``,
``boxes[0]``; the sample itself when it is not a container) must keep one type and,
for tensors and arrays, one dtype and one shape across samples. The most common
signature of a field is its reference; every sample that differs is reported by its
index. The check also notes which global generators ``dataset[i]`` draws from: a
known cause of differences between worker counts and between epochs.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._common import UsageError

__all__ = [
    "AuditUsageError",
    "ContractReport",
    "Violation",
    "check_contract",
    "check_stream_contract",
    "field_name",
    "flatten_sample",
]

# (type name, dtype or "-", shape or None)
Signature = tuple[str, str, "tuple[int, ...] | None"]


class AuditUsageError(UsageError):
    """The audited target cannot be used as documented (bad factory, iterable dataset)."""


@dataclass(frozen=True)
class Violation:
    """One sample that breaks the contract (an ``IterableDataset``'s: by its place in the stream)."""

    index: int
    text: str
    what: str = "sample index"  # or "item"

    def __str__(self) -> str:
        return f"{self.what} {self.index}: {self.text}"


@dataclass
class ContractReport:
    """What ``check_contract`` found over the checked indices."""

    checked: int = 0
    complete: bool = False  # every index of the dataset was checked
    references: dict[str, tuple[Signature, int]] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    # Global generators that dataset[i] drew from in the main process ("torch", "random", "numpy").
    global_generators: list[str] = field(default_factory=list)


def field_name(path: str) -> str:
    """How a report names the field at ``path`` of a sample."""
    return f"field {path!r}" if path else "the sample itself"


def describe(signature: Signature) -> tuple[str, str, str]:
    type_name, dtype, shape = signature
    return type_name, dtype, "-" if shape is None else str(list(shape))


@dataclass(frozen=True)
class _Length:
    type_name: str
    length: int


def _signature(value: Any) -> Signature:
    if isinstance(value, _Length):
        # The length is part of the contract: it decides how collation pairs the items.
        return value.type_name, "-", (value.length,)
    if isinstance(value, torch.Tensor):
        return "Tensor", str(value.dtype).removeprefix("torch."), tuple(value.shape)
    if isinstance(value, np.ndarray):
        return "ndarray", str(value.dtype), tuple(value.shape)
    if isinstance(value, np.generic):
        return type(value).__name__, str(value.dtype), None
    return type(value).__name__, "-", None


def flatten_sample(value: Any, path: str = "") -> dict[str, Any]:
    """Path -> leaf of a nested sample (``""`` is the sample itself when it is a leaf).

    A sequence also stands for its own length (the value at its own path), which
    decides how collation pairs its items.
    """
    out: dict[str, Any] = {}
    _flatten(value, path, out)
    return out


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{path}.{key}" if path else str(key), out)
        return
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        out[path] = _Length(type(value).__name__, len(value))
        for position, item in enumerate(value):
            _flatten(item, f"{path}[{position}]", out)
        return
    out[path] = value


def _difference(found: Signature, expected: Signature) -> str:
    if found[0] != expected[0]:
        return f"is {found[0]}, expected {expected[0]}"
    if found[1] != expected[1]:
        return f"has dtype {found[1]}, expected {expected[1]}"
    if found[0] not in ("Tensor", "ndarray"):
        return f"has length {found[2][0]}, expected {expected[2][0]}"
    return f"has shape {describe(found)[2]}, expected {describe(expected)[2]}"


def _global_generators() -> tuple[Any, Any, Any]:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _drawn_from(before: tuple[Any, Any, Any], after: tuple[Any, Any, Any]) -> list[str]:
    drawn = []
    if not torch.equal(before[0], after[0]):
        drawn.append("torch")
    if before[1] != after[1]:
        drawn.append("random")
    numpy_before, numpy_after = before[2], after[2]
    if numpy_before[2] != numpy_after[2] or not np.array_equal(numpy_before[1], numpy_after[1]):
        drawn.append("numpy")
    return drawn


def check_contract(dataset: Any, indices: Sequence[int]) -> ContractReport:
    """Read ``dataset[i]`` for each index (no collation) and check every field."""

    def read() -> Iterator[tuple[int, Any, BaseException | None]]:
        for index in indices:
            try:
                yield index, dataset[index], None
            except Exception as error:  # a failing sample is a finding, not the end of the audit
                yield index, None, error

    return _check(read(), "sample index", lambda index: f"dataset[{index}]")


def check_stream_contract(dataset: Any, limit: int | None) -> ContractReport:
    """Read an ``IterableDataset`` as a loader without workers does (one ``iter()``, then
    ``next()``), up to ``limit`` items, and check every field of each item."""

    def read() -> Iterator[tuple[int, Any, BaseException | None]]:
        number = 0
        try:
            iterator = iter(dataset)
            while limit is None or number < limit:
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                yield number, item, None
                number += 1
        except Exception as error:  # the stream ends at a failure: a finding
            yield number, None, error

    return _check(read(), "item", lambda number: f"reading item {number}")


def _check(
    samples: Iterator[tuple[int, Any, BaseException | None]],
    what: str,
    action: Callable[[int], str],
) -> ContractReport:
    report = ContractReport()
    per_sample: list[tuple[int, dict[str, Signature] | None]] = []
    counts: dict[str, Counter[Signature]] = {}
    before = _global_generators()
    for index, sample, error in samples:
        report.checked += 1
        if error is not None:
            text = f"{action(index)} raised {type(error).__name__}: {error}"
            report.violations.append(Violation(index, text, what))
            per_sample.append((index, None))
            continue
        signatures = {path: _signature(value) for path, value in flatten_sample(sample).items()}
        for path, signature in signatures.items():
            counts.setdefault(path, Counter())[signature] += 1
        per_sample.append((index, signatures))
    report.global_generators = _drawn_from(before, _global_generators())

    sampled = sum(1 for _, signatures in per_sample if signatures is not None)
    for path, counter in counts.items():
        # most_common keeps first-seen order on ties, so the reference is deterministic.
        report.references[path] = counter.most_common(1)[0]
    for index, signatures in per_sample:
        if signatures is None:
            continue
        for path, (expected, count) in report.references.items():
            found = signatures.get(path)
            if found is None:
                text = f"has no {field_name(path)} (present in {count} of {sampled} samples)"
                report.violations.append(Violation(index, text, what))
            elif found != expected:
                difference = _difference(found, expected)
                text = f"{field_name(path)} {difference} (like {count} of {sampled} samples)"
                report.violations.append(Violation(index, text, what))
    return report
