"""A loop that stops its epochs early (``STEPS`` of an epoch's ``BATCHES`` batches), for
``tests/mixin/test_mixin_early_epoch_end.py``; resumes run in a new process:

    python tests/support/early_epochs.py WORKDIR NAME...

resumes ``WORKDIR/NAME.ckpt`` for each NAME in a fresh trainer, trains to the end and
writes what must equal the uninterrupted run to ``WORKDIR/NAME.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, RandomSampler

from trainer_resume import ResumePoints
from trainer_resume.loaders import ResumableDataLoader
from trainer_resume.mixin import TrainingResumeMixin, serialized_training, training_step

BATCHES, STEPS, EPOCHS = 4, 2, 4  # the loop reads 2 of an epoch's 4 batches
PAUSE_AT = 2 * STEPS  # completed steps when the pause is taken: after the second epoch


class Augmented(Dataset):
    """Each sample draws its augmentation from the global generator the loader seeds."""

    def __len__(self) -> int:
        return 2 * BATCHES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((3,), index / 8) + torch.rand(3)
        return x, x.sum(0, keepdim=True) * 0.1


class EarlyEpochs(TrainingResumeMixin):
    """``sampled``: epochs of ``STEPS`` batches by the sampler
    (``RandomSampler(num_samples=...)``), which the loop's ``break`` then meets at their end."""

    def __init__(self, points: Path | None = None, sampled: bool = False) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, 1, gamma=0.5)
        data = Augmented()
        if sampled:
            sampler = RandomSampler(data, num_samples=STEPS * 2)
            self.loader = ResumableDataLoader(data, batch_size=2, sampler=sampler, resumable=True)
        else:
            self.loader = ResumableDataLoader(data, batch_size=2, shuffle=True, resumable=True)
        self.losses: list[torch.Tensor] = []
        every = None if points is None else ResumePoints(points, every_steps=STEPS)
        self._initialize_training_resume({"early": 1}, version="1", resume_points=every)

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.detach())

    @serialized_training
    def epoch_end(self) -> None:
        self.scheduler.step()


def train(trainer: EarlyEpochs, *, end_epoch: bool = True, pause: Any = None) -> None:
    """The loop, to ``EPOCHS`` epochs of ``STEPS`` steps. ``pause``: ``(how, path)``, taken
    after ``PAUSE_AT`` steps: ``"pause"`` calls ``pause()`` after the epoch-end work,
    ``"requested"`` asks for one there (as a signal during it would) and lands it with
    ``pause_if_requested(epoch_end_done=True)``, ``"fetched"`` lands one after the next
    epoch's first batch was fetched, before its step, ``"signalled"`` asks for one before
    the epoch's last step (as a signal during that step would)."""
    how, path = pause if pause is not None else (None, None)
    while trainer.completed_steps < EPOCHS * STEPS:
        for batch in trainer.loader:
            if how == "fetched" and trainer.completed_steps == PAUSE_AT:
                trainer.request_pause(path)
                assert trainer.pause_if_requested()
                return
            if how == "signalled" and trainer.completed_steps + 1 == PAUSE_AT:
                trainer.request_pause(path)
            trainer.step(batch)
            if trainer.paused:
                return
            if trainer.completed_steps % STEPS == 0:
                break
        if end_epoch:
            trainer.loader.end_epoch()
        trainer.epoch_end()
        if trainer.completed_steps == PAUSE_AT and how == "pause":
            trainer.pause(path)
            return
        if trainer.completed_steps == PAUSE_AT and how == "requested":
            trainer.request_pause(path)
        if trainer.pause_if_requested(epoch_end_done=True):
            return


def outcome(trainer: EarlyEpochs) -> dict[str, Any]:
    """What must equal the uninterrupted run."""
    return {
        "losses": list(trainer.losses),
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "epoch": trainer.loader.epoch,
        "rng_after": torch.rand(3),
    }


def resume_and_finish(workdir: Path, name: str) -> None:
    """``NAME.ckpt`` resumed and trained to the end; a name starting with ``sampled`` is
    a run of the ``sampled`` trainer."""
    trainer = EarlyEpochs(sampled=name.startswith("sampled"))
    torch.rand(5)  # a resume that forgot the generators must not pass by luck
    trainer.resume(workdir / f"{name}.ckpt")
    trainer.losses = [torch.full((), float("nan"))] * trainer.completed_steps
    train(trainer)
    torch.save(outcome(trainer), workdir / f"{name}.pt")


if __name__ == "__main__":
    for job in sys.argv[2:]:
        resume_and_finish(Path(sys.argv[1]), job)
