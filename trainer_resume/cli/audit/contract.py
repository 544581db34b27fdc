"""The output contract of a dataset, checked sample by sample before collation.

A sample is a mapping with an ``"id"`` field (an int, a str, or a 0-d integer
tensor/array) and any other fields. Each field (nested mappings and sequences are
walked, e.g. ``meta.size`` or ``boxes[0]``) must keep one type and, for tensors and
arrays, one dtype and one shape across samples. The most common signature of a
field is its reference; every sample that differs is reported by its id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._common import UsageError

__all__ = ["ID_FIELD", "AuditUsageError", "ContractReport", "Violation", "check_contract", "sample_id"]

ID_FIELD = "id"

# (type name, dtype or "-", shape or None)
Signature = tuple[str, str, "tuple[int, ...] | None"]


class AuditUsageError(UsageError):
    """The audited target cannot be used as documented (bad factory, no id field)."""


@dataclass(frozen=True)
class Violation:
    """One sample that breaks the contract."""

    index: int
    sample_id: int | str | None
    text: str

    def __str__(self) -> str:
        who = f"sample id {self.sample_id!r}" if self.sample_id is not None else "sample"
        return f"{who} (index {self.index}): {self.text}"


@dataclass
class ContractReport:
    """What ``check_contract`` found over the checked indices."""

    checked: int = 0
    complete: bool = False  # every index of the dataset was checked
    ids: list[int | str] = field(default_factory=list)
    references: dict[str, tuple[Signature, int]] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)


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


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{path}.{key}" if path else str(key), out)
        return
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        # The length is part of the contract too: it decides how collation pairs items.
        out[path] = _Length(type(value).__name__, len(value))
        for position, item in enumerate(value):
            _flatten(item, f"{path}[{position}]", out)
        return
    out[path] = value


def sample_id(sample: Any) -> int | str:
    """The id carried by ``sample`` (see the module docstring).

    Raises:
        AuditUsageError: the sample is not a mapping or has no usable id.
    """
    if not isinstance(sample, Mapping):
        raise AuditUsageError(
            f"samples must be mappings (dicts) with an {ID_FIELD!r} field; got {type(sample).__name__}"
        )
    if ID_FIELD not in sample:
        raise AuditUsageError(f"a sample has no {ID_FIELD!r} field (fields: {', '.join(map(str, sample))})")
    value = sample[ID_FIELD]
    if isinstance(value, torch.Tensor):
        integral = not (value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool)
        if value.ndim == 0 and integral:
            return int(value.item())
    elif isinstance(value, (np.ndarray, np.generic)):
        if np.ndim(value) == 0 and np.issubdtype(value.dtype, np.integer):
            return int(value)
    elif isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    raise AuditUsageError(
        f"the {ID_FIELD!r} field must be an int, a str or a 0-d integer tensor; got {type(value).__name__}: {value!r}"
    )


def _difference(found: Signature, expected: Signature) -> str:
    if found[0] != expected[0]:
        return f"is {found[0]}, expected {expected[0]}"
    if found[1] != expected[1]:
        return f"has dtype {found[1]}, expected {expected[1]}"
    if found[0] not in ("Tensor", "ndarray"):
        return f"has length {found[2][0]}, expected {expected[2][0]}"
    return f"has shape {describe(found)[2]}, expected {describe(expected)[2]}"


def check_contract(dataset: Any, indices: Sequence[int]) -> ContractReport:
    """Read ``dataset[i]`` for each index (no collation) and check every field.

    Raises:
        AuditUsageError: a sample is not a mapping with an id (the audit cannot go on).
    """
    report = ContractReport(checked=len(indices))
    per_sample: list[tuple[int, int | str | None, dict[str, Signature] | None]] = []
    counts: dict[str, Counter[Signature]] = {}
    first_index_of_id: dict[int | str, int] = {}
    for index in indices:
        try:
            sample = dataset[index]
        except Exception as error:  # a failing sample is a finding, not the end of the audit
            report.violations.append(Violation(index, None, f"dataset[{index}] raised {type(error).__name__}: {error}"))
            per_sample.append((index, None, None))
            continue
        ident = sample_id(sample)
        if ident in first_index_of_id:
            report.violations.append(Violation(index, ident, f"id already used by index {first_index_of_id[ident]}"))
        else:
            first_index_of_id[ident] = index
            report.ids.append(ident)
        flat: dict[str, Any] = {}
        _flatten(sample, "", flat)
        signatures = {path: _signature(value) for path, value in flat.items()}
        for path, signature in signatures.items():
            counts.setdefault(path, Counter())[signature] += 1
        per_sample.append((index, ident, signatures))

    sampled = sum(1 for _, _, signatures in per_sample if signatures is not None)
    for path, counter in counts.items():
        # most_common keeps first-seen order on ties, so the reference is deterministic.
        report.references[path] = counter.most_common(1)[0]
    for index, ident, signatures in per_sample:
        if signatures is None:
            continue
        for path, (expected, count) in report.references.items():
            found = signatures.get(path)
            if found is None:
                report.violations.append(
                    Violation(index, ident, f"has no field {path!r} (present in {count} of {sampled} samples)")
                )
            elif found != expected:
                report.violations.append(
                    Violation(
                        index,
                        ident,
                        f"field {path!r} {_difference(found, expected)} (like {count} of {sampled} samples)",
                    )
                )
    return report
