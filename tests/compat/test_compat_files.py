"""Files written before the package's modules moved into subpackages resume exactly.

The package as it was at commit 21f14a5 writes a mixin trainer's pause file, a
resume-point directory, a Lightning pause file and the pause directory of a model
sharded over 2 ranks (``make_fixtures.py``), once per run of this module, on this machine:
a file written on another CPU would continue with that CPU's rounding. Each is resumed
by the current code and continued to the step an uninterrupted run of the current code
stops at: every tensor of every state, the losses after the pause and the generators'
states must be equal.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from support import earlier_release

from compat import trainers
from trainer_resume.testing import first_difference

EARLIER_LAYOUT = "21f14a5"  # the last commit before the modules moved into subpackages


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the earlier layout writes, made once for this module."""
    scratch = tmp_path_factory.mktemp("earlier")
    package_root = earlier_release.extract(EARLIER_LAYOUT, scratch / "package")
    out = scratch / "fixtures"
    earlier_release.run_script(package_root, Path(__file__).with_name("make_fixtures.py"), str(out))
    return out


def _assert_same(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def _uninterrupted(steps: int) -> dict[str, Any]:
    trainer = trainers.CompatTrainer()
    trainer.run_to(steps)
    trainer.loader.close()
    return trainer.outcome()


def _after(outcome: dict[str, Any], step: int) -> dict[str, Any]:
    """``outcome`` with only the losses of the steps after ``step``."""
    return {**outcome, "losses": outcome["losses"][step:]}


def test_a_pause_file_of_the_mixin_resumes_bitwise_equal_to_the_uninterrupted_run(
    fixtures, tmp_path
):
    shutil.copy(fixtures / "single" / "pause.ckpt", tmp_path / "pause.ckpt")
    resumed = trainers.CompatTrainer()
    resumed.resume(tmp_path / "pause.ckpt")
    assert resumed.completed_steps == trainers.PAUSE_STEP
    resumed.run_to(trainers.STEPS)
    resumed.loader.close()
    expected = _uninterrupted(trainers.STEPS)
    _assert_same(_after(expected, trainers.PAUSE_STEP), resumed.outcome(), "pause file")


def test_a_resume_point_directory_resumes_bitwise_equal_to_the_uninterrupted_run(
    fixtures, tmp_path
):
    directory = shutil.copytree(fixtures / "points", tmp_path / "points")
    resumed = trainers.CompatTrainer()
    path = resumed.resume_latest(directory)
    assert Path(path).name == f"point-{trainers.POINT_STEPS:012d}.ckpt"
    assert resumed.completed_steps == trainers.POINT_STEPS
    resumed.run_to(trainers.STEPS)
    resumed.loader.close()
    expected = _uninterrupted(trainers.STEPS)
    _assert_same(_after(expected, trainers.POINT_STEPS), resumed.outcome(), "resume point")


def test_a_lightning_pause_file_resumes_bitwise_equal_to_the_uninterrupted_fit(fixtures, tmp_path):
    resumed = shutil.copytree(fixtures / "lightning", tmp_path / "resumed")
    (tmp_path / "reference").mkdir()
    expected = trainers.fit_lightning(tmp_path / "reference")
    actual = trainers.fit_lightning(resumed, resume=True)
    assert len(actual["losses"]) == trainers.STEPS - trainers.PAUSE_STEP
    _assert_same(_after(expected, trainers.PAUSE_STEP), actual, "Lightning pause file")


@pytest.mark.slow  # one pair of spawned gloo ranks
def test_a_sharded_pause_directory_resumes_bitwise_equal_on_every_rank(fixtures, tmp_path):
    directory = shutil.copytree(fixtures / "sharded", tmp_path / "sharded")
    trainers.run_sharded_ranks("continue", directory, tmp_path)
    for rank in range(trainers.WORLD):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        expected, actual = result["reference"], result["resumed"]
        assert actual["completed_steps"] == trainers.SHARDED_STEPS
        _assert_same(
            _after(expected, trainers.SHARDED_PAUSE_STEP), actual, f"sharded pause, rank {rank}"
        )
