"""Pause paths whose folder does not exist yet, write failures that say only what is true,
requests that come before any step, and extra state handed back only when saved."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.trainers import TinyTrainer

from trainer_resume import UnsavedStateWarning, run_finished
from trainer_resume.errors import CheckpointWriteError


def test_a_pause_file_in_a_folder_that_does_not_exist_yet_is_written_on_a_signal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs" / "job-17" / "pause.ckpt"
    trainer = TinyTrainer()
    with trainer.pause_on_signal(path):
        assert path.parent.is_dir()  # created when armed
        trainer.train_step()
        os.kill(os.getpid(), signal.SIGUSR1)
        trainer.train_step()
    assert trainer.paused and path.is_file()


def test_pause_and_finish_create_the_folder_of_their_path(tmp_path: Path) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "a" / "pause.ckpt")
    assert (tmp_path / "a" / "pause.ckpt").is_file()
    finished = TinyTrainer()
    finished.train_step()
    finished.finish(tmp_path / "b" / "pause.ckpt")
    assert run_finished(tmp_path / "b" / "pause.ckpt").completed_steps == 1


def test_a_pause_folder_that_cannot_be_created_is_refused_when_armed(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    path = tmp_path / "file" / "pause.ckpt"
    trainer = TinyTrainer()
    with pytest.raises(CheckpointWriteError) as refused:
        trainer.pause_on_signal(path)
    assert str(refused.value) == (
        f"[327] writing failed: {path}: its folder {path.parent} could not be created "
        f"({path.parent} is a file, not a folder)"
    )
    assert isinstance(refused.value.__cause__, OSError)
    assert "_training_resume_signals" not in vars(trainer)  # no handler was installed


def _failing_fsync(monkeypatch: pytest.MonkeyPatch) -> OSError:
    error = OSError(5, "Input/output error")

    def fail(fd: int) -> None:
        raise error

    monkeypatch.setattr(os, "fsync", fail)
    return error


def test_a_failed_first_write_does_not_speak_of_a_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    error = _failing_fsync(monkeypatch)
    with pytest.raises(CheckpointWriteError) as failed:
        trainer.pause(tmp_path / "pause.ckpt")
    assert (
        str(failed.value)
        == f"[327] writing failed: could not write {tmp_path / 'pause.ckpt'}: {error!r}"
    )


def test_a_pause_to_a_folder_says_the_path_is_a_folder_and_no_previous_file(
    tmp_path: Path,
) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    (tmp_path / "runs").mkdir()
    with pytest.raises(CheckpointWriteError) as failed:
        trainer.pause(tmp_path / "runs")
    message = str(failed.value)
    assert message.endswith("; that path is a folder: give a file path inside it"), message
    assert "previous file" not in message
    assert not trainer.paused


def test_a_failed_write_over_a_previous_pause_says_it_is_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = TinyTrainer()
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    trainer.resume(tmp_path / "pause.ckpt")
    trainer.train_step()
    error = _failing_fsync(monkeypatch)
    with pytest.raises(CheckpointWriteError) as failed:
        trainer.pause(tmp_path / "pause.ckpt")
    assert str(failed.value) == (
        f"[327] writing failed: could not write {tmp_path / 'pause.ckpt'}: {error!r}; "
        "the previous file there is intact"
    )


def test_a_signal_before_any_training_step_is_warned_about_at_once(tmp_path: Path) -> None:
    trainer = TinyTrainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainer.pause_on_signal(
            tmp_path / "pause.ckpt", warn_without_step_after=600
        ) as handle:
            os.kill(os.getpid(), signal.SIGTERM)
            handle._watcher.join(timeout=30)
            assert not handle._watcher.is_alive()
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            UnsavedStateWarning,
            "TinyTrainer: a pause was requested (signal SIGTERM) but no @training_step call has "
            "run yet: the pause is written when a @training_step call ends, or by "
            "pause_if_requested(); if the training step is not decorated with @training_step, "
            "this run will not pause",
        )
    ]
    assert trainer.pause_requested and not trainer.paused


def test_the_signal_watcher_ends_with_the_handlers_and_holds_no_trainer(tmp_path: Path) -> None:
    # A watcher still running at interpreter exit would drop the last references to the
    # trainer's objects there: a native library freed with them (a DALI pipeline) aborts.
    trainer = TinyTrainer()
    with trainer.pause_on_signal(tmp_path / "pause.ckpt", warn_without_step_after=600) as handle:
        watcher = handle._watcher
        assert watcher is not None and watcher.is_alive()
        assert not any(handle is argument for argument in watcher._args)
    assert not watcher.is_alive()
    assert trainer.pause_requested is False


def test_a_request_from_another_thread_before_any_training_step_is_warned_about(
    tmp_path: Path,
) -> None:
    trainer = TinyTrainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=trainer.request_pause, args=(tmp_path / "p.ckpt",))
        thread.start()
        thread.join(timeout=30)
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            UnsavedStateWarning,
            "TinyTrainer: a pause was requested (request_pause() from another thread) but no "
            "@training_step call has run yet: the pause is written when a @training_step call "
            "ends, or by pause_if_requested(); if the training step is not decorated with "
            "@training_step, this run will not pause",
        )
    ]
    trainer.train_step()  # the first step lands it
    assert trainer.paused


class NoExtra(TinyTrainer):
    """Saves no extra state; its load hook would fail on an empty dict."""

    def _resume_extra_state(self) -> dict[str, Any]:
        return {}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


def test_the_extra_state_hook_is_not_called_when_no_extra_state_was_saved(tmp_path: Path) -> None:
    trainer = NoExtra()
    trainer.train_step()
    trainer.pause(tmp_path / "pause.ckpt")
    resumed = NoExtra()
    resumed.resume(tmp_path / "pause.ckpt")
    assert not resumed.locked and resumed.completed_steps == 1
