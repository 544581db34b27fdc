"""Evaluation loaders whose workers persist from one evaluation to the next, stopped after each.

A torch ``DataLoader`` with ``persistent_workers=True`` keeps its workers (and its
iterator) between passes: their random generators carry on, and the main process's
torch generator is drawn from, for their seed, only when they start. A framework that
keeps such an evaluation loader through the fit (the Hugging Face Trainer, Lightning)
thus draws once where a resumed process, starting the workers again, draws once more,
and the workers' generators start over there: the evaluations and every later random
draw differ. :func:`stop_kept_workers` after each evaluation makes every one start its
workers, resumed or not, as without persistent workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["stop_kept_workers"]


def stop_kept_workers(loaders: Iterable[Any]) -> None:
    """Stop the workers each loader keeps between passes; its next pass starts new ones."""
    for loader in loaders:
        if not getattr(loader, "persistent_workers", False):
            continue
        # DataLoader keeps the iterator of persistent workers here and starts one when None.
        iterator = getattr(loader, "_iterator", None)
        if iterator is None:
            continue
        loader._iterator = None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
