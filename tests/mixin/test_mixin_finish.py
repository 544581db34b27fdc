"""finish(): a completed run retires its pause file, and resuming it again is refused."""

from __future__ import annotations

import pytest
from support.trainers import TinyTrainer

from trainer_resume import run_finished
from trainer_resume.durable import load_checkpoint
from trainer_resume.errors import CheckpointSignatureError, RunFinishedError
from trainer_resume.mixin import training_step
from trainer_resume.testing import first_difference

KEY = b"s" * 32


def test_finish_replaces_the_pause_file_with_a_marker_of_the_final_step(tmp_path):
    path = tmp_path / "pause.ckpt"
    first = TinyTrainer()
    first.train_step()
    first.pause(path)
    second = TinyTrainer()
    second.resume(path)
    for _ in range(3):
        second.train_step()
    marker = second.finish(path)
    assert not path.exists()
    assert marker == str(path) + ".finished"
    finished = run_finished(path)
    assert finished is not None and finished.completed_steps == 4


def test_resume_of_a_finished_run_is_refused_before_anything_changes(tmp_path):
    path = tmp_path / "pause.ckpt"
    source = TinyTrainer()
    source.train_step()
    source.pause(path)
    source.resume(path)
    source.train_step()
    source.finish(path)
    trainer = TinyTrainer()
    trainer.train_step()
    before = trainer.state()
    with pytest.raises(
        RunFinishedError, match=r"records the end of the run after step 2"
    ) as raised:
        trainer.resume(path)
    assert "run_finished" in str(raised.value)
    difference = first_difference(before, trainer.state())
    assert difference is None, difference.describe()
    assert not trainer.locked


def test_a_pause_file_left_beside_the_marker_is_not_resumed(tmp_path):
    # A crash between the marker and the removal leaves both: the marker wins.
    path = tmp_path / "pause.ckpt"
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.finish(path)
    trainer.pause(path)
    with pytest.raises(RunFinishedError):
        TinyTrainer().resume(path)


def test_finish_signs_the_marker_with_the_trainer_key(tmp_path):
    path = tmp_path / "pause.ckpt"
    trainer = TinyTrainer(key=KEY)
    trainer.train_step()
    trainer.finish(path)
    assert run_finished(path, key=KEY).completed_steps == 1
    with pytest.raises(CheckpointSignatureError):
        load_checkpoint(str(path) + ".finished", key=b"o" * 32)
    with pytest.raises(RunFinishedError):
        TinyTrainer(key=KEY).resume(path)


def test_finish_inside_a_training_step_is_refused(tmp_path):
    class FinishesInside(TinyTrainer):
        @training_step
        def train_step(self):
            self.finish(tmp_path / "pause.ckpt")

    with pytest.raises(RuntimeError, match=r"finish\(\) was called inside a training step"):
        FinishesInside().train_step()
    assert run_finished(tmp_path / "pause.ckpt") is None
