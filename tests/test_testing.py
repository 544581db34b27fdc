"""assert_training_resume and its comparison helpers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from support.trainers import TinyTrainer, make_tiny, run_tiny_step, snapshot_tiny

from trainer_resume.rng import random_state, restore_random_state
from trainer_resume.testing import (
    assert_training_resume,
    first_difference,
    max_abs_difference,
)


class NudgedAfterResume(TinyTrainer):
    def resume(self, path):
        super().resume(path)
        with torch.no_grad():
            self.model.weight[0, 1] += 0.5


class UndecoratedStep(TinyTrainer):
    def train_step(self):
        return TinyTrainer.train_step.__wrapped__(self)


built: list[TinyTrainer] = []


def make_recorded(kind=TinyTrainer):
    trainer = kind()
    built.append(trainer)
    return trainer


def make_nudged() -> TinyTrainer:
    return NudgedAfterResume()


def test_failure_names_the_step_the_key_and_the_max_abs_difference(tmp_path):
    with pytest.raises(AssertionError) as raised:
        assert_training_resume(make_nudged, run_tiny_step, tmp_path / "p.ckpt", 2, 4, snapshot_tiny)
    message = str(raised.value)
    assert "snapshot right after resume (step 2)" in message
    assert (
        "model/weight differs: 1 of 8 values, max abs difference 0.5" in message
    )  # weight is 2 x 4


def test_later_step_results_are_compared_step_by_step(tmp_path):
    def loss_only(trainer):
        return {"position": trainer.position}  # blind to the weights: the losses must catch it

    with pytest.raises(
        AssertionError, match=r"run_step result of step 3 after resume: the value differs.*max abs"
    ):
        assert_training_resume(make_nudged, run_tiny_step, tmp_path / "p.ckpt", 2, 4, loss_only)


def test_a_step_that_is_not_refused_after_pause_fails_the_check(tmp_path):
    with pytest.raises(AssertionError, match="not refused with TrainingPausedError"):
        assert_training_resume(
            UndecoratedStep, run_tiny_step, tmp_path / "p.ckpt", 1, 2, snapshot_tiny
        )


def test_every_trainer_is_closed_and_the_caller_rng_is_restored(tmp_path):
    built.clear()
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    expected = (random.random(), np.random.rand(), torch.rand(2))
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    assert_training_resume(make_recorded, run_tiny_step, tmp_path / "p.ckpt", 2, 4, snapshot_tiny)
    drawn = (random.random(), np.random.rand(), torch.rand(2))
    assert drawn[:2] == expected[:2] and torch.equal(drawn[2], expected[2])
    assert len(built) == 3 and all(trainer.closed for trainer in built)


def test_snapshots_that_draw_random_numbers_do_not_shift_the_run(tmp_path):
    def drawing_snapshot(trainer):
        return {**snapshot_tiny(trainer), "draw": torch.rand(2)}

    assert_training_resume(make_tiny, run_tiny_step, tmp_path / "p.ckpt", 2, 4, drawing_snapshot)


class SkipsRngRestore(TinyTrainer):
    def resume(self, path):
        before = random_state()
        super().resume(path)
        restore_random_state(before)


def test_missing_rng_restore_is_caught_even_when_the_constructor_seeds_identically(tmp_path):
    # Paused right after construction, the saved RNG equals what a fresh constructor
    # sets up: only the deliberate advance before resume() exposes the missing restore.
    with pytest.raises(AssertionError, match=r"right after resume \(step 0\): rng/python differs"):
        assert_training_resume(
            SkipsRngRestore, run_tiny_step, tmp_path / "p.ckpt", 0, 2, snapshot_tiny
        )


def test_new_process_needs_importable_callbacks(tmp_path):
    with pytest.raises(TypeError, match="importable callbacks"):
        assert_training_resume(
            lambda: TinyTrainer(),
            run_tiny_step,
            tmp_path / "p",
            1,
            2,
            snapshot_tiny,
            new_process=True,
        )


def test_pause_point_outside_the_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="pause_after"):
        assert_training_resume(make_tiny, run_tiny_step, tmp_path / "p", 5, 4, snapshot_tiny)


class ResumeRaises(TinyTrainer):
    def resume(self, path):
        raise OSError("disk gone")


@pytest.mark.slow
def test_error_in_the_resume_process_is_raised_in_the_caller_with_its_traceback(tmp_path):
    with pytest.raises(RuntimeError, match=r"in the resume process:(.|\n)*OSError: disk gone"):
        assert_training_resume(
            ResumeRaises, run_tiny_step, tmp_path / "p.ckpt", 1, 2, snapshot_tiny, new_process=True
        )


def test_first_difference_reports_path_shape_dtype_and_values():
    base = {"a": {"w": torch.tensor([1.0, math.nan, 3.0])}, "n": [1, 2.5, "x"]}
    same = {"a": {"w": torch.tensor([1.0, math.nan, 3.0])}, "n": [1, 2.5, "x"]}
    assert first_difference(base, same) is None
    changed = {"a": {"w": torch.tensor([1.0, math.nan, 3.25])}, "n": [1, 2.5, "x"]}
    assert first_difference(base, changed) == (
        "a/w",
        "1 of 3 values, max abs difference 0.25",
        0.25,
    )
    assert (
        first_difference(base, {"a": {"w": base["a"]["w"].double()}, "n": base["n"]}).path == "a/w"
    )
    assert first_difference(base, {"a": base["a"], "n": [1, 2.5]}).detail == "length 3 != 2"
    assert first_difference(base, {"a": base["a"], "n": [1, 2.5, "y"]}).path == "n/2"
    assert first_difference({"k": 1}, {"k": 1.0}) is None  # numbers compare by value
    assert first_difference({"k": 1}, {"j": 1}).detail == "keys missing ['k'], unexpected ['j']"


def test_integer_tensors_are_compared_exactly():
    big = torch.tensor([2**62], dtype=torch.int64)
    assert first_difference(big, big + 1).max_abs_difference == 1.0


def test_max_abs_difference_is_zero_for_identical_and_infinite_for_other_structures():
    a = {"x": torch.tensor([1.0, 2.0]), "y": 3}
    assert max_abs_difference(a, {"x": torch.tensor([1.0, 2.0]), "y": 3}) == 0.0
    assert max_abs_difference(a, {"x": torch.tensor([1.0, 2.5]), "y": 4}) == 1.0
    assert max_abs_difference(a, {"x": torch.tensor([1.0]), "y": 3}) == math.inf


class RenamesKeysOnDisk(TinyTrainer):
    """A file hook that writes the model's keys under other names than the pause built."""

    def _save_pause_checkpoint(self, checkpoint, path):
        broken = dict(checkpoint)
        broken["objects"] = dict(checkpoint["objects"])
        model = checkpoint["objects"]["model"]
        broken["objects"]["model"] = {f"renamed.{key}": value for key, value in model.items()}
        super()._save_pause_checkpoint(broken, path)


def make_renaming() -> TinyTrainer:
    return RenamesKeysOnDisk()


def test_a_pause_file_its_own_trainer_would_refuse_fails_the_check_right_after_the_pause(
    tmp_path,
):
    with pytest.raises(AssertionError) as raised:
        assert_training_resume(
            make_renaming, run_tiny_step, tmp_path / "p.ckpt", 2, 4, snapshot_tiny
        )
    message = str(raised.value)
    assert "the pause at step 2 is refused by the checks of resume()" in message
    assert "renamed.weight" in message
