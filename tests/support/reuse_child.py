"""Picklable builds for the reuse tests, and a child process that continues a run.

Run as a script: ``python reuse_child.py DIRECTORY OUT LOG_DIR START STOP`` runs
epochs ``START..STOP-1`` of :func:`make_loader` over ``DIRECTORY`` and saves the
batches of each epoch to ``OUT``.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_resume.loaders.reuse import ReuseDataLoader, ReuseKey

SIZE = 24
LIFETIME = 3
SEED = 20240611
BATCH_SIZE = 5  # does not divide SIZE: every epoch ends with a short batch


class RandomBuild:
    """Draws from the global generators (seeded by the dataset) and logs each call.

    The sample depends on the key's index and seed only, never on the epoch it is
    first served in, as the dataset requires.
    """

    def __init__(
        self, log_dir: str | os.PathLike[str] | None = None, *, scale: float = 1.0
    ) -> None:
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        if self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
        self.scale = scale
        self.calls: list[tuple[int, int]] = []  # (epoch, index), this process only

    def __call__(self, key: ReuseKey) -> dict[str, torch.Tensor]:
        self.calls.append((key.epoch, key.index))
        if self.log_dir is not None:
            # One file per process, appended line by line: workers never interleave.
            with open(Path(self.log_dir) / f"{os.getpid()}.log", "a") as log:
                log.write(f"{key.epoch} {key.index}\n")
        return {
            "index": torch.tensor(key.index),
            "generation": torch.tensor(key.generation),
            "x": torch.rand(3) * self.scale,
            "py": torch.tensor(random.random()),
            "np": torch.tensor(np.random.rand()),
        }


def logged_calls(log_dir: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """Every (epoch, index) that a :class:`RandomBuild` logged to ``log_dir``, any process."""
    calls = []
    for log in sorted(Path(log_dir).glob("*.log")):
        for line in log.read_text().splitlines():
            epoch, index = line.split()
            calls.append((int(epoch), int(index)))
    return calls


@dataclass
class Point:
    """A sample type outside the weights-only set (needs a custom save/load)."""

    x: float
    y: float


def make_loader(
    directory: str | os.PathLike[str], log_dir: str | os.PathLike[str] | None = None, **kwargs: Any
) -> ReuseDataLoader:
    options: dict[str, Any] = {
        "lifetime": LIFETIME,
        "seed": SEED,
        "batch_size": BATCH_SIZE,
        "shuffle": True,
    }
    options.update(kwargs)
    return ReuseDataLoader(RandomBuild(log_dir), SIZE, directory, **options)


def run_epochs(loader: ReuseDataLoader, epochs: int) -> list[list[Any]]:
    """The batches of the next ``epochs`` iterations of ``loader``."""
    return [list(loader) for _ in range(epochs)]


def main(argv: list[str]) -> None:
    directory, out, log_dir, start, stop = argv
    loader = make_loader(directory, log_dir, start_epoch=int(start))
    torch.save(run_epochs(loader, int(stop) - int(start)), out)


if __name__ == "__main__":
    main(sys.argv[1:])
