"""examples/fabric_quickstart.py, run as is: preempted by a SIGTERM to its process group, run
again, it ends with the weights of an uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "fabric_quickstart.py"
PREEMPT_AT = 15  # the second epoch (12 steps per epoch)


def _run(run_dir: Path, *flags: str) -> str:
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--run-dir", str(run_dir), *flags],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # the SIGTERM goes to the script's own process group
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_quickstart_preempted_and_run_again_ends_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    assert "finished 36 steps" in _run(tmp_path / "a")
    preempted = _run(tmp_path / "b", "--preempt-at-step", str(PREEMPT_AT))
    assert f"paused at step {PREEMPT_AT}" in preempted
    assert not (tmp_path / "b" / "final_weights.pt").exists()
    resumed = _run(tmp_path / "b", "--preempt-at-step", str(PREEMPT_AT))
    assert f"resumed at step {PREEMPT_AT}" in resumed
    assert "finished 36 steps" in resumed

    expected = torch.load(tmp_path / "a" / "final_weights.pt", weights_only=True)
    actual = torch.load(tmp_path / "b" / "final_weights.pt", weights_only=True)
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        assert torch.equal(value, actual[name]), name
