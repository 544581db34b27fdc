"""One comparison rule for nested states, NaN included (trainer_resume.difference)."""

from __future__ import annotations

import io
import math

import torch

from trainer_resume.cli.demo.report import Results, print_report
from trainer_resume.difference import first_difference, max_abs_difference


def test_nan_at_the_same_place_is_no_difference_in_tensors_floats_and_complex_numbers():
    state = {
        "w": torch.tensor([1.0, math.nan]),
        "loss": math.nan,
        "z": complex(math.nan, 0.0),
    }
    copy = {
        "w": torch.tensor([1.0, math.nan]),
        "loss": math.nan,
        "z": complex(math.nan, 0.0),
    }
    assert first_difference(state, copy) is None
    assert max_abs_difference(state, copy) == 0.0


def test_nan_against_a_number_is_an_infinite_difference():
    difference = first_difference(
        {"w": torch.tensor([math.nan, 1.0])}, {"w": torch.tensor([0.0, 1.0])}
    )
    assert (
        difference is not None
        and difference.path == "w"
        and difference.max_abs_difference == math.inf
    )
    assert max_abs_difference([math.nan], [0.0]) == math.inf


def test_the_demo_report_applies_the_same_nan_rule():
    def phase(losses):
        snapshot = {
            "model": {"weight": torch.tensor([math.nan, 1.0])},
            "rng": {"torch": torch.ones(2)},
        }
        return {"losses": losses, "completed_steps": len(losses), "snapshot": snapshot}

    reference = phase([1.0, math.nan, 0.5])
    results = Results(
        reference, phase([1.0]), phase([math.nan, 0.5]), phase([2.0, 2.0]), pause_step=1
    )
    out = io.StringIO()
    assert print_report(results, out)
    assert "  exact resume bit-identical: yes" in out.getvalue().splitlines()
