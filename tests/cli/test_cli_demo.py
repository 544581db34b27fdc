"""``trainer-resume demo``: the exact resume after a real SIGTERM, against a weights-only resume."""

from __future__ import annotations

import re

import pytest
import torch
from support.cli import run_cli

from trainer_resume.cli import main
from trainer_resume.cli.demo.report import Results, print_report


@pytest.mark.slow
def test_demo_resumes_bit_identically_after_sigterm_and_weights_only_differs(tmp_path, capsys):
    workdir = tmp_path / "run"
    result = run_cli(
        "demo", "train.steps=16", "--pause-after", "4", "--no-progress", "data.num_samples=80",
        "--workdir", str(workdir),
        cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "  exact resume bit-identical: yes" in lines
    exact = lines[
        lines.index("  exact resume bit-identical: yes") - 8 : lines.index(
            "  exact resume bit-identical: yes"
        )
    ]
    assert [line.rsplit(None, 2)[1:] for line in exact] == [["yes", "0"]] * 8, "\n".join(exact)
    final = next(line for line in lines if line.strip().startswith("final weights"))
    assert float(final.split()[-1]) > 0
    assert "  weights-only resume bit-identical: no" in lines

    paused = re.search(
        r"SIGTERM sent after step (\d+), paused at step (\d+): pause file [\d,]+ B, exit status 0",
        result.stdout,
    )
    assert paused and 4 <= int(paused.group(1)) <= int(paused.group(2)) < 16
    # The kept pause file is a real one: inspect reads the step it was written at.
    assert main(["inspect", str(workdir / "pause.ckpt"), "--json"]) == 0
    assert f'"completed_steps": {paused.group(2)},' in capsys.readouterr().out


def test_unknown_override_key_is_refused_naming_the_key(capsys):
    assert main(["demo", "optimizer.learning_rate=0.1"]) == 2
    assert capsys.readouterr().err == (
        "error: unknown config key 'optimizer.learning_rate' (override 'optimizer.learning_rate=0.1')\n"
    )


def test_override_of_another_type_is_refused_naming_the_key(capsys):
    assert main(["demo", "train.steps=many"]) == 2
    assert (
        "config key 'train.steps' is an int (200); the override gives a str ('many')"
        in capsys.readouterr().err
    )


def test_pause_point_after_the_last_step_is_refused(capsys):
    assert main(["demo", "train.steps=10", "--pause-after", "10"]) == 2
    assert "--pause-after must be between 1 and 9" in capsys.readouterr().err


def test_missing_config_file_is_refused(tmp_path, capsys):
    assert main(["demo", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err == f"error: config file not found: {tmp_path / 'absent.yaml'}\n"


def phase(losses, **changes):
    snapshot = {
        "model": {"weight": torch.ones(3)},
        "optimizer": {"state": {0: torch.zeros(2)}},
        "rng": {"torch": torch.ones(2)},
    }
    snapshot.update(changes)
    return {"losses": losses, "completed_steps": len(losses), "snapshot": snapshot}


def report(resumed_changes: dict) -> tuple[bool, str]:
    import io

    reference = phase([1.0, 0.5, 0.25, 0.125])
    resumed = phase([0.25, 0.125], **resumed_changes)
    weights_only = phase([0.3, 0.2], model={"weight": torch.full((3,), 2.0)})
    out = io.StringIO()
    results = Results(reference, phase([1.0, 0.5]), resumed, weights_only, pause_step=2)
    return print_report(results, out), out.getvalue()


def test_report_says_yes_only_when_every_compared_entry_is_identical():
    identical, text = report({})
    assert identical and "  exact resume bit-identical: yes" in text.splitlines()
    assert "max abs difference 1.000e+00" in text  # weights-only: 2.0 vs 1.0


def test_report_names_a_one_ulp_difference_in_the_optimizer_state():
    nudged = torch.zeros(2)
    nudged[1] = torch.nextafter(torch.tensor(0.0), torch.tensor(1.0))
    identical, text = report({"optimizer": {"state": {0: nudged}}})
    assert not identical
    row = next(line for line in text.splitlines() if line.strip().startswith("optimizer state"))
    assert row.split()[-2:] == ["NO", "1.401e-45"]
    assert "  exact resume bit-identical: no" in text.splitlines()


def test_report_shows_a_changed_structure_as_structure_differs():
    identical, text = report({"optimizer": {"state": {0: torch.zeros(3)}}})
    assert not identical
    row = next(line for line in text.splitlines() if line.strip().startswith("optimizer state"))
    assert row.split()[-3:] == ["NO", "structure", "differs"]
