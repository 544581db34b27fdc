"""The documented epoch loop, paused on an epoch's last batch, runs that epoch's end exactly once.

The loop steps a per-epoch scheduler and validates after the inner loop, as
docs/data-loading.md writes it. A pause (or a resume point) due at the step that
delivers an epoch's last batch lands at the next step boundary, after that work, so
the resumed run neither skips nor repeats it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_resume import ResumePoints
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, serialized_training, training_step
from trainer_resume.testing import first_difference

EPOCHS, SIZE, BATCH = 3, 16, 4  # 4 batches per epoch
LAST_OF_FIRST_EPOCH = SIZE // BATCH


class EpochTrainer(TrainingResumeMixin):
    def __init__(self, points: ResumePoints | None = None) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.5)
        data = torch.Generator().manual_seed(1)
        dataset = TensorDataset(
            torch.randn(SIZE, 3, generator=data), torch.randn(SIZE, 1, generator=data)
        )
        self.loader = ResumableDataLoader(dataset, batch_size=BATCH, shuffle=True, resumable=True)
        self.losses: dict[int, torch.Tensor] = {}
        self.validations: list[torch.Tensor] = []
        self._initialize_training_resume({"epochs": EPOCHS}, version="1", resume_points=points)

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.losses[self.completed_steps + 1] = loss.detach()

    @serialized_training
    def end_epoch(self) -> None:
        self.scheduler.step()
        with torch.no_grad():  # a random draw shows where validation sits in the RNG sequence
            self.validations.append(self.model(torch.rand(2, 3)).sum())


def train(
    trainer: EpochTrainer,
    request: tuple[int, Path] | None = None,
    *,
    then: Any = None,
    after_step: Any = None,
) -> None:
    """The docs' epoch loop; ``request``: pause asked for before that step; ``then``: called
    after the epoch-end work, ``after_step`` after each step (both may pause)."""
    loader = trainer.loader
    for _ in range(loader.epoch, EPOCHS):
        for batch in loader:
            if request is not None and trainer.completed_steps + 1 == request[0]:
                trainer.request_pause(request[1])
            trainer.step(batch)
            if trainer.paused:
                return
            if after_step is not None:
                after_step(trainer)
                if trainer.paused:
                    return
        trainer.end_epoch()
        if then is not None:
            then(trainer)
            if trainer.paused:
                return


def outcome(trainer: EpochTrainer, after: int = 0) -> dict[str, Any]:
    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "losses": {k: v for k, v in trainer.losses.items() if k > after},
        "rng_after": torch.rand(2),
    }


def uninterrupted() -> tuple[dict[str, Any], list[torch.Tensor]]:
    trainer = EpochTrainer()
    train(trainer)
    return outcome(trainer), trainer.validations


def finish(path: Path) -> tuple[EpochTrainer, int]:
    trainer = EpochTrainer()
    torch.rand(3)  # a missing RNG restore must not pass by luck
    trainer.resume(path)
    start = trainer.completed_steps
    train(trainer)
    return trainer, start


def test_a_pause_requested_at_an_epochs_last_batch_lands_after_the_epoch_end_work(
    tmp_path: Path,
) -> None:
    expected, validations = uninterrupted()
    paused = EpochTrainer()
    train(paused, (LAST_OF_FIRST_EPOCH, tmp_path / "pause.ckpt"))
    # Written at the first step of the next epoch, after scheduler.step() and validation.
    assert paused.completed_steps == LAST_OF_FIRST_EPOCH + 1
    assert len(paused.validations) == 1
    resumed, start = finish(tmp_path / "pause.ckpt")
    assert start == LAST_OF_FIRST_EPOCH + 1
    expected["losses"] = {k: v for k, v in expected["losses"].items() if k > start}
    difference = first_difference(expected, outcome(resumed, start))
    assert difference is None, difference
    assert first_difference(validations, paused.validations + resumed.validations) is None


def test_pause_if_requested_after_the_epoch_end_work_writes_the_pause_there(
    tmp_path: Path,
) -> None:
    expected, validations = uninterrupted()
    paused = EpochTrainer()
    train(
        paused,
        (LAST_OF_FIRST_EPOCH, tmp_path / "pause.ckpt"),
        then=lambda trainer: trainer.pause_if_requested(epoch_end_done=True),
    )
    assert paused.paused and paused.completed_steps == LAST_OF_FIRST_EPOCH
    resumed, start = finish(tmp_path / "pause.ckpt")
    assert start == LAST_OF_FIRST_EPOCH
    expected["losses"] = {k: v for k, v in expected["losses"].items() if k > start}
    assert first_difference(expected, outcome(resumed, start)) is None
    assert first_difference(validations, paused.validations + resumed.validations) is None


def test_a_resume_point_due_at_an_epochs_last_batch_is_taken_one_step_later(tmp_path: Path) -> None:
    expected, validations = uninterrupted()
    points = ResumePoints(
        tmp_path / "points", every_steps=LAST_OF_FIRST_EPOCH, keep=5, when_busy="wait"
    )
    trainer = EpochTrainer(points)
    train(trainer)
    points.wait()
    names = sorted(path.name for path in (tmp_path / "points").glob("point-*.ckpt"))
    assert names == [f"point-{step:012d}.ckpt" for step in (5, 9)]  # due at 4 and 8: epoch ends
    resumed, start = finish(tmp_path / "points" / names[0])
    assert start == 5
    expected["losses"] = {k: v for k, v in expected["losses"].items() if k > start}
    assert first_difference(expected, outcome(resumed, start)) is None
    assert first_difference(validations[1:], resumed.validations) is None


def test_the_loader_says_its_epoch_ended_from_the_last_batch_until_the_next_iteration() -> None:
    trainer = EpochTrainer()
    loader = trainer.loader
    seen = []
    for _ in loader:
        seen.append(loader.epoch_ended)
    seen.append(loader.epoch_ended)
    iter(loader)
    seen.append(loader.epoch_ended)
    assert seen == [False, False, False, True, True, False]


def test_pause_if_requested_right_after_an_epochs_last_batch_hands_the_pause_past_the_epoch_end_work(
    tmp_path: Path,
) -> None:
    expected, validations = uninterrupted()
    paused = EpochTrainer()
    returned: dict[int, bool] = {}

    def request_and_land(trainer: EpochTrainer) -> None:
        # The loop asks for the pause and lands it itself, right after the epoch's last batch.
        if trainer.completed_steps == LAST_OF_FIRST_EPOCH:
            trainer.request_pause(tmp_path / "pause.ckpt")
        returned[trainer.completed_steps] = trainer.pause_if_requested()

    train(paused, after_step=request_and_land)
    # Not written there (False, still requested), but when the next epoch's first step
    # ended: after scheduler.step() and validation.
    assert returned == dict.fromkeys(range(1, LAST_OF_FIRST_EPOCH + 1), False)
    assert paused.paused and paused.completed_steps == LAST_OF_FIRST_EPOCH + 1
    assert len(paused.validations) == 1
    resumed, start = finish(tmp_path / "pause.ckpt")
    assert start == LAST_OF_FIRST_EPOCH + 1
    expected["losses"] = {k: v for k, v in expected["losses"].items() if k > start}
    difference = first_difference(expected, outcome(resumed, start))
    assert difference is None, difference
    assert first_difference(validations, paused.validations + resumed.validations) is None
