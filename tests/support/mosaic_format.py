"""A stand-in for MosaicML's ``streaming.base.dataset`` where the package cannot be installed.

It has the state API of mosaicml-streaming 0.13.0's ``StreamingDataset`` as that
package documents and implements it, read in one process (no workers): an epoch
counter ``next_epoch`` that each ``iter()`` advances; ``state_dict(num_samples,
from_beginning)`` returning the published keys (``epoch``, ``sample_in_epoch``,
``num_canonical_nodes``, ``shuffle_seed``, ``initial_physical_nodes``), the epoch
being ``next_epoch - 1`` unless a loaded state names a later one; and
``load_state_dict``, whose state the next ``iter()`` resumes when its epoch is not
older than the counter's, skipping ``sample_in_epoch`` samples of that epoch's order
(so a state at an epoch's end gives an empty pass). Install it with
:func:`installed` (the module is put in ``sys.modules`` for the test's duration).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from support.streaming_runs import SAMPLES, augment


class StreamingDataset(IterableDataset):
    """MosaicML's dataset as its state API behaves, with an augmentation per sample."""

    def __init__(
        self, *, batch_size: int | None, shuffle_seed: int = 7, replication: int | None = None
    ) -> None:
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed
        self.replication = replication
        self.next_epoch = 0
        self.loaded: list[dict[str, Any]] = []  # every state given to load_state_dict()

    def _resume(self, epoch: int) -> tuple[int, int]:
        state = self.loaded[-1] if self.loaded else None
        if state is None or state["epoch"] < epoch:
            return epoch, 0
        return state["epoch"], state["sample_in_epoch"]

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        epoch, offset = self._resume(self.next_epoch - 1)
        return {
            "epoch": epoch,
            "sample_in_epoch": num_samples if from_beginning else offset + num_samples,
            "num_canonical_nodes": 1,
            "shuffle_seed": self.shuffle_seed,
            "initial_physical_nodes": 1,
        }

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        self.loaded.append(dict(obj))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch, skip = self._resume(self.next_epoch)
        self.next_epoch = epoch + 1
        order = torch.randperm(
            SAMPLES, generator=torch.Generator().manual_seed(self.shuffle_seed + epoch)
        )
        for index in order[skip:].tolist():
            yield {"id": torch.tensor(index), "x": augment(torch.full((3,), float(index)))}


def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make :class:`StreamingDataset` the one ``streaming.base.dataset`` names, for this test."""
    module = types.ModuleType("streaming.base.dataset")
    module.StreamingDataset = StreamingDataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "streaming.base.dataset", module)
