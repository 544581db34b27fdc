"""Small trainers shared by the mixin and testing tests (importable by spawned processes)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer_resume.mixin import TrainingResumeMixin, serialized_training, training_step
from trainer_resume.state import cpu_state


def tiny_config(**changes: Any) -> dict[str, Any]:
    config = {"seed": 3, "lr": 0.1, "width": 4, "outputs": 2, "batches": 5, "load": None}
    config.update(changes)
    return config


class TinyTrainer(TrainingResumeMixin):
    """A Linear model, SGD with momentum and a list of batches walked by an extra counter.

    Every step draws from Python ``random``, NumPy's global generator and torch
    (dropout), so a missing RNG restore changes the next step.
    """

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        *,
        version: str = "1.0",
        key: bytes | None = None,
        config_ignore: tuple[str, ...] = (),
    ):
        self.config = tiny_config() if config is None else config
        width, outputs = self.config["width"], self.config["outputs"]
        torch.manual_seed(self.config["seed"])
        random.seed(self.config["seed"])
        np.random.seed(self.config["seed"])
        self.model = nn.Linear(width, outputs)
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=self.config["lr"], momentum=0.9
        )
        data = torch.Generator().manual_seed(self.config["seed"])
        self.batches = [
            (torch.randn(6, width, generator=data), torch.randn(6, outputs, generator=data))
            for _ in range(self.config["batches"])
        ]
        self.position = 0
        self.closed = False
        self._initialize_training_resume(
            self.config, version=version, key=key, config_ignore=config_ignore
        )

    def _resume_objects(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _resume_loaders(self):
        return {}

    def _resume_extra_state(self):
        return {"position": self.position}

    def _load_resume_extra_state(self, state):
        self.position = state["position"]

    @training_step
    def train_step(self) -> torch.Tensor:
        inputs, targets = self.batches[self.position % len(self.batches)]
        self.position += 1
        noise = random.random() + float(np.random.rand())
        inputs = nn.functional.dropout(inputs, 0.25, training=True) + noise
        loss = nn.functional.mse_loss(self.model(inputs), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    @serialized_training
    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state(self) -> dict[str, Any]:
        """Everything a refusal must leave unchanged, plus the next global RNG draws."""
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        draws = {
            "python": random.random(),
            "numpy": float(np.random.rand()),
            "torch": torch.rand(3),
        }
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        return {
            "model": cpu_state(self.model.state_dict()),
            "optimizer": cpu_state(self.optimizer.state_dict()),
            "position": self.position,
            "completed_steps": self.completed_steps,
            "paused": self.paused,
            "locked": self.locked,
            "rng": draws,
        }

    def close(self) -> None:
        self.closed = True


class SharedKeysTrainer(TinyTrainer):
    """Keeps its weights and optimizer in a regular checkpoint shared with the resume objects."""

    shared = ("model", "optimizer")

    def _regular_checkpoint(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "note": "weights",
        }

    def _resume_shared_keys(self):
        return self.shared


class SeparateCopiesTrainer(SharedKeysTrainer):
    """Same regular checkpoint, but the resume objects are saved again on their own."""

    shared = ()


def wide_config() -> dict[str, Any]:
    """About 4M parameters plus momentum: a 34 MB pause file that takes a while to write."""
    return tiny_config(width=2048, outputs=2048, batches=3, lr=1e-3)


class TwoCounterTrainer(TrainingResumeMixin):
    """A step that sleeps between two mutations: a pause inside it would see first != second."""

    def __init__(self, *, pause_delay: float = 0.002):
        self.first = 0
        self.second = 0
        self.delay = pause_delay
        self.steps_started = threading.Event()
        self._initialize_training_resume({"kind": "two-counters"}, version="1")

    def _resume_objects(self):
        return {}

    def _resume_loaders(self):
        return {}

    def _resume_extra_state(self):
        return {"first": self.first, "second": self.second}

    def _load_resume_extra_state(self, state):
        self.first = state["first"]
        self.second = state["second"]

    @training_step
    def step(self) -> None:
        self.steps_started.set()
        self.first += 1
        time.sleep(self.delay)
        self.second += 1


def make_tiny(config: dict[str, Any] | None = None) -> TinyTrainer:
    return TinyTrainer(config)


def make_wide() -> TinyTrainer:
    return TinyTrainer(wide_config())


def trained_state(trainer: TinyTrainer, steps: int) -> dict[str, Any]:
    """``trainer``'s state once it has completed ``steps`` steps (it trains up to them)."""
    while trainer.completed_steps < steps:
        trainer.train_step()
    return trainer.state()


def uninterrupted_state(steps: int, make: Any = TinyTrainer) -> dict[str, Any]:
    """An uninterrupted run's state after ``steps``; the global generators, which a
    resumed trainer in this process uses, are given back as they were."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        return trained_state(make(), steps)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def run_tiny_step(trainer: TinyTrainer) -> torch.Tensor:
    return trainer.train_step()


def snapshot_tiny(trainer: TinyTrainer) -> dict[str, Any]:
    state = trainer.state()
    return {key: state[key] for key in ("model", "optimizer", "position", "rng")}


def pause_repeatedly(path: str, ready_path: str) -> None:
    """Child process: step, pause, resume, forever (until killed)."""
    trainer = TinyTrainer(wide_config())
    while True:
        trainer.train_step()
        trainer.pause(path)
        if ready_path:
            open(ready_path, "w").close()
            ready_path = ""
        trainer.resume(path)
