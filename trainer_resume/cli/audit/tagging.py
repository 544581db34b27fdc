"""Samples tagged with their dataset index on their way through a loader.

The audit identifies a sample by its index, whatever ``dataset[i]`` returns. It
puts two thin wrappers into the loader under audit: :class:`IndexedDataset` returns
``Tagged(i, dataset[i])`` and :class:`TaggingCollate` hands the bare samples to the
loader's own ``collate_fn``, and returns the batch with the indices and one content
digest per field of every sample, taken before collation (where ``dataset[i]`` ran,
in the worker). The loader's sampler, workers, seeding and collation are otherwise
untouched, so what is measured is the loader as the factory built it. An
``IterableDataset`` has no indices: its items reach ``collate_fn`` bare and are
identified by their content digests; only the collate function is wrapped, so the
dataset the loader reads is the factory's own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from .contract import flatten_sample

__all__ = [
    "Delivered",
    "IndexedDataset",
    "Tagged",
    "TaggingCollate",
    "keep_samples",
    "sample_digests",
    "tag_loader",
    "value_digest",
]


@dataclass(frozen=True)
class Tagged:
    """A sample and the index it was read at."""

    index: int
    sample: Any


@dataclass(frozen=True)
class Delivered:
    """A batch as the loader delivers it, with what the audit recorded about its samples."""

    indices: list[int]  # empty for an IterableDataset's items
    samples: list[dict[str, str]]  # per sample: field path -> content digest
    batch: Any  # the loader's collate_fn output, kept so the audit measures its transfer too


class IndexedDataset(Dataset):
    """``dataset[i]`` as ``Tagged(i, dataset[i])``; every other attribute is the dataset's."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Tagged:
        return Tagged(int(index), self.dataset[index])

    def __getitems__(self, indices: Sequence[int]) -> list[Tagged]:
        # torch's fetcher prefers __getitems__; the dataset's own one is used when it has one.
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            samples = getitems(list(indices))
        else:
            samples = [self.dataset[index] for index in indices]
        return [Tagged(int(index), sample) for index, sample in zip(indices, samples)]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class TaggingCollate:
    """Calls the loader's ``collate_fn`` on the bare samples; returns a :class:`Delivered`.

    Args:
        collate_fn: The loader's own.
        batched: For an ``IterableDataset``'s items (never tagged): ``collate_fn`` gets a
            list of them (``batch_size`` set) rather than one.
    """

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool = True) -> None:
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, items: Any) -> Delivered:
        if isinstance(items, Tagged):  # no automatic batching: collate_fn gets one sample
            return Delivered(
                [items.index], [sample_digests(items.sample)], self.collate_fn(items.sample)
            )
        if not self.batched:  # an IterableDataset's item, one per batch
            return Delivered([], [sample_digests(items)], self.collate_fn(items))
        if not items or not isinstance(items[0], Tagged):  # an IterableDataset's items
            return Delivered([], [sample_digests(item) for item in items], self.collate_fn(items))
        return Delivered(
            [item.index for item in items],
            [sample_digests(item.sample) for item in items],
            self.collate_fn([item.sample for item in items]),
        )


def keep_samples(samples: list[Any]) -> list[Any]:
    """The collate_fn of the loader the audit builds around a dataset: no collation at all."""
    return samples


def tag_loader(loader: DataLoader) -> None:
    """Put the tagging wrappers into ``loader`` before it is iterated."""
    # DataLoader (and ResumableDataLoader for collate_fn) refuse these assignments after
    # construction, to protect a running iteration; none runs yet, and each iter() reads both.
    if isinstance(loader.dataset, IterableDataset):
        batched = loader.batch_size is not None
        object.__setattr__(loader, "collate_fn", TaggingCollate(loader.collate_fn, batched))
        return
    object.__setattr__(loader, "dataset", IndexedDataset(loader.dataset))
    object.__setattr__(loader, "collate_fn", TaggingCollate(loader.collate_fn))


def _leaf_bytes(value: Any) -> bytes:
    if isinstance(value, torch.Tensor):
        try:
            flat = value.detach().cpu().contiguous().reshape(-1)
            data = flat.view(torch.uint8).numpy().tobytes()
        except (RuntimeError, TypeError):  # sparse and other layouts without plain storage
            data = repr(value).encode()
        return f"{value.dtype}{tuple(value.shape)}".encode() + data
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes()
    return f"{type(value).__name__}:{value!r}".encode()


def sample_digests(sample: Any) -> dict[str, str]:
    """Field path -> digest of its content (type, dtype, shape and bytes of tensors)."""
    return {
        path: hashlib.sha256(_leaf_bytes(leaf)).hexdigest()[:16]
        for path, leaf in flatten_sample(sample).items()
    }


def value_digest(value: Any) -> str:
    """One digest of a whole nested value (a collated batch)."""
    hasher = hashlib.sha256()
    for path, digest in sample_digests(value).items():
        hasher.update(path.encode() + b"=" + digest.encode())
    return hasher.hexdigest()[:16]
