"""examples/lightning_quickstart.py, run end to end: preempted by SIGTERM, run again,
it ends with the weights of an uninterrupted run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from support import lightning_procs as procs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "lightning_quickstart.py"
CONFIG = ROOT / "configs" / "lightning_example.yaml"


def _run(run_dir: Path, log: Path, *flags: str) -> str:
    command = [
        sys.executable,
        str(SCRIPT),
        str(CONFIG),
        f"run_dir={run_dir}",
        "trainer.max_steps=24",
        *flags,
    ]
    done = procs.run(command, log)
    assert done.returncode == 0, procs.describe_failure(done, log)
    return done.stdout


def test_quickstart_preempted_and_run_again_ends_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    uninterrupted = _run(tmp_path / "a", tmp_path / "a.txt")
    assert "finished 24 steps" in uninterrupted

    preempted = _run(tmp_path / "b", tmp_path / "b1.txt", "--preempt-at-step", "9")
    assert "paused at step" in preempted
    assert (tmp_path / "b" / "pause.ckpt").is_file() and not (
        tmp_path / "b" / "final_weights.pt"
    ).exists()
    resumed = _run(tmp_path / "b", tmp_path / "b2.txt", "--preempt-at-step", "9")
    assert "finished 24 steps" in resumed
    # Requeued once more after the end: exits 0 without training.
    assert "is finished" in _run(tmp_path / "b", tmp_path / "b3.txt")
    assert not (tmp_path / "b" / "pause.ckpt").exists()

    expected = torch.load(tmp_path / "a" / "final_weights.pt", weights_only=True)
    actual = torch.load(tmp_path / "b" / "final_weights.pt", weights_only=True)
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        assert torch.equal(value, actual[name]), name
