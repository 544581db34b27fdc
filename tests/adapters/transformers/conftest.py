"""Fixtures of the transformers adapter tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _quick_full_collections() -> Iterator[None]:
    # Trainer.train() begins with a full gc.collect() (accelerator.free_memory), which
    # walks every object of the test session: a second or more per train(). Frozen for
    # the module's duration, they are skipped (and collectable again after it).
    gc.freeze()
    yield
    gc.unfreeze()
