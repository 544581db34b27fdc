"""Interrupted and uninterrupted runs of a streaming dataset through ``ResumableDataLoader``.

The library modules (``support.litdata_runs``, ``support.mosaic_runs``) write a small
dataset with the library's own writer and build the loader; what is compared is the
same for both: every batch of a run interrupted after ``stop`` batches and resumed, in
a new process, from the loader's state equals the uninterrupted run's batch.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_resume.loaders import ResumableDataLoader

SAMPLES = 64
BATCH_SIZE = 8
EPOCHS = 2
LOADER_SEED = 11

Batch = dict[str, torch.Tensor]

TESTS = Path(__file__).resolve().parent.parent  # the children import support.<module> from it


def augment(values: torch.Tensor) -> torch.Tensor:
    """A random augmentation drawing from the three global generators, as transforms do."""
    return values + torch.rand(values.shape) + random.random() + float(np.random.rand())


def resumable_loader(dataset: Any, workers: int) -> ResumableDataLoader:
    """The loader every run reads ``dataset`` with (its augmentation seed fixed)."""
    return ResumableDataLoader(
        dataset,
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


def check_resumes_in_new_process(
    module: Any, folder: str, tmp_path: Path, workers: tuple[int, ...] = (0, 2)
) -> None:
    """``module.make_loader(folder, workers)`` interrupted after 3 batches and on the first
    epoch's last batch, resumed by ``module`` run as a script: every batch is the
    uninterrupted run's, and each epoch is a new shuffle of every sample."""
    full, heads, states = {}, {}, {}
    for count in workers:
        full[count] = read(module.make_loader(folder, count))[0]
        per_epoch = len(full[count]) // EPOCHS
        for batches in (full[count][:per_epoch], full[count][per_epoch:]):
            assert sorted(int(i) for b in batches for i in b["id"]) == list(range(SAMPLES))
        first, second = (
            [int(i) for b in part for i in b["id"]]
            for part in (full[count][:per_epoch], full[count][per_epoch:])
        )
        assert first != second and first != sorted(first)
        for stop in (3, per_epoch):
            key = f"{count}/{stop}"
            heads[key], states[key] = read(module.make_loader(folder, count), stop)
    torch.save(states, tmp_path / "states.pt")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            module.__name__,
            folder,
            str(tmp_path / "states.pt"),
            str(tmp_path / "tails.pt"),
        ],
        cwd=TESTS,
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tails = torch.load(tmp_path / "tails.pt", weights_only=True)
    for key, head in heads.items():
        expected = full[int(key.split("/")[0])]
        resumed = head + tails[key]
        assert len(resumed) == len(expected), key
        for number, (got, want) in enumerate(zip(resumed, expected)):
            assert torch.equal(got["id"], want["id"]), (key, number)
            assert torch.equal(got["x"], want["x"]), (key, number)


def resume_main(make_loader: Callable[[str, int], ResumableDataLoader], argv: list[str]) -> None:
    """``DATA STATES OUT``: load each state into a new loader, read the rest, save it to OUT."""
    folder, states_path, out_path = argv
    tails = {}
    for key, state in torch.load(states_path, weights_only=True).items():
        loader = make_loader(folder, int(key.split("/")[0]))
        loader.load_state_dict(state)
        tails[key] = read(loader)[0]
    torch.save(tails, out_path)
