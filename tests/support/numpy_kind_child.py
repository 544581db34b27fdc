"""A fresh process whose NumPy global bit generator is of a chosen kind before any loader
reads: ``python -m support.numpy_kind_child KIND OUT`` (KIND: ``MT19937`` or ``PCG64``).

It reads a map-style loader and a stateful stream whose samples draw from Python,
NumPy and torch, and saves their batches to OUT with whether the caller's bit generator
came back unchanged.
"""

from __future__ import annotations

import random
import sys
import warnings

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from trainer_resume.loaders import ResumableDataLoader


class Drawing(Dataset):
    """Eight samples, each drawing from the three global generators (a Gaussian too)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        draws = [float(index), random.random(), np.random.rand(), np.random.randn()]
        return torch.tensor([*draws, torch.rand(()).item()], dtype=torch.float64)


class DrawingStream(IterableDataset):
    """The same draws as a stream with ``state_dict()``."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> DrawingStream:
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= 8:
            raise StopIteration
        self.position += 1
        return Drawing()[self.position]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def _batches(dataset: Dataset | IterableDataset) -> list[torch.Tensor]:
    loader = ResumableDataLoader(
        dataset, batch_size=2, resumable=True, generator=torch.Generator().manual_seed(0)
    )
    torch.manual_seed(0)  # the stream's augmentation seed
    batches = list(loader)
    loader.close()
    return batches


def _equal(first: object, second: object) -> bool:
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(_equal(first[k], second[k]) for k in first)
    if isinstance(first, np.ndarray):
        return isinstance(second, np.ndarray) and np.array_equal(first, second)
    return type(first) is type(second) and first == second


def main(kind: str, out: str) -> None:
    caller = getattr(np.random, kind)(7)
    np.random.set_bit_generator(caller)  # before the first loader: the layout is found now
    before = caller.state
    warnings.simplefilter("error")  # no warning per batch
    batches = {"map": _batches(Drawing()), "stream": _batches(DrawingStream())}
    after = caller.state
    unchanged = np.random.get_bit_generator() is caller and _equal(before, after)
    torch.save({"batches": batches, "caller_unchanged": unchanged}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
