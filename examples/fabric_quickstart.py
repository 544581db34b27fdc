"""A Lightning Fabric training loop that survives preemption bit-identically.

    python examples/fabric_quickstart.py --run-dir runs/fabric
    python examples/fabric_quickstart.py --run-dir runs/fabric --devices 2   # DDP on CPU (gloo)

Stop it with a SIGTERM (``kill -TERM <pid>``, or ``--preempt-at-step 10`` to have it
signal its own process group, every rank and loader worker included, as a cluster
would), then run the same command again: it resumes from the pause file and ends with
exactly the weights of an uninterrupted run, in ``<run-dir>/final_weights.pt``. Run
again after it finished, it exits at once. The loop is Fabric's usual one (bf16 mixed
precision, ``fabric.backward``, a shuffled loader with workers, a cosine schedule); the
lines marked ``(*)`` are the ones that make it resumable, and the objects and the loader
are returned as Fabric hands them back.
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
from lightning_fabric import Fabric
from torch import nn
from torch.utils.data import Dataset

from trainer_resume import TrainingResumeMixin, run_finished, training_step  # (*)
from trainer_resume.adapters.fabric import loader_epoch, resume_objects  # (*)
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
    def __init__(self, fabric: Fabric, preempt_at: int | None) -> None:
        self.fabric = fabric
        fabric.seed_everything(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        self.model, self.optimizer = fabric.setup(model, optimizer)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=36)
        # (*) was: DataLoader(...); ResumableDataLoader takes the same arguments
        self.loader = fabric.setup_dataloaders(
            ResumableDataLoader(
                NoisyRegression(), batch_size=8, shuffle=True, num_workers=2, resumable=True
            )
        )
        self.preempt_at = preempt_at
        self._initialize_training_resume({"example": "fabric"}, version="1")  # (*)

    def _resume_objects(self) -> dict[str, Any]:  # (*)
        return resume_objects(
            self.fabric, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )

    def _resume_loaders(self) -> dict[str, Any]:  # (*)
        return {"train": self.loader}

    @training_step  # (*)
    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if self.completed_steps + 1 == self.preempt_at:
            os.killpg(os.getpgrp(), signal.SIGTERM)  # what Slurm or Kubernetes send
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.model(inputs).float(), targets)
        self.fabric.backward(loss)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run-dir", type=Path, default=Path("runs/fabric"))
    parser.add_argument("--devices", type=int, default=1, help="processes (DDP on CPU above 1)")
    parser.add_argument(
        "--preempt-at-step",
        type=int,
        default=None,
        help="send SIGTERM to this process group during this step",
    )
    args = parser.parse_args()
    pause = args.run_dir / "pause.ckpt"
    if run_finished(pause) is not None:  # a requeued job whose run is done
        print(f"the run in {args.run_dir} is finished; weights in final_weights.pt")
        return
    args.run_dir.mkdir(parents=True, exist_ok=True)
    strategy = "ddp" if args.devices > 1 else "auto"
    fabric = Fabric(
        accelerator="cpu", devices=args.devices, strategy=strategy, precision="bf16-mixed"
    )
    fabric.launch()
    training = Training(fabric, args.preempt_at_step)
    training.pause_on_signal(pause)  # (*) SIGTERM / SIGUSR1 pause at the end of the step
    if pause.exists():
        training.resume(pause)  # (*)
        fabric.print(f"resumed at step {training.completed_steps}")
    for _ in range(loader_epoch(training.loader), EPOCHS):  # (*) the epoch comes back too
        for batch in training.loader:
            training.step(batch)
            if training.paused:  # (*)
                fabric.print(f"paused at step {training.completed_steps}")
                return
    training.finish(pause)  # (*) a requeued job now exits at once
    if fabric.is_global_zero:
        torch.save(training.model.state_dict(), args.run_dir / "final_weights.pt")
    fabric.print(f"finished {training.completed_steps} steps")


if __name__ == "__main__":
    main()
