"""Runs of litdata's ``StreamingDataset`` through ``ResumableDataLoader``, and a child that resumes them.

The dataset is written with litdata's own writer (``litdata.streaming.Cache``) into a
folder of small chunks; every sample is augmented with draws from the three global
generators in ``__getitem__``, as a transform would. Run as a script,
``python streaming_runs.py DATA STATES OUT`` loads each interrupted run's loader
state from ``STATES`` into a new loader, in this new process, reads the rest of the
run and saves the batches to ``OUT``.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from typing import Any

import numpy as np
import torch

# litdata >= 0.2.70 asks PyPI for a newer release when a dataset is built, unless told not to.
os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
warnings.filterwarnings("ignore", message="A newer version of litdata")

from litdata import StreamingDataset  # noqa: E402
from litdata.streaming import Cache  # noqa: E402

from trainer_resume.loaders import ResumableDataLoader  # noqa: E402

SAMPLES = 64
BATCH_SIZE = 8
EPOCHS = 2
LOADER_SEED = 11

Batch = dict[str, torch.Tensor]


class AugmentedStream(StreamingDataset):
    """litdata's dataset with a random augmentation of every sample."""

    def __getitem__(self, index: Any) -> dict[str, Any]:
        item = super().__getitem__(index)
        noise = torch.rand(3) + random.random() + float(np.random.rand())
        return {"id": item["id"], "x": item["x"] + noise}


def write_dataset(folder: str) -> None:
    """Write ``SAMPLES`` samples into ``folder`` in chunks of 16."""
    cache = Cache(folder, chunk_size=16)
    for index in range(SAMPLES):
        cache[index] = {"id": index, "x": torch.full((3,), float(index))}
    cache.done()
    cache.merge()


def make_loader(folder: str, workers: int) -> ResumableDataLoader:
    return ResumableDataLoader(
        AugmentedStream(folder, shuffle=True),
        batch_size=BATCH_SIZE,
        num_workers=workers,
        resumable=True,
        generator=torch.Generator().manual_seed(LOADER_SEED),
    )


def read(loader: ResumableDataLoader, stop: int | None = None) -> tuple[list[Batch], Any]:
    """The batches of the epochs left (``for epoch in range(loader.epoch, EPOCHS)``), and the
    loader's state after ``stop`` of them (``None``: read to the end)."""
    batches: list[Batch] = []
    for _ in range(loader.epoch, EPOCHS):
        for batch in loader:
            batches.append({"id": batch["id"].clone(), "x": batch["x"].clone()})
            if len(batches) == stop:
                return batches, loader.state_dict()
    return batches, None


def main(folder: str, states_path: str, out_path: str) -> None:
    states = torch.load(states_path, weights_only=True)
    tails = {}
    for key, state in states.items():
        workers = int(key.split("/")[0])
        loader = make_loader(folder, workers)
        loader.load_state_dict(state)
        tails[key] = read(loader)[0]
    torch.save(tails, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:4])
