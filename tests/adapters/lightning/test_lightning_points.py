"""ResumePointsCallback: resume points of a Lightning fit change nothing and resume exactly."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from support.lightning_child import CONFIG, SEED, Regressor, build_loader, build_trainer, result

from trainer_resume import mark_finished
from trainer_resume.adapters.lightning import ResumeCallback, ResumePointsCallback
from trainer_resume.resume_points.files import list_points, point_name
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.slow  # three in-process fits

STEPS = 8


class Crash(Exception):
    """Ends a fit the way a kill would: no pause, no finished marker."""


class CrashAfter(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Crash(f"crashed after step {self.step}")


def fit(
    steps: int,
    tmp_path: Path,
    *,
    points_every: int | None = None,
    resume: bool = False,
    crash_after: int | None = None,
    remove_chosen: bool = False,
) -> dict[str, Any]:
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    model = Regressor()
    pause = ResumeCallback(tmp_path / "pause.ckpt", signals=(), config=CONFIG)
    callbacks: list[Any] = [pause]
    ckpt_path = None
    if points_every is not None:
        points = ResumePointsCallback(
            pause, tmp_path / "points", every_n_steps=points_every, when_busy="wait"
        )
        callbacks.append(points)
        ckpt_path = points.ckpt_path if resume else None
        if remove_chosen:  # as a running writer's retention would, between ckpt_path and fit
            os.remove(ckpt_path)
    if crash_after is not None:
        callbacks.append(CrashAfter(crash_after))
    trainer = build_trainer(steps=steps, epoch_batches=0, callbacks=callbacks)
    try:
        trainer.fit(model, build_loader(workers=0), ckpt_path=ckpt_path)
    except Crash:
        pass
    return {**result(model, trainer), "ckpt_path": ckpt_path}


def assert_equal(expected: Any, actual: Any, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return fit(STEPS, tmp_path_factory.mktemp("reference"))


def test_fit_with_points_equals_fit_without_and_resumes_exactly_from_the_newest(
    tmp_path, reference
):
    crashed = fit(STEPS, tmp_path, points_every=2, crash_after=5)  # points at 2 and 4
    assert_equal(
        {k: reference["losses"][k] for k in range(1, 6)}, crashed["losses"], "losses with points"
    )
    assert [steps for steps, _ in list_points(tmp_path / "points")] == [2, 4]

    # fit resumes from the read ckpt_path verified: the point is not read again, so
    # its removal in between changes nothing.
    resumed = fit(STEPS, tmp_path, points_every=2, resume=True, remove_chosen=True)
    assert resumed["ckpt_path"] == str(tmp_path / "points" / point_name(4))
    assert_equal(
        {k: reference["losses"][k] for k in range(5, STEPS + 1)}, resumed["losses"], "losses"
    )
    assert_equal(reference["model"], resumed["model"], "weights")
    assert_equal(reference["optimizer"], resumed["optimizer"], "optimizer")
    # The fit completed: the run is finished and its points are retired.
    assert os.listdir(tmp_path / "points") == ["run.finished"]
    pause = ResumeCallback(tmp_path / "pause.ckpt", signals=(), config=CONFIG)
    assert ResumePointsCallback(pause, tmp_path / "points", every_n_steps=2).ckpt_path is None


def test_ckpt_path_of_a_finished_point_directory_is_none(tmp_path):
    pause = ResumeCallback(tmp_path / "pause.ckpt", signals=(), config=CONFIG)
    points = ResumePointsCallback(pause, tmp_path / "points", every_n_steps=2)
    mark_finished(tmp_path / "points", completed_steps=8)
    assert points.ckpt_path is None
