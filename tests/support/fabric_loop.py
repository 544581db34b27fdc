"""A Lightning Fabric training loop, as Fabric's docs write one, made resumable.

``Fabric(accelerator="cpu", precision="bf16-mixed")`` (or a ``MixedPrecision("16-mixed")``
plugin, whose GradScaler is part of the state), ``fabric.setup(model, optimizer)``, a
``ResumableDataLoader(shuffle=True, num_workers=2)`` through ``fabric.setup_dataloaders``
(or the adapter's ``setup_dataloaders``), ``fabric.backward``, dropout, a cosine schedule
stepped per optimizer step, samples augmented from ``random``, NumPy and torch, and
optionally gradient accumulation. The trainer returns the objects and the loader as
Fabric handed them back.

``run(...)`` trains one phase (fresh, paused by a SIGTERM to the whole process group at a
chosen step, or resumed from a pause file) and writes what it saw to a results file per
rank. ``python -m support.fabric_loop spec.json`` runs the spec's phases in one process,
each with a Fabric of its own; with ``"devices": 2`` the processes are launched by
``fabric.launch()`` (which starts the second rank by running the same command again) and
their phases share that one Fabric.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import warnings
from typing import Any

import numpy as np
import torch
from lightning_fabric import Fabric
from lightning_fabric.plugins import MixedPrecision
from torch import nn
from torch.utils.data import Dataset

from support.gloo_fork import worker_options
from trainer_resume import ResumeError, TrainingResumeMixin, training_step
from trainer_resume.adapters.fabric import loader_epoch, resume_objects, setup_dataloaders
from trainer_resume.loaders import ResumableDataLoader

SIZE, BATCH, EPOCHS = 40, 4, 3  # 10 global batches per epoch
CONFIG = {"model": "fabric-loop", "batch": BATCH}


class NoisyDataset(Dataset):
    """Sample i: features augmented from Python ``random``, NumPy and torch, a target, and i."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(3)
        self.x = torch.randn(SIZE, 6, generator=generator)
        self.y = torch.randn(SIZE, 1, generator=generator)

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        noise = 0.1 * (torch.rand(6) + random.random() + float(np.random.rand()))
        return self.x[index] + noise, self.y[index], torch.tensor(index)


def make_fabric(devices: int, precision: str) -> Fabric:
    """A launched Fabric on CPU: ``precision`` is Fabric's name, or ``"16-mixed"`` as a plugin
    (Fabric turns ``precision="16-mixed"`` into bf16 on CPU; the plugin keeps fp16 and its GradScaler)."""
    settings: dict[str, Any] = {"precision": precision}
    if precision == "16-mixed":
        settings = {"plugins": [MixedPrecision("16-mixed", "cpu")]}
    fabric = Fabric(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", **settings
    )
    fabric.launch()
    return fabric


class FabricLoop(TrainingResumeMixin):
    def __init__(
        self,
        fabric: Fabric,
        *,
        sharing: str = "fabric",
        accumulation: int = 1,
        signal_at: int | None = None,
        workers: int = 2,
    ) -> None:
        self.fabric = fabric
        fabric.seed_everything(0, workers=True)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        self.model, self.optimizer = fabric.setup(model, optimizer)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=40)
        loader = ResumableDataLoader(
            NoisyDataset(),
            batch_size=BATCH,
            shuffle=True,
            resumable=True,
            **worker_options(workers),
        )
        if sharing == "fabric":
            self.loader = fabric.setup_dataloaders(loader)
        else:
            self.loader = setup_dataloaders(fabric, loader)
        self.accumulation = accumulation
        self.signal_at = signal_at
        self._initialize_training_resume(CONFIG, version="1")

    def _resume_objects(self) -> dict[str, Any]:
        return resume_objects(
            self.fabric, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )

    def _resume_loaders(self) -> dict[str, Any]:
        return {"train": self.loader}

    @training_step
    def step(self, batch: Any) -> torch.Tensor:
        if self.completed_steps + 1 == self.signal_at:
            os.killpg(os.getpgrp(), signal.SIGTERM)  # every rank and its loader workers
        inputs, targets, _ = batch
        last = (self.completed_steps + 1) % self.accumulation == 0
        syncing = self.accumulation == 1 or self.fabric.world_size == 1
        context = (
            contextlib.nullcontext()
            if syncing
            else self.fabric.no_backward_sync(self.model, enabled=not last)
        )
        with context:
            loss = nn.functional.mse_loss(self.model(inputs).float(), targets)
            self.fabric.backward(loss / self.accumulation)
        if last:
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        return loss.detach()


def train(trainer: FabricLoop) -> dict[str, Any]:
    """The loop as Fabric's docs write it: epochs of the loader, one step per batch."""
    losses, batches = [], []
    for _ in range(loader_epoch(trainer.loader), EPOCHS):
        for batch in trainer.loader:
            losses.append(trainer.step(batch))
            batches.append([part.clone() for part in batch])
            if trainer.paused:
                return {"losses": losses, "batches": batches}
    return {"losses": losses, "batches": batches}


def final_states(trainer: FabricLoop) -> dict[str, Any]:
    objects = trainer._resume_objects()
    return {name: obj.state_dict() for name, obj in objects.items()}


def run(
    fabric: Fabric,
    results: str,
    *,
    sharing: str = "fabric",
    accumulation: int = 1,
    signal_at: int | None = None,
    pause: str | None = None,
    resume: str | None = None,
    workers: int = 2,
) -> None:
    """One phase: train from scratch (pausing to ``pause`` on a signal) or from ``resume``.

    A refused resume is recorded (code and detail) instead of raised.
    """
    trainer = FabricLoop(
        fabric, sharing=sharing, accumulation=accumulation, signal_at=signal_at, workers=workers
    )
    rank = fabric.global_rank
    handlers = trainer.pause_on_signal(pause) if pause is not None else None
    caught: list[str] = []
    if resume is not None:
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                trainer.resume(resume)
            caught = [f"{item.category.__name__}: {item.message}" for item in seen]
        except ResumeError as error:
            torch.save({"refused": [error.code, error.detail]}, f"{results}.rank{rank}.pt")
            return
    first = trainer.completed_steps
    seen_run = train(trainer)
    if handlers is not None:
        handlers.restore()
    record = {
        **seen_run,
        "first_step": first,
        "completed_steps": trainer.completed_steps,
        "paused": trainer.paused,
        "states": final_states(trainer),
        "warnings": [text for text in caught if text.startswith("WorldSizeChangeWarning")],
    }
    torch.save(record, f"{results}.rank{rank}.pt")


def load_results(prefix: str, rank: int = 0) -> dict[str, Any]:
    """What ``run`` wrote for ``rank``."""
    return torch.load(f"{prefix}.rank{rank}.pt", weights_only=True)


def main(spec_path: str) -> None:
    with open(spec_path) as spec_file:
        spec = json.load(spec_file)
    devices = spec["devices"]
    shared = make_fabric(devices, spec.get("precision", "bf16-mixed")) if devices > 1 else None
    for phase in spec["phases"]:
        # One Fabric per run, as a user has (its precision plugin's GradScaler is part of
        # the run); the processes of several launch once, so their runs share one.
        fabric = shared or make_fabric(devices, phase.pop("precision", "bf16-mixed"))
        run(fabric, **phase)
    if shared is not None:
        shared.barrier()  # every rank has written its results before the launcher exits
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown under gloo's threads (see ddp_workers)
