"""Fetching one batch with replayable augmentation, in the main process or a worker.

The loader hands its workers ``(first stream position, indices)`` tasks instead of
bare indices. Sample ``i`` of a task runs with Python ``random``, NumPy's global
generator and torch CPU seeded by ``derive_seed(augmentation_seed, position)``, and
``collate_fn`` runs seeded by a per-batch seed: the same stream position gives the
same augmentation in any process, with any number of workers. A failing sample or
collate is returned as a :class:`FetchFailure` (not raised) so the main process can
report the dataset index and chain the original exception, whatever the worker did.
"""

from __future__ import annotations

import pickle
import random
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from ..rng import derive_seed, rng_scope

__all__ = ["BatchFetcher", "FetchFailure", "as_is", "collate_seed", "sample_seeds"]

_MASK32 = (1 << 32) - 1
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_COLLATE_SALT = 0x636F_6C6C_6174_65  # b"collate": keeps batch seeds apart from sample seeds

# derive_seed's documented mix (SplitMix64 steps from a fixed start), vectorised over
# the positions of a batch: one NumPy pass instead of a Python call per sample.
_DERIVE_INIT = 0x5452_5245_5355_4D45
_GOLDEN, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix64(value: int) -> int:
    value = (value + _GOLDEN) & _MASK64
    value = ((value ^ (value >> 30)) * _MUL1) & _MASK64
    value = ((value ^ (value >> 27)) * _MUL2) & _MASK64
    return value ^ (value >> 31)


def _splitmix64_array(value: np.ndarray) -> np.ndarray:
    value = value + np.uint64(_GOLDEN)  # uint64 arrays wrap modulo 2**64
    value = (value ^ (value >> np.uint64(30))) * np.uint64(_MUL1)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(_MUL2)
    return value ^ (value >> np.uint64(31))


def sample_seeds(augmentation_seed: int, first_position: int, count: int) -> list[int]:
    """``[derive_seed(augmentation_seed, p) for p in range(first_position, first_position + count)]``."""
    head = _splitmix64(_DERIVE_INIT ^ (augmentation_seed & _MASK64))
    positions = np.uint64(first_position) + np.arange(count, dtype=np.uint64)
    state = _splitmix64_array(np.uint64(head) ^ positions)
    seeds = _splitmix64_array(state ^ np.uint64(2)) & np.uint64(_MASK63)
    return seeds.tolist()


def collate_seed(augmentation_seed: int, first_position: int) -> int:
    """Seed of the ``collate_fn`` call of the batch starting at ``first_position``."""
    return derive_seed(augmentation_seed, first_position, _COLLATE_SALT)


def _reseed(seed: int) -> None:
    # Exactly what rng_scope(seed) seeds; the caller's states are saved once per
    # batch (below) instead of once per sample: NumPy's get/set_state alone costs
    # tens of microseconds, more than many samples take to load.
    random.seed(seed)
    np.random.seed(seed & _MASK32)
    torch.default_generator.manual_seed(seed)


def as_is(batch: Any) -> Any:
    """The collate function of the internal loader: batches are collated by :class:`BatchFetcher`."""
    return batch


class FetchFailure:
    """Returned instead of a batch when ``dataset[index]`` or ``collate_fn`` raised."""

    __slots__ = ("first_position", "index", "position", "stage", "exception", "remote_traceback", "summary")

    def __init__(
        self,
        first_position: int,
        index: Any,
        position: int,
        stage: str,
        exception: BaseException,
        *,
        in_worker: bool,
    ) -> None:
        self.first_position = first_position
        self.index = index
        self.position = position
        self.stage = stage
        self.summary = f"{type(exception).__name__}: {exception}"
        self.remote_traceback: str | None = None
        self.exception: BaseException | None = exception
        if in_worker:
            # The failure crosses a process boundary: keep the exception only if it
            # survives pickling, and its formatted traceback in any case.
            self.remote_traceback = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
            try:
                self.exception = pickle.loads(pickle.dumps(exception))
            except Exception:
                self.exception = None

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def describe(self) -> str:
        if self.stage == "dataset":
            return f"dataset[{self.index!r}] raised {self.summary} (stream position {self.position})"
        return f"collate_fn raised {self.summary} on the batch starting at stream position {self.first_position}"


class BatchFetcher(Dataset):
    """The internal loader's dataset: ``fetcher[(first_position, indices)]`` is a collated batch.

    Attribute reads it does not define go to the wrapped dataset, so code that
    configures ``get_worker_info().dataset`` in ``worker_init_fn`` still finds the
    user's attributes; ``get_worker_info().dataset.dataset`` is the user's dataset.

    Args:
        dataset: The user's map-style dataset.
        collate_fn: The user's collate function.
        augmentation_seed: Base of every sample and batch seed.
        batched: Tasks carry a list of indices (``batch_size`` set) or one index
            (``batch_size=None``, where ``collate_fn`` gets the single sample).
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any], augmentation_seed: int, batched: bool) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.augmentation_seed = augmentation_seed
        self.batched = batched

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object lacks; private names are refused so that
        # unpickling (which probes for hooks before __dict__ is filled) cannot recurse.
        dataset = self.__dict__.get("dataset")
        if name.startswith("_") or dataset is None:
            raise AttributeError(name)
        return getattr(dataset, name)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, task: tuple[int, Any]) -> Any:
        first_position, indices = task
        if get_worker_info() is not None:
            # In a worker nothing but these fetches draws from the global generators,
            # and each fetch reseeds them, so there is no caller state to restore.
            return self._fetch(first_position, indices, in_worker=True)
        with rng_scope(collate_seed(self.augmentation_seed, first_position)):
            return self._fetch(first_position, indices, in_worker=False)

    def _fetch(self, first_position: int, indices: Any, *, in_worker: bool) -> Any:
        dataset, base = self.dataset, self.augmentation_seed
        batch = indices if self.batched else (indices,)
        samples = []
        for offset, (index, seed) in enumerate(zip(batch, sample_seeds(base, first_position, len(batch)))):
            _reseed(seed)
            try:
                samples.append(dataset[index])
            except Exception as exc:
                position = first_position + offset
                return FetchFailure(first_position, index, position, "dataset", exc, in_worker=in_worker)
        _reseed(collate_seed(base, first_position))
        try:
            return self.collate_fn(samples if self.batched else samples[0])
        except Exception as exc:
            return FetchFailure(first_position, None, first_position, "collate", exc, in_worker=in_worker)
