"""Which file ``resume_latest`` takes: regular files only, by their verified contents, and the
next one when the chosen one vanishes; and one live writer per directory."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.point_trainers import points_trainer
from support.trainers import TinyTrainer

from trainer_resume import (
    CheckpointWriteError,
    ResumePoints,
    ResumePointsInUseError,
    load_checkpoint,
)
from trainer_resume.resume_points._lock import LOCK_NAME
from trainer_resume.resume_points.files import point_name
from trainer_resume.testing import first_difference

pytestmark = pytest.mark.skipif(os.name != "posix", reason="FIFOs, symlinks, flock")

KEY = b"k" * 32


def _written(directory: Path, steps: int, *, key: bytes | None = None) -> TinyTrainer:
    trainer = TinyTrainer(key=key)
    points = ResumePoints(directory, every_steps=2, keep=3, when_busy="wait")
    trainer._initialize_training_resume(
        trainer.config, version="1.0", key=key, resume_points=points
    )
    trainer.points = points
    for _ in range(steps):
        trainer.train_step()
    trainer.points.wait()
    return trainer


def _resumed(directory: Path, trainer: TinyTrainer | None = None) -> tuple[TinyTrainer, Any]:
    trainer = trainer or TinyTrainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = trainer.resume_latest(directory)
    return trainer, (path, [str(w.message) for w in caught])


def _assert_resumed_from(trainer: TinyTrainer, point: Path) -> None:
    expected = TinyTrainer()
    expected.resume(point)
    difference = first_difference(expected.state(), trainer.state())
    assert difference is None, difference.describe()


def test_entries_named_like_points_that_are_no_regular_files_are_skipped_with_a_warning(tmp_path):
    _written(tmp_path, 4)
    entries = {
        point_name(10): "it is not a regular file",  # a directory
        point_name(9): "it is a symlink",  # to nothing
        point_name(8): "it is not a regular file",  # a FIFO: opening it would block forever
        point_name(7): "it is a symlink",  # to a valid point: not followed either
    }
    (tmp_path / point_name(10)).mkdir()
    (tmp_path / point_name(9)).symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / point_name(8))
    (tmp_path / point_name(7)).symlink_to(tmp_path / point_name(4))
    outcome: list[Any] = []
    # A hang (the FIFO opened for reading) fails the test instead of blocking the suite.
    worker = threading.Thread(target=lambda: outcome.append(_resumed(tmp_path)), daemon=True)
    worker.start()
    worker.join(120)
    assert outcome, "resume_latest did not return"
    trainer, (path, messages) = outcome[0]
    assert path == str(tmp_path / point_name(4))
    assert messages == [
        f"skipped {tmp_path / name}: {reason}; only regular files are resume points"
        for name, reason in sorted(entries.items())
    ]
    _assert_resumed_from(trainer, tmp_path / point_name(4))


def test_a_signed_point_copied_to_a_later_name_is_skipped_because_its_contents_hold_another_step(
    tmp_path,
):
    _written(tmp_path, 4, key=KEY)
    shutil.copyfile(tmp_path / point_name(2), tmp_path / point_name(6))  # signature still valid
    trainer, (path, messages) = _resumed(tmp_path, TinyTrainer(key=KEY))
    assert path == str(tmp_path / point_name(4))
    assert messages == [
        f"skipped {tmp_path / point_name(6)}: it holds step 2, its name says 6 (copied or renamed)"
    ]
    assert trainer.completed_steps == 4
    _assert_resumed_from(trainer, tmp_path / point_name(4))


class VanishingTrainer(TinyTrainer):
    """Reads each pause file through the hook; ``before_read`` runs first (once per path)."""

    def __init__(self, before_read: dict[str, Any]) -> None:
        super().__init__()
        self.before_read = before_read
        self.reads: list[str] = []

    def _load_pause_checkpoint(self, path: Any) -> Any:
        self.reads.append(os.path.basename(path))
        action = self.before_read.pop(os.path.basename(path), None)
        if action is not None:
            action()
        return super()._load_pause_checkpoint(path)


def test_a_point_removed_while_it_is_chosen_falls_back_to_the_next_valid_one(tmp_path):
    _written(tmp_path, 4)
    newest = tmp_path / point_name(4)
    trainer = VanishingTrainer({point_name(4): newest.unlink})
    trainer, (path, messages) = _resumed(tmp_path, trainer)
    assert path == str(tmp_path / point_name(2))
    assert messages == []  # retention is not damage: nothing to warn about
    assert trainer.reads == [point_name(4), point_name(2)]  # each file read once
    _assert_resumed_from(trainer, tmp_path / point_name(2))


def test_when_every_listed_point_vanished_the_directory_is_listed_again(tmp_path):
    # keep=1 beside a running writer: the point listed is replaced by a newer one.
    _written(tmp_path, 6)
    later = tmp_path / "later"
    later.mkdir()
    os.replace(tmp_path / point_name(6), later / point_name(6))
    os.remove(tmp_path / point_name(2))

    def replaced() -> None:
        os.replace(later / point_name(6), tmp_path / point_name(6))
        os.remove(tmp_path / point_name(4))

    trainer = VanishingTrainer({point_name(4): replaced})
    trainer, (path, messages) = _resumed(tmp_path, trainer)
    assert path == str(tmp_path / point_name(6))
    assert messages == []
    assert trainer.reads == [point_name(4), point_name(6)]
    assert trainer.completed_steps == 6


def test_a_point_removed_between_listing_and_looking_at_it_lists_again_and_takes_the_new_one(
    tmp_path, monkeypatch
):
    # keep=1 beside a running writer: the listing names step 4's point only (step 6's was
    # renamed in after the listing began), and retention removes step 4's before it is
    # looked at. The run must not start from nothing.
    from trainer_resume.resume_points import files

    _written(tmp_path, 6)
    os.remove(tmp_path / point_name(2))
    listings: list[list[str]] = []
    real = files._entries

    def listed(location: str) -> list[str]:
        names = real(location)
        if not listings:
            names = [name for name in names if name != point_name(6)]
            os.remove(tmp_path / point_name(4))
        listings.append(names)
        return names

    monkeypatch.setattr(files, "_entries", listed)
    trainer = TinyTrainer()
    assert trainer.resume_latest(tmp_path) == str(tmp_path / point_name(6))
    assert trainer.completed_steps == 6
    assert len(listings) == 2


HOLD = """
import sys
from trainer_resume import ResumePoints
from trainer_resume.resume_points._lock import hold_writer_lock
points = ResumePoints(sys.argv[1])
hold_writer_lock(points.directory, points)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_live_writer_is_refused_naming_the_first_and_a_dead_ones_lock_is_free(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout.readline() == "held\n"
        trainer = points_trainer(tmp_path, every_steps=1)
        named = (
            rf"^\[348\] {re.escape(ResumePointsInUseError.message)}: {re.escape(str(tmp_path))} "
            rf"is written by process {holder.pid} on host {re.escape(socket.gethostname())} "
            rf"\(since [^)]+\); it holds {re.escape(str(tmp_path / LOCK_NAME))}$"
        )
        with pytest.raises(ResumePointsInUseError, match=named):
            trainer.train_step()
        assert not list(tmp_path.glob("point-*"))  # nothing written
    finally:
        holder.communicate("", timeout=60)  # it exits: the kernel drops its lock
    trainer.train_step()
    trainer.points.wait()
    assert load_checkpoint(tmp_path / point_name(2))["completed_steps"] == 2


def test_on_a_file_system_without_locks_points_are_written_with_a_warning(
    tmp_path, monkeypatch, caplog
):
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    trainer = points_trainer(tmp_path, every_steps=1, when_busy="wait")
    with caplog.at_level("WARNING", logger="trainer_resume"):
        trainer.train_step()
    trainer.points.wait()
    assert load_checkpoint(tmp_path / point_name(1))["completed_steps"] == 1
    assert "does not support locks" in caplog.text and "would not be detected" in caplog.text


def test_a_lock_that_cannot_be_taken_for_another_reason_is_a_write_error_with_the_os_error(
    tmp_path, monkeypatch
):
    import fcntl

    def failing(fd: int, operation: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", failing)
    trainer = points_trainer(tmp_path, every_steps=1)
    with pytest.raises(
        CheckpointWriteError, match=r"cannot lock .*\.trainer-resume\.lock"
    ) as raised:
        trainer.train_step()
    assert raised.value.__cause__.errno == errno.EIO
    assert not list(tmp_path.glob("point-*"))
