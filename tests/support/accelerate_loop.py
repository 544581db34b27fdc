"""A standard Accelerate training loop made resumable (bf16, accumulation 4, dropout, 2 workers).

``run(...)`` trains one phase in this process (fresh, paused by a SIGTERM to the whole
process group at a chosen micro-step, or resumed from a pause file) and writes what it
saw to a results file per rank: every loss and batch from its first step on, and the
final model, optimizer, scheduler and Accelerator states. ``main`` runs several phases
in one process (``python -m support.accelerate_loop spec.json``, or under ``torchrun``,
which starts every rank in a process group of its own).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import Dataset

from support.gloo_fork import worker_options
from trainer_resume import ResumeError, TrainingResumeMixin, training_step
from trainer_resume.adapters.accelerate import prepare_loader, resume_objects
from trainer_resume.loaders import ResumableDataLoader

SIZE, BATCH, EPOCHS, ACCUMULATION = 40, 4, 3, 4  # 10 global batches per epoch
EVALUATION_SIZE = 23  # not a multiple of any total batch size: the last batch is padded
CONFIG = {"model": "accelerate-loop", "accumulation": ACCUMULATION, "batch": BATCH}


class NoisyDataset(Dataset):
    """Sample i: features augmented from Python ``random``, NumPy and torch, and a target."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(3)
        self.x = torch.randn(SIZE, 6, generator=generator)
        self.y = torch.randn(SIZE, 1, generator=generator)

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        noise = 0.1 * (torch.rand(6) + random.random() + float(np.random.rand()))
        return self.x[index] + noise, self.y[index], torch.tensor(index)


def fresh_accelerate_state() -> None:
    """Forget Accelerate's process-wide singletons, as a new process starts without them."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


class AccelerateLoop(TrainingResumeMixin):
    def __init__(
        self,
        *,
        workers: int = 2,
        signal_at: int | None = None,
        signal_launcher: bool = False,
        accumulation: int = ACCUMULATION,
    ) -> None:
        self.accelerator = Accelerator(
            cpu=True, mixed_precision="bf16", gradient_accumulation_steps=accumulation
        )
        set_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))
        loader = ResumableDataLoader(
            NoisyDataset(),
            batch_size=BATCH,
            shuffle=True,
            resumable=True,
            **worker_options(workers),
        )
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
            model, optimizer, scheduler
        )
        self.loader = prepare_loader(self.accelerator, loader)
        self.signal_at = signal_at
        self.signal_launcher = signal_launcher
        self._initialize_training_resume(CONFIG, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return resume_objects(
            self.accelerator, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> torch.Tensor:
        if self.completed_steps + 1 == self.signal_at:
            if self.signal_launcher and self.accelerator.is_main_process:
                # torchrun's own group: it forwards the signal to every rank's group (later).
                os.killpg(os.getpgid(os.getppid()), signal.SIGTERM)
            os.killpg(os.getpgrp(), signal.SIGTERM)  # this rank and its loader workers
        inputs, targets, _ = batch
        with self.accelerator.accumulate(self.model):
            loss = nn.functional.mse_loss(self.model(inputs).float(), targets)
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        return loss.detach()


def train(trainer: AccelerateLoop) -> dict[str, Any]:
    """The loop as written for Accelerate: epochs of the prepared loader, one step per batch."""
    losses, batches = [], []
    for _ in range(trainer.loader.epoch, EPOCHS):
        for batch in trainer.loader:
            losses.append(trainer.step(batch))
            batches.append([part.clone() for part in batch])
            if trainer.paused:
                return {"losses": losses, "batches": batches}
    return {"losses": losses, "batches": batches}


def evaluate(accelerator: Accelerator) -> list[int]:
    """Sample ids of one evaluation pass, gathered from every process for metrics."""
    data = torch.utils.data.Subset(NoisyDataset(), range(EVALUATION_SIZE))
    loader = prepare_loader(accelerator, ResumableDataLoader(data, BATCH, resumable=True))
    ids: list[int] = []
    for batch in loader:
        ids.extend(accelerator.gather_for_metrics(batch[2]).tolist())
    return ids


def final_states(trainer: AccelerateLoop) -> dict[str, Any]:
    objects = trainer._resume_objects()
    return {name: obj.state_dict() for name, obj in objects.items()}


def run(
    results: str,
    *,
    signal_at: int | None = None,
    pause: str | None = None,
    resume: str | None = None,
    workers: int = 2,
    signal_launcher: bool = False,
    evaluation: bool = False,
) -> None:
    """One phase: train from scratch (pausing to ``pause`` on a signal) or from ``resume``.

    A refused resume is recorded (code and detail) instead of raised.
    """
    fresh_accelerate_state()
    trainer = AccelerateLoop(workers=workers, signal_at=signal_at, signal_launcher=signal_launcher)
    rank = trainer.accelerator.process_index
    handlers = trainer.pause_on_signal(pause) if pause is not None else None
    if resume is not None:
        try:
            trainer.resume(resume)
        except ResumeError as error:
            torch.save({"refused": [error.code, error.detail]}, f"{results}.rank{rank}.pt")
            return
    first = trainer.completed_steps
    seen = train(trainer)
    if handlers is not None:
        handlers.restore()
    if signal_launcher:
        # The launcher forwards its SIGTERM when it gets to it: after the pause, that
        # late copy must not end this rank before it reports.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    trainer.loader.close()
    record = {
        **seen,
        "evaluated": evaluate(trainer.accelerator) if evaluation else None,
        "first_step": first,
        "completed_steps": trainer.completed_steps,
        "paused": trainer.paused,
        "states": final_states(trainer),
        "world_size": trainer.accelerator.num_processes,
    }
    torch.save(record, f"{results}.rank{rank}.pt")


def assert_identical(expected: Any, got: Any, where: str = "state") -> None:
    """Nested dicts, lists and tensors equal to the bit (``torch.equal``), values by ``==``."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(expected, got), where
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), where
        for key, value in expected.items():
            assert_identical(value, got[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), where
        for index, (value, other) in enumerate(zip(expected, got)):
            assert_identical(value, other, f"{where}[{index}]")
    else:
        assert expected == got, where


def load_results(prefix: str, rank: int = 0) -> dict[str, Any]:
    """What ``run`` wrote for ``rank``."""
    return torch.load(f"{prefix}.rank{rank}.pt", weights_only=True)


def main(spec_path: str) -> None:
    with open(spec_path) as spec_file:
        phases = json.load(spec_file)
    for phase in phases:
        run(**phase)
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads (see ddp_workers)
