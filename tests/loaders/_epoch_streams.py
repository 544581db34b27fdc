"""Loaders over torch's own samplers, built by name, and epoch-loop runs for the epoch tests.

Module level on purpose: a spawned process imports this module by name to rebuild the
loaders the parent describes.
"""

from __future__ import annotations

import traceback
from typing import Any

import _loader_streams as streams
import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from trainer_resume.loaders import ResumableDataLoader

SIZE = 23  # batches of 7: 7, 7, 7, 2 per epoch
EPOCHS = 3


def _generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def _sampler_arguments(kind: str, dataset: Any) -> dict[str, Any]:
    """The loader arguments (besides batch size and workers) that choose the order."""
    if kind == "shuffle":
        return {"shuffle": True}
    if kind == "sequential":
        return {"shuffle": False}
    if kind == "shuffle-generator":
        return {"shuffle": True, "generator": _generator(11)}
    if kind == "sequential-sampler":
        return {"sampler": SequentialSampler(dataset)}
    if kind == "random-generator":
        return {"sampler": RandomSampler(dataset, generator=_generator(12))}
    if kind == "random-replacement":
        return {
            "sampler": RandomSampler(
                dataset, replacement=True, num_samples=17, generator=_generator(13)
            )
        }
    if kind == "random-num-samples":
        return {"sampler": RandomSampler(dataset, num_samples=30)}
    if kind == "subset":
        return {"sampler": SubsetRandomSampler(list(range(3, 20)))}
    if kind == "weighted":
        return {"sampler": WeightedRandomSampler([float(1 + i % 4) for i in range(SIZE)], 19)}
    if kind == "distributed":
        return {
            "sampler": DistributedSampler(dataset, num_replicas=3, rank=1, shuffle=True, seed=5)
        }
    if kind == "batch-sampler":
        return {
            "batch_sampler": BatchSampler(RandomSampler(dataset, generator=_generator(14)), 6, True)
        }
    raise ValueError(kind)


KINDS = (
    "shuffle",
    "sequential",
    "shuffle-generator",
    "sequential-sampler",
    "random-generator",
    "random-replacement",
    "random-num-samples",
    "subset",
    "weighted",
    "distributed",
    "batch-sampler",
)


def make_loader(
    kind: str, batch_size: int | None = 7, num_workers: int = 0, **options: Any
) -> ResumableDataLoader:
    dataset = streams.AugmentedDataset(SIZE)
    arguments = _sampler_arguments(kind, dataset)
    if "batch_sampler" not in arguments:
        arguments["batch_size"] = batch_size
    return ResumableDataLoader(
        dataset,
        num_workers=num_workers,
        collate_fn=streams.noisy_collate if batch_size else None,
        resumable=True,
        **arguments,
        **options,
    )


def run_epochs(loader: ResumableDataLoader, epochs: int = EPOCHS, *, after: list | None = None):
    """The usual epoch loop from the loader's own epoch counter to ``epochs``: batches, and
    the state after each batch (``after`` gets the state after each epoch's loop too)."""
    batches, states = [], []
    for epoch in range(loader.epoch, epochs):
        sampler = loader.sampler if loader.batch_sampler is None else loader.batch_sampler.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for batch in loader:
            batches.append(batch)
            states.append(loader.state_dict())
        if after is not None:
            after.append(loader.state_dict())
    return batches, states


def resume_epoch_jobs(jobs: list[tuple[str, int | None, dict]], out: str) -> None:
    """Spawned-process entry: for each ``(kind, batch_size, state)`` build a fresh loader,
    load ``state``, finish the epoch loop and save the batches to ``out``."""
    try:
        torch.manual_seed(987654321)  # seeded unlike the parent: the state must fix every order
        results = []
        for kind, batch_size, state in jobs:
            loader = make_loader(kind, batch_size)
            loader.load_state_dict(state)
            results.append(run_epochs(loader)[0])
        torch.save({"results": results}, out)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out)
        raise
