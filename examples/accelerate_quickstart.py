"""A Hugging Face Accelerate training loop that survives preemption bit-identically.

    python examples/accelerate_quickstart.py --run-dir runs/accelerate
    accelerate launch --num_processes 2 examples/accelerate_quickstart.py --run-dir runs/accelerate

Stop it with a SIGTERM (``kill -TERM <pid>``, or ``--preempt-at-step 10`` to have it
signal its own process group, loader workers included, as a cluster would), then run
the same command again: it resumes from the pause file and ends with exactly the
weights of an uninterrupted run, in ``<run-dir>/final_weights.pt``. Run again after it
finished, it exits at once. The loop is Accelerate's usual one (bf16, gradient
accumulation, a shuffled loader with workers); the lines marked ``(*)`` are the ones
that make it resumable.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import Dataset

from trainer_resume import TrainingResumeMixin, run_finished, training_step  # (*)
from trainer_resume.adapters.accelerate import prepare_loader, resume_objects  # (*)
from trainer_resume.loaders import ResumableDataLoader  # (*)

EPOCHS = 3


class NoisyRegression(Dataset):
    """A fixed regression problem; every read adds random noise (augmentation)."""

    def __init__(self, samples: int = 96, features: int = 8) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(samples, features, generator=generator)
        self.y = self.x @ torch.randn(features, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Python, NumPy and torch's global generators: the loader replays all three.
        noise = 0.05 * (torch.randn(self.x.shape[1]) + random.random() + np.random.rand())
        return self.x[index] + noise.float(), self.y[index]


class Training(TrainingResumeMixin):  # (*) the mixin
    def __init__(self, preempt_at: int | None) -> None:
        self.accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
        set_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
            model, optimizer, scheduler
        )
        # (*) was: self.accelerator.prepare(DataLoader(..., shuffle=True, num_workers=2))
        self.loader = prepare_loader(
            self.accelerator,
            ResumableDataLoader(
                NoisyRegression(), batch_size=8, shuffle=True, num_workers=2, resumable=True
            ),
        )
        self.preempt_at = preempt_at
        self._initialize_training_resume({"example": "accelerate"}, version="1")  # (*)

    def _resume_objects(self) -> dict[str, Any]:  # (*)
        return resume_objects(
            self.accelerator, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )

    def _resume_loaders(self) -> dict[str, Any]:  # (*)
        return {"train": self.loader}

    @training_step  # (*) one micro-batch: a pause may land inside an accumulation window
    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if self.completed_steps + 1 == self.preempt_at:
            os.killpg(os.getpgrp(), signal.SIGTERM)  # what Slurm or Kubernetes send
        inputs, targets = batch
        with self.accelerator.accumulate(self.model):
            loss = nn.functional.mse_loss(self.model(inputs).float(), targets)
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run-dir", type=Path, default=Path("runs/accelerate"))
    parser.add_argument(
        "--preempt-at-step",
        type=int,
        default=None,
        help="send SIGTERM to this process group during this micro-step",
    )
    args = parser.parse_args()
    pause = args.run_dir / "pause.ckpt"
    if run_finished(pause) is not None:  # a requeued job whose run is done
        print(f"the run in {args.run_dir} is finished; weights in final_weights.pt")
        return
    args.run_dir.mkdir(parents=True, exist_ok=True)
    training = Training(args.preempt_at_step)
    accelerator = training.accelerator
    training.pause_on_signal(pause)  # (*) SIGTERM / SIGUSR1 pause at the end of the step
    if pause.exists():
        training.resume(pause)  # (*)
        accelerator.print(f"resumed at micro-step {training.completed_steps}")
    for _ in range(training.loader.epoch, EPOCHS):  # (*) the epoch comes back with the loader
        for batch in training.loader:
            training.step(batch)
            if training.paused:  # (*)
                accelerator.print(f"paused at micro-step {training.completed_steps}")
                return
    training.finish(pause)  # (*) a requeued job now exits at once
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(training.model).state_dict()
        torch.save(weights, args.run_dir / "final_weights.pt")
    accelerator.print(f"finished {training.completed_steps} micro-steps")


if __name__ == "__main__":
    main()
