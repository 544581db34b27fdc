"""The datasets and loaders the loader benchmarks compare, and how their CPU time is counted.

Two datasets whose items spin a fixed CPU time each (0 and 200 µs) and return a small
float tensor:

- :class:`SpinDataset`, map-style: ``dataset[i]``, read in a fresh shuffle by every
  loader (``shuffle=True``);
- :class:`SpinStream`, an ``IterableDataset`` written the common way: its own iterator
  (``__iter__`` restarts it and returns ``self``), split over workers by
  ``get_worker_info()``, with ``state_dict()`` returning a small fresh dict
  (``{"position": int}``).

Each is read by torch's ``DataLoader``, torchdata's ``StatefulDataLoader`` (its default
snapshot of each worker's state with every batch) and ``ResumableDataLoader(...,
resumable=True)``, with ``batch_size=32`` and otherwise default settings.
"""

from __future__ import annotations

import resource
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from benchmarks._common import busy_wait_cpu
from trainer_resume.loaders import ResumableDataLoader

SIZE = 200_000
BATCH = 32
LOADERS = ("torch", "stateful", "resumable")
DATASETS = ("map", "iterable")
LABELS = {
    "torch": "DataLoader",
    "stateful": "StatefulDataLoader",
    "resumable": "ResumableDataLoader",
}


class SpinDataset(Dataset):
    """``dataset[i]`` spins ``cost_us`` of CPU time, then returns a small float tensor."""

    def __init__(self, cost_us: float, size: int = SIZE) -> None:
        self.cost_us = cost_us
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        busy_wait_cpu(self.cost_us)
        return torch.full((8,), float(index))


class SpinStream(IterableDataset):
    """Items ``0..size`` (split over workers), each spinning ``cost_us``; its own iterator."""

    def __init__(self, cost_us: float, size: int = SIZE) -> None:
        self.cost_us = cost_us
        self.size = size
        self.position = 0
        self.end = size
        self.stride = 1

    def __iter__(self) -> SpinStream:
        info = get_worker_info()
        self.position, self.stride = (0, 1) if info is None else (info.id, info.num_workers)
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= self.end:
            raise StopIteration
        busy_wait_cpu(self.cost_us)
        item = torch.full((8,), float(self.position))
        self.position += self.stride
        return item

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def stateful_loader_class() -> tuple[type | None, str]:
    """torchdata's StatefulDataLoader, or None and why it is not available."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as error:  # the bench extra is optional
        return None, f"torchdata not importable ({error})"
    return StatefulDataLoader, ""


def make_loader(kind: str, cost_us: float, workers: int = 2, dataset: str = "map") -> DataLoader:
    if dataset == "map":
        data: Any = SpinDataset(cost_us)
        options: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": workers}
    else:
        data = SpinStream(cost_us)
        options = {"batch_size": BATCH, "num_workers": workers}
    if kind == "torch":
        return DataLoader(data, **options)
    if kind == "stateful":
        stateful, why = stateful_loader_class()
        if stateful is None:
            raise RuntimeError(why)
        with warnings.catch_warnings():  # torchdata warns about its own deprecations
            warnings.simplefilter("ignore")
            return stateful(data, **options)
    return ResumableDataLoader(data, resumable=True, **options)


def cpu_seconds() -> float:
    """This process plus its reaped children (the workers, once the loader joined them)."""
    # getrusage, not os.times: clock ticks (10 ms) are too coarse for a sub-second run.
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def stop_workers(loader: DataLoader, iterator: Any) -> None:
    """Join the workers now, so that their CPU time is reaped and counted."""
    # StatefulDataLoader keeps its iterator (for state_dict()), so dropping ours would not end them.
    if isinstance(loader, ResumableDataLoader):
        loader.close()
        return
    shutdown = getattr(iterator, "_shutdown_workers", None)  # absent without workers
    if shutdown is not None:
        shutdown()
