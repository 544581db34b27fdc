"""Loaders that serialized work between steps reads from or puts in place are paused where
that work left them; a batch fetched for the next step stays undelivered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, serialized_training, training_step

EPOCHS, STEPS_PER_EPOCH = 4, 3
SWITCH_AFTER = 2  # epochs on the easy data, then the hard data


class Noisy(Dataset):
    """Each sample draws its augmentation from the global generator the loader seeds."""

    def __init__(self, size: int, scale: float) -> None:
        self.size, self.scale = size, scale

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((3,), float(index)) * self.scale + torch.rand(3)
        return x, x.sum(0, keepdim=True) * 0.1


def _loader(scale: float, shuffle: bool = True) -> ResumableDataLoader:
    return ResumableDataLoader(Noisy(12, scale), batch_size=4, shuffle=shuffle, resumable=True)


class Curriculum(TrainingResumeMixin):
    """The loader is replaced at an epoch end (a curriculum); validation reads an augmented
    loader that the trainer returns too. Which phase it is comes back as extra state, and
    its hook puts the phase's loader in place."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.001)
        self.loader = _loader(1.0)
        self.val_loader = _loader(0.5, shuffle=False)
        self.phase, self.epochs = 0, 0
        self.losses: list[torch.Tensor] = []
        self.validations: list[torch.Tensor] = []
        self._initialize_training_resume({"curriculum": 1}, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader, "val": self.val_loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"phase": self.phase, "epochs": self.epochs}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.epochs = state["epochs"]
        if state["phase"] == 1:
            self._switch()

    def _switch(self) -> None:
        self.phase, self.loader = 1, _loader(2.0)

    @training_step
    def step(self, batch: Any) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.detach())

    @serialized_training
    def end_epoch(self) -> None:
        self.epochs += 1
        with torch.no_grad():
            for x, _ in self.val_loader:  # one augmented pass: its position moves
                self.validations.append(self.model(x).sum())
        if self.epochs == SWITCH_AFTER:
            self._switch()


class PlainCurriculum(Curriculum):
    """The same epoch-end work as a plain method, as docs/trainer.md's epoch loop writes
    it: the loop lands a pause after it with ``pause_if_requested(epoch_end_done=True)``."""

    def end_epoch(self) -> None:
        Curriculum.end_epoch.__wrapped__(self)  # type: ignore[attr-defined]


def train(trainer: Curriculum, pause: tuple[int, Path] | None = None) -> None:
    """The epoch loop; ``pause``: request one before that step (it lands after the epoch's
    end work when the step ends an epoch)."""
    while trainer.epochs < EPOCHS:
        for batch in trainer.loader:
            if pause is not None and len(trainer.losses) + 1 == pause[0]:
                trainer.request_pause(pause[1])
            trainer.step(batch)
            if trainer.paused:
                return
        trainer.end_epoch()
        if trainer.pause_if_requested(epoch_end_done=True):
            return


def _assert_resumes_exactly(
    tmp_path: Path, pause_before: int, trainer_class: type[Curriculum] = Curriculum
) -> None:
    reference = trainer_class()
    train(reference)
    paused = trainer_class()
    train(paused, (pause_before, tmp_path / "pause.ckpt"))
    assert paused.paused
    resumed = trainer_class()
    resumed.resume(tmp_path / "pause.ckpt")
    resumed.losses = list(paused.losses)
    resumed.validations = list(paused.validations)
    train(resumed)
    assert len(resumed.losses) == len(reference.losses) == EPOCHS * STEPS_PER_EPOCH
    assert all(torch.equal(a, b) for a, b in zip(reference.losses, resumed.losses))
    assert all(torch.equal(a, b) for a, b in zip(reference.validations, resumed.validations))
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_a_pause_after_the_epoch_end_work_saves_the_validation_loader_where_it_left_it(tmp_path):
    # Requested before the epoch's last step: it lands after end_epoch() read the
    # augmented validation loader on (it was saved where the last step had left it).
    _assert_resumes_exactly(tmp_path, STEPS_PER_EPOCH)


def test_a_loader_put_in_place_by_epoch_end_work_and_by_the_extra_state_hook_resumes(tmp_path):
    # After the switch: the pause holds the new loader's position (it held the old one's),
    # and the loader _load_resume_extra_state puts in place gets it (it started over).
    _assert_resumes_exactly(tmp_path, SWITCH_AFTER * STEPS_PER_EPOCH)
    _assert_resumes_exactly(tmp_path, SWITCH_AFTER * STEPS_PER_EPOCH + 2)


def test_epoch_end_work_that_is_not_serialized_is_saved_where_it_left_its_loaders(tmp_path):
    # pause_if_requested(epoch_end_done=True) after a plain method that read the
    # validation loader (it was saved where the last step had left it: every later
    # validation read the epoch again) or put the next phase's loader in place.
    _assert_resumes_exactly(tmp_path, STEPS_PER_EPOCH, PlainCurriculum)
    _assert_resumes_exactly(tmp_path, SWITCH_AFTER * STEPS_PER_EPOCH, PlainCurriculum)


def test_a_batch_fetched_for_the_next_step_stays_undelivered_across_serialized_work(tmp_path):
    trainer = Curriculum()
    batches = iter(trainer.loader)
    trainer.step(next(batches))
    fetched = next(batches)  # fetched for the next step, not trained on yet
    trainer.end_epoch()  # serialized work that reads the validation loader only
    trainer.pause(tmp_path / "pause.ckpt")
    resumed = Curriculum()
    resumed.resume(tmp_path / "pause.ckpt")
    again = next(iter(resumed.loader))
    assert all(torch.equal(a, b) for a, b in zip(fetched, again))
