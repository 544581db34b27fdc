"""Where ResumableTrainer's pauses land and what the pause file carries, in one process:
an epoch ended early by a callback, the run's last step, stateful callbacks, resume
points after a crash, and the refusals of a pause file that does not fit the trainer.

A pause here is requested with ``request_pause`` (what the SIGTERM handler does);
the resumed run is a fresh trainer, model and data, compared with an uninterrupted
run (new processes and real signals: test_hf_trainer_resume.py).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.hf_runs import build, run_record, variant
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

import trainer_resume.resume_points as resume_points_module
from trainer_resume import ResumePoints, load_checkpoint, run_finished, save_checkpoint
from trainer_resume.difference import first_difference
from trainer_resume.errors import (
    CheckpointFormatError,
    ConfigSignatureMismatchError,
    ResumeStateMismatchError,
)


class _PauseAt(TrainerCallback):
    """Requests a pause while step ``step`` runs (it lands at that step's end)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.trainer: Any = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step - 1:
            self.trainer.request_pause(self.trainer.pause_path)


class _EndEpochAt(TrainerCallback):
    """Ends the first epoch early, after step ``step``, as a user's callback may."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_epoch_stop = True


class _Counter(TrainerCallback, ExportableState):
    """Counts steps; its count is state a resume must carry."""

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.count = 0

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.count += self.every

    def state(self) -> dict[str, Any]:
        return {"args": {"every": self.every}, "attributes": {"count": self.count}}


class _SignalMask(TrainerCallback):
    """Records whether SIGTERM is blocked in this thread while the evaluation runs."""

    def __init__(self) -> None:
        self.blocked: list[bool] = []

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.blocked.append(signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []))


class _CrashAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError(f"crash after step {self.step}")


class _FreezeThenUnfreeze(TrainerCallback):
    """Freezes the embeddings when training begins and makes them trainable again at step
    2, as a fine-tuning schedule does; records whether they were trainable at each step."""

    def __init__(self) -> None:
        self.trainable: list[bool] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        kwargs["model"].bert.embeddings.requires_grad_(False)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        embeddings = kwargs["model"].bert.embeddings
        if state.global_step == 2:
            embeddings.requires_grad_(True)
        self.trainable.append(embeddings.word_embeddings.weight.requires_grad)


# Six batches per epoch, two epochs: twelve steps.
SMALL = variant(batches=6)


def _train(folder: Path, *callbacks: TrainerCallback, **options: Any) -> Any:
    settings = options.pop("settings", SMALL)
    trainer_options = {**options.pop("trainer_options", {}), "callbacks": list(callbacks)}
    trainer = build(folder, settings, trainer_options=trainer_options, **options)
    for callback in callbacks:
        if isinstance(callback, _PauseAt):
            callback.trainer = trainer
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run's record."""
    return run_record(_train(tmp_path_factory.mktemp("reference")), final=True)


@pytest.fixture(scope="module")
def early_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run's record, its first epoch ended after step 2 by a callback."""
    return run_record(_train(tmp_path_factory.mktemp("early"), _EndEpochAt(2)), final=True)


def _assert_continues(expected: dict[str, Any], paused: Any, resumed: Any) -> None:
    """The pause and the resume together trained what the reference trained."""
    before, after = run_record(paused, final=False), run_record(resumed, final=True)
    for name in ("batches", "losses", "steps"):
        difference = first_difference(expected[name], before[name] + after[name])
        assert difference is None, f"{name}: {difference.describe()}"
    for name in ("model", "optimizer", "scheduler", "epoch", "log_history"):
        difference = first_difference(expected[name], after[name])
        assert difference is None, f"{name}: {difference.describe()}"


@pytest.mark.parametrize("step", [2, 4], ids=["its-last-step", "the-next-epoch"])
def test_an_epoch_ended_early_by_a_callback_pauses_exactly_at_its_end_and_after(
    tmp_path: Path, early_reference: dict[str, Any], step: int
) -> None:
    paused = _train(tmp_path, _EndEpochAt(2), _PauseAt(step))
    assert paused.paused and paused.state.global_step == step
    if step == 2:  # the epoch's end (its evaluation) ran before the pause, not after the resume
        assert "eval_loss" in paused.state.log_history[-2]
    resumed = _train(tmp_path, _EndEpochAt(2))
    _assert_continues(early_reference, paused, resumed)


@pytest.mark.parametrize("steps", [12, 5], ids=["epoch-end", "max-steps-mid-epoch"])
def test_a_pause_requested_during_the_last_step_lets_the_run_finish(
    tmp_path: Path, steps: int
) -> None:
    trainer = _train(tmp_path, _PauseAt(steps), max_steps=steps)
    assert not trainer.paused and trainer.state.global_step == steps
    finished = run_finished(trainer.pause_path)
    # The last step is no landing while a pause is pending, so the marker counts the
    # steps up to the one before it.
    assert finished is not None and finished.completed_steps == steps - 1
    assert not Path(trainer.pause_path).exists()


def test_stateful_callbacks_continue_from_their_state_at_the_pause(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    paused = _train(tmp_path, _Counter(), _PauseAt(3))
    counter = _Counter()
    resumed = _train(tmp_path, counter)
    assert counter.count == 12
    _assert_continues(reference, paused, resumed)


@pytest.fixture(scope="module")
def unfreezing_reference(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[_FreezeThenUnfreeze, dict[str, Any]]:
    """The uninterrupted run with the fine-tuning schedule, and its schedule."""
    schedule = _FreezeThenUnfreeze()
    trainer = _train(tmp_path_factory.mktemp("unfreezing"), schedule)
    return schedule, run_record(trainer, final=True)


@pytest.mark.parametrize("step", [3, 6, 8], ids=["mid-epoch", "epoch-end", "next-epoch"])
def test_a_layer_frozen_when_training_begins_and_made_trainable_since_stays_trainable(
    tmp_path: Path, step: int, unfreezing_reference: tuple[_FreezeThenUnfreeze, dict[str, Any]]
) -> None:
    schedule, expected = unfreezing_reference
    paused = _train(tmp_path / "run", _FreezeThenUnfreeze(), _PauseAt(step))
    resumed_schedule = _FreezeThenUnfreeze()
    resumed = _train(tmp_path / "run", resumed_schedule)
    # Its on_train_begin froze them again after the restore: the paused run's modes win.
    assert resumed_schedule.trainable == schedule.trainable[step:]
    _assert_continues(expected, paused, resumed)


# Evaluations every 3 steps whose loader keeps its 2 workers from one to the next (the
# collator masks in them, from torch's global generator).
PERSISTENT_EVALUATION = {
    "settings": variant(batches=6, workers=2),
    "eval_strategy": "steps",
    "eval_steps": 3,
    "dataloader_persistent_workers": True,
}


def _evaluated_at(trainer: Any) -> list[int]:
    return [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry]


@pytest.fixture(scope="module")
def persistent_evaluation_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("persistent_evaluation")
    return run_record(_train(folder, **PERSISTENT_EVALUATION), final=True)


@pytest.mark.slow
@pytest.mark.parametrize("step", [3, 4], ids=["at-an-evaluation", "after-it"])
def test_evaluation_workers_kept_between_evaluations_resume_as_the_run_evaluated(
    tmp_path: Path, step: int, persistent_evaluation_reference: dict[str, Any]
) -> None:
    # The Trainer keeps the evaluation loader with persistent workers: their generators
    # carried on, and the main generator was drawn from at the first evaluation only,
    # where the resumed process started them again (every later evaluation and step
    # differed). They start afresh at every evaluation now, resumed or not.
    paused = _train(tmp_path, _PauseAt(step), **PERSISTENT_EVALUATION)
    assert paused.paused and _evaluated_at(paused) == [3]
    resumed = _train(tmp_path, **PERSISTENT_EVALUATION)
    assert _evaluated_at(resumed) == [3, 6, 9, 12]
    assert not getattr(resumed, "_eval_dataloaders", None)  # no evaluation workers left
    _assert_continues(persistent_evaluation_reference, paused, resumed)


def test_a_resume_with_other_stateful_callbacks_is_refused(tmp_path: Path) -> None:
    _train(tmp_path, _Counter(), _PauseAt(3))
    with pytest.raises(ResumeStateMismatchError) as caught:
        _train(tmp_path)
    assert caught.value.detail == (
        "the paused run had the stateful callbacks ['test_hf_trainer_landings._Counter'], this "
        "trainer has []: pass the same callbacks as the paused run"
    )
    with pytest.raises(ResumeStateMismatchError) as caught:
        _train(tmp_path, _Counter(every=2))
    assert caught.value.detail == (
        "callback test_hf_trainer_landings._Counter was built with {'every': 1} in the paused "
        "run and with {'every': 2} here: build it as the paused run did"
    )


def test_a_resume_with_other_training_arguments_is_refused_naming_the_argument(
    tmp_path: Path,
) -> None:
    _train(tmp_path, _PauseAt(3))
    with pytest.raises(ConfigSignatureMismatchError) as caught:
        _train(tmp_path, learning_rate=1e-3)
    assert caught.value.code == 323
    assert (
        "\n  training_arguments.learning_rate: 0.002 in the paused run, 0.001 in this run\n"
        in caught.value.detail
    )


def test_a_resume_may_change_the_config_keys_its_config_ignore_names(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    def options(note: str) -> dict[str, Any]:
        return {"config": {"note": note}, "config_ignore": ["config.note"]}

    paused = _train(tmp_path, _PauseAt(3), trainer_options=options("first launch"))
    resumed = _train(tmp_path, trainer_options=options("second launch"))
    _assert_continues(reference, paused, resumed)


def test_after_a_crash_train_continues_from_the_newest_resume_point(
    tmp_path: Path, reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slow writes: the point of step 8 is still being written when step 9 crashes, and
    # train() lets it finish before the exception leaves it. (Step 6 ends the epoch: its
    # point is taken at step 7.)
    write = resume_points_module.save_checkpoint

    def slow_write(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        write(*args, **kwargs)

    monkeypatch.setattr(resume_points_module, "save_checkpoint", slow_write)
    folder = tmp_path / "run"
    points = {"pause_path": folder / "points" / "pause.ckpt"}

    def with_points(*callbacks: TrainerCallback) -> Any:
        # "wait": every scheduled point is written, however slow (none is skipped).
        every_two = ResumePoints(folder / "points", every_steps=2, when_busy="wait")
        options = {**points, "resume_points": every_two}
        trainer = build(folder, SMALL, trainer_options={**options, "callbacks": list(callbacks)})
        trainer.train()
        return trainer

    (folder / "points").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="crash after step 9"):
        with_points(_CrashAt(9))
    resumed = with_points()
    after = run_record(resumed, final=True)
    # From the point of step 8: the steps after it, then the same end.
    assert [step for step, _ in after["steps"]] == list(range(9, 13))
    for name in ("model", "optimizer", "scheduler", "epoch", "log_history"):
        difference = first_difference(reference[name], after[name])
        assert difference is None, f"{name}: {difference.describe()}"
    difference = first_difference(reference["losses"][8:], after["losses"])
    assert difference is None, difference and difference.describe()
    assert run_finished(folder / "points") is not None


def test_a_pause_file_with_a_malformed_trainer_state_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    _train(tmp_path, _PauseAt(3))
    path = tmp_path / "pause.ckpt"
    checkpoint = load_checkpoint(path)
    checkpoint["extra"]["transformers"]["bookkeeping"]["_tr_loss"] = 0.5
    save_checkpoint(checkpoint, path)
    trainer = build(tmp_path, SMALL)
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    with pytest.raises(CheckpointFormatError) as caught:
        trainer.train()
    assert (
        caught.value.detail == "the pause file's Trainer state: bookkeeping['_tr_loss'] is a float"
    )
    assert first_difference(before, trainer.model.state_dict()) is None
    assert trainer.recording.batches == []


def test_evaluation_runs_with_the_pause_signals_blocked_so_its_workers_ignore_them(
    tmp_path: Path,
) -> None:
    # Workers started meanwhile inherit the block (whatever their start method); a signal
    # to the main process waits for the evaluation's end and then pauses at the landing.
    mask = _SignalMask()
    trainer = build(tmp_path, SMALL, trainer_options={"callbacks": [mask]})
    trainer.evaluate()
    assert mask.blocked == [True, True]
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_pause_file_of_another_trainer_is_refused(tmp_path: Path) -> None:
    _train(tmp_path, _PauseAt(3))
    path = tmp_path / "pause.ckpt"
    checkpoint = load_checkpoint(path)
    del checkpoint["extra"]["transformers"]
    save_checkpoint(checkpoint, path)
    with pytest.raises(CheckpointFormatError) as caught:
        _train(tmp_path)
    assert caught.value.detail == (
        f"{path} holds no Trainer state: it was not written by a ResumableTrainer"
    )
