"""Quickstart: a trainer that is preempted by SIGTERM and resumes bit-identically.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import os
import signal
import tempfile

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_resume import TrainingResumeMixin, training_step
from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader


class Trainer(TrainingResumeMixin):
    def __init__(self, config: dict) -> None:
        torch.manual_seed(config["seed"])
        self.model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config["lr"])
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=10, gamma=0.5)
        data = TensorDataset(torch.randn(100, 8), torch.randn(100, 1))
        self.loader = ResumableDataLoader(
            data,
            batch_size=config["batch_size"],
            sampler=InfiniteRandomSampler(data, resumable=True),  # endless, resumable stream
            num_workers=2,
            resumable=True,
        )
        self.batches = iter(self.loader)
        # Signs the config: resuming with a different config is refused (error 323).
        self._initialize_training_resume(config, version="quickstart/1")

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _resume_loaders(self):
        return {"train": self.loader}

    def _rebuild_resume_iterators(self):
        self.batches = iter(self.loader)  # continues at the first undelivered batch

    @training_step
    def step(self) -> float:
        inputs, targets = next(self.batches)
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.item()


def train(
    trainer: Trainer, steps: int, pause_file: str, *, preempt_after: int | None = None
) -> list[float]:
    """Train until ``steps`` steps are done or a pause was written."""
    losses = []
    # SIGTERM / SIGUSR1 -> pause at the next step boundary
    handlers = trainer.pause_on_signal(pause_file)
    try:
        while trainer.completed_steps < steps and not trainer.paused:
            losses.append(trainer.step())
            if trainer.completed_steps == preempt_after:
                os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler does to a preempted job
    finally:
        handlers.restore()
    return losses


def main() -> int:
    config = {"seed": 0, "lr": 0.01, "batch_size": 16}
    with tempfile.TemporaryDirectory() as workdir:
        pause_file = os.path.join(workdir, "pause.ckpt")

        reference = Trainer(config)
        expected = train(reference, 60, pause_file)

        first = Trainer(config)
        losses = train(first, 60, pause_file, preempt_after=25)
        print(f"paused after step {first.completed_steps}: {first.paused}")

        second = Trainer(config)  # in real life: a new process, after the restart
        second.resume(pause_file)
        losses += train(second, 60, pause_file)

        same_losses = losses == expected
        same_weights = all(
            torch.equal(a, b)
            for a, b in zip(
                reference.model.state_dict().values(), second.model.state_dict().values()
            )
        )
        for trainer in (reference, first, second):
            trainer.loader.close()
    print(f"losses identical: {same_losses}, weights identical: {same_weights}")
    print("bit-identical:", "yes" if same_losses and same_weights else "no")
    return 0 if same_losses and same_weights else 1


if __name__ == "__main__":
    raise SystemExit(main())
