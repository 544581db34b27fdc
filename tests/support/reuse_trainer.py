"""A trainer that returns its ``ReuseDataLoader`` from ``_resume_loaders()``, run in a process of its own.

    python -m support.reuse_trainer MODE WORKDIR [STEP]

An epoch loop as users write it: ``for batch in trainer.batches: trainer.step(batch)``,
then the epoch's work (a per-epoch LR step, the next iterator) in a
``@serialized_training`` call. Two workers, a ``collate_fn`` that draws, samples built
with random draws, Dropout. Modes:

* ``reference``: the whole run, uninterrupted;
* ``signal``: ``pause_on_signal``; the step numbered ``STEP`` sends this process a real
  SIGTERM, and the run stops once paused;
* ``points``: resume points after every second step; the step numbered ``STEP`` kills
  this process (SIGKILL) before it returns;
* ``resume``: resumes the pause file; ``latest``: the newest resume point; both run to
  the end.

Each writes ``WORKDIR/<mode>.pt``: the loss of each step it ran and, at its end, the
model's and the optimizer's states.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from support.reuse_child import RandomBuild
from trainer_resume import TrainingResumeMixin, serialized_training, training_step
from trainer_resume.loaders.reuse import ReuseDataLoader
from trainer_resume.resume_points import ResumePoints

EPOCHS = 3
SIZE = 24
BATCH_SIZE = 5  # 5 batches an epoch, the last of 4 samples
BATCHES_PER_EPOCH = 5


def noisy_collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Collates, and draws a noise per sample (as a mixup or a random crop in the collate would)."""
    batch = default_collate(samples)
    batch["noise"] = torch.rand(len(samples))
    return batch


class ReuseTrainer(TrainingResumeMixin):
    def __init__(self, workdir: Path, *, points: bool = False, kill_at: int | None = None) -> None:
        torch.manual_seed(3)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)
        self.loader = ReuseDataLoader(
            RandomBuild(),
            SIZE,
            workdir / "prepared",
            lifetime=2,
            seed=11,
            batch_size=BATCH_SIZE,
            shuffle=True,
            num_workers=2,
            collate_fn=noisy_collate,
        )
        self.epoch = 0
        self.kill_at = kill_at
        self.losses: dict[int, torch.Tensor] = {}
        self.batches = iter(self.loader)
        self._initialize_training_resume(
            {"loader": "reuse"},
            version="1",
            resume_points=ResumePoints(workdir / "points", every_steps=2) if points else None,
        )

    def _resume_objects(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    def _resume_extra_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def _load_resume_extra_state(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]

    def _rebuild_resume_iterators(self) -> None:
        self.batches = iter(self.loader)

    @training_step
    def step(self, batch: dict[str, torch.Tensor]) -> None:
        number = self.completed_steps + 1
        inputs = batch["x"] + batch["noise"][:, None]
        loss = (self.model(inputs).squeeze(1) - batch["py"]).square().mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.losses[number] = loss.detach()
        if number == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    @serialized_training
    def end_epoch(self) -> None:
        self.scheduler.step()
        self.epoch += 1
        self.batches = iter(self.loader)

    def train(self, signal_at: int | None = None) -> None:
        while self.epoch < EPOCHS:
            for batch in self.batches:
                if self.completed_steps + 1 == signal_at:
                    os.kill(os.getpid(), signal.SIGTERM)  # arrives before the step: lands after it
                self.step(batch)
                if self.paused:
                    return
            self.end_epoch()


def main(mode: str, workdir: Path, step: int | None) -> None:
    pause_file = workdir / "pause.ckpt"
    trainer = ReuseTrainer(
        workdir, points=mode in ("points", "latest"), kill_at=step if mode == "points" else None
    )
    if mode == "signal":
        trainer.pause_on_signal(pause_file)
    elif mode == "resume":
        trainer.resume(pause_file)
    elif mode == "latest":
        trainer.resume_latest()
    trainer.train(signal_at=step if mode == "signal" else None)
    result: dict[str, Any] = {"losses": trainer.losses, "paused_at": None}
    if trainer.paused:
        result["paused_at"] = trainer.completed_steps
    else:
        result["model"] = trainer.model.state_dict()
        result["optimizer"] = trainer.optimizer.state_dict()
    torch.save(result, workdir / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
