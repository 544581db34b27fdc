"""What the Hydra apps share: the data, the seeding, the wait for the test's SIGTERM and
the record of a run."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from trainer_resume.loaders import InfiniteRandomSampler, ResumableDataLoader

FEATURES = 4
# The model's activation by the option of the config group (model.activation).
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
# Set by the test for the launch it signals: after this step the app waits for the signal.
WAIT_ENV = "HYDRA_APP_WAIT_AT_STEP"
WAIT_S = 300.0  # generous: the machine may be loaded


class NoisyRegression(Dataset):
    """A fixed regression problem; each read adds noise from the global generators."""

    def __init__(self, samples: int, noise: float) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(samples, FEATURES, generator=generator)
        self.y = self.x @ torch.randn(FEATURES, 1, generator=generator)
        self.noise = noise

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        scale = 1.0 + self.noise * (random.random() + float(np.random.rand()))
        return scale * self.x[index] + self.noise * torch.randn(FEATURES), self.y[index]


def seed_everything(seed: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def build_loader(cfg: Any) -> ResumableDataLoader:
    data = NoisyRegression(cfg.data.samples, cfg.data.noise)
    return ResumableDataLoader(
        data,
        batch_size=cfg.data.batch_size,
        sampler=InfiniteRandomSampler(data, resumable=True),
        resumable=True,
    )


def wait_at_step() -> int | None:
    value = os.environ.get(WAIT_ENV)
    return int(value) if value else None


def report_step(step: int, loss: torch.Tensor, wait: int | None, ready: Callable[[], bool]) -> None:
    """Print the step and its loss; at step ``wait``, wait until ``ready()`` (the signal came)."""
    print(f"STEP {step} {float(loss).hex()}", flush=True)
    if step != wait:
        return
    print(f"WAITING {step}", flush=True)
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > deadline:
            print("no signal arrived", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(0.01)


def save_result(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    losses: dict[int, torch.Tensor],
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "losses": losses,
            "rng": torch.get_rng_state(),
        },
        path,
    )
