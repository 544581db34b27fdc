"""A forked worker leaves what it inherited to its parent's garbage collector.

A ``torch.distributed`` process group destroyed but left in a reference cycle stays
alive, with its threads, until the parent's next collection. A worker forked before
that collection inherits it as garbage; collected there, its destructor waits forever
for threads that exist in the parent only, and the worker never delivers.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from trainer_resume.loaders import ResumableDataLoader

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork start method"),
]


class Collecting(Dataset):
    """Item ``i`` is ``i``; every read runs a collection, as any allocation may."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        gc.collect()
        return torch.tensor(index)


def test_a_worker_forked_beside_a_destroyed_process_group_left_in_a_cycle_delivers_every_batch(
    tmp_path: Path,
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    cycle: list = [dist.group.WORLD]
    cycle.append(cycle)
    gc.disable()
    try:
        dist.destroy_process_group()
        del cycle  # garbage this process has not collected yet
        loader = ResumableDataLoader(
            Collecting(),
            batch_size=2,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=30,  # a worker blocked in the group's destructor fails the test here
            resumable=True,
        )
        batches = [batch.tolist() for batch in loader]
        loader.close()
    finally:
        gc.enable()
        gc.collect()  # the group is destroyed here, in the process that owns its threads
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
