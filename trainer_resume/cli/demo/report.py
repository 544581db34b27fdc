"""The demo's comparison table: exact resume and weights-only resume against the reference."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from ...difference import first_difference, max_abs_difference
from ...durable import load_checkpoint
from .._common import format_table

__all__ = ["Results", "print_report"]

# The snapshot entries of the example trainer, in the order of the table.
_LABELS = {
    "model": "model (parameters and buffers)",
    "optimizer": "optimizer state (AdamW)",
    "scheduler": "LR schedule",
    "scaler": "GradScaler",
    "loader": "loader position",
    "extra": "counters (samples seen, steps)",
}


@dataclass
class Results:
    """The result files of the four phases, loaded."""

    reference: dict[str, Any]
    paused: dict[str, Any]
    resumed: dict[str, Any]
    weights_only: dict[str, Any]
    pause_step: int

    @classmethod
    def load(
        cls, *, reference: Path, paused: Path, resumed: Path, weights_only: Path, pause_step: int
    ) -> Results:
        return cls(
            load_checkpoint(reference),
            load_checkpoint(paused),
            load_checkpoint(resumed),
            load_checkpoint(weights_only),
            pause_step,
        )


def _difference(value: float) -> str:
    if value == 0:
        return "0"
    if math.isinf(value):
        return "structure differs"
    return f"{value:.3e}"


def _row(label: str, expected: Any, actual: Any) -> tuple[str, str, str]:
    identical = first_difference(expected, actual) is None
    return label, "yes" if identical else "NO", _difference(max_abs_difference(expected, actual))


def _losses(result: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(result["losses"], dtype=torch.float64)


def print_report(results: Results, out: TextIO) -> bool:
    """Print both comparisons; return whether the exact resume is bit-identical."""
    reference, k = results.reference, results.pause_step
    steps = reference["completed_steps"]
    expected, resumed = reference["snapshot"], results.resumed["snapshot"]
    rows = [
        _row(label, expected.get(name), resumed.get(name))
        for name, label in _LABELS.items()
        if name in expected
    ]
    losses = torch.cat([_losses(results.paused), _losses(results.resumed)])
    rows.append(_row(f"per-step losses (steps 1-{steps})", _losses(reference), losses))
    rows.append(_row("RNG draws after the last step", expected["rng"], resumed["rng"]))
    identical = all(row[1] == "yes" for row in rows)
    print(
        f"\nexact resume (paused at step {k}, resumed in a fresh process) vs uninterrupted reference",
        file=out,
    )
    print(format_table(("compared", "bit-identical", "max abs difference"), rows), file=out)
    print(f"  exact resume bit-identical: {'yes' if identical else 'no'}", file=out)

    weights = results.weights_only
    final_identical = first_difference(expected["model"], weights["snapshot"]["model"]) is None
    final_difference = max_abs_difference(expected["model"], weights["snapshot"]["model"])
    after = _losses(reference)[k:]
    got = _losses(weights)
    gap = (after - got).abs() if after.shape == got.shape else None
    differing = [] if gap is None else (gap > 0).nonzero().flatten().tolist()
    print(
        "\nweights-only resume (model weights from the same pause file; new optimizer, LR schedule,"
        "\n  GradScaler and RNG; loader from the start) vs uninterrupted reference",
        file=out,
    )
    rows = [("final weights", f"max abs difference {_difference(final_difference)}")]
    if gap is not None and gap.numel():
        relative = (
            float(gap.mean()) / float(after.abs().mean()) if float(after.abs().mean()) else math.inf
        )
        rows.append(
            (
                f"losses after step {k} (steps {k + 1}-{steps})",
                f"max abs difference {_difference(float(gap.max()))}, "
                f"mean {_difference(float(gap.mean()))} ({relative:.0%} of the mean loss)",
            )
        )
        rows.append(
            ("first differing loss", f"step {k + 1 + differing[0]}" if differing else "none")
        )
    print(format_table(("compared", "result"), rows), file=out)
    print(
        f"  weights-only resume bit-identical: {'yes' if final_identical and not differing else 'no'}",
        file=out,
    )
    return identical
