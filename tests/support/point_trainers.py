"""Trainers and child processes of the resume-point tests (importable by spawned processes)."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

import torch

from support.trainers import TinyTrainer, tiny_config
from trainer_resume import ResumePoints, SkippedCheckpointWarning, save_checkpoint
from trainer_resume import resume_points as resume_points_module


def points_trainer(
    directory: Any, config: dict[str, Any] | None = None, **options: Any
) -> TinyTrainer:
    """A TinyTrainer that takes resume points into ``directory``."""
    trainer = TinyTrainer(config)
    points = ResumePoints(directory, **options)
    trainer._initialize_training_resume(trainer.config, version="1.0", resume_points=points)
    trainer.points = points
    return trainer


class GatedWrites:
    """Holds every background point write until ``release()`` (patches the writer's save_checkpoint)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        monkeypatch.setattr(resume_points_module, "save_checkpoint", self._save)

    def _save(self, *args: Any, **kwargs: Any) -> None:
        self.started.set()
        self.gate.wait(30)
        save_checkpoint(*args, **kwargs)

    def release(self) -> None:
        self.gate.set()


# ----------------------------------------------------------------------- child processes

CRASH_STEPS = 200  # room for 20 kills that each move the run on by a few points
CRASH_EVERY = 3


def crash_config() -> dict[str, Any]:
    """Wide enough that a point takes several steps to write, so kills land inside writes too."""
    return tiny_config(width=256, outputs=256, batches=7, lr=0.01)


def train_with_points(directory: str, losses_dir: str, ready_path: str) -> None:
    """Child: resume from the newest point (if any) and train to CRASH_STEPS.

    Each loss goes to its own file named by its step (replaced atomically, so a kill
    never leaves half a file); the parent compares every one with the reference.
    """
    warnings.simplefilter("error", SkippedCheckpointWarning)  # nothing may be damaged by a kill
    trainer = points_trainer(directory, crash_config(), every_steps=CRASH_EVERY, keep=2)
    resumed = trainer.resume_latest()
    with open(ready_path + ".partial", "w") as ready:
        ready.write(f"{trainer.completed_steps} {resumed}")
    os.replace(ready_path + ".partial", ready_path)
    while trainer.completed_steps < CRASH_STEPS:
        loss = trainer.train_step()
        _save_atomically(loss, os.path.join(losses_dir, f"{trainer.completed_steps:06d}.pt"))
    final = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
    _save_atomically(final, os.path.join(losses_dir, "final.pt"))


def _save_atomically(value: Any, path: str) -> None:
    temp = path + ".partial"
    torch.save(value, temp)
    os.replace(temp, path)


def exit_while_writing(directory: str) -> None:
    """Child: take a point of a 34 MB state and leave the interpreter at once."""
    from support.trainers import wide_config

    trainer = points_trainer(directory, wide_config())
    trainer.train_step()
    trainer.checkpoint()
    sys.exit(0)
