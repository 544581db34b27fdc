"""The finished marker: one rule for every call that looks for something to resume."""

from __future__ import annotations

import os
import re

import pytest
import torch

from trainer_resume import load_checkpoint, mark_finished, run_finished, save_checkpoint
from trainer_resume.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointSignatureError,
    CheckpointWriteError,
    RunFinishedError,
)
from trainer_resume.finished import finished_marker_path, refuse_if_finished

KEY = b"k" * 32


def test_unfinished_run_has_no_marker(tmp_path):
    assert run_finished(tmp_path / "pause.pt") is None
    assert run_finished(tmp_path) is None
    refuse_if_finished(tmp_path / "pause.pt")


def test_finishing_retires_the_pause_file_and_records_the_final_step(tmp_path):
    pause = tmp_path / "pause.pt"
    save_checkpoint({"w": torch.ones(2)}, pause)
    marker = mark_finished(pause, completed_steps=120)
    assert not pause.exists()
    assert marker == str(pause) + ".finished"
    finished = run_finished(pause)
    assert finished is not None
    assert (finished.marker, finished.completed_steps) == (marker, 120)


def test_finishing_without_a_pause_file_still_marks_the_run(tmp_path):
    pause = tmp_path / "pause.pt"
    mark_finished(pause, completed_steps=3)
    assert run_finished(pause).completed_steps == 3


def test_marker_in_a_directory_does_not_touch_its_other_files(tmp_path):
    point = tmp_path / "point.pt"
    save_checkpoint({"w": torch.ones(2)}, point)
    marker = mark_finished(tmp_path, completed_steps=7)
    assert marker == os.path.join(tmp_path, "run.finished")
    assert point.exists()
    assert run_finished(tmp_path).completed_steps == 7


def test_refusal_names_the_marker_and_the_final_step(tmp_path):
    pause = tmp_path / "pause.pt"
    mark_finished(pause, completed_steps=42)
    with pytest.raises(RunFinishedError) as caught:
        refuse_if_finished(pause)
    assert caught.value.code == 340
    assert "run_finished" in str(caught.value)
    assert f"{pause}.finished" in str(caught.value) and "step 42" in str(caught.value)


def test_marker_is_a_verified_checkpoint_and_signed_with_the_run_key(tmp_path):
    pause = tmp_path / "pause.pt"
    mark_finished(pause, completed_steps=5, key=KEY)
    assert load_checkpoint(finished_marker_path(pause), key=KEY)["completed_steps"] == 5
    assert run_finished(pause, key=KEY).completed_steps == 5
    with pytest.raises(CheckpointSignatureError):
        run_finished(pause, key=b"x" * 32)


def test_damaged_marker_is_refused_not_taken_for_unfinished(tmp_path):
    pause = tmp_path / "pause.pt"
    marker = mark_finished(pause, completed_steps=5)
    data = bytearray(open(marker, "rb").read())
    data[-10] ^= 0xFF
    open(marker, "wb").write(bytes(data))
    with pytest.raises(CheckpointCorruptedError):
        run_finished(pause)


def test_foreign_checkpoint_at_the_marker_path_is_refused(tmp_path):
    pause = tmp_path / "pause.pt"
    save_checkpoint({"format": "something else", "completed_steps": 1}, finished_marker_path(pause))
    with pytest.raises(CheckpointFormatError):
        run_finished(pause)


def test_failed_marker_write_keeps_the_pause_file(tmp_path, monkeypatch):
    pause = tmp_path / "pause.pt"
    save_checkpoint({"w": torch.ones(2)}, pause)

    def failing_replace(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(CheckpointWriteError):
        mark_finished(pause, completed_steps=9)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(pause)["w"], torch.ones(2))
    assert run_finished(pause) is None


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ([1, 2], "it holds a list, not a dict"),
        (
            {"format": "something-else"},
            "format 'something-else', expected 'trainer-resume-finished'",
        ),
        (
            {"format": "trainer-resume-finished", "completed_steps": True, "finished_at": 1.0},
            "completed_steps is True, not an int >= 0",
        ),
        (
            {"format": "trainer-resume-finished", "completed_steps": -1, "finished_at": 1.0},
            "completed_steps is -1, not an int >= 0",
        ),
        (
            {"format": "trainer-resume-finished", "completed_steps": 3, "finished_at": "noon"},
            "finished_at is 'noon', not a time in seconds",
        ),
        (
            {"format": "trainer-resume-finished", "completed_steps": 3},
            "finished_at is None, not a time in seconds",
        ),
    ],
)
def test_a_marker_of_another_layout_or_types_is_refused_naming_the_entry(tmp_path, record, reason):
    save_checkpoint(record, finished_marker_path(tmp_path / "pause.pt"))
    message = f"{tmp_path / 'pause.pt.finished'} is not a trainer-resume finished marker: {reason}"
    with pytest.raises(CheckpointFormatError) as refused:
        run_finished(tmp_path / "pause.pt")
    assert str(refused.value) == f"[321] {CheckpointFormatError.message}: {message}"


@pytest.mark.skipif(os.name != "posix", reason="FIFOs and symlinks")
@pytest.mark.parametrize("kind", ["directory", "fifo", "dangling link"])
def test_a_marker_path_that_is_no_regular_file_is_refused_without_opening_it(tmp_path, kind):
    marker = tmp_path / "pause.pt.finished"
    if kind == "directory":
        marker.mkdir()
        reason = "is not a regular file (a directory)"
    elif kind == "fifo":
        os.mkfifo(marker)  # opening it for reading would wait for a writer forever
        reason = "is not a regular file (a FIFO)"
    else:
        marker.symlink_to(tmp_path / "nowhere")
        reason = "is a link to nothing, not a trainer-resume finished marker"
    with pytest.raises(
        CheckpointFormatError, match=f"^\\[321\\] .*: {re.escape(f'{marker} {reason}')}$"
    ):
        refuse_if_finished(tmp_path / "pause.pt")
