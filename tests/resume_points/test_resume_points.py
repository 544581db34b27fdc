"""Resume points: asynchronous checkpoints that change nothing about training and lose nothing."""

from __future__ import annotations

import errno
import gc
import os
import threading
import time

import pytest
import torch
from support.point_trainers import GatedWrites, points_trainer
from support.trainers import TinyTrainer

from trainer_resume import (
    CheckpointWriteError,
    PauseBlockedError,
    ResumePoints,
    RunFinishedError,
    SkippedCheckpointWarning,
    UnsupportedResumeConfigurationError,
    cpu_state,
    load_checkpoint,
    run_finished,
)
from trainer_resume.resume_points._lock import LOCK_NAME
from trainer_resume.resume_points.files import list_points, point_name
from trainer_resume.testing import first_difference


def run_steps(trainer: TinyTrainer, steps: int) -> list[torch.Tensor]:
    return [trainer.train_step() for _ in range(steps)]


def assert_equal(expected, actual, where: str) -> None:
    difference = first_difference(expected, actual)
    assert difference is None, f"{where}: {difference.describe()}"


def steps_on_disk(directory) -> list[int]:
    return [steps for steps, _ in list_points(directory)]


@pytest.mark.parametrize("when_busy", ["skip", "wait"])
def test_run_with_resume_points_is_bit_identical_to_run_without(tmp_path, when_busy):
    reference = TinyTrainer()
    expected_losses = run_steps(reference, 12)
    expected = reference.state()

    trainer = points_trainer(tmp_path, every_steps=1, keep=2, when_busy=when_busy)
    losses = run_steps(trainer, 6)
    trainer.checkpoint().wait()
    losses += run_steps(trainer, 6)
    assert_equal(expected_losses, losses, "losses")
    assert_equal(expected, trainer.state(), "model, optimizer, position and the next RNG draws")


def test_point_holds_what_a_pause_at_the_same_step_holds(tmp_path):
    paused = TinyTrainer()
    run_steps(paused, 4)
    paused.pause(tmp_path / "pause.ckpt")

    trainer = points_trainer(tmp_path / "points", every_steps=4)
    run_steps(trainer, 4)
    trainer.checkpoint().wait()
    point = load_checkpoint(tmp_path / "points" / point_name(4))
    pause = load_checkpoint(tmp_path / "pause.ckpt")
    assert point["completed_steps"] == 4
    assert_equal(pause, point, "point vs pause")


def test_point_keeps_the_state_of_its_step_while_training_goes_on(tmp_path, monkeypatch):
    reference = TinyTrainer()
    run_steps(reference, 3)
    expected = {
        "model": reference.model.state_dict(),
        "optimizer": reference.optimizer.state_dict(),
    }

    writes = GatedWrites(monkeypatch)
    trainer = points_trainer(tmp_path, every_steps=3)
    run_steps(trainer, 3)
    assert writes.started.wait(10)
    run_steps(trainer, 4)  # in-place updates of the live tensors while the point is written
    writes.release()
    trainer.points.wait()
    point = load_checkpoint(tmp_path / point_name(3))
    assert_equal(expected["model"], point["objects"]["model"], "model")
    assert_equal(expected["optimizer"], point["objects"]["optimizer"], "optimizer")


def test_consecutive_points_each_hold_the_state_of_their_own_step(tmp_path):
    # The buffers of a written point are reused for the next one's copy.
    reference = TinyTrainer()
    expected = {}
    for step in range(1, 5):
        reference.train_step()
        expected[step] = cpu_state((reference.model.state_dict(), reference.optimizer.state_dict()))
    trainer = points_trainer(tmp_path, every_steps=1, keep=4, when_busy="wait")
    run_steps(trainer, 4)
    trainer.points.wait()
    for step, path in list_points(tmp_path):
        point = load_checkpoint(path)
        assert_equal(expected[step][0], point["objects"]["model"], f"model of point {step}")
        assert_equal(expected[step][1], point["objects"]["optimizer"], f"optimizer of point {step}")


def test_skip_policy_does_not_block_and_takes_the_point_after_the_write(tmp_path, monkeypatch):
    writes = GatedWrites(monkeypatch)
    points = ResumePoints(tmp_path, every_steps=2, when_busy="skip")
    trainer = TinyTrainer()
    trainer._initialize_training_resume(trainer.config, version="1.0", resume_points=points)
    run_steps(trainer, 2)
    assert writes.started.wait(10)
    run_steps(trainer, 4)  # steps 4 and 6 are due while step 2's point is written
    assert points.skipped == 2
    assert not writes.gate.is_set()
    writes.release()
    points.wait()
    run_steps(trainer, 1)  # the first boundary after the write takes the overdue point
    assert points.latest.completed_steps == 7
    points.wait()
    assert steps_on_disk(tmp_path) == [2, 7]


def test_wait_policy_blocks_the_due_step_until_the_write_is_done(tmp_path, monkeypatch):
    writes = GatedWrites(monkeypatch)
    points = ResumePoints(tmp_path, every_steps=2, when_busy="wait")
    trainer = TinyTrainer()
    trainer._initialize_training_resume(trainer.config, version="1.0", resume_points=points)
    run_steps(trainer, 2)
    assert writes.started.wait(10)
    run_steps(trainer, 1)  # step 3 is not due: it does not wait
    assert not writes.gate.is_set()
    threading.Timer(0.2, writes.release).start()
    run_steps(trainer, 1)  # step 4 is due: returns only once step 2's point is written
    assert writes.gate.is_set()
    assert points.skipped == 0
    points.wait()
    assert steps_on_disk(tmp_path) == [2, 4]


def test_old_points_are_removed_only_after_a_newer_one_is_durable(tmp_path, monkeypatch):
    points = ResumePoints(tmp_path, every_steps=1, keep=2, when_busy="wait")
    trainer = TinyTrainer()
    trainer._initialize_training_resume(trainer.config, version="1.0", resume_points=points)
    run_steps(trainer, 4)
    points.wait()
    assert steps_on_disk(tmp_path) == [3, 4]
    writes = GatedWrites(monkeypatch)
    run_steps(trainer, 1)
    assert writes.started.wait(10)
    assert steps_on_disk(tmp_path) == [3, 4]  # step 5 is being written: nothing is removed yet
    writes.release()
    points.wait()
    assert steps_on_disk(tmp_path) == [4, 5]


def test_failed_background_write_is_raised_by_the_next_step_and_older_points_stay_valid(
    tmp_path, monkeypatch
):
    points = ResumePoints(tmp_path, every_steps=2, keep=3, when_busy="wait")
    trainer = TinyTrainer()
    trainer._initialize_training_resume(trainer.config, version="1.0", resume_points=points)
    run_steps(trainer, 4)
    points.wait()
    before = {steps: load_checkpoint(path) for steps, path in list_points(tmp_path)}
    assert list(before) == [2, 4]

    real_write = os.write

    def full_disk(fd, data):
        if threading.current_thread().name == "trainer-resume-point":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    run_steps(trainer, 2)  # step 6 takes a point; its write fails in the background
    points.wait()
    with pytest.raises(CheckpointWriteError) as caught:
        trainer.train_step()  # step 7 reports it
    assert (
        isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    )
    assert trainer.completed_steps == 7  # the step itself completed
    # No temp file left; the lock file names the writing process.
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME, point_name(2), point_name(4)]
    for steps, path in list_points(tmp_path):
        assert_equal(before[steps], load_checkpoint(path), f"point {steps}")

    monkeypatch.setattr(os, "write", real_write)
    run_steps(trainer, 1)  # step 8: reported once, and the next point is written again
    points.wait()
    assert steps_on_disk(tmp_path) == [2, 4, 8]


def test_resume_latest_continues_bit_identically_from_the_newest_point(tmp_path):
    reference = TinyTrainer()
    expected_losses = run_steps(reference, 10)
    expected = reference.state()

    first = points_trainer(tmp_path, every_steps=3, when_busy="wait")
    run_steps(first, 7)
    first.points.wait()
    second = points_trainer(tmp_path, every_steps=3, when_busy="wait")
    assert second.resume_latest() == str(tmp_path / point_name(6))
    assert second.completed_steps == 6
    losses = run_steps(second, 4)
    assert_equal(expected_losses[6:], losses, "losses after the resume")
    assert_equal(expected, second.state(), "state after the resume")


def test_resume_latest_of_an_empty_or_missing_directory_is_a_fresh_start(tmp_path):
    trainer = points_trainer(tmp_path / "points", every_steps=3)
    assert trainer.resume_latest() is None
    assert trainer.resume_latest(tmp_path / "missing") is None
    assert trainer.completed_steps == 0


def test_resume_latest_skips_a_damaged_point_and_names_it(tmp_path):
    trainer = points_trainer(tmp_path, every_steps=2, keep=3, when_busy="wait")
    run_steps(trainer, 4)
    trainer.checkpoint().wait()
    newest = tmp_path / point_name(4)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))

    fresh = points_trainer(tmp_path, every_steps=2)
    with pytest.warns(SkippedCheckpointWarning, match=point_name(4)):
        assert fresh.resume_latest() == str(tmp_path / point_name(2))
    assert fresh.completed_steps == 2


def test_resume_latest_never_takes_a_temp_file_and_removes_those_of_dead_writers(tmp_path):
    trainer = points_trainer(tmp_path, every_steps=2, when_busy="wait")
    run_steps(trainer, 2)
    trainer.checkpoint().wait()
    dead = 2**22 + 1  # above the default pid_max: no process has it
    stale = tmp_path / f".{point_name(9)}.{dead}.{'ab' * 8}.tmp"
    stale.write_bytes((tmp_path / point_name(2)).read_bytes())  # even a complete copy is not taken
    live = tmp_path / f".{point_name(8)}.{os.getpid()}.{'cd' * 8}.tmp"
    live.write_bytes(b"being written")

    fresh = points_trainer(tmp_path, every_steps=2)
    assert fresh.resume_latest() == str(tmp_path / point_name(2))
    assert not stale.exists()
    assert live.exists()  # its writer (this process) is alive


def test_pause_written_into_the_directory_is_found_by_resume_latest(tmp_path):
    reference = TinyTrainer()
    expected = run_steps(reference, 8)
    trainer = points_trainer(tmp_path, every_steps=3, when_busy="wait")
    run_steps(trainer, 5)
    trainer.pause(tmp_path / "pause.ckpt")

    fresh = points_trainer(tmp_path, every_steps=3)
    assert fresh.resume_latest() == str(tmp_path / "pause.ckpt")
    assert fresh.completed_steps == 5
    assert_equal(expected[5:], run_steps(fresh, 3), "losses after the pause")


def test_checkpoint_when_a_point_is_due_at_the_same_boundary_takes_one_point(tmp_path):
    trainer = points_trainer(tmp_path, every_steps=2, when_busy="wait")
    points = trainer.points
    run_steps(trainer, 2)
    automatic = points.latest
    handle = trainer.checkpoint()
    assert handle is automatic
    assert handle.wait() == str(tmp_path / point_name(2))
    assert points.written == 1


def test_checkpoint_from_another_thread_is_taken_at_a_step_boundary(tmp_path):
    trainer = points_trainer(tmp_path, when_busy="wait")
    handles = []
    stop = threading.Event()

    def train():
        while not stop.is_set():
            trainer.train_step()

    runner = threading.Thread(target=train)
    runner.start()
    try:
        while trainer.completed_steps < 3:
            time.sleep(0.001)
        handles = [trainer.checkpoint() for _ in range(2)]
        paths = [handle.wait(30) for handle in handles]
    finally:
        stop.set()
        runner.join()
    final = trainer.completed_steps
    for handle, path in zip(handles, paths):
        point = load_checkpoint(path)
        assert point["completed_steps"] == handle.completed_steps <= final
        # A boundary: the extra counter moves with the step count inside every step.
        assert point["extra"]["position"] == point["completed_steps"]


def test_checkpoint_after_a_failed_step_is_refused(tmp_path):
    trainer = points_trainer(tmp_path)
    trainer.batches = []
    with pytest.raises(ZeroDivisionError):
        trainer.train_step()
    with pytest.raises(PauseBlockedError):
        trainer.checkpoint()
    assert steps_on_disk(tmp_path) == []


def test_checkpoint_without_resume_points_names_the_missing_argument():
    trainer = TinyTrainer()
    with pytest.raises(RuntimeError, match=r"resume_points=ResumePoints\(directory"):
        trainer.checkpoint()


def test_finish_retires_the_points_and_resume_latest_reports_the_finished_run(tmp_path):
    points_dir, pause = tmp_path / "points", tmp_path / "pause.ckpt"
    trainer = points_trainer(points_dir, every_steps=2)
    run_steps(trainer, 5)  # the write of step 4's point may still be in flight
    trainer.finish(pause)
    assert steps_on_disk(points_dir) == []
    assert os.listdir(points_dir) == ["run.finished"]
    assert run_finished(points_dir).completed_steps == 5
    with pytest.raises(RunFinishedError):
        points_trainer(points_dir, every_steps=2).resume_latest()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"every_steps": 0}, ValueError),
        ({"every_steps": 2.5}, TypeError),
        ({"every_seconds": 0}, ValueError),
        ({"keep": 0}, ValueError),
        ({"when_busy": "drop"}, ValueError),
    ],
)
def test_resume_points_refuse_settings_that_cannot_work(tmp_path, options, error):
    with pytest.raises(error):
        ResumePoints(tmp_path, **options)


def test_resume_points_of_a_sharded_model_are_sharded_directories_resumed_bitwise_equal_and_refused_at_a_url(  # noqa: E501
    tmp_path,
):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    trainers: list = []
    try:
        _sharded_points_run(tmp_path, trainers)
    finally:
        for trainer in trainers:
            trainer.loader.close()
        trainers.clear()
        dist.destroy_process_group()
        gc.collect()  # the trainers' groups go now, not in a loader worker forked later


def _sharded_points_run(tmp_path, trainers: list) -> None:
    from support.ddp_workers import CONFIG
    from support.fsdp_workers import FSDPTrainer, by_parameter_order

    from trainer_resume.resume_points.sharded_points import list_sharded_points

    reference = FSDPTrainer()
    trainers.append(reference)
    for _ in range(6):
        reference.step()
        if reference.completed_steps == 4:
            at_four = by_parameter_order(reference)
    points = ResumePoints(tmp_path / "points", every_steps=2, keep=2, when_busy="wait")
    writer = FSDPTrainer()
    trainers.append(writer)
    writer._initialize_training_resume(CONFIG, version="1", resume_points=points)
    for _ in range(5):
        writer.step()
    points.wait()
    listed = [(steps, done) for steps, _, done in list_sharded_points(tmp_path / "points")]
    assert listed == [(2, True), (4, True)]
    resumed = FSDPTrainer()
    trainers.append(resumed)
    resumed.step()  # a state any missing restore would leave behind
    resumed._initialize_training_resume(  # one writer in the directory: the writer
        CONFIG, version="1", resume_points=ResumePoints(tmp_path / "points", every_steps=100)
    )
    assert resumed.resume_latest().endswith("point-000000000004.sharded")
    assert first_difference(at_four, by_parameter_order(resumed)) is None
    resumed.step()
    resumed.step()
    assert first_difference(by_parameter_order(reference), by_parameter_order(resumed)) is None
    on_demand = writer.checkpoint().wait()  # one process: taken now, between steps
    assert on_demand.endswith("point-000000000005.sharded")
    writer.pause(tmp_path / "points" / "pause")  # a sharded pause there: newest on a tie
    assert resumed.resume_latest() == str(tmp_path / "points" / "pause")
    assert resumed.completed_steps == 5
    writer.finish(tmp_path / "points" / "pause")
    assert list_sharded_points(tmp_path / "points") == []
    with pytest.raises(RunFinishedError):
        resumed.resume_latest()
    # At a URL: refused when training starts, naming the fix, before anything is written.
    import fsspec

    at_url = FSDPTrainer()
    trainers.append(at_url)
    at_url._initialize_training_resume(
        CONFIG, version="1", resume_points=ResumePoints("memory://sharded-points", every_steps=1)
    )
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"\[332\].*shared file system"):
        at_url.step()
    assert at_url.completed_steps == 0
    with pytest.raises(UnsupportedResumeConfigurationError, match=r"\[332\].*not a URL"):
        at_url.resume_latest("memory://sharded-points")
    assert not fsspec.filesystem("memory").exists("/sharded-points")
