"""MosaicML's ``StreamingDataset``, randomly augmented, through ``ResumableDataLoader``.

The dataset is written with MosaicML's own writer (``MDSWriter``) in small shards. Run
as a script, ``python -m support.mosaic_runs DATA STATES OUT`` resumes each saved state in this
new process (see ``support.streaming_runs``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from streaming import MDSWriter, StreamingDataset

from support.streaming_runs import BATCH_SIZE, SAMPLES, augment, resumable_loader, resume_main
from trainer_resume.loaders import ResumableDataLoader


class AugmentedStream(StreamingDataset):
    """MosaicML's dataset with a random augmentation of every sample."""

    def __getitem__(self, index: Any) -> dict[str, Any]:
        item = super().__getitem__(index)
        return {"id": item["id"], "x": augment(torch.as_tensor(item["x"]))}


def write_dataset(folder: str) -> None:
    columns = {"id": "int", "x": "ndarray:float32:3"}
    with MDSWriter(out=folder, columns=columns, size_limit=1 << 10) as writer:
        for index in range(SAMPLES):
            writer.write({"id": index, "x": np.full(3, float(index), np.float32)})


def make_loader(folder: str, workers: int) -> ResumableDataLoader:
    dataset = AugmentedStream(local=folder, shuffle=True, batch_size=BATCH_SIZE, shuffle_seed=7)
    return resumable_loader(dataset, workers)


if __name__ == "__main__":
    resume_main(make_loader, sys.argv[1:4])
