"""Loaders over torch's own samplers, built by name, and epoch-loop runs for the epoch tests.

Module level on purpose: a spawned process imports this module by name to rebuild the
loaders the parent describes.
"""

from __future__ import annotations

import itertools
import traceback
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from support import loader_streams as streams
from trainer_resume.loaders import ResumableDataLoader

SIZE = 23  # batches of 7: 7, 7, 7, 2 per epoch
EPOCHS = 3


def _generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


class ShuffleWithState(Sampler):
    """A sampler with torchdata's Stateful protocol: a shuffle per pass, its state the
    pass number and the indices it yielded in it."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.passes, self.yielded = size, seed, 0, 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed * 1000 + self.passes)
        order = torch.randperm(self.size, generator=generator).tolist()
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index
        self.passes, self.yielded = self.passes + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"passes": self.passes, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if set(state) != {"passes", "yielded"}:
            raise KeyError(f"not a ShuffleWithState state: {sorted(state)}")
        self.passes, self.yielded = state["passes"], state["yielded"]


class BucketsWithState(ShuffleWithState):
    """A stateful batch sampler: batches of 3 and 5 indices in turn from a shuffle."""

    def __iter__(self):
        indices = iter(super().__iter__())
        sizes = (3, 5)
        while True:
            batch = list(itertools.islice(indices, sizes[len(self.sizes_seen) % 2]))
            if not batch:
                return
            self.sizes_seen.append(len(batch))
            yield batch

    def __len__(self) -> int:
        count, left, turn = 0, self.size, 0
        while left > 0:
            left, count, turn = left - (3, 5)[turn], count + 1, 1 - turn
        return count

    @property
    def sizes_seen(self) -> list[int]:
        return self.__dict__.setdefault("_sizes", [])

    def state_dict(self) -> dict[str, int]:
        return {**super().state_dict(), "turn": len(self.sizes_seen) % 2}

    def load_state_dict(self, state: dict[str, int]) -> None:
        super().load_state_dict({key: state[key] for key in ("passes", "yielded")})
        self.__dict__["_sizes"] = [0] * state["turn"]


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
    if kind == "stateful":
        return {"sampler": ShuffleWithState(SIZE, 15)}
    if kind == "stateful-batch-sampler":
        return {"batch_sampler": BucketsWithState(SIZE, 16)}
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
    "stateful",
    "stateful-batch-sampler",
)
BATCH_SAMPLER_KINDS = ("batch-sampler", "stateful-batch-sampler")


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
        sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
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
