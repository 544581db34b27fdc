"""Accelerate's own loader wrappers, refused with the fix that names ``prepare_loader``.

``accelerator.prepare`` turns a data loader (a ``ResumableDataLoader`` too) into a
``DataLoaderShard`` (``DataLoaderDispatcher`` when it dispatches batches;
``skip_first_batches`` makes a ``SkipDataLoader``, or a ``DataLoader`` over a
``SkipBatchSampler``): none of them saves its position,
and with ``use_stateful_dataloader=True`` the state they do save brings back other
samples. Returned from ``_resume_loaders()``, one is refused when training starts
(with or without a state); the hint registered here gives that refusal its fix. The classes are Accelerate's
(``accelerate.data_loader``, accelerate 1.15).
"""

from __future__ import annotations

from typing import Any

from accelerate.data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    SkipBatchSampler,
    SkipDataLoader,
)

from ...checks.hook_results import register_loader_hint

__all__ = ["prepared_loader_hint"]

# type() is tested, not isinstance(): these classes pose as their DataLoader through __class__.
_WRAPPERS = (DataLoaderShard, DataLoaderDispatcher, SkipDataLoader)


def prepared_loader_hint(loader: Any) -> str | None:
    """The fix for a loader Accelerate wrapped, or ``None`` for any other loader."""
    if type(loader) is SkipDataLoader or isinstance(
        getattr(loader, "batch_sampler", None), SkipBatchSampler
    ):
        return (
            f"Accelerate's skip_first_batches made it a {type(loader).__name__} that skips "
            "batches, which does not resume at the samples it stopped at: resume() puts the "
            "loader trainer_resume.adapters.accelerate.prepare_loader(accelerator, loader) "
            "returns at its position, with no batches to skip; iterate that loader and "
            "return it"
        )
    if not issubclass(type(loader), _WRAPPERS):
        return None
    return (
        f"accelerator.prepare made it Accelerate's {type(loader).__name__}, which does not resume "
        "at the samples it stopped at: pass the ResumableDataLoader to "
        "trainer_resume.adapters.accelerate.prepare_loader(accelerator, loader) instead of "
        "accelerator.prepare, and return what prepare_loader returns"
    )


register_loader_hint(prepared_loader_hint)
