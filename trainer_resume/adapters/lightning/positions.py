"""The delivered position of the training loaders, despite Lightning's prefetch.

Lightning's fit loop saves every stateful training loader's ``state_dict()`` in the
checkpoint (``loops.fit_loop.combined_loader``) and loads it back before the next
iterator is created. But when the loader has no length, Lightning's
``_PrefetchDataFetcher`` pulls one batch ahead of training: at a checkpoint after
batch ``j`` the loader has already delivered batch ``j + 1``, so the saved state
would skip a batch on resume. (With a length, Lightning does not prefetch and the
saved state is already right.)

:class:`DeliveredLoaderStates` corrects this without touching the loaders: while
batches are prefetched it records the loaders' states at each training batch start,
keyed by how many batches the fetcher had pulled at that moment, and at a
checkpoint it substitutes the state recorded when exactly the trained batches had
been pulled.
"""

from __future__ import annotations

import weakref
from typing import Any

from ...state import cpu_state

__all__ = ["DeliveredLoaderStates", "LoaderPositionUnknown"]


class LoaderPositionUnknown(Exception):
    """The loaders' state at the last trained batch was not observed."""


def _fit_loop_parts(trainer: Any) -> tuple[Any, Any]:
    fit_loop = trainer.fit_loop
    return getattr(fit_loop, "_data_fetcher", None), getattr(fit_loop, "_combined_loader", None)


def _stateful(loader: Any) -> bool:
    # The same test as Lightning's ``_Stateful`` runtime protocol, which decides what is saved.
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _loader_states(combined_loader: Any) -> list[Any]:
    return [
        cpu_state(loader.state_dict()) for loader in combined_loader.flattened if _stateful(loader)
    ]


def _prefetched(fetcher: Any) -> int:
    # Batches pulled from the loaders but not yet handed to training.
    return len(getattr(fetcher, "batches", None) or ())


class DeliveredLoaderStates:
    """Tracks the training loaders' states at each trained-batch boundary."""

    def __init__(self) -> None:
        self._iterator: weakref.ReferenceType[Any] | None = None
        self._handed_out = 0
        self._by_pulled: dict[int, list[Any]] = {}

    def _follow_iterator(self, combined_loader: Any) -> None:
        # A new iterator (new epoch, or the one a resumed fit creates) restarts the counts.
        # A weak reference: holding the iterator would keep its worker processes alive.
        iterator = getattr(combined_loader, "_iterator", None)
        current = self._iterator() if self._iterator is not None else None
        if iterator is not current:
            self._iterator = weakref.ref(iterator) if iterator is not None else None
            self._handed_out = 0
            self._by_pulled = {}

    def on_train_start(self, trainer: Any) -> None:
        """Record the states right after the iterator was created (and prefetched)."""
        fetcher, combined_loader = _fit_loop_parts(trainer)
        if fetcher is None or combined_loader is None:
            return
        self._follow_iterator(combined_loader)
        ahead = _prefetched(fetcher)
        if ahead:
            self._by_pulled[self._handed_out + ahead] = _loader_states(combined_loader)

    def on_train_batch_start(self, trainer: Any) -> None:
        """Count the batch handed to training; record the states while batches are prefetched."""
        fetcher, combined_loader = _fit_loop_parts(trainer)
        if fetcher is None or combined_loader is None:
            return
        self._follow_iterator(combined_loader)
        self._handed_out += 1
        ahead = _prefetched(fetcher)
        if ahead:
            self._by_pulled[self._handed_out + ahead] = _loader_states(combined_loader)
        # A later checkpoint needs the states at pulled == handed out (or more): drop older ones.
        for pulled in [p for p in self._by_pulled if p < self._handed_out]:
            del self._by_pulled[pulled]

    def delivered(self, trainer: Any) -> list[Any] | None:
        """Return the loader states to save, or ``None`` when Lightning's own are right.

        Call while saving a checkpoint after the current batch was trained.

        Raises:
            LoaderPositionUnknown: Batches are prefetched and the states at the last
                trained batch were not observed.
        """
        fetcher, combined_loader = _fit_loop_parts(trainer)
        if fetcher is None or combined_loader is None:
            return None
        ahead = _prefetched(fetcher)
        if not ahead:
            return None
        iterator = getattr(combined_loader, "_iterator", None)
        current = self._iterator() if self._iterator is not None else None
        states = self._by_pulled.get(self._handed_out) if iterator is current else None
        if states is None:
            raise LoaderPositionUnknown(
                f"Lightning has prefetched {ahead} batch(es) beyond the last trained one and the loader state "
                "before them was not observed (a loader without a length, at the first batch of an epoch); "
                "give the training loader a length or set Trainer(limit_train_batches=...)"
            )
        return states
