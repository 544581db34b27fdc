"""Building the audited loader for a worker count and recording what it delivers."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from .._common import type_phrase
from .contract import AuditUsageError
from .tagging import Delivered, keep_samples, tag_loader, value_digest

__all__ = [
    "EpochRun",
    "Target",
    "build_target",
    "delivered",
    "is_endless",
    "load_factory",
    "run_epochs",
]


@dataclass
class Target:
    """The loader under audit for one worker count, and where it came from."""

    loader: DataLoader
    dataset: Any  # the dataset itself (the loader reads it through the tagging wrapper)
    built_by_audit: bool  # the factory returned a dataset that the audit wrapped
    iterable: bool = False  # an IterableDataset: items identified by content, not index
    refusal: str | None = None  # why ResumableDataLoader refused the factory's dataset


@dataclass
class EpochRun:
    """What one pass over the loader delivered and how long it took."""

    indices: list[int] = field(default_factory=list)
    samples: list[dict[str, str]] = field(default_factory=list)  # per sample: field path -> digest
    batch_digests: list[str] = field(default_factory=list)  # of each collated batch
    batch_indices: list[list[int]] = field(default_factory=list)
    batches: int = 0
    warmup_s: float = 0.0  # iter() plus the first batch: worker start-up, excluded from the rate
    warmup_samples: int = 0
    measured_s: float = 0.0
    ended: bool = False  # the loader's iterator ran out (a complete finite epoch)

    @property
    def samples_per_s(self) -> float | None:
        measured = len(self.samples) - self.warmup_samples
        if measured <= 0 or self.measured_s <= 0:
            return None
        return measured / self.measured_s


def load_factory(target: str) -> Callable[..., Any]:
    """Import ``MODULE:FACTORY`` (the current directory first on ``sys.path``, as ``python -m`` does).

    Raises:
        AuditUsageError: malformed target, module or attribute missing, not callable.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise AuditUsageError(
            f"expected MODULE:FACTORY (e.g. mypackage.data:make_dataset), got {target!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise AuditUsageError(f"cannot import module {module_name!r}: {error}") from error
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as error:
            raise AuditUsageError(
                f"module {module_name!r} has no attribute {attribute!r}"
            ) from error
    if not callable(obj):
        raise AuditUsageError(f"{target} is {type_phrase(obj)}, not a callable factory")
    return obj


def _accepts_num_workers(factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "num_workers" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


def build_target(factory: Callable[..., Any], *, num_workers: int, batch_size: int) -> Target:
    """Call the factory and return the loader to audit at ``num_workers``.

    Raises:
        AuditUsageError: the factory's result cannot be audited.
    """
    takes_workers = _accepts_num_workers(factory)
    try:
        product = factory(num_workers=num_workers) if takes_workers else factory()
    except Exception as error:
        name = getattr(factory, "__qualname__", repr(factory))
        raise AuditUsageError(
            f"the factory {name} raised {type(error).__name__}: {error}"
        ) from error
    if isinstance(product, DataLoader):
        if not takes_workers:
            raise AuditUsageError(
                "the factory returned a loader but takes no num_workers argument; "
                "define it as factory(num_workers) so each worker count can be built"
            )
        if product.num_workers != num_workers:
            raise AuditUsageError(
                f"the factory was called with num_workers={num_workers} but its loader has "
                f"num_workers={product.num_workers}"
            )
        dataset = product.dataset
        tag_loader(product)
        return Target(
            product, dataset, built_by_audit=False, iterable=isinstance(dataset, IterableDataset)
        )
    if isinstance(product, IterableDataset):
        return _stream_target(product, num_workers=num_workers, batch_size=batch_size)
    if not (hasattr(product, "__getitem__") and hasattr(product, "__len__")):
        raise AuditUsageError(
            f"the factory returned a {type(product).__name__}; expected a map-style dataset "
            "(__getitem__ and __len__) or a torch DataLoader"
        )
    # No collation: the samples are compared exactly as dataset[i] returned them.
    loader = DataLoader(
        product,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=keep_samples,
    )
    tag_loader(loader)
    return Target(loader, product, built_by_audit=True)


def _stream_target(dataset: Any, *, num_workers: int, batch_size: int) -> Target:
    """An IterableDataset, loaded without collation by ResumableDataLoader(resumable=True), so
    its resumes are checked; by torch's DataLoader where that refuses it (the refusal is a
    finding)."""
    from ...errors import UnsupportedResumeConfigurationError
    from ...loaders import ResumableDataLoader

    options = {"batch_size": batch_size, "num_workers": num_workers, "collate_fn": keep_samples}
    refusal = None
    try:
        loader: DataLoader = ResumableDataLoader(dataset, resumable=True, **options)
    except UnsupportedResumeConfigurationError as error:
        refusal = str(error)
        loader = DataLoader(dataset, **options)
    tag_loader(loader)
    return Target(loader, dataset, built_by_audit=True, iterable=True, refusal=refusal)


def delivered(batch: Any) -> Delivered:
    if not isinstance(batch, Delivered):
        raise AuditUsageError(
            f"the loader delivered a {type(batch).__name__} instead of its collate_fn's output; "
            "a loader that bypasses its dataset or collate_fn attributes cannot be audited"
        )
    return batch


def is_endless(loader: DataLoader) -> bool:
    """True when the loader has no length (an endless sampler): its epochs are cut by size.
    An IterableDataset's passes end where its iterators stop."""
    if isinstance(loader.dataset, IterableDataset):
        return False
    try:
        len(loader)
    except (TypeError, NotImplementedError, OverflowError):
        return True
    return False


def run_epochs(
    loader: DataLoader, *, dataset_size: int | None, epochs: int, batches: int | None
) -> list[EpochRun]:
    """Iterate ``epochs`` passes; a pass ends with the iterator, after ``batches``
    batches, or (for an endless loader) after ``dataset_size`` samples."""
    endless = is_endless(loader)
    runs = []
    for _ in range(epochs):
        run = EpochRun()
        start = time.perf_counter()
        iterator = iter(loader)
        first_done = start
        while batches is None or run.batches < batches:
            if endless and dataset_size is not None and len(run.indices) >= dataset_size:
                break
            try:
                batch = next(iterator)
            except StopIteration:
                run.ended = True
                break
            delivered_batch = delivered(batch)
            run.indices.extend(delivered_batch.indices)
            run.samples.extend(delivered_batch.samples)
            run.batch_indices.append(delivered_batch.indices)
            run.batch_digests.append(value_digest(delivered_batch.batch))
            run.batches += 1
            if run.batches == 1:
                first_done = time.perf_counter()
                run.warmup_s = first_done - start
                run.warmup_samples = len(delivered_batch.samples)
        run.measured_s = time.perf_counter() - first_done if run.batches > 1 else 0.0
        # Dropping the iterator stops its workers before the next pass starts new ones.
        del iterator
        runs.append(run)
    return runs
