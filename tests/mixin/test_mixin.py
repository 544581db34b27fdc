"""TrainingResumeMixin: steps, pause/resume, failures, locks, threads and signals."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
import torch
from support.trainers import (
    TinyTrainer,
    TwoCounterTrainer,
    make_tiny,
    run_tiny_step,
    snapshot_tiny,
)

from trainer_resume.durable import load_checkpoint
from trainer_resume.errors import (
    CheckpointWriteError,
    PauseBlockedError,
    TrainerLockedError,
    TrainingPausedError,
)
from trainer_resume.mixin import TrainingResumeMixin, _setup, training_step
from trainer_resume.testing import assert_training_resume, first_difference


def assert_same_state(before, after):
    difference = first_difference(before, after)
    assert difference is None, difference.describe()


def reference_losses(steps: int) -> list[torch.Tensor]:
    trainer = TinyTrainer()
    return [trainer.train_step() for _ in range(steps)]


@pytest.mark.parametrize("pause_after", [0, 1, 3, 5])
def test_fresh_trainer_resumed_after_k_steps_matches_uninterrupted_run(tmp_path, pause_after):
    assert_training_resume(
        make_tiny, run_tiny_step, tmp_path / "pause.ckpt", pause_after, 7, snapshot_tiny
    )


def test_trainer_without_initialization_names_the_missing_call(tmp_path):
    class Forgetful(TrainingResumeMixin):
        @training_step
        def step(self):
            return 1

    trainer = Forgetful()
    for action in (
        trainer.step,
        lambda: trainer.pause(tmp_path / "p"),
        lambda: trainer.resume(tmp_path / "p"),
    ):
        with pytest.raises(
            RuntimeError, match=r"_initialize_training_resume\(config, version=\.\.\.\)"
        ):
            action()


def test_step_on_paused_trainer_is_refused_and_changes_nothing(tmp_path):
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    before = trainer.state()
    with pytest.raises(TrainingPausedError):
        trainer.train_step()
    assert_same_state(before, trainer.state())
    assert trainer.paused and trainer.completed_steps == 1


def test_resume_unpauses_and_continues_the_same_trainer(tmp_path):
    expected = reference_losses(4)
    trainer = TinyTrainer()
    losses = [trainer.train_step() for _ in range(2)]
    trainer.pause(tmp_path / "pause.ckpt")
    trainer.resume(tmp_path / "pause.ckpt")
    losses += [trainer.train_step() for _ in range(2)]
    assert not trainer.paused
    assert all(torch.equal(a, b) for a, b in zip(expected, losses))


def test_nested_training_steps_count_once():
    class Nested(TinyTrainer):
        @training_step
        def outer(self):
            self.train_step()
            self.train_step()

    trainer = Nested()
    trainer.outer()
    assert trainer.completed_steps == 1
    assert trainer.position == 2


def test_failed_step_reraises_unchanged_and_blocks_pause_until_a_step_succeeds(tmp_path):
    class Flaky(TinyTrainer):
        fail = False

        @training_step
        def train_step(self):
            if self.fail:
                raise self.fail
            return super().train_step()

    trainer = Flaky()
    trainer.train_step()
    error = ValueError("bad batch")
    trainer.fail = error
    with pytest.raises(ValueError) as raised:
        trainer.train_step()
    assert raised.value is error
    before = trainer.state()
    with pytest.raises(PauseBlockedError):
        trainer.pause(tmp_path / "pause.ckpt")
    assert not (tmp_path / "pause.ckpt").exists()
    assert_same_state(before, trainer.state())
    trainer.fail = False
    trainer.train_step()  # retrying is allowed and clears the failure
    trainer.pause(tmp_path / "pause.ckpt")
    assert load_checkpoint(tmp_path / "pause.ckpt")["completed_steps"] == 2


def test_resume_clears_a_failed_step(tmp_path):
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    other = TinyTrainer()
    other.batches = None  # the next step raises TypeError
    with pytest.raises(TypeError):
        other.train_step()
    other.batches = TinyTrainer().batches
    other.resume(tmp_path / "pause.ckpt")
    other.pause(tmp_path / "again.ckpt")
    assert load_checkpoint(tmp_path / "again.ckpt")["completed_steps"] == 1


def test_write_failure_leaves_trainer_running_and_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "pause.ckpt"
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(path)
    trainer.resume(path)
    trainer.train_step()
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    before = trainer.state()
    with pytest.raises(CheckpointWriteError):
        trainer.pause(path)
    monkeypatch.undo()
    assert calls, "the patched fsync was never reached"
    assert not trainer.paused
    assert_same_state(before, trainer.state())
    assert load_checkpoint(path)["completed_steps"] == 1
    trainer.train_step()  # training goes on
    trainer.pause(path)  # and a retry succeeds
    assert load_checkpoint(path)["completed_steps"] == 3


def test_pause_inside_a_step_is_refused_and_points_to_request_pause(tmp_path):
    class PausesInside(TinyTrainer):
        @training_step
        def train_step(self):
            self.pause(tmp_path / "pause.ckpt")

    with pytest.raises(RuntimeError, match="request_pause"):
        PausesInside().train_step()


def test_request_pause_during_a_step_is_written_when_the_step_ends(tmp_path):
    path = tmp_path / "pause.ckpt"

    class RequestsInside(TinyTrainer):
        @training_step
        def train_step(self):
            loss = super().train_step()
            self.request_pause(path)
            assert not path.exists() and not self.paused
            return loss

    trainer = RequestsInside()
    trainer.train_step()
    assert trainer.paused and not trainer.pause_requested
    saved = load_checkpoint(path)
    assert saved["completed_steps"] == 1 and saved["extra"] == {"position": 1}


def test_signal_requests_a_pause_that_is_written_at_the_next_step_boundary(tmp_path):
    path = tmp_path / "pause.ckpt"
    trainer = TinyTrainer()
    previous = signal.getsignal(signal.SIGUSR1)
    previous_term = signal.getsignal(signal.SIGTERM)
    with trainer.pause_on_signal(path) as handlers:
        assert handlers.previous[signal.SIGUSR1] is previous
        assert signal.getsignal(signal.SIGTERM) is not previous_term
        trainer.train_step()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert trainer.pause_requested
        assert not path.exists(), "the handler itself must not write"
        trainer.train_step()
        assert trainer.paused
        with pytest.raises(TrainingPausedError):
            trainer.train_step()
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert signal.getsignal(signal.SIGTERM) is previous_term
    assert load_checkpoint(path)["completed_steps"] == 2


def test_restore_signal_handlers_puts_back_the_handlers_from_before():
    trainer = TinyTrainer()
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGUSR1)}
    trainer.pause_on_signal("a.ckpt")
    trainer.pause_on_signal("b.ckpt", signals=(signal.SIGUSR1,))
    assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    trainer.restore_signal_handlers()
    assert {number: signal.getsignal(number) for number in before} == before


def test_pause_on_signal_outside_the_main_thread_is_refused():
    trainer = TinyTrainer()
    errors = []

    def install():
        try:
            trainer.pause_on_signal("p.ckpt")
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join(10)
    assert errors and "main thread" in str(errors[0])


def test_pause_from_another_thread_always_lands_on_a_step_boundary(tmp_path):
    trainer = TwoCounterTrainer()
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                trainer.step()
            except TrainingPausedError:
                time.sleep(0.0005)

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    delays = random.Random(0)
    steps_between = []
    try:
        assert trainer.steps_started.wait(10)
        last = 0
        for index in range(15):
            time.sleep(delays.uniform(0.0, 0.006))
            path = tmp_path / f"pause-{index}.ckpt"
            trainer.pause(path)
            extra = load_checkpoint(path)["extra"]
            assert extra["first"] == extra["second"] == trainer.completed_steps, extra
            steps_between.append(extra["first"] - last)
            last = extra["first"]
            trainer.resume(path)
    finally:
        stop.set()
        worker.join(10)
    assert not worker.is_alive()
    assert sum(count > 0 for count in steps_between) >= 10, (
        steps_between
    )  # pauses really met running steps


def test_serialized_method_waits_for_the_running_step():
    class SlowStep(TinyTrainer):
        started = threading.Event()
        finished_at = 0.0

        @training_step
        def train_step(self):
            self.started.set()
            time.sleep(0.2)
            loss = super().train_step()
            self.finished_at = time.monotonic()
            return loss

    trainer = SlowStep()
    worker = threading.Thread(target=trainer.train_step)
    worker.start()
    assert trainer.started.wait(10)
    trainer.set_lr(0.5)
    returned_at = time.monotonic()
    worker.join(10)
    assert trainer.finished_at and returned_at >= trainer.finished_at
    assert trainer.optimizer.param_groups[0]["lr"] == 0.5


def test_failure_after_restore_began_locks_until_a_resume_succeeds(tmp_path):
    path = tmp_path / "pause.ckpt"
    source = TinyTrainer()
    expected = [source.train_step() for _ in range(4)]
    source = TinyTrainer()
    source.train_step()
    source.train_step()
    source.pause(path)

    class BrokenExtra(TinyTrainer):
        broken = True

        def _load_resume_extra_state(self, state):
            if self.broken:
                raise KeyError("position")
            super()._load_resume_extra_state(state)

    trainer = BrokenExtra()
    with pytest.raises(TrainerLockedError, match="extra state") as raised:
        trainer.resume(path)
    assert isinstance(raised.value.__cause__, KeyError)
    assert trainer.locked
    before = trainer.state()
    with pytest.raises(TrainerLockedError):
        trainer.train_step()
    with pytest.raises(TrainerLockedError):
        trainer.pause(tmp_path / "other.ckpt")
    assert not (tmp_path / "other.ckpt").exists()
    assert_same_state(before, trainer.state())
    trainer.broken = False
    trainer.resume(path)
    assert not trainer.locked
    later = [trainer.train_step() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(expected[2:], later))


@pytest.mark.parametrize("every_step, expected", [(True, 3), (False, 0)])
def test_collective_trainers_get_the_boundary_hook_after_every_step(
    every_step, expected, monkeypatch
):
    class Collective(TinyTrainer):
        _pause_check_every_step = every_step

    boundaries = []
    check = _setup.pause_at_step_boundary  # the boundary check each new guard is given
    monkeypatch.setattr(
        _setup,
        "pause_at_step_boundary",
        lambda trainer: boundaries.append(trainer) or check(trainer),
    )
    trainer = Collective()
    for _ in range(3):
        trainer.train_step()
    assert len(boundaries) == expected and not trainer.paused
    assert all(seen is trainer for seen in boundaries)


def test_trainer_methods_named_like_the_machinery_do_not_replace_pause_or_resume(tmp_path):
    class SameNames(TinyTrainer):
        # Names the pause and restore machinery once had as methods of the trainer.
        def _restore(self, *args):
            raise AssertionError("the trainer's own _restore ran")

        def _pause_checkpoint(self, *args):
            raise AssertionError("the trainer's own _pause_checkpoint ran")

        def _check_pause_checkpoint(self, *args):
            raise AssertionError("the trainer's own _check_pause_checkpoint ran")

        def _rank_checkpoint(self, *args):
            raise AssertionError("the trainer's own _rank_checkpoint ran")

        def _pause_at_step_boundary(self):
            raise AssertionError("the trainer's own _pause_at_step_boundary ran")

    expected = reference_losses(4)
    trainer = SameNames()
    trainer.train_step()
    trainer.request_pause(tmp_path / "pause.ckpt")
    trainer.train_step()
    assert trainer.paused
    resumed = SameNames()
    resumed.resume(tmp_path / "pause.ckpt")
    later = [resumed.train_step() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(expected[2:], later, strict=True))


def test_requested_pause_that_fails_to_write_is_raised_from_the_completed_step(
    tmp_path, monkeypatch
):
    trainer = TinyTrainer()
    trainer.request_pause(tmp_path / "pause.ckpt")

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(CheckpointWriteError):
        trainer.train_step()
    monkeypatch.undo()
    assert trainer.completed_steps == 1 and trainer.position == 1
    assert not trainer.paused and not trainer.pause_requested
    assert not (tmp_path / "pause.ckpt").exists()
    trainer.train_step()  # not a failed step: training goes on and pausing works
    trainer.pause(tmp_path / "pause.ckpt")
    assert load_checkpoint(tmp_path / "pause.ckpt")["completed_steps"] == 2
