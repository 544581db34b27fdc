"""A trainer that returns its ``ReuseDataLoader`` pauses at any step and resumes in a new
process bit for bit: on a real SIGTERM, and from a resume point after a SIGKILL.

Every run is a process of its own (``support/reuse_trainer.py``): two workers, a
``collate_fn`` that draws, samples built with random draws, Dropout, a per-epoch LR step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import reuse_trainer

from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
STEPS = reuse_trainer.EPOCHS * reuse_trainer.BATCHES_PER_EPOCH


def _run(mode: str, workdir: Path, step: int | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "support.reuse_trainer", mode, str(workdir)]
    return subprocess.run(
        command + ([] if step is None else [str(step)]),
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _result(workdir: Path, mode: str) -> dict[str, Any]:
    return torch.load(workdir / f"{mode}.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("reference")
    done = _run("reference", workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return _result(workdir, "reference")


def _assert_continues(
    reference: dict[str, Any], parts: list[dict[str, Any]], first_step: int = 1
) -> None:
    """The losses of steps ``first_step``.. and the final states equal the reference's."""
    losses: dict[int, torch.Tensor] = {}
    for part in parts:
        losses.update(part["losses"])
    assert sorted(losses) == list(range(first_step, STEPS + 1))
    expected = {step: loss for step, loss in reference["losses"].items() if step >= first_step}
    for record, actual in (
        ("losses", losses),
        ("model", parts[-1]["model"]),
        ("optimizer", parts[-1]["optimizer"]),
    ):
        difference = first_difference(expected if record == "losses" else reference[record], actual)
        assert difference is None, f"{record}: {difference.describe()}"


def test_a_sigterm_at_an_epochs_last_batch_pauses_after_the_epochs_work_and_resumes_exactly(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    last = reuse_trainer.BATCHES_PER_EPOCH  # the first epoch's last batch
    paused = _run("signal", tmp_path, last)
    assert paused.returncode == 0, paused.stderr[-3000:]
    # At the next boundary, after the per-epoch LR step: one batch into the next epoch.
    assert _result(tmp_path, "signal")["paused_at"] == last + 1
    resumed = _run("resume", tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_continues(reference, [_result(tmp_path, "signal"), _result(tmp_path, "resume")])


def test_a_run_killed_inside_an_epoch_resumes_from_its_latest_point_exactly(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    killed = _run("points", tmp_path, 8)  # killed inside step 8, of the second epoch
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _run("latest", tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _result(tmp_path, "latest")
    first = min(after["losses"])
    assert 1 < first <= 8  # from a point inside the run, not from its start
    _assert_continues(reference, [after], first_step=first)
