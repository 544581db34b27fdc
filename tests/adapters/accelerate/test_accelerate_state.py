"""accelerator_state and resume_objects: what an Accelerator carries between steps, saved and
checked."""

from __future__ import annotations

import io

import pytest
import torch
from accelerate import Accelerator
from support.accelerate_loop import AccelerateLoop, fresh_accelerate_state, train

from trainer_resume.adapters.accelerate import (
    ACCELERATOR_FORMAT,
    accelerator_state,
    resume_objects,
)
from trainer_resume.errors import ResumeStateMismatchError


@pytest.fixture(autouse=True)
def _fresh_accelerate():
    fresh_accelerate_state()
    yield
    fresh_accelerate_state()


def _step_through(trainer: AccelerateLoop, steps: int) -> None:
    batches = iter(trainer.loader)
    for _ in range(steps):
        trainer.step(next(batches))


def test_the_state_holds_the_micro_step_the_sync_decision_and_loads_weights_only():
    trainer = AccelerateLoop(workers=0)
    _step_through(trainer, 6)
    state = accelerator_state(trainer.accelerator).state_dict()
    assert state == {
        "format": ACCELERATOR_FORMAT,
        "step": 6,
        "sync_gradients": False,
        "settings": {
            "num_steps": 4,
            "adjust_scheduler": False,
            "sync_with_dataloader": True,
            "sync_each_batch": False,
        },
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state
    fresh_accelerate_state()
    other = Accelerator(cpu=True, gradient_accumulation_steps=4)
    accelerator_state(other).load_state_dict(state)
    assert (other.step, other.sync_gradients) == (6, False)


def test_a_pause_with_another_accumulation_count_is_refused_before_anything_changes(tmp_path):
    paused = AccelerateLoop(workers=0)
    _step_through(paused, 6)
    paused.pause(tmp_path / "pause.ckpt")
    fresh_accelerate_state()
    other = AccelerateLoop(workers=0, accumulation=2)
    weights = {name: value.clone() for name, value in other.model.state_dict().items()}
    with pytest.raises(ResumeStateMismatchError) as caught:
        other.resume(tmp_path / "pause.ckpt")
    assert caught.value.code == 330
    assert caught.value.detail == (
        "object 'accelerator' (AcceleratorResumeState): gradient accumulation setting 'num_steps' "
        "was 4 when the run paused and is 2 in this Accelerator; build it with "
        "gradient_accumulation_steps as in the paused run"
    )
    assert not other.locked
    assert other.accelerator.step == 0
    assert all(
        torch.equal(weights[name], value) for name, value in other.model.state_dict().items()
    )


def test_resume_objects_unwraps_the_model_and_adds_the_accelerator_and_its_scaler():
    trainer = AccelerateLoop(workers=0)
    objects = trainer._resume_objects()
    assert list(objects) == ["model", "optimizer", "scheduler", "accelerator"]
    assert objects["model"] is trainer.accelerator.unwrap_model(trainer.model)
    assert objects["optimizer"] is trainer.optimizer
    # A scaler is made for fp16 on GPUs only; set one as Accelerate would there.
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
    assert resume_objects(trainer.accelerator, model=trainer.model)["scaler"] is (
        trainer.accelerator.scaler
    )
    with pytest.raises(ValueError) as caught:
        resume_objects(trainer.accelerator, scaler=trainer.accelerator.scaler)
    assert str(caught.value) == "resume_objects adds 'scaler' itself; name your object otherwise"


def test_a_pause_at_a_window_boundary_resumes_exactly_in_this_process(tmp_path):
    # The quick in-process form of the signal tests: no workers, no signal.
    reference = AccelerateLoop(workers=0)
    expected = train(reference)
    fresh_accelerate_state()
    first = AccelerateLoop(workers=0)
    _step_through(first, 8)
    first.pause(tmp_path / "pause.ckpt")
    fresh_accelerate_state()
    resumed = AccelerateLoop(workers=0)
    resumed.resume(tmp_path / "pause.ckpt")
    assert resumed.accelerator.step == 8
    rest = train(resumed)
    assert len(rest["losses"]) == len(expected["losses"]) - 8
    assert all(torch.equal(a, b) for a, b in zip(expected["losses"][8:], rest["losses"]))
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


class _Counter:
    """State only the Accelerator holds: registered for checkpointing, in no attribute."""

    def __init__(self) -> None:
        self.optimizer_steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"optimizer_steps": self.optimizer_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.optimizer_steps = state["optimizer_steps"]


class _RegisteringLoop(AccelerateLoop):
    def __init__(self) -> None:
        super().__init__(workers=0)
        self.accelerator.register_for_checkpointing(_Counter())

    def step(self, batch):
        loss = super().step(batch)
        if self.accelerator.sync_gradients:
            self.accelerator._custom_objects[0].optimizer_steps += 1
        return loss


def test_an_object_registered_for_checkpointing_and_held_nowhere_else_resumes_with_its_state(
    tmp_path,
):
    # Accelerate's save_state saves it; the pause lost it silently (the count restarted).
    reference = _RegisteringLoop()
    expected = train(reference)
    fresh_accelerate_state()
    paused = _RegisteringLoop()
    _step_through(paused, 6)
    assert "custom_object_0" in paused._resume_objects()
    paused.pause(tmp_path / "pause.ckpt")
    fresh_accelerate_state()
    resumed = _RegisteringLoop()
    resumed.resume(tmp_path / "pause.ckpt")
    rest = train(resumed)
    assert all(torch.equal(a, b) for a, b in zip(expected["losses"][6:], rest["losses"]))
    counted = resumed.accelerator._custom_objects[0].optimizer_steps
    assert counted == reference.accelerator._custom_objects[0].optimizer_steps > 0


def test_a_registered_object_passed_by_name_is_saved_once_under_that_name():
    trainer = _RegisteringLoop()
    counter = trainer.accelerator._custom_objects[0]
    objects = resume_objects(trainer.accelerator, model=trainer.model, counter=counter)
    assert list(objects) == ["model", "counter", "accelerator"]
    with pytest.raises(ValueError) as caught:
        resume_objects(trainer.accelerator, custom_object_0=counter)
    assert str(caught.value) == (
        "resume_objects adds 'custom_object_0' itself; name your object otherwise"
    )


def test_a_resume_without_the_registered_object_is_refused_before_anything_changes(tmp_path):
    paused = _RegisteringLoop()
    _step_through(paused, 6)
    paused.pause(tmp_path / "pause.ckpt")
    fresh_accelerate_state()
    other = AccelerateLoop(workers=0)
    with pytest.raises(ResumeStateMismatchError) as caught:
        other.resume(tmp_path / "pause.ckpt")
    assert caught.value.code == 330
    assert "custom_object_0" in caught.value.detail
    assert not other.locked and other.accelerator.step == 0
